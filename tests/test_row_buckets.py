"""Row buckets pay: a bfloat16 engine's resident memory over many input lengths, measured in fresh
processes, with and without its projections' rows rounded up (engine/precision/rows.py; what the
rounding changes and not: tests/unit/test_rows.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.precision import rows
from engine.runtime.device import cpu_has
from tests.server_process import ROOT

GROWTH = """
import sys
from pathlib import Path
from common.modelfolder import read_model_folder
from common.wire import Tokens
from engine.precision import rows
from engine.runtime.device import place
from engine.runtime.model import PoolingModel
if sys.argv[2] == "unbucketed":
    rows.bucket = lambda *args: 0
engine = PoolingModel(read_model_folder(Path(sys.argv[1])), 2, place("cpu", "bfloat16", []))
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
engine.forward([Tokens([101, 102])])
before = resident()
for n in range(3, 300, 2):
    engine.forward([Tokens([101] * n)])
print(resident() - before)
"""


# memory, not time: beside other workers it runs slower and grows the same (not `alone`)
@pytest.mark.skipif(not cpu_has(torch.bfloat16), reason="bfloat16 needs AVX512-BF16 or AMX on the CPU")
def test_a_bfloat16_engine_holds_less_over_many_lengths_bucketed(model_dir: Path) -> None:
    """all-MiniLM-L6-v2 in bfloat16, one input of each of 149 lengths: the bucketed engine's resident
    memory grows by less than half what the same engine grows by with every length its own shape."""

    def growth(mode: str) -> int:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for name in rows.CACHE_SETTINGS:
            env.pop(name, None)
        done = subprocess.run(
            [sys.executable, "-c", GROWTH, str(model_dir), mode], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return int(done.stdout.split()[-1])

    bucketed, unbucketed = growth("bucketed"), growth("unbucketed")
    assert unbucketed > 2 * bucketed, (bucketed, unbucketed)
