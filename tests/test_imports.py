"""What each process imports, checked at run time in fresh interpreters (import-linter checks the
layering rules statically).

- the HTTP process (orchestrator, server) never imports torch (not even to find its files for the
  prefetch) or transformers, nor, with tracing off, OpenTelemetry's SDK, exporters or protobuf;
- CUDA is touched only inside the engine, after the fork, when its placement asks;
- an engine module loads nothing of the HTTP side: no web stack, no tokenizers, no metrics
  client, nothing under `orchestrator` or `server`.
- a model of a native family loads and runs without transformers;
- `warmpool embed` is a client: nothing of the server, the engine, torch or the web stack;
- the Ray adapter (warmpool.ray) loads the engine and the tokenizer, nothing of the web stack.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import pytest

import engine
from tests.server_process import ROOT
from tests.tiny_models import TINY, TinyFolders

HTTP_SIDE = ("fastapi", "starlette", "uvicorn", "tokenizers", "prometheus_client", "orchestrator", "server")
ENGINE_MODULES = sorted(m.name for m in pkgutil.walk_packages(engine.__path__, "engine.") if not m.ispkg)
# transformers imports tokenizers itself; the fallback's preload is the one engine module allowed it.
ALLOWED = {"engine.transformers_preload": {"tokenizers"}}


def loaded_packages(imports: str) -> set[str]:
    """Top-level packages present in sys.modules after `imports` in a fresh interpreter."""
    code = f"import sys, json\n{imports}\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.splitlines()[-1]))


def test_the_http_process_never_imports_torch() -> None:
    """Importing the orchestrator, its lifecycle and supervisor and the app leaves torch out."""
    loaded = loaded_packages(
        "import orchestrator.__main__, orchestrator.lifecycle, orchestrator.supervisor, server.http.app, "
        "server.core.pipeline"
    )
    assert {"torch", "transformers"} & loaded == set()
    assert "fastapi" in loaded  # the check sees what was imported


def test_finding_torchs_libraries_does_not_import_it() -> None:
    """The orchestrator never imports torch, not even to find its files for the prefetch."""
    loaded = loaded_packages("from orchestrator.envfiles import environment_files; environment_files(['torch'])")
    assert "torch" not in loaded
    assert "orchestrator" in loaded  # the check sees what was imported


def test_the_embed_cli_loads_nothing_of_the_server_or_engine() -> None:
    loaded = loaded_packages("import orchestrator.__main__, orchestrator.embed.cli")
    assert ({"torch", "transformers", "engine", *HTTP_SIDE} - {"orchestrator"}) & loaded == set()
    assert {"httpx", "orchestrator"} <= loaded  # the check sees what was imported


def test_engine_modules_load_nothing_of_the_http_side() -> None:
    """The engine's own modules, imported together (so each alone loads no more), load no web stack,
    tokenizers, metrics client, orchestrator or server module."""
    modules = [m for m in ENGINE_MODULES if m not in ALLOWED]
    loaded = loaded_packages("\n".join(f"import {m}" for m in modules))
    assert {"engine", "torch"} <= loaded and len(modules) >= 7
    assert set(HTTP_SIDE) & loaded == set()


def test_native_families_load_and_run_without_transformers(tiny: TinyFolders) -> None:
    """Loading and running a model of every native family (encoders with their Dense modules, and
    classifiers) in a fresh interpreter imports neither transformers nor anything of the HTTP side."""
    folders = [str(tiny[name]) for name in TINY if TINY[name].family != "distilbert"]
    loaded = loaded_packages(
        "from pathlib import Path\n"
        "from common.modelfolder import read_model_folder\n"
        "from common.wire import Tokens\n"
        "from engine.runtime.model import PoolingModel\n"
        f"for folder in {folders!r}:\n"
        "    info = read_model_folder(Path(folder))\n"
        "    assert info.native, folder\n"
        "    assert PoolingModel(info, threads=1).forward([Tokens([0, 5, 2])]).shape[0] == 1\n"
    )
    assert "torch" in loaded  # the check sees what was imported
    assert {"transformers", "sentence_transformers", *HTTP_SIDE} & loaded == set()


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_the_transformers_fallback_loads_only_what_transformers_needs(module: str) -> None:
    """The fallback's preload loads transformers (and the tokenizers it imports itself), nothing else
    of the HTTP side."""
    loaded = loaded_packages(f"import {module}")
    assert "transformers" in loaded
    assert set(HTTP_SIDE) & loaded <= ALLOWED[module]


def test_the_ray_adapter_loads_the_engine_and_tokenizer_only() -> None:
    """warmpool.ray in a Ray actor: the engine, torch and tokenizers, no web stack, metrics client,
    orchestrator, transformers, nor Ray itself (map_batches needs only the class)."""
    loaded = loaded_packages("import warmpool.ray")
    assert {"engine", "torch", "tokenizers"} <= loaded  # the check sees what was imported
    forbidden = {"fastapi", "starlette", "uvicorn", "prometheus_client", "orchestrator", "transformers", "ray"}
    assert forbidden & loaded == set()


FAKE_CUDA = """
import sys, torch
calls = []
torch.cuda._lazy_init = lambda: calls.append("lazy_init")
torch.cuda.init = lambda: calls.append("init")
torch.cuda.is_available = lambda: (calls.append("is_available"), False)[1]
import engine.process, engine.runtime.model, engine.runtime.device        # what the forkserver preloads
import orchestrator.__main__, orchestrator.lifecycle       # the HTTP process
before_fork = list(calls)
from engine.runtime.device import place
place("cpu", "auto", [])
on_cpu = list(calls)
try:
    place("cuda:0", "auto", [])
