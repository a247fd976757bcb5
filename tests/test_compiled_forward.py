"""Every native family's compiled forward gives the eager engine's numbers: packages built in this
process, as the compile worker builds them, then run on the engine's own weights (the servers that
run the worker itself: test_compiled_engine.py). One pytest worker runs them all, as it does any
file's tests (tests/conftest.py): each process first pays ~20 s for inductor's probes and headers."""

from __future__ import annotations

import os
import random

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["DO_NOT_TRACK"] = "1"

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch._inductor import codecache

from common.modelfolder import read_model_folder
from common.wire import Tokens
from engine.compiling import package as compiled_package
from engine.compiling.compilation import AGREE
from engine.compiling.package import CompiledForward, build_package
from engine.layers.packed import Packed
from engine.precision import gemm
from engine.runtime.device import cpu_has, cpu_has_int8, place
from engine.runtime.model import PoolingModel
from server.tokenizing.tokenizer import TokenizerPool
from tests.tiny_kinds import build_splade
from tests.tiny_models import TinyFolders

pytestmark = pytest.mark.slow

# one folder per native module but nomic_gte's and xlm_roberta's (test_compiled_engine's servers compile
# those): every graph the exporter meets, heads and attention variants included (the classifier
# heads, MPNet's bias, ModernBERT's and Gemma 3's band, Gemma 3's grouped heads and embedding scale,
# Qwen3's causal mask and yes/no score, SPLADE's masked-LM head and vocabulary pooling over BERT)
FAMILIES = ["xlm-roberta-reranker", "mpnet", "modernbert-reranker", "embeddinggemma", "qwen3-reranker", "splade"]
TEXTS = [
    "",
    "a",
    "Hello world, the warm pool model",
    "naïve café 日本語 🙂",
    "the warm pool engine keeps models loaded " * 20,
]


@pytest.fixture(autouse=True, scope="module")
def precompiled_headers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """This file builds nine packages in one process: inductor's precompiled headers (~300 MB,
    built once for the run in a cache of its own, removed with the run's tmp folders) save ~3 s of
    each (engine/compiling/package.py)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiled_package, "PRECOMPILED_HEADERS", True)
        cache = tmp_path_factory.mktemp("inductor")
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
        # inductor puts its headers in its default cache whatever the variable says (read at import)
        patch.setattr(codecache, "_HEADER_DIR", str(cache / "precompiled_headers"))
        patch.setattr(codecache, "_HEADER_LOCK_DIR", str(cache / "precompiled_headers" / "locks"))
        yield


def eager_answers(folder: Path, model: PoolingModel | None = None) -> np.ndarray:
    """The engine's answers to TEXTS (embeddings, sparse weights, or scores against a query)."""
    info = read_model_folder(folder)
    model = model or PoolingModel(info, threads=1)
    pool = TokenizerPool(folder, info.pair_template)
    if info.kind in ("embedding", "sparse"):
        return model.forward(pool.encode_batch(TEXTS, truncate=info.max_model_len))
    return model.forward(pool.encode_pairs([("a warm pool", text) for text in TEXTS], truncate=info.max_model_len))


