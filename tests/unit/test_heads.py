"""The engine's output heads (engine/heads/__init__.py): a group's inputs answered per head they name."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from common.wire import Tokens
from engine.heads import HEADS, answer, default_head


class Recorder:
    """Stands in for a PoolingModel: each method answers (its head, the input's ids) per input and
    records the inputs of each call."""

    def __init__(self, default: str = "pooled") -> None:
        self.default_head = default
        self.calls: list[tuple[str, list[list[int]]]] = []

    def _answer(self, head: str, items: list[Tokens]) -> list[Any]:
        self.calls.append((head, [item.input_ids for item in items]))
        return [(head, item.input_ids) for item in items]

    def forward(self, items: list[Tokens]) -> list[Any]:
        return self._answer("pooled", items)

    def forward_tokens(self, items: list[Tokens]) -> list[Any]:
        return self._answer("tokens", items)

    def forward_outputs(self, items: list[Tokens]) -> list[Any]:
        return self._answer("m3", items)


def test_a_group_mixing_heads_runs_each_head_once_and_answers_in_input_order() -> None:
    model = Recorder()
    items = [
        Tokens([1], head="m3", outputs=("sparse",)),
        Tokens([2]),
        Tokens([3], head="tokens"),
        Tokens([4], head="m3", outputs=("dense",)),
        Tokens([5], head="pooled"),
    ]
    out = answer(model, items)  # type: ignore[arg-type]
    assert out == [("m3", [1]), ("pooled", [2]), ("tokens", [3]), ("m3", [4]), ("pooled", [5])]
    assert sorted(model.calls) == [("m3", [[1], [4]]), ("pooled", [[2], [5]]), ("tokens", [[3]])]


def test_inputs_naming_no_head_get_the_models_default() -> None:
    model = Recorder(default="tokens")
    assert answer(model, [Tokens([1]), Tokens([2], head="pooled")]) == [("tokens", [1]), ("pooled", [2])]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "head"),
    [("embedding", "pooled"), ("classification", "pooled"), ("sparse", "pooled"), ("multi-vector", "tokens")],
)
def test_a_models_default_head_follows_its_kind(kind: str, head: str) -> None:
    assert default_head(SimpleNamespace(kind=kind)) == head  # type: ignore[arg-type]
    assert head in HEADS


def test_an_unknown_head_fails_its_group_by_name() -> None:
    with pytest.raises(ValueError, match="no engine head named pooled_tokens"):
        answer(Recorder(), [Tokens([1]), Tokens([2], head="pooled_tokens")])  # type: ignore[arg-type]
