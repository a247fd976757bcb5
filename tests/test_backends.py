"""A model outside the native BERT path is served through transformers, with the same numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.server_process import ServerProcess
from tests.tiny_models import build_distilbert

TEXTS = ["plain encoders get mean pooling", "as sentence-transformers would wrap them", ""]


def test_plain_distilbert_through_transformers(model_dir: Path, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    folder = build_distilbert(tmp_path / "distilbert", model_dir)
    server = ServerProcess(folder, tmp_path / "server.log").wait_ready()
    try:
        assert server.phase("engine")["detail"]["backend"] == "transformers"
        preload = server.phase("forkserver")["detail"]["preload"]
        assert "transformers.models.distilbert.modeling_distilbert" in preload
        r = server.post("/v1/embeddings", json={"input": TEXTS})
        assert r.status_code == 200, r.text
        got = np.asarray([d["embedding"] for d in r.json()["data"]])
    finally:
        assert server.stop() == 0
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    with torch.inference_mode():
        batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
        hidden = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        expected = ((hidden * mask).sum(1) / mask.sum(1)).numpy()  # mean pooling, no normalisation
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
