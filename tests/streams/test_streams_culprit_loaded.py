"""A network culprit measured while the whole machine was starved of CPU is vetoed (noise23): the real kept
steps of a ``make demo`` run whose step 43 fired a wrong ``step_stall`` node-03 / network at load 4+, and
the charge's own test (``culprit._loaded_net``, through ``charge_starved``) on shapes around it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from obshub.streams import analysis
from obshub.streams.analysis.culprit import SELF_MIN
from tests.support import replaykit

STEPS = Path(__file__).with_name("data") / "lead23_makedemo_steps.jsonl.gz"


def _run() -> tuple[dict, list[dict]]:
    """The kept run (``bench.stall_replay --pack`` format, steps 1-70): ``make demo`` (``obshub demo --hosts 4
    --fault net-loss --fault-host 1``) on a fresh clone of f174a23, 2026-12-07 15:46 UTC, load rising to 4+
    while four other sessions started; the job's step summaries read back from the broker
    (/work/runs19/lead23-makedemo-steps). Its verdict: ``{fault, host, layer, t0_ns}`` (t0: the injection)."""
    lines = gzip.decompress(STEPS.read_bytes()).decode().splitlines()
    return json.loads(lines[0])["report"]["verdict"], [json.loads(ln) for ln in lines[1:] if ln.strip()]


def _replay() -> tuple[dict[int, dict], list[dict]]:
    """Each closed step's culprit recomputed as the worker does, the running records as kept, all through the
    builtin pack in close order (``replaykit.replay_steps``): ``({step: closed summary}, firing changes)``."""
    _verdict, steps = _run()
    return replaykit.replay_steps(steps)


def test_make_demos_starved_machine_names_no_link_before_the_fault():
    """Step 43 (x2.58, 370 ms lost): node-03 / network by 2 spreads of ``rx``, directed, while every host
    waited 811-956 ms in its run queue, 672-851 ms over its own recent steps. On f174a23 it fired
    ``step_stall`` node-03 / network 2.4 s before the fault (``stall_weak_net``); now the culprit stays,
    vetoed (``runq_veto``), and nothing fires before the injection, while the real loss on node-01 is
    still named at its first slowed step (54) and by no other host or layer."""
    verdict, _steps = _run()
    closed, fired = _replay()
    early = [(f["rule"], f["annotations"].get("step")) for f in fired if f["starts_at_ns"] < verdict["t0_ns"]]
    assert early == []  # f174a23: [('step_stall', '43')]
    c = closed[43]["culprit"]
    assert (c["host"], c["layer"], c["source"]) == ("node-03", "network", "evidence")
    assert c["runq_veto"] is True and "every host's run queue vetoes it" in c["why"]
    stalls = [f for f in fired if f["rule"] == "step_stall"]
    assert stalls, "the real fault must still be named"
    first = min(stalls, key=lambda f: f["starts_at_ns"])
    assert (first["labels"]["host"], first["labels"]["layer"], first["annotations"]["step"]) == (
        "node-01",
        "network",
        "54",
    )
    assert {(f["labels"]["host"], f["labels"]["layer"]) for f in stalls} == {("node-01", "network")}
    # the real loss's steps left the run queues at or under their own recent medians: none vetoed
    for step in (54, 55, 56, 57, 59):
        c = closed[step]["culprit"]
        assert c is not None and c["host"] == "node-01" and not c.get("runq_veto"), (step, c)


def _loaded_step(rises_ms: dict[str, int], lost_ms: int = 370, median_ms: int = 235) -> tuple[dict, list[dict]]:
    """A 4-host step charged to node-03 / network by 2 spreads (directed), with each host's run-queue time
    ``rises_ms`` over a flat history of 100 ms (16 recent parts), and what the step lost over its median."""
    recent = [{h: 100_000_000 for h in rises_ms} for _ in range(analysis.SELF_STEPS)]
    s = {
        "step": 43,
        "baseline": {"n": 43, "median_ns": median_ms * 1_000_000, "spread_ns": 65_000_000},
        "step_time_max_ns": (median_ms + lost_ms) * 1_000_000,
        "net_directed": True,
        "layers": {h: {"sched": {"time_ns": (100 + r) * 1_000_000, "count": 8}} for h, r in rises_ms.items()},
        "evidence": {"spread_ns": 65_000_000, "hosts": {}},
        "culprit": {
            "host": "node-03",
            "layer": "network",
            "evidence": 2.0,
            "source": "evidence",
            "net_view": "rx",
            "runq_veto": False,
            "why": "network evidence 2 spreads of 65.0 ms",
        },
    }
    return s, recent


def test_a_machine_starved_as_a_whole_vetoes_the_network_culprit():
    s, recent = _loaded_step({"node-00": 825, "node-01": 672, "node-02": 851, "node-03": 753})
    analysis.charge_starved(s, recent)
    c = s["culprit"]
    assert (c["host"], c["layer"], c["runq_veto"]) == ("node-03", "network", True)
    assert "+672 ms or more" in c["why"] and "370 ms lost" in c["why"]


def test_one_host_that_did_not_rise_keeps_the_culprit():
    """A blackout's host sleeps on its sockets: its run queue stays near its own steps while its peers'
    rise with outside load, so the link is not vetoed (nor when any host rose less than the loss)."""
    for rises in (
        {"node-00": 825, "node-01": 672, "node-02": 851, "node-03": 40},
        {"node-00": 825, "node-01": 369, "node-02": 851, "node-03": 753},
    ):
        s, recent = _loaded_step(rises)
        analysis.charge_starved(s, recent)
        assert s["culprit"]["runq_veto"] is False, rises


def test_without_the_hosts_own_steps_nothing_is_vetoed():
    """Fewer than ``SELF_MIN`` recent steps of a host (a job's first steps), a step that lost nothing, a wide
    step with omitted rows, or another layer's culprit: the culprit is left as it is."""
    rises = {"node-00": 825, "node-01": 672, "node-02": 851, "node-03": 753}
    s, recent = _loaded_step(rises)
    analysis.charge_starved(s, recent[: SELF_MIN - 1])
    assert s["culprit"]["runq_veto"] is False
    s, recent = _loaded_step(rises, lost_ms=0)
    analysis.charge_starved(s, recent)
    assert s["culprit"]["runq_veto"] is False
    s, recent = _loaded_step(rises)
    s["layers_omitted"] = 2
    analysis.charge_starved(s, recent)
    assert s["culprit"]["runq_veto"] is False
    from obshub.streams.analysis.culprit import _loaded_net  # noqa: PLC0415  (the charge's own test)

    s, recent = _loaded_step(rises)
    s["culprit"] = dict(s["culprit"], layer="process", runq_veto=None)
    part = analysis.sched_times(s)
    _loaded_net(s, recent, part)
    assert s["culprit"]["runq_veto"] is None
