"""Find a kernel header tree bcc can compile against, without touching system folders.

bcc looks for headers at ``/lib/modules/$(uname -r)/build`` (and ``source``), or at ``$BCC_KERNEL_SOURCE``.
When the running kernel has no matching headers (a custom or cloud kernel newer than the distribution's),
obshub tries, in order:

1. ``/lib/modules/$(uname -r)/build`` — the running kernel's own headers: used as they are;
2. ``/sys/kernel/kheaders.tar.xz`` (CONFIG_IKHEADERS) — bcc extracts it itself: used as it is;
3. the distribution's nearest headers. Debian splits them into an arch folder
   (``/usr/src/linux-headers-X-amd64``: .config, generated headers) and a common folder
   (``/usr/src/linux-headers-X-common``: the headers proper). bcc's ``$BCC_KERNEL_SOURCE`` takes one folder,
   so obshub builds a *merged* tree of symbolic links (common first, arch on top) in its own cache
   (``$OBSHUB_CACHE/kheaders/X``) and points ``BCC_KERNEL_SOURCE`` at it for its own processes only.

The merged tree costs ~60 MB of directory entries, is made once, and nothing under /lib or /usr is edited.
Headers of an older kernel are fine for tracepoints (bcc reads their format from tracefs), raw tracepoints,
uprobes and USDT; struct layouts of the running kernel may differ, which is why obshub's probes read
tracepoint fields and arguments rather than kernel structs.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from obshub.core.settings import Settings
from obshub.core.stopping import run_child


@dataclass
class HeaderTree:
    """The header tree chosen: ``path`` to give bcc (None = bcc's default lookup works), ``source`` how it
    was found (``running-kernel``, ``kheaders``, ``distribution``, ``none``), ``version`` of the headers, and
    a human ``detail``."""

    path: Path | None
    source: str
    version: str
    detail: str

    def env(self) -> dict[str, str]:
        """Environment variables bcc needs to use this tree (empty when its defaults work)."""
        return {"BCC_KERNEL_SOURCE": str(self.path)} if self.path and self.source == "distribution" else {}


def _version_key(name: str) -> tuple:
    nums = re.findall(r"\d+", name)
    return tuple(int(n) for n in nums)


def _debian_pairs(usr_src: Path = Path("/usr/src")) -> list[tuple[str, Path, Path]]:
    """(version, arch_dir, common_dir) for every Debian-style split header package, newest first."""
    out = []
    if not usr_src.exists():
        return out
    for arch_dir in usr_src.glob("linux-headers-*"):
        name = arch_dir.name[len("linux-headers-") :]
        if name.endswith("-common") or not (arch_dir / ".config").exists():
            continue
        base = name.rsplit("-", 1)[0]  # 6.1.0-56-amd64 -> 6.1.0-56
        common = usr_src / f"linux-headers-{base}-common"
        if common.is_dir():
            out.append((name, arch_dir, common))
        elif (arch_dir / "include" / "linux" / "sched.h").exists():
            out.append((name, arch_dir, arch_dir))  # a non-split tree
    return sorted(out, key=lambda t: _version_key(t[0]), reverse=True)


def merge_tree(arch_dir: Path, common_dir: Path, dest: Path) -> Path:
    """Build ``dest`` as a tree of symbolic links: every file of ``common_dir``, then every file of
    ``arch_dir`` on top (arch wins). Idempotent: an existing complete tree is reused. Returns ``dest``."""
    marker = dest / ".obshub-merged"
    if marker.exists():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for src in [common_dir, arch_dir] if common_dir != arch_dir else [arch_dir]:
        run_child(["cp", "-rs", "--remove-destination", f"{src}/.", str(tmp)], check=True)
    (tmp / ".obshub-merged").write_text(f"arch={arch_dir}\ncommon={common_dir}\n")
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return dest


def find_header_tree(settings: Settings, create: bool = True) -> HeaderTree:
    """Choose the header tree for bcc as described in the module docstring. With ``create`` false the
    merged tree is only reported, not built."""
    release = platform.release()
    build = Path("/lib/modules") / release / "build"
    if (build / "include").exists() or (build / ".config").exists():
        return HeaderTree(None, "running-kernel", release, f"{build} matches the running kernel")
    if Path("/sys/kernel/kheaders.tar.xz").exists():
        return HeaderTree(None, "kheaders", release, "/sys/kernel/kheaders.tar.xz (CONFIG_IKHEADERS)")
    pairs = _debian_pairs()
    if not pairs:
        return HeaderTree(
            None, "none", "", f"no headers for {release} and none under /usr/src (apt-get install linux-headers-amd64)"
        )
    name, arch_dir, common = pairs[0]
    dest = settings.cache / "kheaders" / name
    if create:
        merge_tree(arch_dir, common, dest)
    return HeaderTree(
        dest,
        "distribution",
        name,
        f"merged {arch_dir} + {common} into {dest} (kernel {release} has no headers of its own)",
    )


def apply_env(settings: Settings) -> HeaderTree:
    """Find (and build if needed) the header tree and export ``BCC_KERNEL_SOURCE`` in this process, so
    every later ``bcc.BPF(...)`` compiles. Returns the tree chosen."""
    tree = find_header_tree(settings)
    os.environ.update(tree.env())
    return tree


def tracefs_mount() -> Path | None:
    """Where tracefs is mounted (``/sys/kernel/tracing`` or the debugfs path), or None."""
    for p in (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing")):
        if (p / "events").is_dir():
            return p
    return None


def ensure_tracefs() -> tuple[Path | None, str]:
    """Mount tracefs at /sys/kernel/tracing when it is not mounted (bcc attaches tracepoints and uprobes
    through it). Returns (mount point or None, what was done)."""
    found = tracefs_mount()
    if found:
        return found, f"tracefs at {found}"
    target = Path("/sys/kernel/tracing")
    proc = run_child(["mount", "-t", "tracefs", "nodev", str(target)])
    if proc.returncode == 0 and tracefs_mount():
        return target, f"mounted tracefs at {target} (it was not mounted)"
    return None, f"tracefs is not mounted and mounting it failed: {proc.stderr.strip()}"
