"""The HTTP process must never hold torch: importing the orchestrator and the app leaves it out."""

from __future__ import annotations

import subprocess
import sys

from tests.server_process import ROOT


def test_orchestrator_and_app_do_not_import_torch() -> None:
    code = (
        "import sys, orchestrator, orchestrator.lifecycle, orchestrator.supervisor, server.app\n"
        "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
