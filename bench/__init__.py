"""Benchmarks: each prints ratios against a baseline measured in the same run and never asserts.

Their servers run with the result cache off unless a benchmark asks for it (bench.cache does): a
benchmark repeats its texts, and would otherwise measure cache hits, not the engine's path.
"""

from tests.server_process import DEFAULT_SETTINGS

DEFAULT_SETTINGS.setdefault("cache_bytes", "0")
