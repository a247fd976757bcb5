"""Settings: where values come from, the frozen model path, and the docs that list every setting
(the generated settings reference, compose.yaml's environment block) checked against the class itself."""

from __future__ import annotations

import functools
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic.fields import FieldInfo

from common.settings import Settings
from orchestrator.cli_help import default_text
from tests.server_process import ROOT

FIELDS: dict[str, FieldInfo] = dict(Settings.model_fields)


def is_derived(field: FieldInfo) -> bool:
    """A default the server works out at start: a default_factory, or None with its derivation said in words
    (the field's `default_text`: "the folder's name")."""
    return field.default_factory is not None or (field.default is None and default_text(field) is not None)


DERIVED = sorted(name for name, field in FIELDS.items() if is_derived(field))
UNSET = sorted(name for name, field in FIELDS.items() if not is_derived(field) and field.default is None)
FIXED = sorted(name for name in FIELDS if name not in DERIVED and name not in UNSET)


def env_name(name: str) -> str:
    return f"WARMPOOL_{name.upper()}"


def flag_name(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def same_default(text: str, default: Any) -> bool:
    """`text` as written in a doc is `default`: numbers compared numerically, anything else as text."""
    if isinstance(default, int | float) and not isinstance(default, bool):
        try:
            return float(text) == float(default)
        except ValueError:
            return False
    return text == ("none" if default is None else str(default))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No WARMPOOL_* variable of the calling shell leaks into these tests."""
    for key in list(os.environ):
        if key.startswith("WARMPOOL_"):
            monkeypatch.delenv(key)


# Where values come from


def test_default_applies_without_env_or_flag() -> None:
    """With neither an env var nor a flag, a setting has its default."""
    assert Settings(_cli_parse_args=[]).max_batch_size == FIELDS["max_batch_size"].default == 256


def test_env_var_wins_over_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """WARMPOOL_<NAME> replaces the default."""
    monkeypatch.setenv("WARMPOOL_MAX_BATCH_SIZE", "32")
    assert Settings(_cli_parse_args=[]).max_batch_size == 32


def test_flag_wins_over_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    """--<name> replaces what WARMPOOL_<NAME> says."""
    monkeypatch.setenv("WARMPOOL_MAX_BATCH_SIZE", "32")
    assert Settings(_cli_parse_args=["--max-batch-size", "64"]).max_batch_size == 64


def test_empty_env_var_leaves_derived_setting_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty WARMPOOL_MAX_CONCURRENT_INPUTS (compose's `${X:-}`) means unset: the server derives it."""
    monkeypatch.setenv("WARMPOOL_MAX_CONCURRENT_INPUTS", "")
    settings = Settings()
    assert settings.max_concurrent_inputs is None
    assert settings.admission_permits == 4 * settings.max_batch_tokens // 64


def test_empty_env_var_gives_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty env var for a setting with a fixed default gives that default, not a validation error."""
    monkeypatch.setenv("WARMPOOL_PORT", "")
    assert Settings().port == 8000


# The model path


def snapshot(hub: Path, name: str, mtime: float) -> Path:
    """A snapshot folder of org/name in an HF_HOME cache, last modified at `mtime`."""
    folder = hub / "models--org--name" / "snapshots" / name
    folder.mkdir(parents=True)
    os.utime(folder, (mtime, mtime))
    return folder


@pytest.fixture
def hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HF_HOME, with a working directory where `org/name` is no folder."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "hf" / "hub"


def test_repo_id_resolves_to_newest_snapshot(hf_home: Path) -> None:
    """A repo id resolves to the most recently modified snapshot in the HF_HOME cache."""
    snapshot(hf_home, "a", 1_000_000)
    newer = snapshot(hf_home, "b", 2_000_000)
    snapshot(hf_home, "c", 1_500_000)
    assert Settings(model="org/name").model_path == newer


def test_repo_id_resolves_to_the_snapshot_refs_main_names(hf_home: Path) -> None:
    """Where the cache records the current revision (refs/main), that snapshot wins over a newer folder."""
    current = snapshot(hf_home, "a", 1_000_000)
    snapshot(hf_home, "b", 2_000_000)
    (hf_home / "models--org--name" / "refs").mkdir()
    (hf_home / "models--org--name" / "refs" / "main").write_text("a\n")
    assert Settings(model="org/name").model_path == current


def test_model_path_is_frozen_after_first_read(hf_home: Path) -> None:
    """Once read, model_path stays what it was even when a newer snapshot lands; a new Settings sees the newer."""
    first = snapshot(hf_home, "a", 1_000_000)
    settings = Settings(model="org/name")
    assert settings.model_path == first
    second = snapshot(hf_home, "b", 2_000_000)
    assert Settings(model="org/name").model_path == second
    assert settings.model_path == first


def test_folder_resolves_to_its_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative folder that exists resolves to its absolute path, even when it looks like a repo id."""
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert Settings(model="org/name").model_path == tmp_path / "org" / "name"


# The settings reference (docs/reference/settings.md)


def readme_table() -> list[list[str]]:
    """Rows of the settings reference that start with '| `WARMPOOL_'; cells: variable, flag, default, meaning."""
    section = (ROOT / "docs" / "reference" / "settings.md").read_text()
    lines = [line.strip() for line in section.splitlines() if line.startswith("| `WARMPOOL_")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def readme_row(name: str) -> list[str]:
    """The row of one setting (the last, should it be repeated: test_readme_lists_every_setting_once counts)."""
    rows = {row[0]: row for row in readme_table()}
    row = rows.get(f"`{env_name(name)}`")
    assert row is not None, f"no README row for {env_name(name)}"
    return row


LITERAL = re.compile(r"`([^`]*)`")


def test_readme_lists_every_setting_once() -> None:
    """The table has exactly one row per Settings field, named WARMPOOL_<NAME>, and no other rows."""
    counts = Counter(row[0].strip("`") for row in readme_table())
    expected = Counter(env_name(name) for name in FIELDS)
    assert counts == expected, f"missing: {sorted(expected - counts)}, extra or repeated: {sorted(counts - expected)}"


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_readme_row_has_four_columns_and_the_flag(name: str) -> None:
    """A setting's row reads `WARMPOOL_<NAME>` | `--<name-with-dashes>` | default | meaning."""
    row = readme_row(name)
    assert len(row) == 4, row
    assert row[1] == f"`{flag_name(name)}`"


@pytest.mark.parametrize("name", FIXED + UNSET)
def test_readme_gives_the_fixed_default(name: str) -> None:
    """A setting with a fixed default shows it as one backticked literal equal to the default as text (numbers
    compared numerically: `300` is 300.0); a None default (unset unless given) is `none`, or none without
    backticks."""
    row = readme_row(name)
    cell, default = row[2], FIELDS[name].default
    if default is None and cell == "none":
        return
    literal = LITERAL.fullmatch(cell)
    assert literal is not None, f"{env_name(name)}: default {cell!r} is not a backticked literal"
    assert same_default(literal.group(1), default), f"{env_name(name)}: README says {cell}, Settings {default!r}"


@pytest.mark.parametrize("name", DERIVED)
def test_readme_describes_a_derived_default_in_words(name: str) -> None:
    """A derived default (a default_factory, or None with "default ..." in the field's description) is
    described in words: the cell holds at least one letter outside backticks and is not one backticked literal
    (that would read as a fixed value). Backticked names inside the words are fine."""
    row = readme_row(name)
    cell = row[2]
    assert LITERAL.fullmatch(cell) is None, f"{env_name(name)}: derived default written as a literal: {cell}"
    assert re.search(r"[A-Za-z]", LITERAL.sub("", cell)), f"{env_name(name)}: derived default not in words: {cell}"


# compose.yaml's environment block

IMAGE_VALUES = {"WARMPOOL_HOST": "0.0.0.0", "WARMPOOL_PORT": "8000"}  # fixed in the image: compose publishes 8000
INTERPOLATION = re.compile(r"\$\{(?P<var>[A-Z0-9_]+):-(?P<default>[^}]*)\}")


@functools.cache  # read by ~80 parametrized tests
def compose_environment() -> dict[str, str]:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    environment = compose["services"]["warmpool"]["environment"]
    assert isinstance(environment, dict), "environment is written as a mapping"
    return {str(key): "" if value is None else str(value) for key, value in environment.items()}


def compose_default(name: str, value: str) -> str:
    """The default of a `${WARMPOOL_<NAME>:-default}` value; fails for any other form."""
    match = INTERPOLATION.fullmatch(value)
    assert match is not None, f"{env_name(name)}: {value!r} is not ${{{env_name(name)}:-default}}"
    assert match["var"] == env_name(name), f"{env_name(name)} interpolates {match['var']}"
    return match["default"]


def test_compose_names_only_settings() -> None:
    """Every key of services.warmpool.environment is WARMPOOL_<NAME> of a Settings field."""
    known = {env_name(name) for name in FIELDS}
    assert sorted(set(compose_environment()) - known) == []


@pytest.mark.parametrize("name", FIXED)
def test_compose_passes_the_settings_default(name: str) -> None:
    """A setting with a fixed default is listed as `${WARMPOOL_<NAME>:-<default>}`, the default equal to
    Settings' (numbers compared numerically), so the shell can override it and unset means the server's default.
    Image values are the exceptions: WARMPOOL_HOST and WARMPOOL_PORT are either absent (the image sets them) or
    fixed to 0.0.0.0 and 8000 (compose publishes container port 8000); WARMPOOL_MODEL's default may be the
    image's embedded copy of the default model (/opt/warmpool/models/<name>); WARMPOOL_LOG_FORMAT's default may
    be json (container logs)."""
    key, default = env_name(name), FIELDS[name].default
    environment = compose_environment()
    if key in IMAGE_VALUES:
        assert environment.get(key, IMAGE_VALUES[key]) == IMAGE_VALUES[key]
        return
    assert key in environment, f"{key} is missing from compose.yaml"
    written = compose_default(name, environment[key])
    allowed = {
        "WARMPOOL_MODEL": f"/opt/warmpool/models/{Path(str(default)).name}",
        "WARMPOOL_LOG_FORMAT": "json",
    }
    assert same_default(written, default) or written == allowed.get(key), f"{key}: compose {written!r}, {default!r}"


@pytest.mark.parametrize("name", DERIVED + UNSET)
def test_compose_never_pins_a_derived_or_unset_setting(name: str) -> None:
    """A setting the server derives, or one unset by default, is absent or `${WARMPOOL_<NAME>:-}`: empty unless
    the shell sets it, so the server derives it (an empty env var is unset). Never a fixed value."""
    value = compose_environment().get(env_name(name))
    if value is not None:
        assert compose_default(name, value) == "", f"{env_name(name)} is pinned: {value}"


def test_the_warmpool_command_is_the_orchestrator_and_says_its_name() -> None:
    """`warmpool` (the console script) starts the orchestrator; --help calls the program warmpool."""
    import subprocess
    import sys

    script = Path(sys.executable).parent / "warmpool"
    assert script.exists() and "orchestrator.__main__" in script.read_text()
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("usage: warmpool")
    assert "--max-batch-tokens" in result.stdout


def test_help_groups_every_setting_once_with_its_variable() -> None:
    """`warmpool --help` lists every setting exactly once, in a group, with its WARMPOOL_ variable:
    a new setting left out of the groups fails here."""
    from orchestrator.cli_help import GROUPS, render

    grouped = [name for names in GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(FIELDS) and len(grouped) == len(set(grouped))
    text = render()
    for name in FIELDS:
        assert f"--{name.replace('_', '-')}  (WARMPOOL_{name.upper()}" in text


def test_the_derived_stall_timeout_follows_the_largest_group_not_the_batch() -> None:
    """Derived from warm-up, the stall timeout is 8 x the time of the largest forward an engine
    answers in one go (at least 10 s): 384 tokens at 10 ms a token give 30.72 s where the full
    16,384-token batch would give ~22 minutes; without a group size the batch is the yardstick; a
    set WARMPOOL_ENGINE_STALL_TIMEOUT wins."""
    assert Settings().stall_timeout(10.0, 384) == pytest.approx(30.72)
    assert Settings(request_timeout=3600).stall_timeout(10.0) == pytest.approx(8 * 16384 * 10 / 1000)
    assert Settings().stall_timeout(0.01, 384) == 10.0
    assert Settings(engine_stall_timeout=3).stall_timeout(10.0, 384) == 3


def test_the_derived_stall_timeout_is_at_most_half_the_request_timeout() -> None:
    """However slow warm-up measured (a busy machine), a derived stall timeout leaves half the request
    timeout for a stalled engine's inputs to finish elsewhere; a set one is taken as it is."""
    assert Settings().stall_timeout(10.0) == 60.0  # 22 minutes derived, request timeout 120 s
    assert Settings(request_timeout=5).stall_timeout(0.01, 384) == 2.5  # below the 10 s floor too
    assert Settings(request_timeout=5, engine_stall_timeout=30).stall_timeout(10.0, 384) == 30


def test_adapters_are_name_folder_pairs_and_the_default_model_s_alone() -> None:
    """WARMPOOL_ADAPTERS as the engines get it (EngineSpec.adapters), for the first of WARMPOOL_MODELS only."""
    settings = Settings(models="embed=/m/a,rerank=/m/b", adapters=" legal=/a/legal , medical=/a/medical")
    assert settings.adapter_folders == (("legal", Path("/a/legal")), ("medical", Path("/a/medical")))
    assert [s.adapter_folders for s in settings.per_model()] == [settings.adapter_folders, ()]


@pytest.mark.parametrize(
    ("adapters", "models", "words"),
    [
        ("/a/legal", None, "is not NAME=FOLDER"),
        ("legal=/a,legal=/b", None, "names two adapters"),
        ("m=/a", None, "an adapter and its model"),
        ("rerank=/a", "embed=/m/a,rerank=/m/b", "as WARMPOOL_MODELS names a model"),
    ],
)
def test_adapters_that_cannot_be_told_apart_are_refused_at_start(adapters: str, models: str | None, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Settings(model="/x/m", models=models, adapters=adapters).per_model()
