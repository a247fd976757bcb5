"""The compile cache's keys and an engine's way to its compiled forward when the artifact is bad or
the compile does not finish: the engine stays eager and says why (no compile runs to completion here;
tests/test_compiled_engine.py builds real ones)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from common.modelfolder import read_model_folder
from engine.compiling import artifacts, worker
from engine.compiling import package as compiled
from engine.compiling.compilation import UNPACKED, Compilation
from engine.compiling.package import CompiledForward, CompileError, cache_key
from engine.runtime.model import PoolingModel
from tests.checkpoints import linked_copy


@pytest.fixture
def folder(model_dir: Path, tmp_path: Path) -> Path:
    """A copy of the default model's folder (its files' times kept), to change files of. Its 90 MB of
    weights are a hard link where the file system allows (no test writes them; one removes them)."""
    return linked_copy(model_dir, tmp_path / "model")


def test_the_same_model_and_precision_give_the_same_key(folder: Path) -> None:
    """The key is a pure function of what it covers: asked twice, one key."""
    assert cache_key(folder, "float32") == cache_key(folder, "float32")


def test_another_precision_misses(folder: Path) -> None:
    """A bfloat16 engine does not load a float32 artifact."""
    assert cache_key(folder, "float32") != cache_key(folder, "bfloat16")


def test_a_changed_model_misses(folder: Path) -> None:
    """A model's files are part of the key: one changed file (its size and time) misses."""
    before = cache_key(folder, "float32")
    config = folder / "config.json"
    config.write_text(config.read_text() + " ")
    assert cache_key(folder, "float32") != before


