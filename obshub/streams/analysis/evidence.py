"""The job's baseline (median, p99, spread of recent step times) and the sequential evidence per (host,
layer) that the rules' CUSUM sums (docs/ANALYSIS.md "Sequential detection")."""

from __future__ import annotations

import msgspec
import numpy as np

from obshub.streams.analysis.network import NetStats, net_evidence
from obshub.streams.analysis.stats import LeaveOneOut, median_int, p99_int, quantile_int
from obshub.streams.analysis.straggler import LayerColumns
from obshub.streams.analysis.thresholds import Thresholds


class Baseline(msgspec.Struct):
    """The job's baseline before a step (``baseline``), the summary's ``baseline`` map (its fields in
    this order). ``median_ns``/``p99_ns``: median and p99 (nearest rank) of the recent step times (ns,
    the longest host step time of each step); ``n``: how many steps it is made of (0: no baseline yet;
    lateness-based evidence needs ``Thresholds.baseline_min_n``); ``spread_ns``: the job's recent spread
    of lateness (ns), the unit of the sequential evidence."""

    median_ns: int = 0
    p99_ns: int = 0
    n: int = 0
    spread_ns: int = 0


OWN_TIME_EXPLAIN_REL = 0.25
"""``evidence``: a host's own time-layer lateness takes the place of its connection-based network evidence
only when it makes up at least this part of what the step lost over the job's median step (the culprit's
``EXPLAIN_REL``): a node-02 whose link queued at 20 Mbit for 300 ms (x3.96, 291 ms lost, 4 retransmits on
each busy connection) had 11.7 ms of run-queue excess over its peers on a loaded 2-core host, 1.13
spreads, which hid its network evidence and named nobody (stall11)."""

EVIDENCE_LAYERS = ("sched", "memory", "cuda", "nic", "network", "pytorch")
"""Layers the sequential evidence covers (``evidence``); each host entry carries all of them."""


class HostEvidence(msgspec.Struct):
    """One host's evidence in one step (``evidence``): per layer of ``EVIDENCE_LAYERS`` (its fields, in
    that order) a value in units of the job's recent spread of lateness (dimensionless, ``>= 0``, clipped
    to ``Thresholds.evidence_clip``, rounded to 3 places), 0.0 where the layer has none."""

    sched: float = 0.0
    memory: float = 0.0
    cuda: float = 0.0
    nic: float = 0.0
    network: float = 0.0
    pytorch: float = 0.0

    def top(self) -> float:
        """The largest value of the host's layers (spreads)."""
        return max(self.sched, self.memory, self.cuda, self.nic, self.network, self.pytorch)


class Evidence(msgspec.Struct):
    """A step's sequential evidence (``evidence``), the summary's ``evidence`` map: ``spread_ns`` the
    unit of its values (ns, the baseline's spread or ``Thresholds.spread_min_ns``), ``hosts`` per host
    (sorted) with a value above 0 its ``HostEvidence``, ``ranks`` per such host the rank its evidence
    names (filled by ``summarize``; a host whose rank is unknown is left out), ``net_view`` per host whose
    evidence is ``network`` the view of its connections that gave it (``NetEvidence.view``, a key of
    ``schema.NET_VIEWS``; ``summarize`` writes it to the summary only when it names a host)."""

    spread_ns: int
    hosts: dict[str, HostEvidence]
    ranks: dict[str, int] = {}
    net_view: dict[str, str] = {}


def baseline(history: list[list[int]], step: int, th: Thresholds) -> Baseline:
    """The ``Baseline`` over the last ``baseline_n`` entries ``[step,
    step_time_max_ns, late_max_ns]`` of the job's history with a step number below ``step`` (entries
    of two values, written by an older worker, have no lateness). ``spread_ns`` is the job's recent spread
    of lateness: ``max(spread_min_ns, spread_rel * median_ns, quantile_int(late_max_ns, spread_q))``, a
    high quantile because lateness on a shared machine is heavy-tailed (docs/ANALYSIS.md "Sequential
    detection")."""
    prior = sorted((e[0], e[1], e[2] if len(e) > 2 else None) for e in history if e[0] < step)[-th.baseline_n :]
    times = [t for _s, t, _l in prior]
    med = median_int(times)
    lates = [x for _s, _t, x in prior if x is not None]
    spread = max(th.spread_min_ns, int(th.spread_rel * med), quantile_int(lates, th.spread_q))
    return Baseline(med, p99_int(times), len(times), spread)


