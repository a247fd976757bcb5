from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server_process import ROOT, ServerProcess

os.environ["HF_HUB_OFFLINE"] = "1"
MODEL_DIR = ROOT / "models" / "all-MiniLM-L6-v2"


@pytest.fixture(scope="session")
def model_dir() -> Path:
    if not (MODEL_DIR / "config.json").exists():
        from orchestrator.models import fetch

        fetch("sentence-transformers/all-MiniLM-L6-v2", MODEL_DIR.parent)
    return MODEL_DIR


@pytest.fixture(scope="session")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One embedding server shared by every test that only sends requests."""
    proc = ServerProcess(model_dir, tmp_path_factory.mktemp("logs") / "server.log")
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def st_model(model_dir: Path):  # type: ignore[no-untyped-def]
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_dir), device="cpu")
