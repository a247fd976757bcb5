"""bge-m3's heads beside its encoder, as FlagEmbedding saves them (no torch).

`sparse_linear` (hidden -> 1: each token's lexical weight, after a relu) and `colbert_linear`
(hidden -> hidden: each token's ColBERT vector) sit in the folder as torch pickles, as BAAI ships
them, or as safetensors where someone converted them. With them the folder answers three outputs
from one forward: the dense vector (CLS), lexical weights (per token id, its largest weight) and
ColBERT vectors (every token but the first, normalised).

The engine reads the pickles with torch's weights-only unpickler and refuses a file that is not a
state dict of tensors (engine/heads/m3.py); the HTTP process, which never imports torch, learns
the outcome from the engine's load report (REFUSED, in its LOADED detail: as_loaded).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from common.modelfolder import ModelFolder

OUTPUTS = ("dense", "sparse", "multi_vector")
REFUSED = "heads_refused"  # the engine's LOADED detail: why it left the heads unread (dense only)


@dataclass(frozen=True)
class M3Heads:
    sparse: Path
    colbert: Path
    refused: str | None = None  # why the engine did not load them (its report); None: they serve

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


def as_loaded(folder: ModelFolder, loaded: Mapping[str, Any]) -> ModelFolder:
    """The folder as its engine loaded it (`loaded`: its LOADED detail): bge-m3's heads marked
    refused, with the engine's reason, where it left them unread."""
    reason = loaded.get(REFUSED)
    if folder.m3 is None or reason is None:
        return folder
    return replace(folder, m3=replace(folder.m3, refused=str(reason)))
