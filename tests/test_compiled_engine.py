"""Compiled engines in servers, built by the real compile worker (each family's compiled numbers:
test_compiled_forward.py): a server switches to it under load without a wrong or failed answer, loads it
from the cache before its first request on the next start, and with WARMPOOL_COMPILE=required is not
ready until compiled; warmpool.ray's Embedder runs the cached artifact."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["DO_NOT_TRACK"] = "1"

import shutil
import struct
import threading
import zipfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from engine.compiling.artifacts import REASON, write_manifest
from engine.compiling.package import PACKAGE, cache_key
from engine.compiling.worker import PROBES, build
from server.core.outputs import normalize
from tests.server_process import ServerProcess, serving, wait_for
from tests.test_compiled_forward import TEXTS, eager_answers
from tests.tiny_models import TinyFolders
from warmpool.ray import Embedder

pytestmark = pytest.mark.slow

SERVED = {"long_inputs": "truncate", "served_model_name": "m"}  # TEXTS' long one cut; embed()'s model name
# The compile worker and engines at nice 0, not 19 and 5: beside make test's other workers a nice-19
# compile gets almost no CPU (a cold-cache server test took 211 s instead of 33 s).
COMPILE_NICE = 0
COMPILING = {"engines": 2, "compile_nice": COMPILE_NICE, "engine_nice": 0, **SERVED}  # the servers that compile
COMPILE_S = 300  # a tiny model compiles in 15-30 s on 2 cores; the deadline is for a loaded machine


def finished(proc: ServerProcess) -> dict[str, Any] | None:
    """The compile phase once it is done or skipped (every engine compiled, or one eager for good)."""
    phase = proc.phase("compile")
    return phase if phase["state"] in ("done", "skipped") else None


def workers(cache: Path) -> list[int]:
    """Compile workers building into `cache`, by their command lines."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            line = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"engine.compiling.worker" in line and any(str(cache).encode() in part for part in line):
            found.append(int(proc.name))
    return found


