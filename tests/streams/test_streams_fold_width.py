"""The fold at width (issue #30 item 4): what a step's close and a registration cost must not grow with the
job's ranks where it need not. The ``jobs`` record no longer carries every rank's process (it was
rewritten with each step's history: 262 KB at 2,048 hosts x 8 ranks), and a record an older worker wrote
with them still tells a restarted rank from a registration repeated; the layer culprit's peer medians
come from one sort (a sort per host cost 1.7-2.0 s of a 2,048-host step's close)."""

from __future__ import annotations

import importlib
import random

from obshub.streams import fold as fold_mod
from obshub.streams import wire
from obshub.streams.inproc import ChangelogDict
from obshub.streams.topics import TABLES

C = importlib.import_module("obshub.streams.analysis.culprit")  # the package's ``culprit`` is the function


def _fold() -> fold_mod.Fold:
    return fold_mod.Fold({name: ChangelogDict() for name in TABLES}, window_ns=10**9, clock=lambda: 10**18)


def _register(f: fold_mod.Fold, rank: int, pid: int, host: str | None = None, world: int = 0) -> list:
    host = host or f"node{rank // 8}"
    msg = {"t": "host", "job": "j", "host": host, "host_id": rank // 8, "rank": rank, "world_size": world, "pid": pid}
    return f.apply(msg, 0)


def test_the_jobs_record_does_not_grow_with_the_ranks_registered():
    sizes = {}
    for n in (64, 2048):
        f = _fold()
        for r in range(n):
            _register(f, r, 1000 + r, world=n)
        js = f.jobs["j@0"]
        assert js["n_ranks"] == n and "pids" not in js
        sizes[n] = len(wire.packb(js))
    # the bucket lists grow to at most 256 numbers each; every rank's [host, pid] took ~16 bytes (32 KB here)
    assert sizes[2048] - sizes[64] < 1024, sizes


def test_a_restarted_rank_starts_a_new_life_and_a_repeated_registration_does_not():
    f = _fold()
    for r in range(16):
        _register(f, r, 1000 + r, world=16)
    _register(f, 3, 1003)  # the same process again (an agent's restart): same life
    assert int(f.jobs["j@0"].get("life") or 0) == 0
    _register(f, 3, 2003)  # another process under rank 3: torchrun restarted the job
    assert int(f.jobs["j@0"]["life"]) == 1
    assert f.jobs["j@0"]["n_ranks"] == 1


def test_a_jobs_record_of_an_older_worker_with_every_ranks_pid_still_tells_a_restart():
    f = _fold()
    for r in range(16):
        _register(f, r, 1000 + r, world=16)
    # rewrite the state as an older worker left it: every rank's [host, pid] in the jobs record, the rank
    # buckets naming the host only
    js = dict(f.jobs["j@0"])
    js["pids"] = {str(r): [f"node{r // 8}", 1000 + r] for r in range(16)}
    f.jobs["j@0"] = js
    for k in [k for k in f.members if "#r" in k]:
        f.members[k] = {r: (v[0] if isinstance(v, list) else v) for r, v in f.members[k].items()}
    restarted = fold_mod.Fold(
        {
            name: t.recovered()
            for name, t in {
                "parts": f.parts,
                "steps": f.steps,
                "members": f.members,
                "jobs": f.jobs,
                "closed": f.closed,
                "agents": ChangelogDict(),
            }.items()
        },
        window_ns=10**9,
        clock=lambda: 10**18,
    )
    _register(restarted, 5, 1005)  # the same process: no new life, its bucket now names its pid
    assert int(restarted.jobs["j@0"].get("life") or 0) == 0
    assert restarted.members[f"j@0#r{5 % fold_mod.BUCKETS}"]["5"] == ["node0", 1005]
    _register(restarted, 9, 7009)  # rank 9 in another process: known from the older record's pids
    assert int(restarted.jobs["j@0"]["life"]) == 1
    assert "pids" not in restarted.jobs["j@0"]


def _layer_culprit_reference(summary: dict, lost: int) -> dict | None:
    """The layer culprit as written before (a sort of the peers per host), for comparison."""
    layers = summary["layers"]
    found = []
    for layer in C.LAYER_CULPRIT:
        times = {h: (row.get(layer) or {}).get("time_ns", 0) for h, row in layers.items()}
        if len(times) < 2:
            continue
        for h, t in times.items():
            peers = sorted(v for g, v in times.items() if g != h)
            ref = peers[(len(peers) - 1) // 2]
            ex = t - ref
            if ex >= C.EXPLAIN_REL * lost and ex > 0:
                found.append((ex, h, layer, ref))
    found.sort(reverse=True)
    if not found or any(f[1] != found[0][1] and f[0] >= C.AMBIGUOUS_REL * found[0][0] for f in found[1:]):
        return None
    return {"host": found[0][1], "layer": found[0][2]}


def test_the_layer_culprit_names_what_a_sort_per_host_named():
    rnd = random.Random(7)
    named = 0
    for _ in range(400):
        n = rnd.randint(2, 9)
        layers = {
            f"h{i}": {layer: {"time_ns": rnd.choice((0, 1, 2, 5, 40, 300)) * 10**6} for layer in C.LAYER_CULPRIT}
            for i in range(n)
        }
        lost = rnd.choice((10**6, 50 * 10**6, 400 * 10**6))
        got = C._layer_culprit({"layers": layers}, lost)
        want = _layer_culprit_reference({"layers": layers}, lost)
        assert (got and {"host": got["host"], "layer": got["layer"]}) == want
        named += want is not None
    assert named > 20  # the comparison covered steps with a culprit
