"""The Indexed Job of deploy/kubernetes/embed-job.yaml is a valid Job (kubernetes-validate, offline,
strictly) whose pods run `warmpool embed` as the CLI parses it: shard i of N with N the Job's
completions, each into a part of its own, resumable, its model and data mounted."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from orchestrator.embed import cli
from orchestrator.embed.corpus import Shard

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "embed-job.yaml"


def documents() -> list[dict[str, Any]]:
    return list(yaml.safe_load_all(MANIFEST.read_text()))


def job() -> dict[str, Any]:
    (found,) = [d for d in documents() if d["kind"] == "Job"]
    return found


def test_every_document_is_valid() -> None:
    for document in documents():
        kubernetes_validate.validate(document, kubernetes_validate.utils.latest_version(), strict=True)


def expanded(args: list[str], env: dict[str, str]) -> list[str]:
    """The args as the kubelet expands them: $(VAR) from the container's env."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg) for arg in args]


def test_each_index_embeds_its_shard_into_its_own_resumable_part() -> None:
    spec = job()["spec"]
    assert spec["completionMode"] == "Indexed" and spec["template"]["spec"]["restartPolicy"] == "Never"
    (container,) = spec["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    outputs = set()
    for index in range(spec["completions"]):
        args = expanded(container["args"], {**env, "JOB_COMPLETION_INDEX": str(index)})
        assert args[0] == "embed"  # the image's entrypoint is `python -m orchestrator`
        parsed = cli.parser().parse_args(args[1:])
        assert Shard.parse(parsed.shard) == Shard(index, spec["completions"])
        assert parsed.resume and parsed.url is None
        outputs.add(parsed.output)
    assert len(outputs) == spec["completions"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/models", "/data", "/tmp"} <= mounts and parsed.model.startswith("/models/")


def test_an_input_error_fails_its_index_without_retries() -> None:
    (rule,) = job()["spec"]["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailIndex" and rule["onExitCodes"]["values"] == [cli.EXIT_USAGE]
