"""Several models in one appliance: their settings, their phases, and how a request finds its model
and its admission permits."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from common.modelfolder import read_model_folder
from common.settings import Settings
from common.startup import StartupState
from server.core.admission import Admission
from server.core.inputs import RequestContext
from server.core.services import ServedModel
from server.http.errors import APIError

MODEL = Path(__file__).parents[2] / "models" / "all-MiniLM-L6-v2"


def test_each_model_gets_its_settings_and_a_share_of_the_engines() -> None:
    """NAME=FOLDER names a model, a bare folder is named after itself; engines and threads are shared out."""
    embed, rerank = Settings(models="embed=/m/a, /m/b", engine_threads=4).per_model()
    assert (embed.model_name, embed.model_path, rerank.model_name, rerank.model_path) == (
        "embed",
        Path("/m/a"),
        "b",
        Path("/m/b"),
    )
    assert embed.engines == rerank.engines == max(1, Settings().engine_count // 2)
    assert embed.engine_threads == rerank.engine_threads == 2


def test_a_model_may_set_its_own_engines_and_dtype() -> None:
    """`;engines=3;dtype=bfloat16` applies to that model alone; another option is refused by name."""
    fast, plain = Settings(models="fast=/m/a;engines=3;dtype=bfloat16,/m/b").per_model()
    assert (fast.engines, fast.dtype, plain.dtype) == (3, "bfloat16", "auto")
    with pytest.raises(ValueError, match="port"):
        Settings(models="a=/m/a;port=1").per_model()


def test_one_model_keeps_its_settings() -> None:
    """Without WARMPOOL_MODELS the one model is served as configured."""
    settings = Settings(engines=3)
    assert settings.per_model() == [settings]


def test_two_models_under_one_name_are_refused() -> None:
    """A name served twice would make requests ambiguous: refused at start."""
    with pytest.raises(ValueError, match="NAME=FOLDER"):
        Settings(models="/a/m,/b/m").per_model()


def several() -> StartupState:
    return StartupState(["embed", "rerank"])


def names(state: StartupState) -> list[str]:
    return [p["name"] for p in state.snapshot()["phases"]]


def test_each_model_has_its_own_phases_between_the_shared_ones() -> None:
    """bind and forkserver are shared; prefetch, engine, warmup and ready are per model, marked with it."""
    state = several()
    assert names(state) == [
        "bind",
        "forkserver",
        *[f"{p}:{m}" for m in ("embed", "rerank") for p in ("prefetch", "engine", "warmup", "compile", "ready")],
        "ready",
    ]
    assert {p.get("model") for p in state.snapshot()["phases"]} == {None, "embed", "rerank"}


def test_a_models_view_writes_its_own_phases_and_the_shared_ones_once() -> None:
    """`engine` through a model's view is `engine:NAME`; a shared phase done by the first model is
    not restarted or re-timed by the second."""
    state = several()
    embed, rerank = state.for_model("embed"), state.for_model("rerank")
    embed.start("engine", engines=1)
    assert state.state("engine:embed") == "running" and state.state("engine:rerank") == "pending"
    embed.start("forkserver")
    embed.done("forkserver", preload=["engine"])
    first = next(p for p in state.snapshot()["phases"] if p["name"] == "forkserver")
    rerank.start("forkserver")
    rerank.done("forkserver", preload=["engine"])
    again = next(p for p in state.snapshot()["phases"] if p["name"] == "forkserver")
    assert (again["state"], again["duration_s"]) == ("done", first["duration_s"])


def test_traffic_flows_for_a_ready_model_while_readiness_waits_for_all() -> None:
    """One model up: accepting, not yet ready; both up: ready."""
    state = several()
    for phase in ("bind", "forkserver", "ready"):
        state.start(phase)
        state.done(phase)
    state.for_model("embed").engine_up = True
    state.set_up("rerank", False)
    assert state.accepting and not state.serving
    state.for_model("rerank").engine_up = True
    assert state.serving


def test_a_failed_model_fails_the_appliance_by_default() -> None:
    """WARMPOOL_ON_MODEL_FAILURE=exit: one model's failure skips every other pending phase."""
    state = several()
    state.for_model("rerank").fail("engine", "broken")
    assert state.failed
    assert state.state("engine:embed") == "skipped"


