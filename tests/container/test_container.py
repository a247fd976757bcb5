"""The real image under `docker compose up --wait`, driven over HTTP and through the docker SDK.

Needs a Docker engine: it uses a running one, or starts dockerd itself (and stops it after).
Run by `make container-test`, which CI calls; `make test` leaves it out.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

import docker
from tests.server_process import ROOT, ServerProcess, free_port, wait_for

PROJECT = "warmpool-test"
IMAGE = "warmpool:latest"  # what `make image` tags
DRAIN_TIMEOUT = 30


def compose(*args: str, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", "compose", "-p", PROJECT, *args],
        cwd=ROOT,
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def engine() -> Iterator[docker.DockerClient]:
    """A Docker engine: the running one, or a dockerd started here and stopped afterwards."""
    started = None
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException:
        if shutil.which("dockerd") is None:
            raise
        started = subprocess.Popen(["dockerd"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = wait_for(lambda: docker.from_env() if docker.from_env().ping() else None, 60, "dockerd")
    try:
        yield client
    finally:
        client.close()
        if started is not None:
            started.terminate()
            started.wait(timeout=60)


@pytest.fixture(scope="module")
def image(engine: docker.DockerClient) -> str:
    subprocess.run(["make", "image"], cwd=ROOT, check=True, timeout=1800)
    return IMAGE


@pytest.fixture(scope="module")
def stack(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """Bring the compose stack up, bare (an empty models folder, no WARMPOOL_MODEL: the image's
    embedded model); always take it down again."""
    port = free_port()
    empty = tmp_path_factory.mktemp("empty-models")  # nothing mounted: a clean checkout's ./models
    env = {
        **os.environ,
        "WARMPOOL_PUBLISH": f"127.0.0.1:{port}",
        "WARMPOOL_DRAIN_TIMEOUT": str(DRAIN_TIMEOUT),
        "WARMPOOL_MODELS_DIR": str(empty),
    }
    env.pop("WARMPOOL_MODEL", None)
    try:
        started = time.monotonic()
        up = compose("up", "--wait", "--no-build", env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        print(f"compose up --wait: {time.monotonic() - started:.1f}s")
        yield f"http://127.0.0.1:{port}", env
    finally:
        compose("down", "--remove-orphans", "--volumes", "--timeout", "60", env=env)  # the compile cache too


def container(engine: docker.DockerClient) -> docker.models.containers.Container:
    found = engine.containers.list(all=True, filters={"label": f"com.docker.compose.project={PROJECT}"})
    assert len(found) == 1, found
    return found[0]


def test_container_serves_like_the_local_server(
    engine: docker.DockerClient, stack: tuple[str, dict[str, str]], server: ServerProcess
) -> None:
    url, env = stack
    with httpx.Client(base_url=url, timeout=60) as http:
        # ready while compiling (an empty cache volume): the image's compiler builds the engine's artifact
        compiled = wait_for(
            lambda: (
                next(p for p in http.get("/health/startup").json()["phases"] if p["name"] == "compile")["state"]
                in ("done", "skipped")
            ),
            600,
            "the compile phase",
        )
        assert compiled
        startup = http.get("/health/startup").json()
        assert [p["name"] for p in startup["phases"]] == [
            "bind",
            "prefetch",
            "forkserver",
            "engine",
            "warmup",
            "compile",
            "ready",
        ]
        assert {p["state"] for p in startup["phases"]} == {"done"}, startup
        assert http.get("/v1/models").json()["data"][0]["id"] == "all-MiniLM-L6-v2"  # the embedded model
        texts = ["served from a container", "and from a local process"]
        in_container = http.post("/v1/embeddings", json={"input": texts}).json()["data"]
    local = server.post("/v1/embeddings", json={"input": texts}).json()["data"]
    np.testing.assert_allclose(
        [d["embedding"] for d in in_container], [d["embedding"] for d in local], atol=1e-5, rtol=0
    )

    box = container(engine)
    assert box.attrs["State"]["Health"]["Status"] == "healthy"
    assert box.attrs["HostConfig"]["ReadonlyRootfs"] is True
    # The image's own init (tini) is PID 1: signals forwarded, orphans reaped, with or without compose.
    assert box.exec_run(["cat", "/proc/1/comm"]).output.decode().strip() == "tini"
    uid = box.exec_run(["python", "-c", "import os; print(os.getuid())"]).output.decode().strip()
    assert uid == "10001"
    write = box.exec_run(["python", "-c", "open('/opt/probe', 'w')"])
    assert write.exit_code != 0 and b"Read-only file system" in write.output

    started = time.monotonic()
    stop = compose("stop", "--timeout", str(DRAIN_TIMEOUT + 15), env=env)
    took = time.monotonic() - started
    assert stop.returncode == 0, stop.stderr
    box.reload()
    print(f"compose stop (SIGTERM, drain): {took:.1f}s, exit code {box.attrs['State']['ExitCode']}")
    assert box.attrs["State"]["ExitCode"] == 0
    assert took < DRAIN_TIMEOUT
    assert b'"event": "drained"' in box.logs()


def test_container_under_sagemakers_contract(engine: docker.DockerClient, image: str, model_dir: Path) -> None:
    """Run as SageMaker runs it: `docker run IMAGE serve`, the model data mounted at /opt/ml/model,
    port 8080. /ping turns 200, the mounted model (not the embedded one) serves /invocations, and
    the image's health check follows the port."""
    port = free_port()
    box = engine.containers.run(
        image,
        ["serve"],
        detach=True,
        volumes={str(model_dir): {"bind": "/opt/ml/model", "mode": "ro"}},
        ports={"8080/tcp": ("127.0.0.1", port)},
        environment={"WARMPOOL_COMPILE": "off"},
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:

            def pinged() -> bool:
                return http.get("/ping").status_code == 200

            wait_for(pinged, 300, "/ping 200", interval=0.5)
            assert http.get("/v1/models").json()["data"][0]["id"] == "model"  # /opt/ml/model's folder
            r = http.post("/invocations", json={"inputs": ["sagemaker sends this"]})
            assert r.status_code == 200, r.text
            assert len(r.json()) == 1 and len(r.json()[0]) == 384

        def healthy() -> bool:  # the image's HEALTHCHECK finds the port `serve` moved
            box.reload()
            return bool(box.attrs["State"]["Health"]["Status"] == "healthy")

        wait_for(healthy, 60, "the HEALTHCHECK on port 8080", interval=1)
    finally:
        box.remove(force=True)
