"""Services serving the embedded model's tokenizer (no engine), every start phase done: for tests of
what the HTTP side decides before any engine work (admission, refusals)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from common.modelfolder import read_model_folder
from common.settings import Settings
from common.startup import PHASES, StartupState
from server.core.services import ServedModel, Services
from server.tokenizing.tokenizer import TokenizerPool


@contextmanager
def served(model_dir: Path, permits: int, threads: int) -> Iterator[Services]:
    startup = StartupState()
    for phase in PHASES:
        startup.start(phase)
        startup.done(phase)
    startup.engine_up = True
    with ThreadPoolExecutor(threads) as executor:
        services = Services(settings=Settings(max_concurrent_inputs=permits), startup=startup, executor=executor)
        folder = read_model_folder(model_dir)
        services.models["minilm"] = ServedModel("minilm", folder, TokenizerPool(model_dir), engine=None)  # type: ignore[arg-type]
        yield services
