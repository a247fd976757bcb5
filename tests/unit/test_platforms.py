"""Platforms' container contracts as settings: SageMaker's `serve` and /opt/ml/model, Vertex AI's
AIP_* variables, and which wins over what."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.settings import Settings
from orchestrator.platforms import overrides, sagemaker_model


def settings(args: list[str], environ: dict[str, str], model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    import os

    for name in [n for n in os.environ if n.startswith(("WARMPOOL_", "AIP_", "SAGEMAKER_"))]:
        monkeypatch.delenv(name)  # the runner's own settings must not decide these tests
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    rest, fixed = overrides(args, environ, model_dir)
    return Settings(_cli_parse_args=rest, **fixed)  # type: ignore[call-arg]


def model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    return folder


def test_serve_takes_port_8080_and_every_interface(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`serve` is SageMaker's command, not a flag: it is taken off and fixes port 8080 over the
    image's WARMPOOL_PORT, on 0.0.0.0."""
    got = settings(["serve"], {"WARMPOOL_PORT": "8000"}, tmp_path / "absent", monkeypatch)
    assert (got.port, got.host) == (8080, "0.0.0.0")


def test_sagemaker_bind_to_port_names_the_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SAGEMAKER_BIND_TO_PORT (inference pipelines) replaces 8080."""
    assert settings(["serve"], {"SAGEMAKER_BIND_TO_PORT": "9090"}, tmp_path, monkeypatch).port == 9090


def test_the_sagemaker_model_folder_wins_over_the_images_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model extracted under /opt/ml/model is served instead of WARMPOOL_MODEL (the image sets it)."""
    folder = model(tmp_path / "ml" / "model")
    got = settings(["serve"], {"WARMPOOL_MODEL": "/opt/warmpool/models/x"}, folder, monkeypatch)
    assert got.model == str(folder)


def test_an_empty_sagemaker_model_folder_leaves_the_configured_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No model data (an image with its model inside): WARMPOOL_MODEL stays."""
    (tmp_path / "model").mkdir()
    got = settings(["serve"], {"WARMPOOL_MODEL": "/opt/warmpool/models/x"}, tmp_path / "model", monkeypatch)
    assert got.model == "/opt/warmpool/models/x"


def test_a_model_packed_in_one_folder_is_found_inside_it(tmp_path: Path) -> None:
    """model.tar.gz often holds one top folder: the model is that folder."""
    inner = model(tmp_path / "model" / "bge-small")
    assert sagemaker_model(tmp_path / "model") == inner
    model(tmp_path / "model" / "second")
    assert sagemaker_model(tmp_path / "model") is None  # two candidates: none is guessed


def test_vertex_variables_set_port_and_routes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """AIP_HTTP_PORT wins over WARMPOOL_PORT; AIP_HEALTH_ROUTE and AIP_PREDICT_ROUTE name the routes."""
    environ = {
        "WARMPOOL_PORT": "8000",
        "AIP_HTTP_PORT": "7080",
        "AIP_HEALTH_ROUTE": "/v1/endpoints/1/deployedModels/2",
        "AIP_PREDICT_ROUTE": "/v1/endpoints/1/deployedModels/2:predict",
    }
    got = settings([], environ, tmp_path, monkeypatch)
    assert (got.port, got.host) == (7080, "0.0.0.0")
    assert got.health_route == "/v1/endpoints/1/deployedModels/2"
    assert got.predict_route == "/v1/endpoints/1/deployedModels/2:predict"


def test_flags_win_over_the_platform_and_warmpool_host_over_its_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flag on the command line beats AIP_HTTP_PORT; an explicit WARMPOOL_HOST is kept."""
    got = settings(["--port", "9"], {"AIP_HTTP_PORT": "7080", "WARMPOOL_HOST": "10.0.0.5"}, tmp_path, monkeypatch)
    assert (got.port, got.host) == (9, "10.0.0.5")


def test_without_a_platform_nothing_changes(tmp_path: Path) -> None:
    """No `serve`, no AIP_*: the arguments pass through and no setting is fixed."""
    assert overrides(["--port", "1"], {"WARMPOOL_PORT": "2"}, model(tmp_path / "m")) == (["--port", "1"], {})


def test_a_route_that_is_not_a_path_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A route must start with '/': anything else would never match a request."""
    with pytest.raises(ValueError, match="predict_route"):
        settings([], {"AIP_PREDICT_ROUTE": "predict"}, tmp_path, monkeypatch)


def test_the_health_route_cannot_be_the_predict_route(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One path cannot be both the open probe and the keyed predict route."""
    with pytest.raises(ValueError, match="give each its own path"):
        settings([], {"AIP_HEALTH_ROUTE": "/v1/x", "AIP_PREDICT_ROUTE": "/v1/x"}, tmp_path, monkeypatch)


def test_the_bound_port_is_written_where_asked(tmp_path: Path) -> None:
    """WARMPOOL_PORT_FILE receives the port the socket got; an unwritable one costs nothing but a line."""
    from orchestrator.__main__ import _write_port

    _write_port(tmp_path / "port", 8080)
    assert (tmp_path / "port").read_text() == "8080\n"
    _write_port(tmp_path / "missing" / "port", 8080)  # no folder: the start goes on
