"""LoRA adapters over HTTP (WARMPOOL_ADAPTERS): a request names an adapter in its `model` field and
gets sentence-transformers + PEFT's vectors on every embedding surface; /v1/models lists each with
its base as `parent`; an unknown name is each surface's 404; an adapter the engine cannot compute
exactly fails the start with its reason."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.app.inprocess import InProcessServer, serving
from tests.lora_adapters import build_adapter, reference
from tests.tiny_models import TinyFolders

TEXTS = ["the warm pool model", "Hello world, the engine", "naïve café"]


@pytest.fixture(scope="module")
def adapters(tiny: TinyFolders, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        "legal": build_adapter(root / "legal", tiny["xlm-roberta"], seed=1),
        "medical": build_adapter(root / "medical", tiny["xlm-roberta"], seed=2, use_rslora=True),
    }


@pytest.fixture(scope="module")
def app(tiny: TinyFolders, adapters: dict[str, Path]) -> Iterator[InProcessServer]:
    listed = ",".join(f"{name}={folder}" for name, folder in adapters.items())
    with serving(tiny["xlm-roberta"], served_model_name="base", adapters=listed) as served:
        yield served


@pytest.mark.parametrize("name", ["legal", "medical"])
def test_openai_embeddings_of_an_adapter_are_peft_s(
    app: InProcessServer, tiny: TinyFolders, adapters: dict[str, Path], name: str
) -> None:
    r = app.post("/v1/embeddings", json={"model": name, "input": TEXTS})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == name
    got = [item["embedding"] for item in r.json()["data"]]
    np.testing.assert_allclose(got, reference(tiny["xlm-roberta"], adapters[name], TEXTS), atol=1e-5, rtol=0)


def test_cohere_embed_of_an_adapter_is_peft_s(
    app: InProcessServer, tiny: TinyFolders, adapters: dict[str, Path]
) -> None:
    body = {"model": "legal", "texts": TEXTS, "input_type": "search_document", "embedding_types": ["float"]}
    r = app.post("/v2/embed", json=body)
    assert r.status_code == 200, r.text
    got = r.json()["embeddings"]["float"]
    np.testing.assert_allclose(got, reference(tiny["xlm-roberta"], adapters["legal"], TEXTS), atol=1e-5, rtol=0)


def test_the_base_still_answers_its_own_vectors(app: InProcessServer, tiny: TinyFolders) -> None:
    from sentence_transformers import SentenceTransformer

    r = app.post("/v1/embeddings", json={"model": "base", "input": TEXTS})
    assert r.status_code == 200, r.text
    expected = SentenceTransformer(str(tiny["xlm-roberta"]), device="cpu").encode(TEXTS)
    np.testing.assert_allclose([item["embedding"] for item in r.json()["data"]], expected, atol=1e-5, rtol=0)


def test_models_lists_each_adapter_with_its_base_as_parent(app: InProcessServer, adapters: dict[str, Path]) -> None:
    cards = {card["id"]: card for card in app.get("/v1/models").json()["data"]}
    assert set(cards) == {"base", "legal", "medical"}
    assert "parent" not in cards["base"]
    for name, folder in adapters.items():
        assert cards[name]["parent"] == "base" and cards[name]["root"] == str(folder)
        assert cards[name]["dimensions"] == cards["base"]["dimensions"]


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/embeddings", {"model": "tax", "input": "x"}, lambda r: r["error"]["message"]),
        ("/v2/embed", {"model": "tax", "texts": ["x"], "input_type": "search_query"}, lambda r: r["message"]),
    ],
)
def test_an_unknown_adapter_is_a_404_in_the_surface_s_shape(
    app: InProcessServer, path: str, body: dict, message
) -> None:  # type: ignore[no-untyped-def]
    r = app.post(path, json=body)
    assert r.status_code == 404, r.text
    assert "model 'tax' does not exist; this server serves 'base' and the adapters 'legal', 'medical'" in message(
        r.json()
    )


def test_an_adapter_using_dora_fails_the_start_naming_it(tiny: TinyFolders, tmp_path: Path) -> None:
    adapter = build_adapter(tmp_path / "dora", tiny["xlm-roberta"], seed=3)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    with (
        pytest.raises(RuntimeError, match=r"adapter 'dora'.*use_dora=True"),
        serving(tiny["xlm-roberta"], adapters=f"dora={adapter}"),
    ):
        pass


def test_scores_with_an_adapter_are_the_cosines_of_its_vectors(
    app: InProcessServer, tiny: TinyFolders, adapters: dict[str, Path]
) -> None:
    """/score on an embedder: the pairs' vectors come from the adapter the request names."""
    r = app.post("/score", json={"model": "medical", "text_1": TEXTS[0], "text_2": TEXTS[1:]})
    assert r.status_code == 200, r.text
    vectors = reference(tiny["xlm-roberta"], adapters["medical"], TEXTS)  # normalised by the folder's Normalize
    np.testing.assert_allclose([d["score"] for d in r.json()["data"]], vectors[1:] @ vectors[0], atol=1e-5)


def test_models_says_an_adapter_every_engine_refused_is_unavailable(
    tiny: TinyFolders, adapters: dict[str, Path]
) -> None:
    """An adapter the engine refused (its folder gone before it was re-forked) is listed with how many
    engines refused it, and as unavailable once every engine has; the base as before."""
    with serving(tiny["xlm-roberta"], served_model_name="base", adapters=f"legal={adapters['legal']}") as served:
        served.services.models["base"].engine.adapters.refused_by(0, "legal")  # what its NO_ADAPTER records
        cards = {card["id"]: card for card in served.get("/v1/models").json()["data"]}
    assert (cards["legal"]["engines_refused"], cards["legal"]["state"]) == (1, "unavailable")
    assert "engines_refused" not in cards["base"] and cards["base"]["state"] == "ready"
