"""`make test` deals the longest test modules first (tests/conftest.py): a module renamed
or removed must leave that list too, or the list silently stops ordering anything."""

from pathlib import Path

from tests.conftest import LONGEST_FIRST

ROOT = Path(__file__).resolve().parents[2]


def test_every_module_dealt_first_is_a_test_module() -> None:
    missing = [module for module in LONGEST_FIRST if not (ROOT / module).is_file()]
    assert not missing
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
