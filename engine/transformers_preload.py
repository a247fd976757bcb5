"""Modules the model-load path imports lazily, imported here so the forkserver pays for them once.

The served architecture's own modelling module is added to the forkserver's preload list by
the orchestrator (it knows the model's config.json).

On a 2-core machine `from_pretrained` of a 90 MB model spends most of its time in such imports;
forked engines then find them in sys.modules.
"""

from __future__ import annotations

import contextlib
import importlib

import torch  # noqa: F401
import transformers
from transformers import AutoModel, AutoModelForSequenceClassification  # noqa: F401

LAZY = [
    "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto",
    "transformers.masking_utils",
    "transformers.modeling_layers",
    "transformers.generation.utils",
]

transformers.utils.logging.disable_progress_bar()

for name in LAZY:
    # A module missing in this transformers version only costs time later.
    with contextlib.suppress(Exception):
        importlib.import_module(name)
