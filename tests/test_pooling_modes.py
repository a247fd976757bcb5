"""Every sentence-transformers pooling mode gives sentence-transformers' vectors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.server_process import serving

TEXTS = ["short", "a somewhat longer sentence to pool over", "", "mid length text here"]
MODES = {
    "cls": "pooling_mode_cls_token",
    "max": "pooling_mode_max_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_pooling_mode_matches_sentence_transformers(model_dir: Path, tmp_path: Path, mode: str) -> None:
    from sentence_transformers import SentenceTransformer

    folder = tmp_path / f"minilm-{mode}"
    shutil.copytree(model_dir, folder)
    config_path = folder / "1_Pooling" / "config.json"
    config = json.loads(config_path.read_text())
    config.update({key: False for key in config if key.startswith("pooling_mode")})
    config[MODES[mode]] = True
    config_path.write_text(json.dumps(config))
    expected = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    with serving(folder, tmp_path / "server.log") as server:
        data = server.post("/v1/embeddings", json={"input": TEXTS}).json()["data"]
    np.testing.assert_allclose([d["embedding"] for d in data], expected, atol=1e-5, rtol=0)
