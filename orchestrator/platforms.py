"""Managed platforms' container contracts, turned into settings.

SageMaker starts the image as `docker run IMAGE serve`, expects port 8080 (or
SAGEMAKER_BIND_TO_PORT) and mounts the model data under /opt/ml/model. Vertex AI names the port
and two routes in AIP_HTTP_PORT, AIP_HEALTH_ROUTE and AIP_PREDICT_ROUTE. Their values win over
WARMPOOL_* variables (the image itself sets WARMPOOL_PORT and WARMPOOL_MODEL), and command-line
flags win over them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SAGEMAKER_MODEL_DIR = Path("/opt/ml/model")
SAGEMAKER_PORT = "8080"
_MODEL_MARKERS = ("config.json", "modules.json")


def overrides(
    args: Sequence[str], environ: Mapping[str, str], model_dir: Path = SAGEMAKER_MODEL_DIR
) -> tuple[list[str], dict[str, Any]]:
    """The command-line arguments left once a leading `serve` is taken off, and the settings the
    platform's contract fixes (passed to Settings as init values: above the environment, below flags)."""
    rest, fixed = list(args), {}
    if rest[:1] == ["serve"]:
        rest = rest[1:]
        fixed["port"] = environ.get("SAGEMAKER_BIND_TO_PORT") or SAGEMAKER_PORT
        folder = sagemaker_model(model_dir)
        if folder is not None:
            fixed["model"] = str(folder)
    if environ.get("AIP_HTTP_PORT"):
        fixed["port"] = environ["AIP_HTTP_PORT"]
    for route in ("health", "predict"):
        if environ.get(f"AIP_{route.upper()}_ROUTE"):
            fixed[f"{route}_route"] = environ[f"AIP_{route.upper()}_ROUTE"]
    if fixed and not environ.get("WARMPOOL_HOST"):  # the platform's probes come from outside the container
        fixed["host"] = "0.0.0.0"
    return rest, fixed


def sagemaker_model(model_dir: Path) -> Path | None:
    """The model folder SageMaker extracted: the directory itself, or the one folder a
    model.tar.gz packed it in; None where it holds no model (the image's own model serves)."""
    if any((model_dir / marker).is_file() for marker in _MODEL_MARKERS):
        return model_dir
    try:
        children = [child for child in model_dir.iterdir() if not child.name.startswith(".")]
    except OSError:
        return None
    if len(children) == 1 and any((children[0] / marker).is_file() for marker in _MODEL_MARKERS):
        return children[0]
    return None
