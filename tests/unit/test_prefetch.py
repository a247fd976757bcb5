"""Prefetch reads exactly the files serving reads, in order, and never leaves the volume; before them
the environment (tests/unit/test_prefetch_environment.py); the RAM guard and the off switches apply
to both."""

from __future__ import annotations

import json
import os
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from orchestrator import prefetch, residency
from orchestrator.forkserver import ENGINE
from orchestrator.prefetch import ENVIRONMENT_OFF, OFF, model_files, plan


def folder_with(tmp_path: Path, *names: str) -> Path:
    folder = tmp_path / "model"
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("{}")
    return folder


def test_weights_come_last_and_extras_are_left_out(tmp_path: Path) -> None:
    """Config files, then the tokenizer, then model.safetensors; no ONNX export, second copy of the
    weights or README."""
    folder = folder_with(
        tmp_path,
        "model.safetensors",
        "pytorch_model.bin",
        "onnx/model.onnx",
        "README.md",
        "tokenizer.json",
        "config.json",
    )
    assert [p.name for p in model_files(folder)] == ["config.json", "tokenizer.json", "model.safetensors"]


def test_sentencepiece_model_is_the_tokenizer_read_without_tokenizer_json(tmp_path: Path) -> None:
    """A folder with spiece.model and no tokenizer.json (SigLIP's) reads spiece.model after
    tokenizer_config.json; beside a tokenizer.json, spiece.model is never read."""
    folder = folder_with(tmp_path, "config.json", "tokenizer_config.json", "spiece.model", "model.safetensors")
    assert [p.name for p in model_files(folder)] == [
        "config.json",
        "tokenizer_config.json",
        "spiece.model",
        "model.safetensors",
    ]
    (folder / "tokenizer.json").write_text("{}")
    assert "spiece.model" not in [p.name for p in model_files(folder)]


def test_a_sharded_checkpoint_reads_its_index_then_its_shards(tmp_path: Path) -> None:
    """model.safetensors.index.json names the shards: the index, then each shard once."""
    folder = folder_with(tmp_path, "config.json", "a.safetensors", "b.safetensors", "stale.safetensors")
    weight_map = {"x": "b.safetensors", "y": "a.safetensors", "z": "b.safetensors"}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    names = [p.name for p in model_files(folder)]
    assert names == ["config.json", "model.safetensors.index.json", "a.safetensors", "b.safetensors"]


def test_pytorch_bin_is_read_only_without_safetensors(tmp_path: Path) -> None:
    """pytorch_model.bin is the weights only where no safetensors file exists."""
    folder = folder_with(tmp_path, "config.json", "pytorch_model.bin")
    assert [p.name for p in model_files(folder)] == ["config.json", "pytorch_model.bin"]


def test_module_configs_named_by_modules_json_are_read(tmp_path: Path) -> None:
    """The sentence-transformers modules' own config files are read, after modules.json."""
    folder = folder_with(tmp_path, "config.json", "1_Pooling/config.json", "2_Dense/config.json")
    modules = [{"path": ""}, {"path": "1_Pooling"}, {"path": "2_Dense"}]
    (folder / "modules.json").write_text(json.dumps(modules))
    files = [p.relative_to(folder).as_posix() for p in model_files(folder)]
    assert files == ["config.json", "modules.json", "1_Pooling/config.json", "2_Dense/config.json"]


def test_a_symlink_out_of_the_volume_is_not_followed(tmp_path: Path) -> None:
    """A weight file that links outside the model folder is left alone."""
    folder = folder_with(tmp_path, "config.json")
    (tmp_path / "elsewhere.safetensors").write_text("secret")
    (folder / "model.safetensors").symlink_to(tmp_path / "elsewhere.safetensors")
    assert [p.name for p in model_files(folder)] == ["config.json"]


def test_a_hub_snapshot_follows_its_links_into_the_repos_blobs(tmp_path: Path) -> None:
    """In a Hugging Face cache a snapshot's files link into the repo's blobs/: those are read."""
    repo = tmp_path / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "c0ffee").write_text("{}")
    (repo / "blobs" / "beef").write_text("weights")
    snapshot = repo / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to(repo / "blobs" / "c0ffee")
    (snapshot / "model.safetensors").symlink_to(repo / "blobs" / "beef")
    assert [p.name for p in model_files(snapshot)] == ["config.json", "model.safetensors"]


# The RAM guard and the off switches apply to both groups.

MB = 1_000_000


def sized(name: str, size: int) -> list[tuple[Path, int, int]]:
    return [(Path(name), 0, size)]


def test_the_environment_is_dropped_when_it_would_not_fit_beside_the_model() -> None:
    """Model 50 MB + environment 50 MB against 100 MB available (limit 90 MB): the model is read,
    the environment is skipped and says why."""
    progress = plan(sized("libtorch.so", 50 * MB), sized("model.safetensors", 50 * MB), available=100 * MB)
    assert progress.groups == [progress.model]
    assert "exceed 90% of available memory" in str(progress.environment.skipped)


