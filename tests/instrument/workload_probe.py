"""Run a workload module as ``python -m MODULE ARGS`` would, recording every USDT probe the hooks fire:
``obshub run -- python tests/instrument/workload_probe.py OUT.json MODULE ARGS...``.

``obshub run``'s bootstrap enables the hooks when the module imports torch, exactly as in the demo; this
wrapper only turns the recording of ``obshub.instrument._usdt`` on first and keeps the merged probes off
(an agent of another test on this machine may follow every registered process), and at exit writes
``{"calls": [[probe, *args], ...]}`` to OUT.json, in firing order.
"""

from __future__ import annotations

import atexit
import json
import runpy
import sys

from obshub.instrument import usdt

OUT, MODULE = sys.argv[1], sys.argv[2]
usdt._usdt._record(True)
_real_sites = {usdt.probe_site(n) for n in ("register", "phase_next", "step_next", "coll")} - {None}
_site_traced = usdt.site_traced
usdt.site_traced = lambda address: address not in _real_sites and _site_traced(address)


def _dump() -> None:
    with open(OUT, "w") as f:
        json.dump({"calls": [list(c) for c in usdt._usdt._recorded()]}, f)


atexit.register(_dump)
sys.argv = [MODULE, *sys.argv[3:]]
runpy.run_module(MODULE, run_name="__main__", alter_sys=True)
