"""The layering docs/development.md states (the README's layout section points there),
checked: import-linter contracts and a torch-free gateway."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_hold() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_gateway_imports_without_torch() -> None:
    code = (
        "import sys; import shoal.api, shoal.cli, shoal.client; "
        "from shoal.config import load_settings; shoal.api.create_app(load_settings()); "
        "bad = [m for m in ('torch', 'transformers', 'sentence_transformers') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