TIME_EVIDENCE = ("sched", "memory", "cuda", "nic")
"""The time layers of the evidence: the host's own lost time that made it late."""


def evidence(
    accs: dict[str, dict],
    late: dict[str, int],
    layers: dict,
    bl: Baseline,
    th: Thresholds,
    recent_directed: bool = False,
    stats: NetStats | None = None,
    window_stats: NetStats | None = None,
    lost_ns: int = 0,
) -> Evidence:
    """Per-step evidence for the rules' sequential test (docs/ANALYSIS.md "Sequential detection"):
    ``Evidence(spread_ns=s, hosts={host: HostEvidence}, net_view={host: view})`` with each layer's ``z`` in units
    of the job's recent spread ``s`` (``bl.spread_ns``), clipped to ``[0, evidence_clip]``, rounded to 3 places; a
    host appears only when one of its values is above 0; ``net_view`` names, per host whose evidence is
    ``network``, the view of its connections that gave it (``NetEvidence.view``).

    - time layers L (sched, memory, cuda, nic): ``min(late(h), excess(h, L)) / s``: the host's own layer
      time above the median of its peers, counted only as far as it made the host late (a victim is not
      late; a host whose extra layer time delayed nobody is no culprit);
    - pytorch: ``max(0, late(h) - sum of those excesses) / s``: lateness no lower layer explains;
    - network (>= 3 hosts, from ``net_stats``): the larger of ``(rx(h) - m_rx) / sqrt(m_rx + 1)`` and
      ``(rtt(h) - m_rtt) / max(m_rtt, rtt_scale_ns)``, ``m_*`` the median over the other hosts: loss or
      delay on every busy connection of the host (its late arrival is not needed: a slow link slows
      every rank alike). A host's own retransmit count is no evidence against it: a segment is
      retransmitted by its sender, which is the peer of the host whose link drops it.

    One cause per host and step: a host with connection-based network evidence keeps only that, unless
    its time-layer evidence reaches ``min(1, network evidence)`` (its own lost time made it at least one
    spread late) and that lateness (spreads x ``s``) makes up ``OWN_TIME_EXPLAIN_REL`` of ``lost_ns`` (ns
    the step lost over the job's median step, 0 when not known): then it keeps only the time layers. A
    slow link makes its host late without any run-queue or memory excess, while a host starved of CPU or
    stalled in reclaim answers its peers late, which raises the RTT of all of its connections; a few ms
    of a loaded machine's run-queue noise in a step that lost hundreds does not explain its link. Lateness-based values need a
    baseline (``bl.n >= baseline_min_n``): the start of a job is noisy. ``recent_directed``, ``stats``:
    see ``net_evidence``."""
    s = max(1, int(bl.spread_ns or th.spread_min_ns))
    clip = th.evidence_clip

    columns = layers if isinstance(layers, LayerColumns) else None  # a wide step: no row built

    def layer_value(g: str, layer: str, field: str) -> int:
        if columns is not None:
            return columns.value(g, layer, 0)  # field is "time_ns" (the only one read)
        return layers.get(g, {}).get(layer, {}).get(field, 0)

    out: dict[str, HostEvidence] = {}

    def put(h: str, layer: str, z: float) -> None:
        z = round(min(clip, max(0.0, z)), 3)
        if z > 0:
            mine = out.get(h)
            if mine is None:
                mine = out[h] = HostEvidence()
            setattr(mine, layer, z)

    if bl.n >= th.baseline_min_n and len(accs) >= 2:
        if not (
            columns is not None and set(accs) == set(columns) and _time_evidence_columns(columns, late, s, clip, out)
        ):
            peer_time = {layer: LeaveOneOut(layer_value(g, layer, "time_ns") for g in accs) for layer in TIME_EVIDENCE}
            for h, lt in late.items():
                if lt <= 0:
                    continue
                explained = 0
                for layer in TIME_EVIDENCE:
                    mine = layer_value(h, layer, "time_ns")
                    peer = peer_time[layer].median_without(mine)
                    ex = max(0, mine - peer)
                    explained += ex
                    put(h, layer, min(lt, ex) / s)
                put(h, "pytorch", (lt - explained) / s)
    net_view: dict[str, str] = {}
    for h, net in net_evidence(accs, th, recent_directed, stats, window_stats).items():
        have = out.get(h)
        z_time = max(have.sched, have.memory, have.cuda, have.nic) if have is not None else 0.0
        if z_time >= min(1.0, net.z) and z_time * s >= OWN_TIME_EXPLAIN_REL * lost_ns:
            continue  # its own CPU or memory made it late, and slow to answer on every connection
        # its connections explain its lateness (a slow link delays its own collectives): no other
        # layer of it is the culprit in this step
        out[h] = HostEvidence(network=net.z)
        if net.view:
            net_view[h] = net.view
    return Evidence(s, {h: out[h] for h in sorted(out)}, net_view=net_view)


