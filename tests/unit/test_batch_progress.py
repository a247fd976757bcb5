"""RunningJob: the running Batch API job's rate counts this run's lines only (a resumed job's earlier
lines are not its rate), and the time left is the lines left at that rate."""

from __future__ import annotations

from server.batches.progress import RunningJob


def test_rate_and_eta_count_this_runs_lines_only() -> None:
    job = RunningJob("batch_1", total=100, done=40, failed=2, started=10.0)  # resumed at line 40
    job.advance(completed=18, failed=2)
    shown = job.as_dict(now=20.0)
    assert (shown["done"], shown["failed"], shown["lines_per_s"]) == (60, 4, 2.0)
    assert shown["eta_s"] == 20.0


def test_no_eta_before_a_line_is_answered() -> None:
    assert RunningJob("batch_1", total=10, done=0, failed=0, started=0.0).as_dict(now=5.0)["eta_s"] is None
