"""A CLIP model's engines in real processes: its towers are built once, in the forkserver."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server_process import ServerProcess, serving
from tests.tiny_vision import build_clip


@pytest.fixture(scope="module")
def appliance(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """CLIP (the default) beside the text embedder, as tests/app/test_image_api.py serves them."""
    clip = build_clip(tmp_path_factory.mktemp("vision") / "clip")
    with serving(clip, tmp_path_factory.mktemp("logs") / "clip.log", models=f"clip={clip},minilm={model_dir}") as proc:
        yield proc


def test_engine_phase_reports_both_towers_built_in_the_forkserver(appliance: ServerProcess) -> None:
    """The CLIP model's engine phase names its text and image towers, built once in the forkserver
    (the engines inherit them), and its warm-up ran an image."""
    engine, warmup = appliance.phase("engine:clip")["detail"], appliance.phase("warmup:clip")["detail"]
    assert set(engine["towers"]) == {"text", "vision"} and engine["weights"] == "forkserver", engine
    assert "image_forward_ms" in warmup, warmup