def test_the_model_is_not_read_when_its_converted_copy_leaves_no_room_for_it() -> None:
    """A 50 MB model that fits in 100 MB available is not read ahead when the engine's build will
    allocate 60 MB beside it (a converted copy): read early, its pages would be evicted before use."""
    progress = plan(None, sized("model.safetensors", 50 * MB), available=100 * MB, reserved=60 * MB)
    assert progress.groups == []
    assert "less the 60000000 B the engine converts the weights into" in str(progress.model.skipped)
    assert plan(None, sized("model.safetensors", 50 * MB), available=100 * MB, reserved=20 * MB).groups


def test_the_environment_alone_is_read_when_the_model_is_too_big() -> None:
    """A model over the limit is skipped (as before); the environment still fits on its own."""
    progress = plan(sized("libtorch.so", 50 * MB), sized("model.safetensors", 95 * MB), available=100 * MB)
    assert progress.groups == [progress.environment]
    assert "model files" in str(progress.model.skipped)


def test_both_fit_and_the_environment_is_read_first() -> None:
    """Under the limit both groups are read, the environment first (the import comes before the load)."""
    progress = plan(sized("libtorch.so", 40 * MB), sized("model.safetensors", 40 * MB), available=100 * MB)
    assert progress.groups == [progress.environment, progress.model]


def test_nothing_read_gives_the_reason_of_each_group() -> None:
    """Both groups over the limit: the phase's reason names both."""
    progress = plan(sized("libtorch.so", 95 * MB), sized("model.safetensors", 95 * MB), available=100 * MB)
    reason = str(progress.skip_reason())
    assert reason.startswith("environment: environment files") and "; model: model files" in reason


def test_the_environment_switch_leaves_the_model_alone() -> None:
    """environment None (WARMPOOL_PREFETCH_ENVIRONMENT=off): only the model is read."""
    progress = plan(None, sized("model.safetensors", 10 * MB), available=None)
    assert progress.groups == [progress.model]
    assert progress.environment.skipped == ENVIRONMENT_OFF


@dataclass
class Run:
    """What one prefetch.start reported: the final detail, or the skip reason."""

    finished: threading.Event = field(default_factory=threading.Event)
    detail: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None
    read: list[str] = field(default_factory=list)

    def done(self, detail: dict[str, Any]) -> None:
        self.detail = detail
        self.finished.set()

    def skip(self, reason: str) -> None:
        self.skipped = reason
        self.finished.set()


def run_prefetch(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    enabled: bool = True,
    environment: bool = True,
    evicted: bool = True,
) -> Run:
    """prefetch.start with one reader over a small model folder and two stand-in environment files,
    none of them in the page cache (unless not `evicted`: just written, all of them are)."""
    folder = folder_with(tmp_path, "config.json", "model.safetensors")
    (folder / "model.safetensors").write_bytes(bytes(3000))
    env = [tmp_path / "env" / "libbase.so", tmp_path / "env" / "libtop.so"]
    for i, path in enumerate(env):
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(bytes(1000 * (i + 1)))
    monkeypatch.setattr(prefetch, "_environment", lambda preload: [(p, 0, p.stat().st_size) for p in env])
    run = Run()
    real_read = prefetch._read_block

    def recording_read(path: Path, offset: int, length: int, buffer: memoryview) -> int:
        run.read.append(path.name)
        return real_read(path, offset, length, buffer)

    monkeypatch.setattr(prefetch, "_read_block", recording_read)
    if evicted:
        monkeypatch.setattr(prefetch, "_cached", lambda path, offset, length: False)
    prefetch.start(folder, [ENGINE], 1, enabled, environment, lambda d: None, run.done, run.skip)
    assert run.finished.wait(30), "prefetch neither finished nor skipped"
    return run


