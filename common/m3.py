"""bge-m3's heads beside its encoder, as FlagEmbedding saves them (no torch).

`sparse_linear` (hidden -> 1: each token's lexical weight, after a relu) and `colbert_linear`
(hidden -> hidden: each token's ColBERT vector) sit in the folder as torch pickles, or as
safetensors where someone converted them. With them the folder answers three outputs from one
forward: the dense vector (CLS), lexical weights (per token id, its largest weight) and ColBERT
vectors (every token but the first, normalised).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

OUTPUTS = ("dense", "sparse", "multi_vector")


@dataclass(frozen=True)
class M3Heads:
    sparse: Path
    colbert: Path

    @property
    def pickled(self) -> bool:
        """The heads are torch pickles: loaded only where WARMPOOL_ALLOW_BIN_WEIGHTS allows."""
        return self.sparse.suffix == ".pt" or self.colbert.suffix == ".pt"

    def files(self) -> list[Path]:
        return [self.sparse, self.colbert]


def read_m3(path: Path) -> M3Heads | None:
    """The two heads' files, safetensors first; None unless the folder has both."""
    found = []
    for name in ("sparse_linear", "colbert_linear"):
        files = [path / f"{name}.{ext}" for ext in ("safetensors", "pt")]
        found.append(next((f for f in files if f.is_file()), None))
    sparse, colbert = found
    return None if sparse is None or colbert is None else M3Heads(sparse, colbert)
