"""A LoRA adapter loaded at run time survives its engine: the re-forked engine serves it (a real server)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.lora_adapters import build_adapter
from tests.server_process import ServerProcess, wait_for
from tests.tiny_models import TinyFolders

TEXTS = ["the warm pool model", "Hello world, the engine"]


def test_a_killed_engine_comes_back_serving_the_run_time_adapters(tiny: TinyFolders, tmp_path: Path) -> None:
    root = tmp_path / "adapters"
    build_adapter(root / "legal", tiny["xlm-roberta"], seed=1)
    server = ServerProcess(tiny["xlm-roberta"], tmp_path / "server.log", engines=1, adapter_root=root).wait_ready()
    try:
        assert server.post("/admin/adapters/legal/load", json={"path": "legal"}).status_code == 200
        before = server.post("/v1/embeddings", json={"model": "legal", "input": TEXTS})
        assert before.status_code == 200, before.text
        victim = server.phase("engine")["detail"]["pids"][0]
        os.kill(victim, signal.SIGKILL)
        wait_for(
            lambda: (d := server.phase("engine")["detail"])["restarts"] == 1 and d["up"] == 1,
            60,
            "the killed engine re-forked and up",
        )
        after = server.post("/v1/embeddings", json={"model": "legal", "input": TEXTS})
        assert after.status_code == 200, after.text
        assert [d["embedding"] for d in after.json()["data"]] == [d["embedding"] for d in before.json()["data"]]
    finally:
        server.stop()