def _peer_excess(values: np.ndarray) -> np.ndarray:
    """Per host, its value above the median of the other hosts' values (ns, ``>= 0``), for ``values``
    (int64, one per host, n >= 2): ``max(0, v - LeaveOneOut(values).median_without(v))`` for all hosts at
    once, from one sort (the median of the rest as ``median_int``: the mean of the two middle values,
    floored)."""
    srt = np.sort(values, kind="stable")
    n = len(srt) - 1  # the values left once the host's own is left out
    i = np.searchsorted(srt, values, side="left")  # where the host's own value sits in the sort

    def at(k: int) -> np.ndarray:  # the k-th smallest once each host's own value is left out
        return np.where(k < i, srt[k], srt[min(k + 1, n)])

    peer = at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) // 2
    return np.maximum(values - peer, 0)


_COLUMN_BOUND = 2**59
"""``_time_evidence_columns`` takes layer times and lateness within ``+-_COLUMN_BOUND`` ns (the sum of four
excesses and a lateness stays within int64); a step with a value beyond it takes the per-host loop."""


def _time_evidence_columns(
    columns: LayerColumns, late: dict[str, int], s: int, clip: float, out: dict[str, HostEvidence]
) -> bool:
    """``evidence``'s time layers and pytorch value of every late host of a wide step, column-wise: the
    same values as the per-host loop (each a Python float ``round(min(clip, x / s), 3)`` of the same ints
    ``x``, 0.0 where ``x <= 0``), a ``HostEvidence`` in ``out`` (``{host: HostEvidence}``, empty before)
    for each host with a value above 0. ``columns``: the step's layer table (its hosts are the step's);
    ``late``: ns per host; ``s``: the spread (ns, >= 1). False (``out`` untouched) when a value lies beyond
    ``_COLUMN_BOUND``: the caller takes the per-host loop."""
    pos = {h: k for k, h in enumerate(columns)}
    late_hs = [h for h, lt in late.items() if lt > 0]
    if not late_hs:
        return True
    times = [columns.full(layer, 0) for layer in TIME_EVIDENCE]
    if any(min(c) <= -_COLUMN_BOUND or max(c) >= _COLUMN_BOUND for c in times) or max(late.values()) >= _COLUMN_BOUND:
        return False
    idx = np.fromiter((pos[h] for h in late_hs), dtype=np.int64, count=len(late_hs))
    lt = np.fromiter((late[h] for h in late_hs), dtype=np.int64, count=len(late_hs))
    num = np.empty((len(TIME_EVIDENCE) + 1, len(late_hs)), dtype=np.int64)  # ns: the time layers, pytorch
    for r, col in enumerate(times):
        num[r] = _peer_excess(np.asarray(col, dtype=np.int64))[idx]
    num[-1] = lt - num[:-1].sum(axis=0)  # lateness no time layer explains
    np.minimum(num[:-1], lt, out=num[:-1])  # a time layer counts only as far as it made the host late
    some = np.flatnonzero((num > 0).any(axis=0))
    for k, row in zip(some.tolist(), num[:, some].T.tolist()):
        z = [round(min(clip, x / s), 3) if x > 0 else 0.0 for x in row]
        if any(z):
            out[late_hs[k]] = HostEvidence(z[0], z[1], z[2], z[3], 0.0, z[4])
    return True


def history_entry(summary: dict) -> list[int]:
    """The job-history entry of a closed step: ``[step, step_time_max_ns, late_max_ns]`` (the largest
    lateness of any host in the step, the sample of the job's spread of lateness)."""
    return [summary["step"], summary["step_time_max_ns"], int(summary.get("late_max_ns") or 0)]
