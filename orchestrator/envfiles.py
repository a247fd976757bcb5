"""The Python environment's native libraries the forkserver's preload loads, in the order it needs
them, found without importing anything (the HTTP process never imports torch).

Measured with the environment evicted, on a disk with 128 KiB readahead capped at 1000 reads/s:
`import engine.process` took 2.8 s, 1.6 s with these libraries cached, 1.3 s with the ~820 .pyc
files it reads cached too. Bytecode is left out: which files the import reads is not known without
importing, and reading all 2,900 of the packages' made the forkserver 2x slower on a disk capped
so (every small file costs a read).

The rule, computed at start from the files themselves rather than recorded from one install: for
each package the preload imports, its extension modules and what they link (DT_NEEDED, resolved
through RUNPATH/RPATH as the dynamic loader does, within the environment: system libraries are
shared with this process and already warm). That is exactly what the import maps: torch._C →
libtorch_python → libtorch → libtorch_cpu → libc10, libgomp (not torch's test libraries), and in a
CUDA build libtorch_cuda and the nvidia-* wheels' libraries. Each closure is listed dependencies
first, the order the loader relocates and initialises them (where most of a library's pages are
faulted in); within a package the extension with the largest closure first (torch._C, numpy's
_multiarray_umath: the ones imported first).
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import os
from pathlib import Path

from orchestrator.elf import dynamic_section, loaded_segments
from orchestrator.forkserver import ENGINE, TRANSFORMERS

# What each preloaded module imports that has native code, in import order: engine.process imports
# torch (which imports numpy when it is installed) and safetensors; the transformers fallback adds
# tokenizers (transformers itself is pure Python).
PACKAGES = {ENGINE: ("torch", "numpy", "safetensors"), TRANSFORMERS: ("tokenizers",)}

_EXTENSIONS = tuple(s for s in importlib.machinery.EXTENSION_SUFFIXES if s != ".so")

Extent = tuple[Path, int, int]  # (file, offset, length): one stretch to read


def packages_for(preload: list[str]) -> list[str]:
    """The packages with native code the preload imports, in import order, each once. Spawned
    engines import the same as the forkserver would, so no preload means the engine's packages."""
    names = [name for module in (preload or [ENGINE]) for name in PACKAGES.get(module, ())]
    return list(dict.fromkeys(names))


def environment_extents(packages: list[str]) -> list[Extent]:
    """What to read of environment_files: the segments the loader maps (not the symbol tables for
    debuggers, 89 of libtorch_cpu's 434 MB), every library's non-executable ones first — headers,
    dynamic symbols, relocations, data: what the loader reads and writes before any code runs —
    then the code, of which the import runs only the constructors."""
    first: list[Extent] = []
    then: list[Extent] = []
    for path in environment_files(packages):
        segments = loaded_segments(path)
        if segments is None:
            first.append((path, 0, path.stat().st_size))
            continue
        for segment in segments:
            (then if segment.executable else first).append((path, segment.offset, segment.size))
    return first + then


def environment_files(packages: list[str]) -> list[Path]:
    """Native libraries the packages' import loads, in the order it needs them, each once."""
    seen: set[Path] = set()
    ordered: list[Path] = []
    for package in packages:
        closures = [linked_closure(root) for root in extension_modules(package)]
        for closure in sorted(closures, key=_size, reverse=True):
            for path in closure:
                if path not in seen:
                    seen.add(path)
                    ordered.append(path)
    return ordered


def extension_modules(package: str) -> list[Path]:
    """The package's extension modules: from its wheel's RECORD (one file, scanned as text: torch
    lists 16,000 files), else a walk of where it is installed; [] when it is not installed."""
    try:
        dist: importlib.metadata.Distribution | None = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        dist = None
    record = dist.read_text("RECORD") if dist is not None else None
    if dist is not None and record is not None:
        names = (line.split(",", 1)[0] for line in record.splitlines())
        found = [Path(str(dist.locate_file(name))) for name in names if name.endswith(_EXTENSIONS)]
    else:
        spec = importlib.util.find_spec(package)
        roots = list(spec.submodule_search_locations or []) if spec is not None else []
        found = [Path(d, n) for root in roots for d, _, names in os.walk(root) for n in names]
    return sorted(p.resolve() for p in found if p.name.endswith(_EXTENSIONS) and p.is_file())


def linked_closure(root: Path) -> list[Path]:
    """root and the libraries it links within the environment, dependencies first. Breadth-first
    as the loader maps them; a name is found in the object's own RUNPATH/RPATH directories, then in
    those of the objects that led to it (as RPATH is inherited), or is one already found."""
    found: dict[str, Path] = {}
    order = [root]
    queue: list[tuple[Path, list[Path]]] = [(root, [])]
    while queue:
        path, inherited = queue.pop(0)
        needed, own = dynamic_section(path)
        dirs = own + inherited
        for name in needed:
            if name in found:
                continue
            hit = next((d / name for d in dirs if (d / name).is_file()), None)
            if hit is None:
                continue  # a system library: shared with this process, already warm
            found[name] = hit.resolve()
            if found[name] not in order:
                order.append(found[name])
                queue.append((found[name], dirs))
    return order[::-1]


def _size(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths)