@pytest.mark.parametrize("name", FAMILIES)
def test_compiled_forward_gives_the_eager_engines_numbers(
    tiny: TinyFolders, model_dir: Path, tmp_path: Path, name: str
) -> None:
    """A package built from the engine's model and run on its own weights answers within 1e-5 of the
    eager engine (which the family tests hold to sentence-transformers and transformers): texts
    empty, unicode and cut at the model's maximum, in one batch of unequal lengths. Built here, in
    this process, as the compile worker builds it (the server tests run the worker itself)."""
    folder = build_splade(tmp_path / "splade", model_dir) if name == "splade" else tiny[name]
    model = PoolingModel(read_model_folder(folder), threads=1)
    eager = eager_answers(folder, model)
    build_package(model.model, Packed.of([Tokens([5] * n) for n in (3, 5, 9)]), tmp_path / "artifact")
    model.compiled = CompiledForward(tmp_path / "artifact", model.model, tmp_path / "unpacked")
    compiled = eager_answers(folder, model)
    assert compiled.shape == eager.shape
    assert not np.array_equal(eager, np.zeros_like(eager))
    np.testing.assert_allclose(compiled, eager, atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("precision", ["bfloat16", "int8"])
def test_a_reduced_precision_package_agrees_with_its_eager_engine(
    tiny: TinyFolders, tmp_path: Path, precision: str
) -> None:
    """bfloat16 (projections on rows rounded up to a step, engine/precision/rows.py) and int8 (int8 products)
    compile through the same wrapper and answer within the engine's own agreement check of eager.
    Only where the CPU computes the precision in its own instructions (else the engine refuses it)."""
    if not (cpu_has(torch.bfloat16) if precision == "bfloat16" else cpu_has_int8()):
        pytest.skip(f"this CPU has no {precision} instructions: the engine refuses {precision} here")
    folder = tiny["bert"]
    model = PoolingModel(read_model_folder(folder), threads=1, placement=place("cpu", precision, []))
    eager = eager_answers(folder, model)
    build_package(model.model, Packed.of([Tokens([5] * n) for n in (3, 5, 9)]), tmp_path / "artifact")
    model.compiled = CompiledForward(tmp_path / "artifact", model.model, tmp_path / "unpacked")
    compiled = eager_answers(folder, model)
    assert compiled.shape == eager.shape and np.isfinite(compiled).all()
    np.testing.assert_allclose(compiled, eager, atol=AGREE[precision], rtol=AGREE[precision])


def test_a_compiled_forward_gives_an_input_the_same_bits_alone_and_in_any_group(
    tiny: TinyFolders, tmp_path: Path
) -> None:
    """float32 compiled as served (its projections' rows on a multiple of 4: engine/precision/rows.py):
    short inputs, alone, have the bits they get inside groups of other inputs of other lengths."""
    model = PoolingModel(read_model_folder(tiny["bert"]), threads=2)
    build_package(model.model, Packed.of([Tokens([5] * n) for n in (3, 5, 9)]), tmp_path / "artifact")
    model.compiled = CompiledForward(tmp_path / "artifact", model.model, tmp_path / "unpacked")
    rng = random.Random(3)
    for length in (1, 3, 5, 11):
        probe = Tokens([rng.randrange(5, 90) for _ in range(length)])
        alone = model.forward([probe])[0].tobytes()
        for size in (1, 2, 6, 17):
            others = [Tokens([rng.randrange(5, 90) for _ in range(rng.randint(1, 40))]) for _ in range(size)]
            at = rng.randint(0, size)
            got = model.forward([*others[:at], probe, *others[at:]])[at]
            assert got.tobytes() == alone, f"a {length}-token input beside {size} others"


def test_a_package_on_onednns_packed_weights_answers_as_the_eager_engine_on_mkl(
    tiny: TinyFolders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where oneDNN is chosen for this CPU (engine/precision/gemm.py; chosen here whatever this CPU
    prefers), the package's projections run on the packed copies through the stand-ins it is handed
    by name: within 1e-5 of the eager engine on MKL, and an input's bits the same alone and in a group."""
    monkeypatch.setattr(gemm, "measure", lambda k, n, dtype=None: "onednn")
    folder = tiny["bert"]
    mkl = eager_answers(folder)
    model = PoolingModel(read_model_folder(folder), threads=2, gemm_records=tmp_path / "records")
    assert "oneDNN packed" in model.weights["gemm"]
    build_package(model.model, Packed.of([Tokens([5] * n) for n in (3, 5, 9)]), tmp_path / "artifact")
    model.compiled = CompiledForward(tmp_path / "artifact", model.model, tmp_path / "unpacked")
    np.testing.assert_allclose(eager_answers(folder, model), mkl, atol=1e-5, rtol=1e-6)
    probe = Tokens([7, 11, 13])
    alone = model.forward([probe])[0].tobytes()
    others = [Tokens([9] * n) for n in (1, 30, 17)]
    assert model.forward([*others, probe])[3].tobytes() == alone
