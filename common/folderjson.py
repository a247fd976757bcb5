"""A model folder's JSON config files, read and checked, and ModelError: what every reader of a
folder raises (common.modelfolder, common.st_modules and common.modelfiles share both)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class ModelError(Exception):
    """The model folder is missing, unreadable or not something warmpool can serve."""


def read_json(path: Path, list_key: str | None = None) -> dict[str, Any]:
    """A JSON object ({} when the file is absent); a top-level list only where `list_key` names it
    (modules.json is a list)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as exc:
        raise ModelError(f"cannot read {path}: {type(exc).__name__}: {exc}") from exc
    if isinstance(data, list) and list_key is not None:
        return {list_key: data}
    if not isinstance(data, dict):
        raise ModelError(f"{path} is not a JSON object")
    return data


def modules_json(path: Path) -> list[dict[str, Any]]:
    """modules.json's entries (sentence-transformers' module list; [] without one)."""
    return read_json(path / "modules.json", list_key="modules").get("modules", [])
