"""Checkpoints as the native engine reads them: views on the mapped safetensors files, in shards or in
half precision as exact as sentence-transformers, pages it no longer needs dropped, models built in the
forkserver taken as they are, and pickles refused unless allowed."""

from __future__ import annotations

import multiprocessing
import re
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from common.folderjson import ModelError
from common.modelfolder import read_model_folder
from common.wire import EngineSpec, Msg
from engine.layers.checkpoint import read_checkpoint, read_safetensors, release_unused_pages
from engine.process import run_engine
from engine.runtime import preloaded
from engine.runtime.device import Placement
from engine.runtime.model import PoolingModel
from server.core.outputs import normalize
from server.tokenizing.tokenizer import TokenizerPool
from tests.checkpoints import pickle_only, resave
from tests.tiny_models import TinyFolders

TEXTS = ["", "Hello world, the warm pool model", "naïve café 日本語 🙂", "the warm pool engine keeps models " * 20]
LAYOUTS = {
    "sharded": {"shards": 3},
    "bfloat16": {"dtype": torch.bfloat16},
    "float16-sharded": {"dtype": torch.float16, "shards": 2},
}


def mapped_ranges(path: Path) -> list[tuple[int, int]]:
    """This process's mappings of `path`: (start, end) addresses from /proc/self/maps."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(str(path)):
            start, end = (int(a, 16) for a in line.split()[0].split("-"))
            ranges.append((start, end))
    return ranges


def resident_kb(path: Path) -> int:
    """Kilobytes of `path`'s mappings resident in this process (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):  # a mapping's header: its address range, ..., its file
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", ["bert", "mpnet", "modernbert"])
def test_sharded_and_half_precision_checkpoints_give_sentence_transformers_vectors(
    tiny: TinyFolders, tmp_path: Path, name: str, layout: str
) -> None:
    """A folder whose checkpoint is in shards, in bfloat16, or both in float16, is served natively and
    its float32 vectors are SentenceTransformer's (loading the same folder in float32) within 1e-5."""
    from sentence_transformers import SentenceTransformer

    folder = resave(tiny[name], tmp_path / name, **LAYOUTS[layout])  # type: ignore[arg-type]
    info = read_model_folder(folder)
    assert info.native
    tokens = TokenizerPool(folder).encode_batch(TEXTS, truncate=info.max_model_len)
    got = PoolingModel(info, threads=1).forward(tokens)
    got = normalize(got) if info.normalize else got
    reference = SentenceTransformer(str(folder), device="cpu", model_kwargs={"dtype": torch.float32})
    np.testing.assert_allclose(got, reference.encode(TEXTS), atol=1e-5, rtol=0)


def test_float32_weights_are_views_on_the_mapped_file(tiny: TinyFolders) -> None:
    """Every parameter of a float32 model loaded on the CPU lies inside this process's mapping of its
    model.safetensors, but for the fused QKV projections: nothing else was copied."""
    folder = tiny["mpnet"]
    model = preloaded.build(read_model_folder(folder), Placement(torch.device("cpu"), torch.float32))
    ranges = mapped_ranges(folder / "model.safetensors")
    params = dict(model.named_parameters())
    assert ranges and len(params) > 10
    outside = {name for name, p in params.items() if not any(a <= p.data_ptr() < b for a, b in ranges)}
    assert outside == {name for name in params if ".qkv." in name} != set()


def test_pages_no_weight_lies_on_are_dropped(tmp_path: Path) -> None:
    """Of a mapped checkpoint whose pages were all read, the pages of tensors the model did not keep
    leave this process's resident set; those of the one it kept stay."""
    path = tmp_path / "model.safetensors"
    save_file({"kept": torch.ones(1 << 18), "copied": torch.ones(1 << 18)}, path)  # 1 MiB each
    tensors = read_safetensors(path)
    assert sum(float(t.sum()) for t in tensors.values()) == 2 << 18  # every page touched
    before = resident_kb(path)
    model = nn.Module()
    model.kept = nn.Parameter(tensors["kept"], requires_grad=False)
    released = release_unused_pages(model, tmp_path)
    after = resident_kb(path)
    assert before >= 2048 and 1020 <= after <= 1040 and released >= (1 << 20) - 8192


def test_a_truncated_shard_is_a_model_error_naming_it(tiny: TinyFolders, tmp_path: Path) -> None:
    """A shard cut short fails the load with a ModelError that names the shard."""
    folder = resave(tiny["mpnet"], tmp_path / "mpnet", shards=2)
    shard = folder / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(ModelError, match=re.escape(shard.name)):
        read_checkpoint(folder)


def test_an_engine_takes_the_model_the_forkserver_built(tiny: TinyFolders) -> None:
    """A CPU engine uses the model the forkserver built for its folder and dtype as it is (nothing
    loaded again), and loads one itself for another dtype."""
    folder = tiny["mpnet"]
    preloaded.build_all([(str(folder), "float32", None)])
    try:
        built = preloaded.BUILT[(str(folder), "float32")]
        engine = PoolingModel(read_model_folder(folder), threads=1)
        assert engine.model is built.model and engine.weights["weights"] == "forkserver"
        bf16 = Placement(torch.device("cpu"), torch.bfloat16)
        other = PoolingModel(read_model_folder(folder), threads=1, placement=bf16)
        assert other.model is not built.model and other.weights == {"weights": "engine"}
    finally:
        preloaded.BUILT.clear()


@pytest.mark.parametrize("allowed", [False, True], ids=["refused", "allowed"])
def test_a_pickle_only_folder_fails_the_engine_phase_unless_allowed(
    tiny: TinyFolders, tmp_path: Path, allowed: bool
) -> None:
    """An engine given a folder whose weights are only pytorch_model.bin fails its start with a one-line
    reason naming the file and the setting; with WARMPOOL_ALLOW_BIN_WEIGHTS it loads and warms up."""
    folder = pickle_only(tiny["roberta"], tmp_path / "roberta")
    ours, theirs = multiprocessing.Pipe(duplex=True)
    ours.send((Msg.STOP, None))  # served after READY: run_engine returns
    spec = EngineSpec(folder, 0, 1, 1, 1024, 64, allow_bin_weights=allowed)
    try:
        run_engine(theirs, spec, [0])
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # run_engine ignores SIGINT
    kinds: list[tuple[str, Any]] = []
    while ours.poll(0):
        kinds.append(ours.recv())
    if allowed:
        assert [kind for kind, _ in kinds] == [Msg.LOADED, Msg.READY]
        assert kinds[0][1]["backend"] == "transformers"
    else:
        assert [kind for kind, _ in kinds] == [Msg.FAILED]
        reason = kinds[0][1][0]
        assert "pytorch_model.bin" in reason and "WARMPOOL_ALLOW_BIN_WEIGHTS=on" in reason and "\n" not in reason
