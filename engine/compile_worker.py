"""The compile worker: builds one model's compiled artifact into the cache, in a process of its own.

`python -m engine.compile_worker FOLDER PRECISION ARTIFACT_DIR`. An engine starts it when the cache
misses and keeps serving eager meanwhile; the worker runs at the lowest CPU priority, so its tens
of seconds of tracing and C++ compiling take only the cycles serving leaves, and it dies with the
engine that started it. Engines of one model start one each: the first takes the artifact's lock
and builds, the others wait on the lock and find the artifact built. The artifact appears whole or
not at all (built beside it, then renamed).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    folder, precision, artifact = Path(argv[0]), argv[1], Path(argv[2])
    os.nice(19)
    # die with the engine that started this: a compile outliving its engine is work nobody waits for
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    artifact.parent.mkdir(parents=True, exist_ok=True)
    with open(artifact.parent / f"{artifact.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if artifact.is_dir():
            return 0  # another engine's worker built it while this one waited
        for stale in artifact.parent.glob(f".{artifact.name}.*"):  # a killed worker's: the lock says none runs
            shutil.rmtree(stale, ignore_errors=True)
        started = time.monotonic()
        scratch = Path(tempfile.mkdtemp(prefix=f".{artifact.name}.", dir=artifact.parent))
        try:
            # inductor's own caches under the scratch folder: gone with it, never grown without end
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(scratch / "inductor")
            build(folder, precision, scratch / "artifact")
            os.rename(scratch / "artifact", artifact)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        print(f"compiled in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


def build(folder: Path, precision: str, out: Path) -> None:
    import torch  # after the environment above: inductor reads it when imported

    from common.modelfolder import read_model_folder
    from common.wire import Tokens
    from engine import compiled, preloaded
    from engine.device import place
    from engine.packed import Packed

    info = read_model_folder(folder)
    model = preloaded.build(info, place("cpu", precision, []))
    token = int(info.config.get("pad_token_id") or 0) + 1
    # three inputs of unequal lengths: no dimension is traced at a size the exporter specialises on
    sample = Packed.of([Tokens([token] * n) for n in (3, 5, 9)])
    torch.set_num_threads(1)
    compiled.build_package(model, sample, out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
