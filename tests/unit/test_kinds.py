"""The output-kind registry: every kind a folder can be read as is registered once, and a folder's
kind follows from what it holds."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import get_args

import pytest

from common.m3 import M3Heads
from common.modelfolder import ModelFolder, Output
from server import kinds


def test_every_output_a_folder_can_have_is_registered_once() -> None:
    assert sorted(kinds.KINDS) == sorted(get_args(Output))
    assert all(name == kind.name for name, kind in kinds.KINDS.items())


BASE = ModelFolder(Path("m"), "embedding", "BertModel", 512, 384, 30522)


@pytest.mark.parametrize(
    ("changes", "output"),
    [
        ({}, "dense"),
        ({"m3": M3Heads(Path("sparse_linear.pt"), Path("colbert_linear.pt"))}, "m3"),
        ({"kind": "sparse"}, "sparse"),
        ({"kind": "sparse", "idf": Path("idf.safetensors")}, "inference-free-sparse"),
        ({"kind": "multi-vector"}, "multi-vector"),
        ({"kind": "classification"}, "labels"),
        ({"kind": "cross-encoder"}, "cross-encoder"),
    ],
)
def test_a_folder_output_follows_from_what_it_holds(changes: dict[str, object], output: str) -> None:
    assert dataclasses.replace(BASE, **changes).output == output  # type: ignore[arg-type]
