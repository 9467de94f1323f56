"""The culprit of a step: the host and layer one step is charged to, for the single-step stall rules
(docs/ANALYSIS.md "Culprit of a step"), and the culprit of a step that hung."""

from __future__ import annotations

CULPRIT_LAYER = {"pytorch": "process"}
"""Culprit layer names that differ from the evidence layer's: lateness no lower layer explains is the
rank's own process (stopped, frozen, or its own code slow), named ``process`` as the hang rules do."""
CULPRIT_MIN_EVIDENCE = 2.0
"""The least per-step evidence (spreads) that names a culprit: on recorded demo stalls the true culprit had
4-7, while a blackout step whose retransmits fell outside it left only run-queue noise of 1.4-1.6 spreads
on two hosts, which must not name one of them."""
_SPECIFIC_FIRST = {layer: i for i, layer in enumerate(("network", "sched", "memory", "cuda", "nic", "pcie", "pytorch"))}


def culprit(summary: dict) -> dict | None:
    """The host and layer one step is charged to, for the single-step stall rules (docs/ANALYSIS.md
    "Culprit of a step"): ``{host, layer, evidence, source, why}`` or None when nothing names one.

    1. ``source`` "evidence": the (host, layer) with the largest per-step evidence (``evidence.hosts``, in
       spreads), at least ``CULPRIT_MIN_EVIDENCE``; on a tie a named layer (network, sched, memory, cuda, nic) wins over unexplained
       lateness (``pytorch``), then the host name; ``evidence`` is that value;
    2. else ``source`` "blame": the straggler and its first blamed layer (``evidence`` 0): a step without
       per-step evidence (the job's first steps, the steps right after a hang);
    3. else None (no straggler and no evidence: every host equally slow, or nothing to compare).

    The worker charges a step that hung to the rank its hang record named instead (``hang_culprit``,
    ``source`` "hang").

    Layer ``pytorch`` is named ``process`` (``CULPRIT_LAYER``); a straggler without any blamed layer too.
    Reads only ``evidence``, ``straggler`` and ``blame`` of ``summary``, so a caller that changes those
    (the worker drops the evidence of the steps after a hang) recomputes it."""
    best: tuple | None = None
    for h, zs in ((summary.get("evidence") or {}).get("hosts") or {}).items():
        for layer, z in zs.items():
            if z >= CULPRIT_MIN_EVIDENCE:
                key = (-z, _SPECIFIC_FIRST.get(layer, len(_SPECIFIC_FIRST)), h)
                if best is None or key < best[0]:
                    best = (key, h, layer, z)
    strag = summary.get("straggler")
    if best is not None:
        _key, h, layer, z = best
        spread = (summary.get("evidence") or {}).get("spread_ns", 0)
        why = f"{layer} evidence {z:g} spreads of {spread / 1e6:.1f} ms"
        if strag and strag.get("host") == h:
            why += f"; straggler: {strag.get('reason', '')}"
        return {"host": h, "layer": CULPRIT_LAYER.get(layer, layer), "evidence": z, "source": "evidence", "why": why}
    if strag:
        mine = [b for b in summary.get("blame") or [] if b.get("host") == strag["host"]]
        layer = mine[0]["layer"] if mine else "pytorch"
        why = f"straggler: {strag.get('reason', '')}" + (
            f"; blamed {layer} +{mine[0]['excess_ns'] / 1e6:.1f} ms over its peers" if mine else "; no layer blamed"
        )
        return {
            "host": strag["host"],
            "layer": CULPRIT_LAYER.get(layer, layer),
            "evidence": 0.0,
            "source": "blame",
            "why": why,
        }
    return None


def hang_culprit(hosts: list[dict]) -> dict | None:
    """The culprit of a closed step that hung (``source`` "hang"), from the ``hosts`` of its latest hang
    record (``hang.hosts``: ``{host, state, last_phase, ...}``): the first named host, layer ``network``
    when it was ``unreachable`` (its peers retransmitted toward it), else ``process`` (silent, frozen,
    stopped or exited), as the hang rules name them; None without hosts."""
    if not hosts:
        return None
    h = hosts[0]
    state = h.get("state", "silent")
    return {
        "host": h["host"],
        "layer": "network" if state == "unreachable" else "process",
        "evidence": 0.0,
        "source": "hang",
        "why": f"the step hung on it ({state}; {h.get('last_phase', '?')})"
        + (f"; {len(hosts) - 1} more rank(s) named" if len(hosts) > 1 else ""),
    }
