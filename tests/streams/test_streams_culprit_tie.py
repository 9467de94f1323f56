"""A tie of two hosts' network evidence names neither (demo20): the kept step of ``make demo`` whose tie
the host name broke, and the persistent fault's charge that names the lossy host instead."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from obshub.streams.analysis.culprit import charge_persistent, culprit

STEP = Path(__file__).with_name("data") / "demo20_makedemo_step126.json"


def _step() -> dict:
    """Step 126 of a ``make demo`` run (``bench.ttd --make-demo --keep``, 8 % net-loss on node-01, a CPU hog
    beside it, load ~6, 2026-12-07; /work/runs19/demo20-makedemo-hog4): x2.5, directed view, node-00 and
    node-01 both 3.0 spreads by ``rx`` (node-01 33 network records, node-00 3). Its kept culprit removed."""
    return json.loads(STEP.read_text())


def test_a_network_tie_the_host_name_broke_names_nobody():
    """On 29a55fb the tie went to node-00 by its name: a wrong ``step_stall`` node-00 / network (the same
    shape as newuser20-makedemo-fail1's, 3 spreads, "network 3 events")."""
    s = _step()
    hosts = s["evidence"]["hosts"]
    assert hosts["node-00"]["network"] == hosts["node-01"]["network"] == 3.0
    assert culprit(s) is None
    # either host standing out alone is named, whichever name sorts first
    for lone, other in (("node-00", "node-01"), ("node-01", "node-00")):
        t = copy.deepcopy(s)
        t["evidence"]["hosts"][other]["network"] = 2.9
        c = culprit(t)
        assert c is not None and (c["host"], c["layer"]) == (lone, "network")


def test_the_persistent_fault_names_the_lossy_host_in_the_tied_step():
    """The job's recent steps named node-01 / network (3 of the last 8 before step 126): the tied step,
    slowed (x2.5 >= PERSIST_SLOW), is charged to it and keeps it alive; without a recent culprit it names
    nobody."""
    s = _step()
    s["culprit"] = culprit(s)
    recent = [None, ("node-01", "network"), None, ("node-01", "network"), None, ("node-01", "network")]
    c, key = charge_persistent(s, recent)
    assert c is not None and (c["host"], c["layer"], c["source"]) == ("node-01", "network", "persistent")
    assert key == ("node-01", "network")
    assert charge_persistent(s, [None] * 8) == (None, None)
