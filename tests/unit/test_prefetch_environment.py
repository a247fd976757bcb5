"""The environment prefetch reads before the model: the native libraries the forkserver's import loads
(orchestrator.envfiles, orchestrator.elf), dependencies first, each library's data before its code,
in the packages' import order."""

from __future__ import annotations

import importlib.machinery
import struct
from pathlib import Path

import pytest

from orchestrator.elf import dynamic_section, loaded_segments
from orchestrator.envfiles import environment_extents, environment_files, linked_closure, packages_for
from orchestrator.forkserver import ENGINE, TRANSFORMERS


def write_elf(
    path: Path, needed: list[str], runpath: str | None = None, rpath: str | None = None, code: int = 0, trailer: int = 0
) -> Path:
    """A minimal 64-bit little-endian shared object: a read-only PT_LOAD holding the headers, the
    string table and the dynamic section (DT_NEEDED entries, an optional DT_RUNPATH/DT_RPATH), an
    executable PT_LOAD of `code` bytes after it, and `trailer` bytes in no segment (as .symtab)."""
    strings, at = b"\0", {}
    for text in [*needed, *(p for p in (runpath, rpath) if p)]:
        at[text] = len(strings)
        strings += text.encode() + b"\0"
    phnum = 3 if code else 2
    base, strtab = 0x400000, 64 + phnum * 56
    dynamic_at = (strtab + len(strings) + 7) // 8 * 8
    entries = [(1, at[name]) for name in needed]
    entries += [(29, at[runpath])] if runpath else []
    entries += [(15, at[rpath])] if rpath else []
    entries += [(5, base + strtab), (10, len(strings)), (0, 0)]
    dynamic = b"".join(struct.pack("<qQ", tag, value) for tag, value in entries)
    data_end = dynamic_at + len(dynamic)
    code_at = (data_end + 4095) // 4096 * 4096
    header = b"\x7fELF\x02\x01\x01" + bytes(9)
    header += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 64, 0, 0, 64, 56, phnum, 64, 0, 0)
    segments = [(1, 4, 0, base, data_end), (1, 5, code_at, base + code_at, code)][: phnum - 1]
    segments.append((2, 4, dynamic_at, base + dynamic_at, len(dynamic)))
    table = b"".join(struct.pack("<IIQQQQQQ", t, f, off, va, va, size, size, 8) for t, f, off, va, size in segments)
    body = header + table + strings
    body += bytes(dynamic_at - len(body)) + dynamic
    body += bytes(code_at - len(body)) + b"\x90" * code if code else b""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body + bytes(trailer))
    return path


def test_the_dynamic_section_gives_needed_names_and_origin_relative_runpath(tmp_path: Path) -> None:
    """DT_NEEDED names in order; RUNPATH directories with $ORIGIN and ${ORIGIN} expanded."""
    lib = write_elf(tmp_path / "pkg" / "a.so", ["libb.so", "libc.so.6"], runpath="$ORIGIN/lib:${ORIGIN}/../x.libs")
    assert dynamic_section(lib) == (
        ["libb.so", "libc.so.6"],
        [tmp_path / "pkg" / "lib", tmp_path / "pkg" / "../x.libs"],
    )


def test_a_file_that_is_not_elf_links_nothing_and_has_no_segments(tmp_path: Path) -> None:
    """A script or a truncated file is read as linking nothing and mapping nothing (prefetch then
    reads it whole), without raising."""
    (tmp_path / "a.so").write_bytes(b"#!/bin/sh\n")
    (tmp_path / "b.so").write_bytes(b"\x7fELF\x02\x01")
    assert dynamic_section(tmp_path / "a.so") == dynamic_section(tmp_path / "b.so") == ([], [])
    assert loaded_segments(tmp_path / "a.so") is loaded_segments(tmp_path / "b.so") is None


def test_only_what_the_loader_maps_is_read(tmp_path: Path) -> None:
    """The read-only and the executable segment, in file order; the trailer no segment holds (as
    a debugger's symbol table) is not."""
    lib = write_elf(tmp_path / "lib.so", ["libc.so.6"], code=5000, trailer=7000)
    segments = loaded_segments(lib)
    assert segments is not None
    assert [(s.offset, s.executable) for s in segments] == [(0, False), (4096, True)]
    assert segments[1].size == 5000 and sum(s.size for s in segments) < lib.stat().st_size - 7000


def test_a_closure_lists_dependencies_first_and_leaves_system_libraries_out(tmp_path: Path) -> None:
    """ext.so -> libtop.so -> libbase.so (and libc, not in the environment): deepest first, the
    extension last, each once though libbase is linked twice."""
    lib = tmp_path / "pkg" / "lib"
    write_elf(lib / "libbase.so", ["libc.so.6"], runpath="$ORIGIN")
    write_elf(lib / "libtop.so", ["libbase.so", "libc.so.6"], runpath="$ORIGIN")
    ext = write_elf(tmp_path / "pkg" / "ext.so", ["libtop.so", "libbase.so"], runpath="$ORIGIN/lib")
    assert [p.name for p in linked_closure(ext)] == ["libbase.so", "libtop.so", "ext.so"]


