from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server_process import DEFAULT_SETTINGS, ROOT, ServerProcess, serving
from tests.tiny_models import TinyFolders

# Process tests are about engines, processes and signals: their servers run with the result cache
# off, or their repeated texts (a stall, a flood, a kill under load) would be answered from it and
# never reach an engine. The cache is tested in the app layer (tests/app/test_result_cache*.py).
DEFAULT_SETTINGS.setdefault("cache_bytes", "0")
# Their compile cache (the engines' GEMM backend records) is this test process's own, not the user's.
_COMPILE_CACHE = tempfile.mkdtemp(prefix="warmpool-tests-cache-")
atexit.register(shutil.rmtree, _COMPILE_CACHE, True)
DEFAULT_SETTINGS.setdefault("compile_cache", _COMPILE_CACHE)

os.environ.update({"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1"})
# make test's two workers share two cores: an OpenMP thread that spins after each parallel region
# (libgomp's default) takes a core from the other worker, or from its own sibling thread still
# computing. Read by libgomp when torch first loads it, which is after this (here and in every process
# the tests start). The policy decides what an idle thread does, never how work is split: a 2-thread
# engine's products, and so their bits, are the same (tests/unit/test_batch_invariance.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
MODEL_DIR = ROOT / "models" / "all-MiniLM-L6-v2"
IN_PROCESS = tuple(Path(__file__).parent / layer for layer in ("unit", "app", "real_checkpoints"))


# The longest files (make test's --durations), sent first to the parallel workers so they end together.
# test_compiled_forward.py (~150 s) is one unit too, though its tests share no fixture: a process's
# first compile pays ~20 s for inductor's vector-instruction probes and precompiled headers.
LONGEST = (
    "tests/test_compiled_forward.py",
    "tests/test_compiled_engine.py",
    "tests/test_lifecycle.py",
    "tests/test_on_demand.py",
    # and the in-process layers' longest, so that their many short files even out the workers' ends
    # (a file is one unit: one of these last kept a worker ~2 s past the other)
    "tests/unit/test_checkpoint.py",
    "tests/unit/test_sparse.py",
    "tests/unit/test_batch_invariance.py",
    "tests/unit/test_pooling.py",
    "tests/unit/test_clip.py",
    "tests/unit/test_families.py",
    "tests/unit/test_compile_cache.py",
)
# How make test's alone pass finds its files (the Makefile's ALONE_FILES, a grep): an `alone` test in a
# file without it would run in neither pass.
ALONE_MARK = "pytest.mark.alone"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test outside tests/unit and tests/app starts real server processes: the `slow` layer.
    An `alone` test is found by its file's text (ALONE_MARK). The process layer runs first, its
    longest files first, and the many short in-process tests fill the end of a parallel run."""
    for item in items:
        if not any(layer in Path(str(item.fspath)).parents for layer in IN_PROCESS):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("alone") and ALONE_MARK not in Path(str(item.fspath)).read_text():
            raise pytest.UsageError(f"{item.nodeid} is marked alone, but its file does not say {ALONE_MARK}")

    def rank(item: pytest.Item) -> tuple[bool, int]:
        file = item.nodeid.split("::")[0]
        return (item.get_closest_marker("slow") is None, LONGEST.index(file) if file in LONGEST else len(LONGEST))

    items.sort(key=rank)  # stable: collection order within a rank


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test` runs two pytest-xdist workers: a file's tests go to one worker together, in order,
    sharing its module's servers (the zoo, the compile cache); units leave in the collection order
    above, not by size."""
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False
    return LoadFileScheduling(config, log)


@pytest.fixture(scope="session")
def model_dir() -> Path:
    if not (MODEL_DIR / "config.json").exists():
        from orchestrator.fetch_model import fetch

        fetch("sentence-transformers/all-MiniLM-L6-v2", MODEL_DIR.parent)
    return MODEL_DIR


@pytest.fixture(scope="session")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One embedding server shared by every test that only sends requests."""
    with serving(model_dir, tmp_path_factory.mktemp("logs") / "server.log") as proc:
        yield proc


@pytest.fixture(scope="session")
def st_model(model_dir: Path):  # type: ignore[no-untyped-def]
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_dir), device="cpu")


@pytest.fixture(scope="session")
def classifier_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.tiny_kinds import build_classifier

    return build_classifier(tmp_path_factory.mktemp("classifier"), model_dir, ["negative", "neutral", "positive"])


@pytest.fixture(scope="session")
def cross_encoder_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.tiny_kinds import build_classifier

    return build_classifier(tmp_path_factory.mktemp("cross-encoder"), model_dir, ["relevance"])


@pytest.fixture(scope="session")
def splade_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random SPLADE folder (BERT + masked-LM head), shared: no test writes into it."""
    from tests.tiny_kinds import build_splade

    return build_splade(tmp_path_factory.mktemp("splade") / "splade", model_dir)


@pytest.fixture(scope="session")
def colbert_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random ColBERT folder (PyLate's layout), shared: no test writes into it."""
    from tests.tiny_kinds import build_colbert

    return build_colbert(tmp_path_factory.mktemp("colbert") / "colbert", model_dir)


API_KEY = "s3cret-test-key"
VERTEX_PREDICT = "/v1/endpoints/7/deployedModels/8:predict"  # a route as Vertex AI names it


@pytest.fixture(scope="session")
def classifier_server(classifier_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Keyed too (from the environment), as client libraries meet it behind a gateway."""
    log = tmp_path_factory.mktemp("logs") / "classifier.log"
    with serving(classifier_dir, log, api_key=API_KEY, predict_route=VERTEX_PREDICT) as proc:
        proc.client.headers["authorization"] = f"Bearer {API_KEY}"
        yield proc


@pytest.fixture(scope="session")
def cross_encoder_server(cross_encoder_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Also the API-key server: the key comes from a file, as from a mounted secret."""
    secrets = tmp_path_factory.mktemp("secrets")
    (secrets / "api-key").write_text(API_KEY + "\n")
    log = tmp_path_factory.mktemp("logs") / "cross.log"
    with serving(cross_encoder_dir, log, api_key_file=secrets / "api-key", predict_route=VERTEX_PREDICT) as proc:
        proc.client.headers["authorization"] = f"Bearer {API_KEY}"
        yield proc


@pytest.fixture(scope="session")
def tiny(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> TinyFolders:
    """tests.tiny_models.TINY's folders (every native family, one transformers model), built when first asked for."""
    return TinyFolders(tmp_path_factory.mktemp("tiny"), model_dir)