def test_serve_others_keeps_the_other_model() -> None:
    """serve-others: only the failed model's phases stop; the appliance fails only when every model has."""
    state = StartupState(["embed", "rerank"], tolerate_model_failures=True)
    state.for_model("embed").engine_up = True
    state.for_model("rerank").fail("engine", "broken")
    assert not state.failed and state.state("engine:embed") == "pending"
    assert state.state("ready:rerank") == "skipped" and state.for_model("rerank").failed
    state.for_model("embed").fail("warmup", "broken too")
    assert state.failed


@pytest.fixture(scope="module")
def models() -> dict[str, ServedModel]:
    embedder = read_model_folder(MODEL)
    reranker = dataclasses.replace(embedder, kind="cross-encoder", id2label={0: "score"})
    fake: Any = None  # neither tokenizers nor engines are used by model selection
    return {
        "embed": ServedModel("embed", embedder, fake, fake, Admission(2)),
        "rerank": ServedModel("rerank", reranker, fake, fake, Admission(2)),
    }


def context(models: dict[str, ServedModel]) -> RequestContext:
    ctx = RequestContext(
        models["embed"], models, Settings(), models["embed"].admission, configured=("embed", "rerank", "late")
    )
    ctx.admit(1)
    return ctx


def test_a_route_naming_no_model_goes_to_the_first_of_the_kind_it_needs(models: dict[str, ServedModel]) -> None:
    """/rerank without a model reaches the cross-encoder, /embed the embedder."""
    ctx = context(models)
    ctx.require("/rerank", "cross-encoder", "embedding")
    assert ctx.model_name == "rerank"
    ctx.release()
    ctx = context(models)
    ctx.require("/embed", "embedding")
    assert ctx.model_name == "embed"
    ctx.release()


def test_a_named_model_is_kept_even_for_a_route_it_cannot_serve(models: dict[str, ServedModel]) -> None:
    """model=embed on /classify is a 400 naming its kind, not a silent switch to another model."""
    ctx = context(models)
    ctx.select_model("embed")
    with pytest.raises(APIError) as caught:
        ctx.require("/classify", "classification", "cross-encoder")
    assert caught.value.status == 400 and "'embedding'" in caught.value.message
    ctx.release()


@pytest.mark.parametrize(("name", "status"), [("nope", 404), ("late", 503)])
def test_unknown_and_starting_models(models: dict[str, ServedModel], name: str, status: int) -> None:
    """A name not configured is a 404 naming the served models; a configured one still starting is a 503."""
    ctx = context(models)
    with pytest.raises(APIError) as caught:
        ctx.select_model(name)
    assert caught.value.status == status
    if status == 404:
        assert "'embed', 'rerank', 'late'" in caught.value.message
    ctx.release()


def test_permits_move_to_the_selected_models_pool(models: dict[str, ServedModel]) -> None:
    """Selecting another model moves the permits held to its pool; a full pool there is a 429,
    whatever the first model's pool holds."""
    embed, rerank = models["embed"].admission, models["rerank"].admission
    assert embed is not None and rerank is not None
    ctx = context(models)
    ctx.select_model("rerank")
    assert (embed.used, rerank.used) == (0, 1)
    other = context(models)
    other.select_model("rerank")
    third = context(models)
    with pytest.raises(APIError) as caught:
        third.select_model("rerank")
    assert caught.value.status == 429
    assert (embed.used, rerank.used) == (0, 2)
    for held in (ctx, other, third):
        held.release()
    assert (embed.used, rerank.used) == (0, 0)