def test_a_library_without_its_own_rpath_is_found_through_the_one_that_linked_it(tmp_path: Path) -> None:
    """RPATH is inherited: libfortran has none, yet its libquad is found in the directory of the
    extension's RPATH."""
    libs = tmp_path / "pkg.libs"
    write_elf(libs / "libquad.so", [])
    write_elf(libs / "libfortran.so", ["libquad.so"])
    ext = write_elf(tmp_path / "pkg" / "ext.so", ["libfortran.so"], rpath="$ORIGIN/../pkg.libs")
    assert [p.name for p in linked_closure(ext)] == ["libquad.so", "libfortran.so", "ext.so"]


def test_torchs_import_closure_is_read_without_its_test_libraries() -> None:
    """Against the installed torch (never imported): its libraries, libc10 before libtorch_cpu
    before libtorch_python before torch._C (the order the loader initialises them), and none of
    the test libraries torch ships but its import does not load."""
    names = [p.name for p in environment_files(["torch"])]
    ordered = ["libc10.so", "libtorch_cpu.so", "libtorch.so", "libtorch_python.so"]
    assert [n for n in names if n in ordered] == ordered
    assert names[-1].startswith("_C.")
    assert not [n for n in names if "test" in n]


def test_every_librarys_data_is_read_before_any_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loader reads symbols and relocations and writes data before any constructor runs: the
    non-executable segments of every library (dependencies first), then the code, in that order."""
    suffix = next(s for s in importlib.machinery.EXTENSION_SUFFIXES if s != ".so")
    package = tmp_path / "segmented_pkg"
    (package / "__init__.py").parent.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    write_elf(package / "libdep.so", [], code=100)
    write_elf(package / f"_ext{suffix}", ["libdep.so"], runpath="$ORIGIN", code=200)
    monkeypatch.syspath_prepend(str(tmp_path))
    extents = [(path.name, offset > 0) for path, offset, _ in environment_extents(["segmented_pkg"])]
    assert extents == [("libdep.so", False), (f"_ext{suffix}", False), ("libdep.so", True), (f"_ext{suffix}", True)]


def test_torchs_symbol_tables_for_debuggers_are_not_read() -> None:
    """Of the installed libtorch_cpu, what the loader maps is read, less than the whole file."""
    extents = [e for e in environment_extents(["torch"]) if e[0].name == "libtorch_cpu.so"]
    assert extents and sum(length for _, _, length in extents) < extents[0][0].stat().st_size


def test_a_packages_core_extension_comes_before_its_others() -> None:
    """Within numpy, the extension with the largest closure (_multiarray_umath and the BLAS it
    links: the one imported first) comes before the rest, which sort before it by name."""
    extensions = [p.name for p in environment_files(["numpy"]) if ".cpython-" in p.name or ".abi3." in p.name]
    assert extensions[0].startswith("_multiarray_umath.")
    assert sorted(extensions)[0] != extensions[0]


def test_a_package_without_a_record_is_walked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A package on the path with no installed metadata: its extension modules are found where it
    lies, with what they link, and nothing else of it."""
    suffix = next(s for s in importlib.machinery.EXTENSION_SUFFIXES if s != ".so")
    package = tmp_path / "unrecorded_pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    write_elf(package / "lib" / "libdep.so", [])
    write_elf(package / "sub" / f"_ext{suffix}", ["libdep.so"], runpath="$ORIGIN/../lib")
    monkeypatch.syspath_prepend(str(tmp_path))
    files = environment_files(["unrecorded_pkg"])
    assert [p.relative_to(package.resolve()).as_posix() for p in files] == ["lib/libdep.so", f"sub/_ext{suffix}"]


def test_the_packages_follow_the_preload() -> None:
    """The native engine imports torch (then numpy) and safetensors; the transformers fallback
    adds tokenizers; spawned engines (no preload) import what the native engine does."""
    assert packages_for([ENGINE]) == ["torch", "numpy", "safetensors"]
    assert packages_for([ENGINE, TRANSFORMERS, "transformers.models.bert.modeling_bert"]) == [
        "torch",
        "numpy",
        "safetensors",
        "tokenizers",
    ]
    assert packages_for([]) == packages_for([ENGINE])


def test_packages_are_listed_in_import_order_and_a_missing_one_adds_nothing() -> None:
    """torch's libraries come before numpy's; a package that is not installed is skipped."""
    files = environment_files(["torch", "not_installed_anywhere", "numpy"])
    packages = [p.parts for p in files]
    torch_last = max(i for i, parts in enumerate(packages) if "torch" in parts)
    numpy_first = min(i for i, parts in enumerate(packages) if "numpy" in parts or "numpy.libs" in parts)
    assert torch_last < numpy_first
