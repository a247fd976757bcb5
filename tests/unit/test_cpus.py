"""The CPUs an engine sizes its threads by (common/cpus.py): affinity, capped by a cgroup CPU quota."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common.cpus import cgroup_quota, usable_cpus


def cgroup(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({"cpu.max": "250000 100000\n"}, 2.5),
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 0.5),
        ({"cpu,cpuacct/cpu.cfs_quota_us": "300000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, 3.0),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
    ids=["v2", "v2-unlimited", "v1", "v1-joined", "v1-unlimited", "none"],
)
def test_the_quota_is_read_from_cgroup_v2_or_v1(tmp_path: Path, files: dict[str, str], quota: float | None) -> None:
    """cpu.max (v2) or the CFS quota over its period (v1): CPUs' worth of time; None when unlimited."""
    assert cgroup_quota(cgroup(tmp_path, files)) == quota


def test_a_quota_caps_the_affinity_rounded_down_and_never_below_one(tmp_path: Path) -> None:
    """2.5 CPUs of quota on a larger affinity set give 2; half a CPU gives 1; no quota, the affinity."""
    cpus = len(os.sched_getaffinity(0))
    assert usable_cpus(cgroup(tmp_path / "a", {"cpu.max": "250000 100000"})) == min(cpus, 2)
    assert usable_cpus(cgroup(tmp_path / "b", {"cpu.max": "50000 100000"})) == 1
    assert usable_cpus(cgroup(tmp_path / "c", {})) == cpus


def test_engine_threads_default_to_the_usable_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """WARMPOOL_ENGINE_THREADS unset: the usable CPUs, not the host's count; the engines' default
    count follows them too."""
    from common import engine_fields, settings

    monkeypatch.delenv("WARMPOOL_ENGINE_THREADS", raising=False)
    monkeypatch.delenv("WARMPOOL_ENGINES", raising=False)
    monkeypatch.setattr(engine_fields, "usable_cpus", lambda: 1)  # the fields' defaults
    monkeypatch.setattr(settings, "usable_cpus", lambda: 1)  # what is derived from them
    config = settings.Settings(device="cpu")
    assert config.engine_threads == 1 and config.engine_count == 1