def test_the_phase_detail_reports_the_environment_and_the_model_separately(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each group's files and bytes, and the totals over both."""
    detail = run_prefetch(tmp_path, monkeypatch).detail
    assert detail["environment"] == {"files": 2, "bytes_done": 3000, "bytes_total": 3000, "bytes_cached": 0}
    assert detail["model"] == {"files": 2, "bytes_done": 3002, "bytes_total": 3002, "bytes_cached": 0}
    assert (detail["files"], detail["bytes_done"], detail["bytes_total"]) == (4, 6002, 6002)


def test_what_is_in_the_page_cache_already_is_not_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files still in the page cache (just written) are counted done and cached, and never read."""
    run = run_prefetch(tmp_path, monkeypatch, evicted=False)
    assert run.read == []
    assert run.detail["bytes_cached"] == run.detail["bytes_done"] == run.detail["bytes_total"] == 6002
    assert run.detail["model"]["bytes_cached"] == 3002 and run.detail["mb_per_s"] == 0


def test_pages_evicted_from_the_page_cache_are_not_resident(model_dir: Path) -> None:
    """A file's pages dropped from the page cache read as not resident; after reading it, resident.
    (Beside the model, on a disk: a tmpfs keeps its pages whatever one advises.)"""
    with tempfile.TemporaryDirectory(dir=model_dir.parent) as folder:
        path = Path(folder) / "weights"
        path.write_bytes(bytes(1 << 20))
        _evicted_then_read(path)


def _evicted_then_read(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert not residency.all_resident(fd, 4096, 100_000)
        os.pread(fd, 1 << 20, 0)
        assert residency.all_resident(fd, 4096, 100_000)
    finally:
        os.close(fd)


def test_mincore_is_not_trusted_for_someone_elses_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """For a file another user owns, without CAP_FOWNER (mincore then answers "all resident" whatever
    the truth), the block counts as not cached: it is read."""
    path = tmp_path / "weights"
    path.write_bytes(bytes(8192))
    monkeypatch.setattr(residency.os, "geteuid", lambda: os.stat(path).st_uid + 1)
    monkeypatch.setattr(residency, "_has_cap_fowner", lambda: False)  # root that dropped its capabilities
    fd = os.open(path, os.O_RDONLY)
    try:
        assert not residency.trustworthy(fd) and not residency.all_resident(fd, 0, 8192)
    finally:
        os.close(fd)


def test_the_environment_is_read_before_the_model_in_listed_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one reader: the environment's files as listed, then the model's config, then weights."""
    run = run_prefetch(tmp_path, monkeypatch)
    assert run.read == ["libbase.so", "libtop.so", "config.json", "model.safetensors"]


def test_the_environment_switch_off_reads_only_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """WARMPOOL_PREFETCH_ENVIRONMENT=off: the model's files are read, the environment says why not."""
    run = run_prefetch(tmp_path, monkeypatch, environment=False)
    assert run.read == ["config.json", "model.safetensors"]
    assert run.detail["environment"] == {"skipped": ENVIRONMENT_OFF}


def test_prefetch_off_reads_nothing_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """WARMPOOL_PREFETCH=off switches off both groups: the phase is skipped, nothing is read."""
    run = run_prefetch(tmp_path, monkeypatch, enabled=False)
    assert (run.skipped, run.read) == (OFF, [])


def test_the_ram_guard_applies_to_the_environment_in_a_real_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With memory for the model (3 kB) but not for the environment beside it, only the model is read."""
    monkeypatch.setattr(prefetch, "available_bytes", lambda: 5000)
    run = run_prefetch(tmp_path, monkeypatch)
    assert run.read == ["config.json", "model.safetensors"]
    assert "exceed 90% of available memory" in run.detail["environment"]["skipped"]


def test_a_fast_volume_leaves_the_rest_to_the_loader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the model's first PROBE_BYTES came at FAST_MB_S or more, the prefetch reads no more of
    the model and says why; at a slower pace it reads everything."""
    monkeypatch.setattr(prefetch, "PROBE_BYTES", 1000)
    monkeypatch.setattr(prefetch, "BLOCK", 1000)
    monkeypatch.setattr(prefetch, "FAST_MB_S", 0.0)  # any pace is fast
    fast = run_prefetch(tmp_path / "fast", monkeypatch, environment=False)
    assert fast.read == ["config.json", "model.safetensors"]  # 2 bytes, then the first 1000 of 3000
    assert fast.detail["model"]["bytes_done"] == 1002
    assert "the loader's own reads keep up" in fast.detail["model"]["stopped"]
    monkeypatch.setattr(prefetch, "FAST_MB_S", float("inf"))
    slow = run_prefetch(tmp_path / "slow", monkeypatch, environment=False)
    assert slow.detail["model"]["bytes_done"] == 3002 and "stopped" not in slow.detail["model"]


def resident_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_reading_leaves_no_memory_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight readers reading a 128 MiB checkpoint (sparse: no disk read), five times over as five loads
    would: this process's memory after is within a few MiB of before (with a bytes object per
    block, glibc kept ~16 MiB in each reader's arena)."""
    folder = folder_with(tmp_path, "config.json")
    with open(folder / "model.safetensors", "wb") as weights:
        weights.truncate(8 * prefetch.BLOCK)
    monkeypatch.setattr(prefetch, "_cached", lambda path, offset, length: False)
    before = resident_mb()
    for _ in range(5):
        run = Run()
        prefetch.start(folder, [], 8, True, False, lambda d: None, run.done, run.skip)
        assert run.finished.wait(30), "prefetch neither finished nor skipped"
        assert run.detail["model"]["bytes_done"] >= 8 * prefetch.BLOCK, run.skipped or run.detail
    grown = resident_mb() - before
    assert grown < 24, f"{grown:.0f} MiB more resident after five prefetches"
