"""The reference pages are generated from the code (tools/reference_docs.py): one that differs from
what the code makes now is stale, and fails here until `python -m tools.reference_docs` is run."""

from __future__ import annotations

import pytest

from tests.server_process import ROOT
from tools import reference_docs

PAGES = reference_docs.pages()


@pytest.mark.parametrize("path", sorted(PAGES, key=str), ids=str)
def test_the_committed_page_is_what_the_code_makes(path) -> None:  # type: ignore[no-untyped-def]
    """Each generated file as committed equals what the settings, metrics, routes and families make now."""
    committed = (ROOT / path).read_text() if (ROOT / path).is_file() else None
    assert committed == PAGES[path](), f"{path} is stale: run python -m tools.reference_docs"


def test_a_changed_setting_makes_its_page_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check sees a change: a setting's description edited in the code no longer matches the page."""
    field = reference_docs.Settings.model_fields["max_windows"]
    monkeypatch.setattr(field, "description", "Windows one text may be chunked into, and then some.")
    assert reference_docs.Path("docs/reference/settings.md") in reference_docs.stale()
