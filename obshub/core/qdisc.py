"""Which traffic-control qdiscs this kernel takes, tried for real in a throwaway network namespace.

Used by ``obshub demo``'s argument check (a fault shaped with a qdisc the kernel lacks is refused before
anything is set up) and by ``obshub doctor`` (one row per qdisc the demo's faults use). The qdisc is added
as the root qdisc of the loopback of a new, unnamed network namespace (``unshare --net``): the namespace
lives only as long as that one ``tc`` process, so nothing is left behind, whatever happens to the caller
(Ctrl-C included), and no namespace of the machine (the demo's hosts) is touched.

Sources: tc(8), tc-netem(8), tc-tbf(8), unshare(1).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

#: the qdiscs the demo's faults use, as tc's words for a minimal one, and what each shapes
DEMO_QDISCS: dict[str, tuple[list[str], str]] = {
    "netem": (
        ["netem", "delay", "1ms"],
        "`obshub demo --fault stall --param layer=net --param delay_ms=N` (an RTT spike with netem delay)",
    ),
    "tbf": (
        ["tbf", "rate", "1000kbit", "burst", "16kb", "latency", "100ms"],
        "`obshub demo --fault net-slow` and `--fault stall --param layer=net --param rate_kbit=N`",
    ),
}


@functools.lru_cache(maxsize=16)
def qdisc_missing(name: str) -> str | None:
    """Whether the kernel lacks qdisc ``name`` (a key of :data:`DEMO_QDISCS`): tc's error (``Error:
    Specified qdisc kind is unknown.``) when it refused to add one, ``""`` when it was taken, None when
    it cannot be told here (not root, no ``unshare`` or ``tc``, a namespace that cannot be made): the
    caller then lets the fault try. Answers are cached for the process (the kernel's qdiscs do not change
    under it; a module loaded meanwhile is seen by the next command). Raises KeyError for another name."""
    words, _what = DEMO_QDISCS[name]
    unshare, tc = shutil.which("unshare"), shutil.which("tc") or shutil.which("tc", path="/usr/sbin:/sbin")
    if os.geteuid() != 0 or unshare is None or tc is None:
        return None
    try:
        out = subprocess.run(
            [unshare, "--net", tc, "qdisc", "add", "dev", "lo", "root", *words],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode == 0:
        return ""
    err = out.stderr.strip()
    if err.startswith("unshare:"):  # the namespace itself could not be made
        return None
    return err or f"tc exited {out.returncode}"
