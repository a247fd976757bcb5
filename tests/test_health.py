"""Probes and the phase table of a server that has finished starting."""

from __future__ import annotations

import json

from tests.server_process import ServerProcess


def test_every_phase_has_finished_with_durations(server: ServerProcess) -> None:
    """Every phase is done, with times; compile is skipped with its reason (the test servers'
    WARMPOOL_COMPILE=off: tests/test_compiled_engine.py compiles)."""
    r = server.get("/health/startup")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ready"
    names = [p["name"] for p in body["phases"]]
    assert names == ["bind", "prefetch", "forkserver", "engine", "warmup", "compile", "ready"]
    for phase in body["phases"]:
        assert phase["state"] == ("skipped" if phase["name"] == "compile" else "done"), phase
        assert phase["started_s"] >= 0 and phase["duration_s"] >= 0, phase


def test_the_forkserver_is_spawned_before_the_settings_are_read(server: ServerProcess) -> None:
    """Its torch import (the start's floor) overlaps the HTTP process's own imports: the forkserver
    phase starts before bind, which waits for the settings (pydantic) and the logging (structlog)."""
    phases = {p["name"]: p for p in server.get("/health/startup").json()["phases"]}
    assert phases["forkserver"]["started_s"] < phases["bind"]["started_s"], phases


def test_prefetch_read_the_files_serving_reads(server: ServerProcess, model_dir) -> None:  # type: ignore[no-untyped-def]
    """Prefetch covered (read, or found in the page cache) the config files, the tokenizer and the
    weights, and nothing else of the folder (its README, vocab.txt and data_config.json are never loaded)."""
    detail = server.phase("prefetch")["detail"]["model"]
    names = ["config.json", "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"]
    names += ["1_Pooling/config.json", "tokenizer_config.json", "tokenizer.json", "model.safetensors"]
    total = sum((model_dir / name).stat().st_size for name in names)
    assert detail["files"] == len(names)
    assert detail["bytes_total"] == detail["bytes_done"] == total


def test_engine_was_forked_from_a_preloaded_forkserver(server: ServerProcess) -> None:
    forkserver = server.phase("forkserver")["detail"]
    assert forkserver["method"] == "forkserver"
    # BERT runs natively: no transformers; its weights are built in the forkserver, for all engines
    assert forkserver["preload"] == ["engine.process", "engine.forkserver_preload"]
    engine = server.wait_engines()
    assert engine["preloaded"] is True, "the forkserver did not preload engine.process"
    assert engine["weights"] == "forkserver"
    assert engine["backend"] == "native"
    assert len(engine["pids"]) == engine["engines"] == engine["up"] == 2  # the default on 2 cores
    assert set(engine["pids"]) <= set(server.children()) and engine["pid"] == engine["pids"][0]


def test_probes_answer(server: ServerProcess) -> None:
    assert server.get("/health/live").status_code == 200
    assert server.get("/health/ready").json() == {"status": "ready"}
    assert server.get("/health").status_code == 200


def test_what_the_start_built_is_frozen_out_of_the_collector(server: ServerProcess) -> None:
    """Once ready, the HTTP process's objects from its start are out of the cyclic collector's view
    (gc.freeze), so no full collection rescans them under load, pausing the event loop."""
    lines = [json.loads(line) for line in server.log_path.read_text().splitlines() if line.startswith("{")]
    (ready,) = [line for line in lines if line.get("event") == "ready"]
    assert ready["frozen_objects"] > 10_000, ready
