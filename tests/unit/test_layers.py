"""The layering rules, checked at run time in fresh interpreters (import-linter checks them statically).

- the HTTP process (orchestrator, server) never imports torch or transformers;
- an engine module loads nothing of the HTTP side: no web stack, no tokenizers, no metrics
  client, nothing under `orchestrator` or `server`.
- a model of a native family loads and runs without transformers.
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
