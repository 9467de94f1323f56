"""Build the optional C++ collective kernel ``obshub.instrument._c10d_kernel`` (obshub/instrument/_c10d_kernel.cpp)
against the installed torch wheel: ``python -m obshub.instrument.native_build`` (``make setup`` runs it).

It needs g++ and the wheel's headers and libraries (``torch.utils.cpp_extension`` gives the paths; the
C++ ABI flag is the wheel's own, ``torch._C._GLIBCXX_USE_CXX11_ABI``). A build is skipped when the shared
object is newer than the source and was built for the same torch version (a stamp file beside it). A
failure prints why and exits 0 (``--strict``: 1): obshub then uses its Python kernel
(obshub/instrument/hooks.py), which does the same with ~20-70 µs more per collective.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "_c10d_kernel.cpp"


def target() -> Path:
    """Where the extension goes: beside this file, named as CPython imports it (``_c10d_kernel.<tag>.so``)."""
    return HERE / ("_c10d_kernel" + sysconfig.get_config_var("EXT_SUFFIX"))


def command(out: Path) -> list[str]:
    """The g++ command line that builds ``out`` (imports torch for its paths)."""
    import torch
    from torch.utils import cpp_extension

    includes = [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    libdirs = cpp_extension.library_paths()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [
        "g++",
        "-shared",
        "-fPIC",
        "-O2",
        "-std=c++20",
        "-mno-red-zone",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        "-DUSE_C10D_GLOO",
        *includes,
        str(SOURCE),
        "-o",
        str(out),
        *[f"-L{d}" for d in libdirs],
        *[f"-Wl,-rpath,{d}" for d in libdirs],
        "-lc10",
        "-ltorch_cpu",
        "-ltorch",
    ]


def build(force: bool = False) -> tuple[bool, str]:
    """Build the extension unless it is up to date; returns (ok, what happened in one line). Never raises."""
    out = target()
    stamp = HERE.parents[1] / "build" / "c10d_kernel.torch"  # build/ is git-ignored
    stamp.parent.mkdir(exist_ok=True)
    try:
        import torch

        version = torch.__version__
    except ImportError as exc:
        return False, f"torch is not importable ({exc})"
    if (
        not force
        and out.exists()
        and stamp.exists()
        and stamp.read_text() == version
        and out.stat().st_mtime >= SOURCE.stat().st_mtime
    ):
        return True, f"{out.name} is up to date (torch {version})"
    try:
        cmd = command(out)
    except Exception as exc:  # noqa: BLE001 - any failure means: fall back to the Python kernel
        return False, f"cannot find torch's C++ headers and libraries ({exc})"
    tmp = out.with_name(out.name + ".tmp")
    cmd[cmd.index(str(out))] = str(tmp)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"g++ did not run ({exc})"
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        return False, f"g++ failed (exit {proc.returncode}): {shlex.join(cmd[:8])} ...\n{tail}"
    tmp.replace(out)
    stamp.write_text(version)
    return True, f"built {out.name} for torch {version}"


def main(argv: list[str] | None = None) -> int:
    """CLI entry: build, print one line; exit 0 even on failure unless ``--strict``."""
    ap = argparse.ArgumentParser(prog="python -m obshub.instrument.native_build", description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="rebuild even if up to date")
    ap.add_argument("--strict", action="store_true", help="exit 1 when the build fails")
    args = ap.parse_args(argv)
    ok, msg = build(args.force)
    if ok:
        print(f"setup: C++ collective kernel: {msg}")
        return 0
    print(
        f"setup: C++ collective kernel not built, obshub uses its Python kernel (slower per collective): {msg}",
        file=sys.stderr,
    )
    return 1 if args.strict else 0


if __name__ == "__main__":
    raise SystemExit(main())