def test_another_torch_or_cpu_misses(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An artifact is machine code for one torch and one instruction set: either changed misses."""
    before = cache_key(folder, "float32")
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    newer_torch = cache_key(folder, "float32")
    monkeypatch.undo()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "an ISA no CPU has")
    assert len({before, newer_torch, cache_key(folder, "float32")}) == 3


def test_the_engines_own_code_is_part_of_the_key(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph is traced from the engine's modules: another version of them misses."""
    before = cache_key(folder, "float32")
    changed = tmp_path / "layers.py"
    changed.write_text(compiled.SOURCES[0].read_text() + "\n# changed\n")
    monkeypatch.setattr(compiled, "SOURCES", [changed, *compiled.SOURCES[1:]])
    assert cache_key(folder, "float32") != before


def corrupt_artifact(root: Path) -> Path:
    """A package its reader refuses, under a manifest that matches it (written corrupt)."""
    root.mkdir(parents=True)
    (root / compiled.PACKAGE).write_bytes(b"PK\x03\x04 not a package")
    torch.save({}, root / compiled.CONSTANTS)
    artifacts.write_manifest(root)
    return root


def test_a_corrupt_package_is_a_compile_error_naming_it(tmp_path: Path, model_dir: Path) -> None:
    """A torn or foreign model.pt2 raises CompileError with the folder in its message, never a crash."""
    model = PoolingModel(read_model_folder(model_dir), threads=1)
    artifact = corrupt_artifact(tmp_path / "artifact")
    with pytest.raises(CompileError, match=r"cannot load the compiled artifact in .*artifact"):
        CompiledForward(artifact, model.model, tmp_path / "unpacked")


def test_a_corrupt_cached_artifact_leaves_the_engine_eager_and_is_built_again(tmp_path: Path, model_dir: Path) -> None:
    """A cache hit that does not load: the engine eager, the reason in its detail (cache "invalid"),
    the artifact removed and a worker started to build it again; stopped, the worker is gone."""
    model = PoolingModel(read_model_folder(model_dir), threads=1)
    artifact = corrupt_artifact(tmp_path / cache_key(model_dir, "float32"))
    compilation = Compilation(model, tmp_path, 60)
    compilation.start()
    assert model.compiled is None and compilation.detail["mode"] == "eager"
    assert compilation.detail["cache"] == "invalid" and compilation.detail["compiling"]
    assert "cannot load the compiled artifact" in compilation.detail["reason"]
    assert not artifact.exists() and compilation.worker is not None
    aside = tmp_path / compilation.detail["quarantined"]
    assert (aside / compiled.PACKAGE).is_file() and "cannot load" in (aside / artifacts.REASON).read_text()
    compilation.stop()
    assert compilation.worker.returncode is not None


def test_a_checksum_finds_bytes_zeroed_in_place(tmp_path: Path) -> None:
    """A file of the artifact changed after its manifest (zeroed in place, its size kept: a torn
    write, a bad block) fails verification, naming the file; the intact artifact passes."""
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    (artifact / compiled.PACKAGE).write_bytes(bytes(range(256)) * 64)
    (artifact / compiled.CONSTANTS).write_bytes(b"constants")
    artifacts.write_manifest(artifact)
    artifacts.verify(artifact)
    with open(artifact / compiled.PACKAGE, "r+b") as package:
        package.seek(4096)
        package.write(bytes(4096))
    assert (artifact / compiled.PACKAGE).stat().st_size == 256 * 64
    with pytest.raises(artifacts.CorruptArtifact, match=r"model\.pt2 does not match its sha256"):
        artifacts.verify(artifact)


def test_a_cached_artifact_changed_since_its_manifest_is_never_mapped(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache hit whose package was zeroed in place after it was built is refused by its checksum
    before the loader maps it (mapping torn machine code is a crash): quarantined with that reason."""
    model = PoolingModel(read_model_folder(model_dir), threads=1)
    artifact = corrupt_artifact(tmp_path / cache_key(model_dir, "float32"))
    size = (artifact / compiled.PACKAGE).stat().st_size
    (artifact / compiled.PACKAGE).write_bytes(bytes(size))

    def mapped(*args: object) -> None:
        raise AssertionError("the package was mapped")

    monkeypatch.setattr(torch._C._aoti, "AOTIModelPackageLoader", mapped)
    compilation = Compilation(model, tmp_path, 60)
    compilation.start()
    compilation.stop()
    assert model.compiled is None and compilation.detail["cache"] == "invalid"
    assert "model.pt2 does not match its sha256" in compilation.detail["reason"], compilation.detail
    assert (tmp_path / compilation.detail["quarantined"] / compiled.PACKAGE).stat().st_size == size


def test_an_artifact_without_a_manifest_fails_verification(tmp_path: Path) -> None:
    """No manifest (an artifact torn before it was written, or from before checksums): not loaded."""
    (tmp_path / compiled.PACKAGE).write_bytes(b"code")
    with pytest.raises(artifacts.CorruptArtifact, match=r"no manifest\.json"):
        artifacts.verify(tmp_path)


def test_a_marker_left_by_a_dead_engine_is_found_and_a_live_ones_is_not(tmp_path: Path) -> None:
    """An engine that dies while loading an artifact leaves its marker unlocked: found (its pid)
    and removed; a marker held by a live engine (this process, loading now) is not."""
    child = os.fork()
    if child == 0:  # an engine that crashes while loading
        with artifacts.loading(tmp_path, "key"):
            os._exit(0)
    os.waitpid(child, 0)
    with artifacts.loading(tmp_path, "key"):
        assert artifacts.crashed_loading(tmp_path, "key") == [child]
        assert artifacts.crashed_loading(tmp_path, "key") == []
    assert not list((tmp_path / artifacts.LOADING).iterdir())


def test_an_artifact_that_crashed_an_engine_is_quarantined_unloaded(tmp_path: Path, model_dir: Path) -> None:
    """A cached artifact whose marker a dead engine left: not loaded (never mapped again), moved
    into quarantine/ with the reason, the engine eager and building it again."""
    model = PoolingModel(read_model_folder(model_dir), threads=1)
    key = cache_key(model_dir, "float32")
    corrupt_artifact(tmp_path / key)
    (tmp_path / artifacts.LOADING).mkdir()
    (tmp_path / artifacts.LOADING / f"{key}.1234").touch()
    compilation = Compilation(model, tmp_path, 60)
    compilation.start()
    compilation.stop()
    detail = compilation.detail
    assert model.compiled is None and detail["mode"] == "eager" and detail["cache"] == "invalid", detail
    assert detail["reason"] == "an engine (pid 1234) died while loading or first running it"
    assert (tmp_path / detail["quarantined"] / artifacts.REASON).read_text().strip() == detail["reason"]
    assert not (tmp_path / key).exists() and compilation.worker is not None


def test_quarantine_keeps_the_newest_few(tmp_path: Path) -> None:
    """Quarantined artifacts are evidence, bounded: the oldest go past QUARANTINE_KEEP."""
    for n in range(artifacts.QUARANTINE_KEEP + 2):
        (tmp_path / f"a{n}").mkdir()
        aside = artifacts.quarantine(tmp_path / f"a{n}", f"reason {n}")
        assert aside is not None
        os.utime(tmp_path / aside, (n, n))  # in order, whatever the clock's resolution
    kept = sorted((p / artifacts.REASON).read_text().strip() for p in (tmp_path / artifacts.QUARANTINE).iterdir())
    assert kept == [f"reason {n}" for n in range(2, artifacts.QUARANTINE_KEEP + 2)]


def test_a_compile_past_its_deadline_is_killed_and_the_engine_stays_eager(tmp_path: Path, model_dir: Path) -> None:
    """The worker is killed at the first look past WARMPOOL_COMPILE_TIMEOUT: no artifact."""
    model = PoolingModel(read_model_folder(model_dir), threads=1)
    compilation = Compilation(model, tmp_path, 0.0)
    compilation.start()
    worker = compilation.worker
    assert worker is not None and compilation.pending
    assert compilation.poll() is True
    assert worker.returncode is not None and worker.returncode < 0  # killed, not finished
    assert "WARMPOOL_COMPILE_TIMEOUT" in compilation.detail["reason"] and model.compiled is None
    assert compilation.artifact is not None and not compilation.artifact.exists()


def test_the_worker_is_a_process_group_of_its_own_in_the_engines_session(tmp_path: Path, model_dir: Path) -> None:
    """Killing the worker's group kills its compilers; its niceness holds because it shares the
    engine's session (a session of its own is an autogroup of its own, which nice does not reach)."""
    model = PoolingModel(read_model_folder(model_dir), threads=1)
    compilation = Compilation(model, tmp_path, 60.0)
    compilation.start()
    worker = compilation.worker
    assert worker is not None
    try:
        assert os.getpgid(worker.pid) == worker.pid != os.getpgid(0)
        assert os.getsid(worker.pid) == os.getsid(0)
        deadline = time.monotonic() + 30
        while os.getpriority(os.PRIO_PROCESS, worker.pid) != 19 and time.monotonic() < deadline:
            time.sleep(0.01)  # until the worker has set its own niceness (its first statement)
        assert os.getpriority(os.PRIO_PROCESS, worker.pid) == 19
    finally:
        compilation.stop()
    assert worker.returncode is not None and worker.returncode < 0


def test_an_unwritable_cache_leaves_the_engine_eager(tmp_path: Path, model_dir: Path) -> None:
    """A cache folder that cannot be made (here: under a file) is a reason, not a failed start."""
    model = PoolingModel(read_model_folder(model_dir), threads=1)
    (tmp_path / "file").write_text("")
    compilation = Compilation(model, tmp_path / "file" / "cache", 60)
    compilation.start()
    assert not compilation.pending and model.compiled is None and compilation.detail["mode"] == "eager"
    assert compilation.detail["reason"].startswith(("NotADirectoryError", "FileExistsError")), compilation.detail


def test_a_failed_compile_says_why(tmp_path: Path, folder: Path) -> None:
    """A worker that fails (here: the weights gone once the engine had loaded them) leaves the engine
    eager with the worker's last line of output as the reason."""
    model = PoolingModel(read_model_folder(folder), threads=1)
    os.remove(folder / "model.safetensors")
    compilation = Compilation(model, tmp_path / "cache", 120)
    compilation.start()
    compilation.wait()
    assert model.compiled is None and compilation.detail["mode"] == "eager"
    assert compilation.detail["reason"].startswith("the compile worker exited with 1: "), compilation.detail
    assert compilation.detail["reason"] != "the compile worker exited with 1: no output"


def test_what_a_killed_engine_unpacked_is_removed_and_a_live_ones_kept(tmp_path: Path, model_dir: Path) -> None:
    """An engine's loaded package lives unpacked under the cache's .unpacked/PID (not /tmp, which
    containers mount noexec); a later engine removes the folders of pids no process has."""
    model = PoolingModel(read_model_folder(model_dir), threads=1)
    dead = subprocess.Popen(["true"])
    dead.wait()
    for pid in (dead.pid, os.getpid()):
        (tmp_path / UNPACKED / str(pid) / "aotinductor_x").mkdir(parents=True)
    compilation = Compilation(model, tmp_path, 60)
    compilation.start()
    compilation.stop()  # the cache missed: a worker was started
    assert not (tmp_path / UNPACKED / str(dead.pid)).exists()
    assert (tmp_path / UNPACKED / str(os.getpid()) / "aotinductor_x").is_dir()


def probe_into_cache_dir(runs: list[str], fail: bool = False) -> Callable[[], None]:
    """A stand-in for inductor's probes: writes a library into TORCHINDUCTOR_CACHE_DIR (or dies there)."""

    def probe() -> None:
        where = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        runs.append(str(where))
        where.mkdir(parents=True, exist_ok=True)
        (where / "avx512.so").write_bytes(b"half a libr")
        if fail:
            raise KeyboardInterrupt  # killed mid-probe
        (where / "avx512.so").write_bytes(b"a library")

    return probe


def test_the_vector_isa_probes_are_kept_in_the_cache_and_read_there_next_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first build probes in its scratch folder and moves the probes into the cache whole; the
    next build (another model, same compiler and torch) probes against the kept ones."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "unset")
    runs: list[str] = []
    worker.keep_probes(tmp_path, tmp_path / ".a.1", "k1", probe_into_cache_dir(runs))
    kept = tmp_path / f"{worker.PROBES}-k1"
    assert runs == [str(tmp_path / ".a.1" / worker.PROBES)]
    assert (kept / "avx512.so").read_bytes() == b"a library"
    worker.keep_probes(tmp_path, tmp_path / ".b.1", "k1", probe_into_cache_dir(runs))
    assert runs[1] == str(kept) and not (tmp_path / ".b.1").exists()
    worker.keep_probes(tmp_path, tmp_path / ".c.1", "k2", probe_into_cache_dir(runs))  # another compiler
    assert runs[2] == str(tmp_path / ".c.1" / worker.PROBES) and (tmp_path / f"{worker.PROBES}-k2").is_dir()


def test_probes_cut_short_are_never_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker killed mid-probe leaves its torn library in its scratch folder (removed by the next
    build), never in the cache where the next build would take it for a missing instruction set."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "unset")
    with pytest.raises(KeyboardInterrupt):
        worker.keep_probes(tmp_path, tmp_path / ".a.1", "k1", probe_into_cache_dir([], fail=True))
    assert not (tmp_path / f"{worker.PROBES}-k1").exists()


def test_the_probes_are_kept_per_torch_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked twice, one key; another torch (its probes' code and flags) another."""
    before = worker.probes_key()
    assert worker.probes_key() == before
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert worker.probes_key() != before
