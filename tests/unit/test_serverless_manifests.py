"""The KServe and Knative manifests (deploy/kubernetes/serverless/) hold valid Kubernetes pod specs,
checked offline with kubernetes-validate as a Pod (their own resources are custom ones no schema
here describes), and they run warmpool as it needs: its model folder, its port, its probes, held
requests during the start, and a concurrency target below its admission permits (past which it
answers 429)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from common.settings import Settings

FOLDER = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "serverless"


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((FOLDER / name).read_text())  # type: ignore[no-any-return]


def pod_of(manifest: dict[str, Any]) -> dict[str, Any]:
    """The pod spec a manifest's custom resource runs (ServingRuntime's containers, a Knative
    Service's template)."""
    if manifest["kind"] == "ServingRuntime":
        return {"containers": manifest["spec"]["containers"]}
    spec = dict(manifest["spec"]["template"]["spec"])
    for knative_only in ("containerConcurrency", "timeoutSeconds"):
        spec.pop(knative_only, None)
    return spec


@pytest.mark.parametrize("name", ["kserve-servingruntime.yaml", "knative-service.yaml"])
def test_the_pod_spec_is_valid_and_runs_warmpool_as_it_needs(name: str) -> None:
    """Validated strictly as a Pod; the container serves on its declared port with warmpool's
    readiness probe and holds requests while it starts."""
    pod = pod_of(load(name))
    kubernetes_validate.validate(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "warmpool"}, "spec": pod},
        kubernetes_validate.utils.latest_version(),
        strict=True,
    )
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["WARMPOOL_HOLD_DURING_START"] == "on" and float(env["WARMPOOL_LOAD_WAIT"]) > 0
    port = container["ports"][0]["containerPort"]
    assert int(env["WARMPOOL_PORT"]) == port and container["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    Settings(**{key.removeprefix("WARMPOOL_").lower(): value for key, value in env.items()})  # every value parses


def test_kserve_serves_the_storage_initializers_folder_and_scales_on_admission() -> None:
    """The runtime serves /mnt/models (where KServe puts storageUri); the InferenceService picks that
    runtime, scales to zero, and scales out before warmpool's admission would refuse."""
    runtime, service = load("kserve-servingruntime.yaml"), load("kserve-inferenceservice.yaml")
    env = {e["name"]: e["value"] for e in runtime["spec"]["containers"][0]["env"]}
    assert env["WARMPOOL_MODEL"] == "/mnt/models"
    predictor = service["spec"]["predictor"]
    assert predictor["model"]["runtime"] == runtime["metadata"]["name"] and predictor["minReplicas"] == 0
    assert 0 < predictor["scaleTarget"] < Settings().admission_permits


def test_knative_scales_to_zero_and_out_before_admission_refuses() -> None:
    """Knative's concurrency target is below warmpool's default admission permits; min scale 0."""
    annotations = load("knative-service.yaml")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["autoscaling.knative.dev/min-scale"] == "0"
    assert 0 < int(annotations["autoscaling.knative.dev/target"]) < Settings().admission_permits
