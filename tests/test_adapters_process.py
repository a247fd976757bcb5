"""A LoRA adapter loaded at run time survives its engine: the re-forked engine serves it (a real server);
one whose folder went away meanwhile, loaded at run time or configured at start, is refused by the
re-forked engine alone (it serves the rest), its requests answered 503."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from tests.lora_adapters import build_adapter
from tests.server_process import ServerProcess, wait_for
from tests.tiny_models import TinyFolders

TEXTS = ["the warm pool model", "Hello world, the engine"]


def _serving_legal(tiny: TinyFolders, tmp_path: Path, configured: bool = False) -> tuple[ServerProcess, Path]:
    """A server of one engine with the adapter `legal` loaded at run time (or `configured` with
    WARMPOOL_ADAPTERS), and its folder."""
    root = tmp_path / "adapters"
    build_adapter(root / "legal", tiny["xlm-roberta"], seed=1)
    settings = {"engines": 1, "served_model_name": "base"}
    settings |= {"adapters": f"legal={root / 'legal'}"} if configured else {"adapter_root": root}
    server = ServerProcess(tiny["xlm-roberta"], tmp_path / "server.log", **settings).wait_ready()
    if not configured:
        assert server.post("/admin/adapters/legal/load", json={"path": "legal"}).status_code == 200
    return server, root / "legal"


def _kill_the_engine(server: ServerProcess) -> None:
    """SIGKILL the engine, then wait for its re-fork to be up."""
    os.kill(server.phase("engine")["detail"]["pids"][0], signal.SIGKILL)
    wait_for(
        lambda: (d := server.phase("engine")["detail"])["restarts"] == 1 and d["up"] == 1,
        60,
        "the killed engine re-forked and up",
    )


def test_a_killed_engine_comes_back_serving_the_run_time_adapters(tiny: TinyFolders, tmp_path: Path) -> None:
    server, _ = _serving_legal(tiny, tmp_path)
    try:
        before = server.post("/v1/embeddings", json={"model": "legal", "input": TEXTS})
        assert before.status_code == 200, before.text
        _kill_the_engine(server)
        after = server.post("/v1/embeddings", json={"model": "legal", "input": TEXTS})
        assert after.status_code == 200, after.text
        assert [d["embedding"] for d in after.json()["data"]] == [d["embedding"] for d in before.json()["data"]]
    finally:
        server.stop()


@pytest.mark.parametrize("configured", [False, True], ids=["loaded at run time", "configured"])
def test_a_re_forked_engine_without_an_adapters_folder_answers_its_requests_503(
    tiny: TinyFolders, tmp_path: Path, configured: bool
) -> None:
    """Its folder removed after the load: the re-forked engine starts, refusing the adapter; a request
    naming it is a 503 adapter_unavailable naming it, with Retry-After (never a 500), and the base is
    answered."""
    server, folder = _serving_legal(tiny, tmp_path, configured)
    try:
        shutil.rmtree(folder)
        _kill_the_engine(server)
        refused = server.post("/v1/embeddings", json={"model": "legal", "input": TEXTS})
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "adapter_unavailable"
        assert "adapter 'legal'" in refused.json()["error"]["message"]
        assert refused.headers["retry-after"] == "1"
        assert server.post("/v1/embeddings", json={"model": "base", "input": TEXTS}).status_code == 200
    finally:
        server.stop()
