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
import contextlib
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import platformdirs

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


def _cached(cmd: list[str], out: Path) -> Path | None:
    """The build cache's copy of the extension for this source and command line:
    ``$OBSHUB_CACHE/native/<sha256 of the source, the g++ flags without this clone's paths, torch's version,
    the extension suffix, g++'s version>/`` (the first g++ build takes 1-2 min; a fresh clone on the same
    machine, as CI's, copies it in milliseconds). The copy's rpath names the building clone's torch/lib,
    which need not exist: the kernel is loaded after ``import torch``, whose libraries the dynamic linker
    then finds loaded by their sonames. None when g++ does not answer (the build then says why)."""
    try:
        gxx = subprocess.run(["g++", "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    # the flags without this clone's paths (-I/-L/-rpath into its .venv, the source, the output): the key
    # is the same for every clone with the same torch (its version: the same headers) and compiler
    import torch

    flags = [c for c in cmd if not c.startswith(("-I", "-L", "-Wl,", "/")) and c != str(out)]
    key.update("\0".join([*flags, torch.__version__, sysconfig.get_config_var("EXT_SUFFIX") or ""]).encode())
    key.update(gxx.encode())
    root = Path(os.environ.get("OBSHUB_CACHE") or platformdirs.user_cache_dir("obshub"))
    return root / "native" / key.hexdigest()[:24] / out.name


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
    cached = _cached(cmd, out)
    if not force and cached is not None and cached.exists():  # built before on this machine (another clone): seconds
        tmp = out.with_name(out.name + ".tmp")
        shutil.copyfile(cached, tmp)
        tmp.replace(out)
        stamp.write_text(version)
        return True, f"{out.name} for torch {version} from the build cache {cached.parent}"
    tmp = out.with_name(out.name + ".tmp")
    cmd[cmd.index(str(out))] = str(tmp)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"g++ did not run ({exc})"
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        return False, f"g++ failed (exit {proc.returncode}): {shlex.join(cmd[:8])} ...\n{tail}"
    if cached is not None:
        with contextlib.suppress(OSError):  # a cache that cannot be written only costs the next clone a build
            cached.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tmp, cached.with_name(cached.name + ".tmp"))
            cached.with_name(cached.name + ".tmp").replace(cached)
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