except Exception as exc:
    refusal = str(exc)
print(before_fork, on_cpu, calls, refusal, sep="|")
"""


def test_cuda_is_never_touched_before_the_engine_asks_for_its_device() -> None:
    """With torch's CUDA entry points faked: importing what the forkserver preloads and the HTTP
    process touches nothing; a CPU engine touches nothing; only a CUDA engine's own placement asks,
    and with no CUDA it refuses with the reason."""
    result = subprocess.run([sys.executable, "-c", FAKE_CUDA], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    before_fork, on_cpu, calls, refusal = result.stdout.strip().splitlines()[-1].split("|")
    assert before_fork == "[]" and on_cpu == "[]"
    assert calls == "['is_available']"
    assert "CUDA is not available" in refusal


HEAVY = ("opentelemetry.sdk", "opentelemetry.exporter", "google.protobuf", "grpc")


def loaded_after(code: str) -> list[str]:
    """The heavy modules present after `code` in a fresh interpreter that imported the HTTP process's modules."""
    program = (
        "import sys, json\nimport orchestrator.lifecycle, server.http.app\nfrom server.http import tracing\n"
        f"from common.settings import Settings\n{code}\n"
        f"print(json.dumps(sorted({{m for m in sys.modules if m.startswith({HEAVY!r})}})))"
    )
    out = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def test_tracing_off_imports_no_sdk_exporter_or_protobuf() -> None:
    """Without WARMPOOL_OTLP_ENDPOINT, configure() is None and none of the SDK's modules are loaded."""
    assert loaded_after("assert tracing.configure(Settings()) is None") == []


def test_tracing_on_loads_the_sdk_and_its_exporter() -> None:
    """The counterpart: with an endpoint the SDK and the HTTP exporter (protobuf) are loaded."""
    loaded = loaded_after("tracing.configure(Settings(otlp_endpoint='http://127.0.0.1:9'))")
    assert any(m.startswith("opentelemetry.sdk") for m in loaded)
    assert any(m.startswith("opentelemetry.exporter.otlp.proto.http") for m in loaded)


def test_grpc_is_imported_only_by_its_server() -> None:
    """Without WARMPOOL_GRPC_PORT the HTTP process imports no grpc (LifecycleServer.startup imports
    server.grpc.server only with the port set); that module brings it."""
    assert loaded_after("import orchestrator.__main__; Settings()") == []
    assert "grpc" in loaded_after("import server.grpc.server")
