"""FlagEmbedding's bge-m3 embedder, imported past its package's __init__: that imports every model
family it has, one of which needs a transformers module newer releases dropped; the bge-m3 one does not."""

from __future__ import annotations

import functools
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

_SHELLS = ("FlagEmbedding", "FlagEmbedding.inference", "FlagEmbedding.inference.embedder")


@functools.cache  # once: the shells below have no import spec for a second find_spec
def m3_embedder() -> Any:
    """FlagEmbedding's M3Embedder (BGEM3FlagModel) class."""
    spec = importlib.util.find_spec("FlagEmbedding")
    assert spec is not None and spec.origin is not None, "FlagEmbedding is a test dependency"
    root = Path(spec.origin).parent
    for name in (*_SHELLS, "FlagEmbedding.inference.embedder.encoder_only"):
        if name not in sys.modules:  # empty packages where the real __init__ would import everything
            shell = types.ModuleType(name)
            shell.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = shell
    from FlagEmbedding.inference.embedder.encoder_only.m3 import M3Embedder

    return M3Embedder
