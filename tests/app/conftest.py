"""The app layer's servers: the real app in this process (tests/app/inprocess.py), one per model
and settings, each shared by the whole run; same names as tests/conftest.py's process servers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.app.inprocess import InProcessServer, serving
from tests.conftest import API_KEY, VERTEX_PREDICT


@pytest.fixture(scope="session")
def server(model_dir: Path) -> Iterator[InProcessServer]:
    """One embedding app shared by every test that only sends requests."""
    with serving(model_dir) as app:
        yield app


@pytest.fixture(scope="session")
def classifier_server(classifier_dir: Path) -> Iterator[InProcessServer]:
    """Keyed, as client libraries meet it behind a gateway."""
    with serving(classifier_dir, api_key=API_KEY, predict_route=VERTEX_PREDICT) as app:
        app.client.headers["authorization"] = f"Bearer {API_KEY}"
        yield app


@pytest.fixture(scope="session")
def cross_encoder_server(
    cross_encoder_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcessServer]:
    """Also an API-key server: the key comes from a file, as from a mounted secret."""
    secrets = tmp_path_factory.mktemp("secrets")
    (secrets / "api-key").write_text(API_KEY + "\n")
    with serving(cross_encoder_dir, api_key_file=secrets / "api-key", predict_route=VERTEX_PREDICT) as app:
        app.client.headers["authorization"] = f"Bearer {API_KEY}"
        yield app
