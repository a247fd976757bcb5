"""The status page in Debian's headless Chromium, against a real server that requires an API key.

The browser sends no key: the page and its polls are open, like the probes. The screenshot of the
updated page is saved under $WARMPOOL_TEST_ARTEFACTS (or the test's tmp path) and its path printed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser import HeadlessChromium
from tests.server_process import ServerProcess, serving, wait_for

API_KEY = "status-page-key"
ROWS = """[...document.querySelectorAll('#timeline .phase')].map((row) => ({
  name: row.dataset.phase, state: row.dataset.state, bars: row.querySelectorAll('.bar').length,
  label: row.querySelector('.name').textContent}))"""
FIGURES = """({refreshes: Number(document.body.dataset.refreshes), marker: window.loadedOnce === true,
  requests: document.getElementById('requests-total').textContent,
  rate_shown: /^[0-9.]+$/.test(document.getElementById('rate').textContent)})"""


@pytest.fixture(scope="module")
def guarded_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("logs") / "status-page.log"
    batches = tmp_path_factory.mktemp("batches")
    # two lines at once: a job's groups (4 x that many lines) commit, and show, one after another
    with serving(model_dir, log, api_key=API_KEY, engines=1, batch_dir=batches, batch_concurrency=2) as proc:
        proc.client.headers["authorization"] = f"Bearer {API_KEY}"
        yield proc


@pytest.fixture(scope="module")
def page(guarded_server: ServerProcess) -> Iterator[HeadlessChromium]:
    """http://host:port/ opened as a person would: no API key, Accept: text/html."""
    browser = HeadlessChromium(f"{guarded_server.url}/")
    try:
        yield browser
    finally:
        browser.close()


def figures(page: HeadlessChromium) -> dict[str, Any]:
    value: dict[str, Any] = page.evaluate(FIGURES)
    return value


def test_every_startup_phase_has_a_bar_with_its_name_and_state(
    guarded_server: ServerProcess, page: HeadlessChromium
) -> None:
    """One row per phase of /health/startup, in its order, each with one bar, its name and its state."""
    expected = [
        {"name": p["name"], "state": p["state"], "bars": 1, "label": p["name"]}
        for p in guarded_server.startup()["phases"]
    ]
    wait_for(lambda: page.evaluate(ROWS) == expected, 30, f"the page to show {expected}")


def test_hovering_a_phase_shows_its_details(page: HeadlessChromium) -> None:
    """The engine phase's details (its pids) appear when the pointer rests on its bar."""
    box = wait_for(
        lambda: page.evaluate(
            "(() => { const r = document.querySelector('.phase[data-phase=engine] .track');"
            " if (!r) return null; const b = r.getBoundingClientRect();"
            " return {x: b.x + b.width / 2, y: b.y + b.height / 2}; })()"
        ),
        30,
        "the engine phase's row",
    )
    tip = "document.querySelector('.phase[data-phase=engine] .tip')"
    assert page.evaluate(f"getComputedStyle({tip}).display") == "none"
    page.hover(box["x"], box["y"])
    shown = f"getComputedStyle({tip}).display === 'block' && {tip}.textContent.includes('pids: [')"
    wait_for(lambda: page.evaluate(shown), 10, "the engine phase's details on hover")


def test_the_page_follows_the_request_counters_without_reloading(
    guarded_server: ServerProcess, page: HeadlessChromium, tmp_path: Path
) -> None:
    """Requests sent after the page loaded show up in its figures by its own refreshes (no reload);
    the updated page is saved as a screenshot."""
    first = wait_for(lambda: (f := figures(page))["refreshes"] >= 1 and f, 30, "a first refresh")
    page.evaluate("window.loadedOnce = true")  # gone if the page reloads
    sent = 4
    for i in range(sent):
        response = guarded_server.post("/v1/embeddings", json={"input": f"status page request {i}"})
        assert response.status_code == 200, response.text
    wanted = str(int(first["requests"]) + sent)
    after = wait_for(
        lambda: (f := figures(page))["requests"] == wanted and f["rate_shown"] and f,
        30,
        f"the page to show {wanted} requests",
    )
    assert after["marker"] and after["refreshes"] > first["refreshes"]

    folder = Path(os.environ.get("WARMPOOL_TEST_ARTEFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    shot = page.screenshot(folder / "status-page.png")
    print(f"status page screenshot: {shot}")
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_a_running_batch_jobs_progress_is_shown(guarded_server: ServerProcess, page: HeadlessChromium) -> None:
    """The batch card shows the running job's lines done of its total, and its id and rate beneath."""
    texts = [[f"t {i} {j}" for j in range(4)] for i in range(480)]
    lines = [
        {"custom_id": f"b{i}", "method": "POST", "url": "/v1/embeddings", "body": {"input": t}}
        for i, t in enumerate(texts)
    ]
    data = "".join(json.dumps(line) + "\n" for line in lines)
    upload = guarded_server.post("/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"}).json()
    body = {"input_file_id": upload["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"}
    batch = guarded_server.post("/v1/batches", json=body).json()
    card = "[document.getElementById('batch').textContent, document.getElementById('batch-rate').textContent]"
    try:
        done, rate = wait_for(
            lambda: (shown := page.evaluate(card))[0] not in ("none", "0 / 480") and shown, 30, "the job on the page"
        )
    finally:
        guarded_server.post(f"/v1/batches/{batch['id']}/cancel")
    assert done.endswith(" / 480") and batch["id"] in rate and "lines/s" in rate