def embed(client: httpx.Client, texts: list[str]) -> np.ndarray:
    response = client.post("/v1/embeddings", json={"input": texts, "model": "m"})
    assert response.status_code == 200, response.text
    return np.array([row["embedding"] for row in response.json()["data"]])


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One compile cache for the server tests below, which run in order: cold, then warm."""
    return tmp_path_factory.mktemp("compile-cache")


def test_a_cold_cache_serves_eager_at_once_then_switches_under_load(
    tiny: TinyFolders, cache: Path, tmp_path: Path
) -> None:
    """With an empty cache the server is ready while its engines are still eager and compiling; a
    client sending all along gets every answer right (the engine's own eager answers) across the
    switch; then the compile phase is done with every engine compiled, and the metric says so."""
    folder = tiny["gte"]
    expected = normalize(eager_answers(folder))
    with serving(folder, tmp_path / "cold.log", compile="auto", compile_cache=cache, **COMPILING) as proc:
        phase = proc.phase("compile")
        assert phase["state"] == "running" and {d["mode"] for d in phase["detail"]["engines"].values()} == {"eager"}
        answers, failures, done = [0], [], threading.Event()

        def client() -> None:
            with httpx.Client(base_url=proc.url, timeout=60) as http:
                while not done.is_set():
                    try:
                        got = embed(http, TEXTS)
                        np.testing.assert_allclose(normalize(got), expected, atol=1e-5, rtol=0)
                        answers[0] += 1
                    except Exception as exc:  # counted, then asserted on in the test's thread
                        failures.append(exc)
                    # paced (~20 requests a second, not as fast as one core goes): the switch is
                    # under load all the same, and the compile is not starved by the test's own load
                    done.wait(0.05)

        threads = [threading.Thread(target=client)]  # one: the other core is the compile's
        for thread in threads:
            thread.start()
        try:
            phase = wait_for(lambda: finished(proc), COMPILE_S, "the compile")
        finally:
            done.set()
            for thread in threads:
                thread.join()
        assert not failures, failures[:3]
        assert answers[0] > 0
        assert phase["state"] == "done", phase
        engines = phase["detail"]["engines"]
        assert {d["mode"] for d in engines.values()} == {"compiled"} and len(engines) == 2
        assert {d["cache"] for d in engines.values()} == {"miss"}
        assert 'warmpool_engines_compiled{model="m"} 2.0' in proc.client.get("/metrics").text
        assert list(cache.glob(f"{PROBES}-*/**/*.so")), "the vector-instruction probes not kept in the cache"
        np.testing.assert_allclose(normalize(embed(proc.client, TEXTS)), expected, atol=1e-5, rtol=0)


def test_a_warm_cache_serves_compiled_from_the_first_request(tiny: TinyFolders, cache: Path, tmp_path: Path) -> None:
    """On the next start with the same cache, every engine up when readiness first answers 200 has
    loaded the artifact (a cache hit) and serves compiled: the compile phase is done; so is the
    second engine once it is up."""
    with serving(tiny["gte"], tmp_path / "warm.log", compile="auto", compile_cache=cache, **COMPILING) as proc:
        phase = proc.phase("compile")
        engines = phase["detail"]["engines"]
        assert phase["state"] == "done" and {(d["mode"], d["cache"]) for d in engines.values()} == {("compiled", "hit")}
        embed(proc.client, TEXTS)
        both = wait_for(lambda: len((p := proc.phase("compile"))["detail"]["engines"]) == 2 and p, 60, "engine 1")
        assert both["state"] == "done" and {d["cache"] for d in both["detail"]["engines"].values()} == {"hit"}, both


def test_the_ray_adapter_runs_a_cached_artifact_from_its_first_batch(tiny: TinyFolders, cache: Path) -> None:
    """warmpool.ray's Embedder with compile=auto on the servers' cache: the artifact loaded before its
    first batch (a hit), the eager engine's vectors. The artifact is built here if the cold test did not run."""
    folder = tiny["gte"]
    key = cache_key(folder, "float32")
    if not (cache / key).is_dir():
        build(folder, "float32", cache / key)
    embedder = Embedder(folder, compile="auto", compile_cache=cache)
    detail = embedder.embedder.compile_detail
    assert (detail["mode"], detail["cache"]) == ("compiled", "hit"), detail
    out = embedder({"text": np.asarray(TEXTS)})
    np.testing.assert_allclose(normalize(out["embedding"]), normalize(eager_answers(folder)), atol=1e-5, rtol=0)


def zeroed_copy(cache: Path, folder: Path, into: Path, manifest: bool = False) -> Path:
    """A copy of `folder`'s artifact from `cache` in a cache `into`, the code of its shared object
    (ELF .text, inside the stored zip entry) zeroed in place, its size kept: a torn write or a bad
    block, which the loader maps and crashes on. `manifest`: checksums of the zeroed files (the
    corruption came before the manifest was written). The artifact is built here if the cold
    test did not run."""
    key = cache_key(folder, "float32")
    if not (cache / key).is_dir():
        build(folder, "float32", into.parent / "built" / key)  # its trial run unpacks beside it
        shutil.copytree(into.parent / "built" / key, cache / key)
    artifact = Path(shutil.copytree(cache / key, into / key))
    package = artifact / PACKAGE
    with zipfile.ZipFile(package) as archive:
        so = next(entry for entry in archive.infolist() if entry.filename.endswith(".so"))
    with open(package, "r+b") as file:
        file.seek(so.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", file.read(4))
        start = so.header_offset + 30 + name_len + extra_len
        file.seek(start)
        elf = file.read(so.file_size)
        (shoff,) = struct.unpack_from("<Q", elf, 0x28)  # the ELF64 header's section table
        entry_size, count, names = struct.unpack_from("<HHH", elf, 0x3A)
        sections = [struct.unpack_from("<IIQQQQ", elf, shoff + i * entry_size) for i in range(count)]
        strings = sections[names][4]
        text = next(s for s in sections if elf[strings + s[0] :].startswith(b".text\0"))
        file.seek(start + text[4])
        file.write(bytes(text[5]))
    if manifest:
        write_manifest(artifact)
    return artifact


def test_an_artifact_zeroed_in_place_is_quarantined_and_built_again(
    tiny: TinyFolders, cache: Path, tmp_path: Path
) -> None:
    """A cached artifact whose code was zeroed after it was built (same size) is not a crash: the
    server is ready and serves eager, the artifact is in quarantine/ with the reason (on
    /health/startup too), and the engine is building it again (the switch once built is what a
    cold cache does: test_a_cold_cache_serves_eager_at_once_then_switches_under_load)."""
    folder = tiny["gte"]
    into = tmp_path / "cache"
    zeroed_copy(cache, folder, into)
    with serving(folder, tmp_path / "zeroed.log", compile="auto", compile_cache=into, fail_linger=0, **SERVED) as proc:
        engine = proc.phase("compile")["detail"]["engines"]["0"]
        assert engine["mode"] == "eager" and engine["cache"] == "invalid" and engine["compiling"], engine
        assert "model.pt2 does not match its sha256" in engine["reason"], engine
        aside = into / engine["quarantined"]
        assert (aside / REASON).read_text().strip() == engine["reason"] and (aside / PACKAGE).is_file()
        np.testing.assert_allclose(embed(proc.client, TEXTS), normalize(eager_answers(folder)), atol=1e-5, rtol=0)


def test_an_artifact_that_crashes_the_engine_loading_it_is_quarantined(
    tiny: TinyFolders, cache: Path, tmp_path: Path
) -> None:
    """An artifact that crashes the engine mapping it though its checksums hold (corrupted before
    its manifest was written): the first engine dies, the one started in its place finds the marker
    it left, quarantines the artifact and serves eager, with the reason on /health/startup."""
    folder = tiny["gte"]
    into = tmp_path / "cache"
    zeroed_copy(cache, folder, into, manifest=True)
    with serving(folder, tmp_path / "crash.log", compile="auto", compile_cache=into, fail_linger=0, **SERVED) as proc:
        engine = proc.phase("compile")["detail"]["engines"]["0"]
        assert engine["mode"] == "eager" and engine["cache"] == "invalid", engine
        assert "died while loading or first running it" in engine["reason"], engine
        assert (into / engine["quarantined"] / REASON).is_file()
        assert "-11" in proc.phase("warmup")["detail"]["first_engine_died"]
        np.testing.assert_allclose(embed(proc.client, TEXTS), normalize(eager_answers(folder)), atol=1e-5, rtol=0)


def test_a_corrupt_artifact_leaves_the_engine_eager_with_a_reason(
    tiny: TinyFolders, cache: Path, tmp_path: Path
) -> None:
    """A cached artifact that does not load is not a failed start: the engine serves eager, says why
    (cache "invalid"), and builds the artifact again."""
    for artifact in cache.iterdir():
        if artifact.is_dir():
            (artifact / "model.pt2").write_bytes(b"not a package")
    with serving(
        tiny["gte"], tmp_path / "corrupt.log", compile="auto", compile_cache=cache, engines=1, **SERVED
    ) as proc:
        phase = proc.phase("compile")
        engine = phase["detail"]["engines"]["0"]
        assert phase["state"] == "running" and engine["mode"] == "eager" and engine["cache"] == "invalid", phase
        assert "cannot load the compiled artifact" in engine["reason"] and engine["compiling"], engine
        assert 'warmpool_engines_compiled{model="m"} 0.0' in proc.client.get("/metrics").text
        embed(proc.client, TEXTS)
    # stopped mid-compile: the worker went with its engine
    assert wait_for(lambda: not workers(cache), 10, "the compile worker gone")


def test_compile_required_holds_readiness_until_compiled(tiny: TinyFolders, cache: Path, tmp_path: Path) -> None:
    """WARMPOOL_COMPILE=required on a cache without the model's artifact: readiness is 503 and the
    compile phase running while the worker builds; the server turns ready with its engine compiled,
    answering as the eager engine does."""
    folder = tiny["roberta"]
    # the CPU's vector-instruction probes the cold-cache test kept (the machine's, not the model's):
    # ~8 s of this compile on 2 cores that the cold-cache test already spends on the truly empty cache
    for probes in cache.glob(f"{PROBES}-*"):
        shutil.copytree(probes, tmp_path / "cache" / probes.name)
    proc = ServerProcess(
        folder,
        tmp_path / "required.log",
        compile="required",
        compile_cache=tmp_path / "cache",
        compile_nice=COMPILE_NICE,
        engine_nice=0,
        **SERVED,
    )
    try:
        running = wait_for(lambda: proc.phase("compile")["state"] == "running", 60, "the compile phase running")
        assert running and proc.client.get("/health/ready").status_code == 503
        proc.wait_ready(timeout=COMPILE_S)
        phase = proc.phase("compile")
        assert phase["state"] == "done" and phase["detail"]["engines"]["0"]["mode"] == "compiled", phase
        np.testing.assert_allclose(embed(proc.client, TEXTS), eager_answers(folder), atol=1e-5, rtol=0)
    finally:
        proc.stop()


def test_compile_off_is_the_eager_engine_and_says_so(server: ServerProcess) -> None:
    """WARMPOOL_COMPILE=off (the test servers' setting): no compile, the phase skipped with that reason."""
    phase = server.phase("compile")
    assert phase["state"] == "skipped" and phase["detail"]["reason"] == "WARMPOOL_COMPILE=off", phase
