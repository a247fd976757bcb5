"""What a request of long texts may cost before it is refused: the tokenizer holds one text (or one
run of texts) at a time, and a chunked text's windows are counted before any is built. Measured as
the peak memory of a fresh interpreter (the windows' own arithmetic: tests/unit/test_long_input_bounds.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.server_process import ROOT

# Builds a request context on the model, then reports how much the process's peak memory grew while
# `chunking.tokenize` refused the texts (the 400 it raises): measured in a process of its own,
# whose peak is this call's and not an earlier test's.
PEAK = """
import json, random, resource, sys
from pathlib import Path
from common.modelfolder import read_model_folder
from common.settings import Settings
from server.texts import chunking
from server.core.admission import Admission
from server.http.errors import APIError
from server.core.inputs import RequestContext
from server.core.services import ServedModel
from server.tokenizing.tokenizer import TokenizerPool

folder, mode, count, chars = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
pool = TokenizerPool(folder)
model = ServedModel("m", read_model_folder(folder), pool, engine=None)
ctx = RequestContext(model, {"m": model}, Settings(), Admission(10_000))
random.seed(0)
words = ["".join(random.choices("abcdefghijklmnopqrstuvwxyz", k=random.randint(2, 9))) for _ in range(5000)]
texts = [" ".join(random.choices(words, k=chars // 5))[:chars] for _ in range(count)]
chunking.tokenize(["warm up"], ctx, None, mode)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    chunking.tokenize(texts, ctx, None, mode)
    status = 200
except APIError as exc:
    status = exc.status
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(json.dumps({"status": status, "grown_mb": grown, "admitted": ctx.admitted}))
"""


def peak_growth(model_dir: Path, mode: str, count: int, chars: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", PEAK, str(model_dir), mode, str(count), str(chars)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])


def test_three_texts_past_the_window_limit_are_refused_within_a_bounded_peak(model_dir: Path) -> None:
    """Three texts just under the character bound of `chunk` (64 windows x 256 tokens x 32 characters)
    that take ~1,300 windows each: a 400 once the first text's first pieces are counted past what 64
    windows hold (under a MB here), where every window of all three was built as Python lists first
    (~240 MB), or the first text encoded whole (~60 MB)."""
    found = peak_growth(model_dir, "chunk", 3, 524_000)
    assert found["status"] == 400 and found["admitted"] == 3, found
    assert found["grown_mb"] < 30, found


def test_a_body_of_texts_each_too_long_is_refused_within_a_bounded_peak(model_dir: Path) -> None:
    """2 MB of texts of 8,192 characters (~1,600 tokens each, past the model's 256): a 400 after the
    first run of texts is tokenized, where all of them were tokenized first."""
    found = peak_growth(model_dir, "refuse", 256, 8_192)
    assert found["status"] == 400, found
    assert found["grown_mb"] < 60, found
