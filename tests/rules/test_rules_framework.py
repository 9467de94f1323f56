"""A stall that a framework's loop splits across two steps by rank (PyTorch Lightning's broadcast at every
batch's start), on a kept live run's real step summaries: the worker's culprit chain (analysis.culprit,
culprit_rank, charge_starved, charge_persistent, as streams/fold.py runs it) over the run's closed steps,
then the builtin pack (docs/ANALYSIS.md "A stall carried into the next step")."""

from __future__ import annotations

import copy

import pytest

from obshub.streams import analysis
from tests.rules.test_rules_burst import fire_at_close, kept, recharge


def test_a_blackout_split_across_two_steps_by_lightnings_broadcast_is_charged_to_the_link_not_the_root():
    # frame21-lightning-net: 800 ms blackouts of node-01 every 12 s under a PyTorch Lightning Trainer (4 hosts,
    # 1 rank each). Lightning broadcasts a SIGTERM check from rank 0 at every batch's start, so the second
    # blackout held node-00 and node-01 in step 483 (976 ms; named node-01 / network by its drops), while
    # node-02 and node-03, done with 483, waited for them at 484's broadcast (988 ms, x6.0): 484 had
    # node-01 +419 ms and node-00 +418 ms late, and named the broadcast's root node-00 rank 0 / process by
    # 7 spreads of lateness, a wrong step_stall (0d7639e). The late ranks carry 483's stall: node-01 / network.
    run = kept("frame21_lightning_net")
    steps = recharge(run["steps"])
    by_step = {s["step"]: s for s in steps}
    c484 = by_step[484]["culprit"]
    assert (c484["host"], c484["layer"], c484["source"]) == ("node-01", "network", "persistent")
    assert "late ranks (node-00, node-01) carry that stall" in c484["why"]
    assert (by_step[483]["culprit"]["host"], by_step[483]["culprit"]["layer"]) == ("node-01", "network")

    firing = fire_at_close(steps)
    first = min(run["stall_starts_ns"])
    # nothing before the first blackout (60 s of clean training), and every alert names the fault's host and
    # layer: no node-00 / process any more
    assert not [a for a in firing if a["starts_at_ns"] < first], firing
    assert {(a["labels"]["host"], a["labels"]["layer"]) for a in firing} == {("node-01", "network")}
    # every blackout named by step_stall within 5 s of its start
    named = [a["starts_at_ns"] for a in firing if a["rule"] == "step_stall"]
    for t0 in run["stall_starts_ns"]:
        assert any(0 <= t - t0 <= 5_000_000_000 for t in named), (t0, named)


@pytest.mark.parametrize("link_late_ms", [None, 20])
def test_lateness_of_ranks_that_carry_no_stall_of_the_step_before_stays_their_own(link_late_ms):
    # the same step 484 with the root late alone (node-01 left out of the late group), or with node-01 in
    # it by 20 ms only, under EXPLAIN_REL of the 823 ms the step lost (a bystander: live, accum, frame22
    # step 544 had node-03 +23 ms beside node-00 +142 ms in a step that lost 240 ms, the step after
    # node-03 / sched): nobody carries 483's stall, so node-00's lateness stays node-00 / process
    run = kept("frame21_lightning_net")
    steps = sorted(run["steps"], key=lambda s: s["closed_at_ns"])
    i = next(i for i, s in enumerate(steps) if s["step"] == 484)
    step = copy.deepcopy(steps[i])
    group = step["straggler"]["group"]
    if link_late_ms is None:
        step["straggler"]["group"] = [g for g in group if g["host"] == "node-00"]
    else:
        for g in group:
            if g["host"] == "node-01":
                g["late_ns"] = link_late_ms * 1_000_000
    recent = [analysis.persistent_key(s["culprit"]) for s in recharge(steps[:i])][-analysis.PERSIST_STEPS :]
    assert recent[-1] == ("node-01", "network")
    step["culprit"] = analysis.culprit_rank(analysis.culprit(step), step)
    assert (step["culprit"]["host"], step["culprit"]["layer"]) == ("node-00", "process")
    c, key = analysis.charge_persistent(step, recent)
    assert (c["host"], c["layer"], c["source"]) == ("node-00", "process", "evidence")
    assert key is None


def test_a_stall_carried_into_the_next_step_counts_once_toward_the_escalation():
    # the same run: 4 blackouts of node-01 (12 s apart) named by step_stall on steps 417, 483, 574 and 660;
    # the second one is charged to 483 and to 484 (484 carries it), both x5.9-x6.0. Counted per step
    # (f174a23), step_stall_recurring (3 in 10 minutes) paged critical at step 484, 13.2 s after the first
    # blackout: two stalls counted as three. Two consecutive stalled steps of one host and layer are one
    # stall now: it pages at the third blackout (step 574) and says 3 stalls in 4 stalled steps.
    run = kept("frame21_lightning_net")
    steps = recharge(run["steps"])
    starts = sorted(run["stall_starts_ns"])
    firing = fire_at_close(steps)
    stalled = [int(a["annotations"]["step"]) for a in firing if a["rule"] == "step_stall"]
    assert stalled == [417, 483, 574, 660]
    by_step = {s["step"]: s for s in steps}
    assert (by_step[484]["culprit"]["host"], by_step[484]["culprit"]["layer"]) == ("node-01", "network")
    rec = [a for a in firing if a["rule"] == "step_stall_recurring"]
    assert len(rec) == 1, rec
    assert rec[0]["annotations"]["step"] == "574"
    assert rec[0]["starts_at_ns"] >= starts[2]
    assert " 3 times in 10 min " in rec[0]["annotations"]["summary"]
    assert rec[0]["annotations"]["evidence"].startswith(
        "3 stalls (4 stalled steps, two consecutive steps counted as one)"
    )
