"""The compile worker: builds one model's compiled artifact into the cache, in a process of its own.

`python -m engine.compiling.worker FOLDER PRECISION ARTIFACT_DIR ENGINE_PID NICE`. An engine starts it
when the cache misses and keeps serving eager meanwhile; the worker runs at WARMPOOL_COMPILE_NICE (19
by default, the lowest CPU priority), so its tens of seconds of tracing and C++ compiling take only
the cycles serving leaves, and it dies with the engine that started it. Engines of one model start
one each: the first takes the artifact's lock and builds, the others wait on the lock and find the
artifact built. The artifact appears whole or not at all (built beside it, then renamed), with its
files' checksums (engine/compiling/artifacts.py), and only once this worker has loaded and run it.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1
PROBES = "isa-probes"  # in the cache: the C++ compiler's checks of this CPU's vector instructions


def main(argv: list[str]) -> int:
    folder, precision, artifact, engine, nice = Path(argv[0]), argv[1], Path(argv[2]), int(argv[3]), int(argv[4])
    # WARMPOOL_COMPILE_NICE, never below the engine's own
    os.setpriority(os.PRIO_PROCESS, 0, max(nice, os.getpriority(os.PRIO_PROCESS, 0)))
    # die with the engine that started this: a compile outliving its engine is work nobody waits for
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != engine:  # it died before the line above took effect
        return 1
    root = artifact.parent
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{artifact.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if artifact.is_dir():
            return 0  # another engine's worker built it while this one waited
        clear_scratch(root, artifact.name)
        started = time.monotonic()
        scratch = Path(tempfile.mkdtemp(prefix=f".{artifact.name}.", dir=root))
        try:
            # the C++ compiler's temporary files and inductor's caches under the scratch folder:
            # gone with it, never grown without end, never in a small /tmp
            os.environ["TMPDIR"] = tempfile.tempdir = str(scratch)
            build(folder, precision, scratch / "artifact", cache=root)
            durable(scratch / "artifact")
            os.rename(scratch / "artifact", artifact)
            durable(root)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        print(f"compiled in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


def clear_scratch(root: Path, own: str) -> None:
    """Remove the scratch folders of killed workers: of this artifact (its lock is held here), and
    of any other whose lock nobody holds."""
    for scratch in root.glob(".*.*"):
        key = scratch.name[1:].split(".", 1)[0]
        if key == own:
            shutil.rmtree(scratch, ignore_errors=True)
            continue
        with open(root / f"{key}.lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live worker's
            shutil.rmtree(scratch, ignore_errors=True)


def keep_probes(root: Path, scratch: Path, key: str, probe: Callable[[], object]) -> None:
    """Which vector instructions inductor may use: it compiles and loads a small library per
    instruction set (~7 s of a tiny model's ~21 s compile on a 2-core AMD Zen 4), the same every
    time for one compiler and torch (`key`). So they are kept in the cache, a folder per key:
    probed in the scratch folder and moved in whole, so that a worker killed mid-probe leaves no
    torn library, which inductor would take for an instruction set the CPU lacks. Inductor keeps
    the answers in this process for the build that follows."""
    kept = root / f"{PROBES}-{key}"
    if kept.is_dir():
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(kept)
        probe()
        return
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(scratch / PROBES)
    probe()
    with contextlib.suppress(OSError):  # another model's worker moved its own in first
        os.rename(scratch / PROBES, kept)


def probes_key() -> str:
    """What the probes depend on: the C++ compiler (its version) and torch's version."""
    import torch
    from torch._inductor import cpp_builder

    compiler = cpp_builder.get_compiler_version_info(cpp_builder.get_cpp_compiler())
    return hashlib.sha256(f"{compiler}={torch.__version__}".encode()).hexdigest()[:16]


def probe_vector_isa() -> object:
    from torch._inductor import cpu_vec_isa

    return cpu_vec_isa.pick_vec_isa()


def durable(folder: Path) -> None:
    """fsync a folder's files and the folder itself: an artifact renamed into place is whole even
    after a power cut."""
    for path in [*(p for p in folder.iterdir() if p.is_file()), folder]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def build(folder: Path, precision: str, out: Path, cache: Path | None = None) -> None:
    """Build `folder`'s package into `out` and run it once. In the worker (`cache` given), inductor's
    files go beside `out`, in the scratch folder, but for its probes, kept in the cache."""
    import torch  # after the environment above: inductor reads it when imported

    from common.modelfolder import read_model_folder
    from common.wire import Tokens
    from engine.compiling import package as compiled
    from engine.layers.packed import Packed
    from engine.runtime import preloaded
    from engine.runtime.device import place

    info = read_model_folder(folder)
    model = preloaded.build(info, place("cpu", precision, []))
    if cache is not None:  # after the model is built: a folder that cannot be read costs no probing
        keep_probes(cache, out.parent, probes_key(), probe_vector_isa)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(out.parent / "inductor")
    token = int(info.config.get("pad_token_id") or 0) + 1
    # three inputs of unequal lengths: no dimension is traced at a size the exporter specialises on
    sample = Packed.of([Tokens([token] * n) for n in (3, 5, 9)])
    torch.set_num_threads(1)
    compiled.build_package(model, sample, out)
    # loaded and run once here, before it is published: a package that crashes whoever maps it
    # kills this worker (the engine stays eager, with the exit), never a serving engine
    with torch.inference_mode():
        compiled.CompiledForward(out, model, out.parent / "trial")(sample)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
