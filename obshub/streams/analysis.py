"""Step analysis, pure functions: per-host accumulators of one closed step -> the step summary.

Every formula here is written out in docs/ANALYSIS.md with its reasons; this docstring only names them.

- step time per host: the STEP_END ``duration_ns``;
- compute time per host: step time minus the union of its collective intervals (time not spent inside
  a collective), the ``pytorch`` layer's ``time_ns``;
- per collective ``(pg, coll_seq)`` seen by >= 2 hosts: arrival = offset-corrected COLLECTIVE_BEGIN time,
  skew = latest - earliest, last arriver, uncertainty = clock uncertainty of the latest + the earliest;
- straggler: the host whose late arrival kept the others waiting longest (lead over the second-latest
  arrival, beyond both clocks' uncertainty), or, without collectives, the largest compute excess over the
  peer median; named only when the excess passes ``Thresholds``;
- layer blame for the straggler: per layer ``time_ns`` minus the median of the same layer on its peers,
  the ``pytorch`` layer counting only what the lower layers do not explain; count-only layers
  (retransmits, AER, NIC counters) by count;
- network blame by connection: per host, the fewest retransmits over its busy connections; a host far
  above the others is blamed for ``network`` even when it is not the straggler (loss on one link slows
  every rank alike, so nobody arrives late);
- baseline: median and p99 (nearest rank) of the job's last ``n`` step times before this step; stall;
- pairing check (no clocks needed): a rank cannot wait at a collective longer than its own collective
  lasted, and the paired intervals must overlap; a collective that fails either is reported in
  ``inconsistent`` and never used to blame a host;
- single-step straggler without a baseline: the last arriver, when its lateness over the median arrival
  is large relative to the step, with the late group (every rank that late, with its lateness);
- sequential evidence: per (host, layer) the excess of the host's own layer that made it late, divided by
  the job's recent spread of lateness (``evidence``), for the rules' CUSUM (docs/ANALYSIS.md
  "Sequential detection");
- hangs: a rank that never arrived at a collective the others reached, silent for long enough
  (``hang_check``, called by the worker's timer while no step closes).

All inputs and outputs are JSON-able dicts; nothing here touches Kafka or Faust.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Iterable

from obshub.core import schema
from obshub.core.schema import Layer
from obshub.streams import compact

TIME_LAYERS = tuple(layer.value for layer in Layer if layer is not Layer.AGENT)


@dataclass(frozen=True)
class Thresholds:
    """When a step names a straggler and when a layer is blamed (docs/ANALYSIS.md "Thresholds").

    - ``straggler_min_ns`` / ``straggler_rel``: the straggler's excess must be at least
      ``max(straggler_min_ns, straggler_rel * median host step time)``; below that the step is clean.
    - ``blame_min_ns`` / ``blame_rel``: a layer is blamed when its excess is at least
      ``max(blame_min_ns, blame_rel * straggler excess)``.
    - ``count_min`` / ``count_factor``: a count-only layer is blamed when the straggler's count is at least
      ``count_min`` and at least ``count_factor`` times the peers' median count.
    - ``baseline_n`` / ``baseline_min_n``: the sliding history length, and how many steps it needs before
      ``stall`` may be true.
    - ``net_busy_rel``: a connection of a host is busy when it has at least this fraction of the RTT
      samples of the host's busiest connection; ``net_rtt_min_ns`` / ``net_rtt_factor``: a host is
      blamed by RTT when its lowest mean RTT over busy connections is at least this and this many times
      the other hosts' median (``net_blame``).
    - ``pair_slack_ns``: tolerance (beyond both clocks' uncertainty) of the pairing check of a collective.
    - ``spread_min_ns`` / ``spread_rel`` / ``spread_q``: the job's recent spread of lateness is the
      ``spread_q`` quantile (nearest rank) of the largest lateness per step over the baseline's steps,
      at least ``max(spread_min_ns, spread_rel * baseline median step time)`` (``baseline``).
    - ``evidence_clip``: one step's evidence is clipped to ``[0, evidence_clip]`` spreads: with the
      rules' CUSUM (drift 1.5, threshold 5) a step fires alone only from 6.5 spreads, and the clip bounds
      what one step can add (docs/ANALYSIS.md "The test: Page's CUSUM").
    - ``net_count_min``: the fewest retransmits on every busy connection of a host (``rx``) that count as
      network evidence (with ``count_factor`` times the other hosts' median): lower than ``count_min``
      because the evidence adds up over steps in the rules' CUSUM, where one step's blame stands alone.
    - ``rtt_scale_ns``: the smallest RTT scale of the network evidence (``(rtt - peers) / max(peers,
      rtt_scale_ns)``).
    - ``hang_min_ns`` / ``hang_factor``: a rank hangs when others arrived at a collective it never reached
      and it sent nothing for at least ``max(hang_min_ns, hang_factor * baseline median step time)``;
      (the arrived ranks must have waited half of it);
      ``hang_hold_ns``: how long a hung step is kept open (hang records repeat) before the window closes it.
    - ``hang_state_wait_ns``: a rank its agent found frozen, stopped or exited (RANK_STATE) hangs without
      the silence once the other ranks have waited this long in a collective it holds up.
    - ``hang_exit_gap_ns``: when the ranks that waited in a collective exited too (they failed on the lost
      peer), the rank that exited at least this long before them is the one that stopped first.
    - ``hang_exit_settle_ns``: a hang with exited ranks is judged only this long after the earliest exit
      known, so that every agent's report of an earlier exit has arrived; of several exits only those
      within ``hang_exit_gap_ns`` of the earliest are named.
    - ``hang_quiet_steps``: a step that hung and this many of the job's steps after it carry no
      sequential evidence (the ranks resynchronise after the thaw: lateness that is no layer's fault).
    - ``running_min_ns`` / ``running_factor``: a step still open (no summary yet) is checked for network
      evidence once it has run ``max(running_min_ns, running_factor * baseline median step time)``
      (``running_check``); ``running_time_rel``: a host whose own time-layer excess in the running step
      reaches this fraction of its elapsed time is not judged on its connections (a CPU-starved or
      memory-stalled host answers late on every connection).
    - ``net_directed_keep_steps``: once a step of a job meets the directed view's condition
      (``net_stats``), the worker reads the job's network evidence in the directed view for this many
      steps after it, although a step of its own does not meet it.
    - ``net_window_steps`` / ``net_window_stall``: a step that took at least ``net_window_stall`` times
      the job's baseline median step time reads its retransmits together with those of the job's
      previous ``net_window_steps`` closed steps (``net_window``; docs/ANALYSIS.md "Loss over a window of
      steps"); over the window a host's fewest retransmits count only from ``net_window_min`` and from
      ``net_window_factor`` times its reference (a CPU-starved host's connections gather a few spurious
      retransmits over 8 steps too).
    """

    straggler_min_ns: int = 2_000_000
    straggler_rel: float = 0.05
    blame_min_ns: int = 1_000_000
    blame_rel: float = 0.10
    count_min: int = 3
    count_factor: float = 2.0
    baseline_n: int = 50
    baseline_min_n: int = 10
    net_busy_rel: float = 0.25
    net_rtt_min_ns: int = 5_000_000
    net_rtt_factor: float = 3.0
    pair_slack_ns: int = 100_000
    spread_min_ns: int = 2_000_000
    spread_rel: float = 0.02
    spread_q: float = 0.9
    evidence_clip: float = 7.0
    net_count_min: int = 2
    rtt_scale_ns: int = 2_000_000
    hang_min_ns: int = 3_000_000_000
    hang_factor: float = 3.0
    hang_hold_ns: int = 300_000_000_000
    hang_state_wait_ns: int = 500_000_000
    hang_exit_gap_ns: int = 20_000_000
    hang_exit_settle_ns: int = 750_000_000
    hang_quiet_steps: int = 3
    running_min_ns: int = 500_000_000
    running_factor: float = 3.0
    running_time_rel: float = 0.05
    net_directed_keep_steps: int = 200
    net_window_steps: int = 8
    net_window_stall: float = 2.0
    net_window_min: int = 10
    net_window_factor: float = 3.0


def median_int(values: list[int]) -> int:
    """Median of integers, as an integer (mean of the two middle values, rounded down). 0 for none."""
    if not values:
        return 0
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2


class LeaveOneOut:
    """Medians of a per-host value over every host but one (the ``peer median`` of each host), after one
    sort: ``median_without(v)`` equals ``median_int`` of the values with one occurrence of ``v`` removed,
    in O(log n) instead of O(n log n), so all hosts' peer medians of a step cost O(n log n), not O(n^2).

    ``values``: the value of every host (ints, any order). ``median_without(v)`` needs ``v`` to be one of
    them (raises ``ValueError`` otherwise)."""

    __slots__ = ("_s",)

    def __init__(self, values):
        self._s = sorted(values)

    def median_without(self, v: int) -> int:
        s = self._s
        n = len(s) - 1
        i = bisect.bisect_left(s, v)
        if i == len(s) or s[i] != v:
            raise ValueError(f"{v!r} is not one of the values")
        if n <= 0:
            return 0

        def at(k: int) -> int:  # the k-th smallest once s[i] is left out
            return s[k] if k < i else s[k + 1]

        return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) // 2

    def median_without_all(self, vs: list[int]) -> int:
        """``median_int`` of the values with one occurrence of each of ``vs`` removed (each must be one of
        them, counted with multiplicity), in O(len(vs) log n): a host's few connections out of a job's
        thousands. 0 when nothing is left."""
        s = self._s
        r = sorted(vs)
        m = len(s) - len(r)
        if m <= 0:
            return 0

        def kth(k: int) -> int:  # the k-th smallest (from 0) once r is left out
            # the smallest value with at least k + 1 of the remaining values at or below it lies at one
            # of the indices k .. k + len(r) of the sorted values
            for i in range(k, min(len(s), k + len(r) + 1)):
                x = s[i]
                if bisect.bisect_right(s, x) - bisect.bisect_right(r, x) >= k + 1:
                    return x
            return s[-1]

        return kth(m // 2) if m % 2 else (kth(m // 2 - 1) + kth(m // 2)) // 2


def p99_int(values: list[int]) -> int:
    """99th percentile by the nearest-rank method: the ``ceil(0.99 n)``-th smallest value. 0 for none."""
    if not values:
        return 0
    s = sorted(values)
    return s[max(0, math.ceil(0.99 * len(s)) - 1)]


def union_ns(intervals: list[tuple[int, int]]) -> int:
    """Total length in ns of the union of ``[start, end]`` intervals (overlaps counted once)."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def compute_ns(acc: dict) -> int | None:
    """A host's compute time in the step, ns: ``step_ns - |union of its collective intervals|`` where a
    collective's interval is ``[end_rt - duration_ns, end_rt]`` from COLLECTIVE_END. Without a STEP_END,
    the sum of the PHASE durations minus the same union (None when there is neither)."""
    ivals = [(c[2] - c[3], c[2]) for c in acc["colls"].values() if c[2] is not None and c[3] is not None]
    waited = union_ns(ivals)
    if acc["step_ns"] is not None:
        return max(0, acc["step_ns"] - waited)
    if acc["phases"]:
        return max(0, sum(acc["phases"].values()) - waited)
    return None


def layer_table(accs: dict[str, dict]) -> dict[str, dict[str, dict]]:
    """``{host: {layer: {time_ns, count, max_ns}}}``; the pytorch layer's time is ``compute_ns``."""
    out: dict[str, dict[str, dict]] = {}
    for host, acc in sorted(accs.items()):
        row = {layer: {"time_ns": t, "count": c, "max_ns": m} for layer, (t, c, m) in sorted(acc["layers"].items())}
        comp = compute_ns(acc)
        if comp is not None:
            row.setdefault(Layer.PYTORCH.value, {"time_ns": 0, "count": 0, "max_ns": 0})["time_ns"] = comp
        out[host] = row
    return out


def _pair_check(key: str, arr: dict[str, tuple], th: Thresholds) -> str | None:
    """Why the per-host records ``arr`` (``{host: (arrive_rt, unc_ns, op, end_rt, duration_ns)}``) of
    collective ``key`` cannot be one collective, or None when they can. A host's collective lasted
    ``end_rt - arrive_rt`` (both on its own clock; the COLLECTIVE_END ``duration_ns`` when the end is
    unknown). Two checks, neither needs the hosts' clocks to agree beyond their stated uncertainty:
    (1) a rank cannot wait longer than its collective lasted: ``arrival(last) - arrival(h) <=
    lasted(h)``; (2) the paired intervals overlap: no host's collective ended before the last one began.
    Both with a tolerance of the two clocks' uncertainty plus ``pair_slack_ns``. Hosts whose collective has
    no known end or duration are not checked."""
    last_h = max(arr, key=lambda h: (arr[h][0], h))
    last_t, last_u = arr[last_h][0], arr[last_h][1]
    for h, (t, u, _op, end, dur) in sorted(arr.items()):
        lasted = end - t if end is not None else dur
        if h == last_h or not lasted or lasted <= 0:
            continue
        tol = u + last_u + th.pair_slack_ns
        if last_t - t > lasted + tol:
            if end is not None:
                return f"{h}'s collective ended {(last_t - end) / 1e6:.3f} ms before {last_h}'s began"
            return (
                f"{h} waited {(last_t - t) / 1e6:.3f} ms for {last_h} but its collective lasted {lasted / 1e6:.3f} ms"
            )
    return None


def collectives(accs: dict[str, dict], th: Thresholds = Thresholds()) -> list[dict]:
    """Per collective seen (COLLECTIVE_BEGIN) by at least two hosts: ``{pg, coll_seq, op, skew_ns,
    uncertainty_ns, last_host, lead_ns, lead_uncertainty_ns, late, consistent, why}`` sorted by (pg,
    coll_seq). ``lead_ns`` is the last arriver's lead over the second-latest arrival (how long it alone kept
    the others waiting) and ``lead_uncertainty_ns`` the summed uncertainty of those two clocks. ``late`` maps
    each host to its arrival minus the median arrival (ns, >= 0 only for the later half). ``consistent``
    is False (and ``why`` says why) when the pairing check (``_pair_check``) fails. Ties break by host
    name."""
    by_key: dict[str, dict[str, tuple]] = {}
    for host, acc in accs.items():
        for key, (op, arrive, end, dur) in acc["colls"].items():
            if arrive is not None:
                by_key.setdefault(key, {})[host] = (arrive, acc["unc_ns"], op, end, dur)
    out = []
    for key, arr in by_key.items():
        if len(arr) < 2:
            continue
        pg, _, seq = key.rpartition("#")
        order = sorted(arr.items(), key=lambda kv: (kv[1][0], kv[0]))
        (_first_h, first), (_second_h, second), (last_h, last) = order[0], order[-2], order[-1]
        med = median_int([v[0] for v in arr.values()])
        why = _pair_check(key, arr, th)
        out.append(
            {
                "pg": pg,
                "coll_seq": int(seq),
                "op": last[2],
                "skew_ns": last[0] - first[0],
                "uncertainty_ns": last[1] + first[1],
                "last_host": last_h,
                "lead_ns": last[0] - second[0],
                "lead_uncertainty_ns": last[1] + second[1],
                "late": {h: v[0] - med for h, v in arr.items()},
                "consistent": why is None,
                "why": why,
            }
        )
    out.sort(key=lambda c: (c["pg"], c["coll_seq"]))
    return out


def lateness(accs: dict[str, dict], colls: list[dict], layers: dict) -> dict[str, int]:
    """Per host, how late it was in the step (ns, >= 0): the largest ``late`` over the collectives it
    joined beyond the two clocks' uncertainty (its arrival minus the median arrival); without any
    collective, its compute time minus the median compute time of its peers. Arrivals only: the pairing
    check is not applied here, because the end of an asynchronous collective may be when it was queued
    (the DDP comm hook's future), which fails the check although the pairing is right; the sequential
    test needs the same host late step after step, which a wrong pairing does not give."""
    good = colls
    out = dict.fromkeys(accs, 0)
    if good:
        for c in good:
            for h, late in c["late"].items():
                if late > c["uncertainty_ns"]:
                    out[h] = max(out[h], late)
        return out
    comp = {h: layers.get(h, {}).get("pytorch", {}).get("time_ns") for h in accs}
    known = {h: v for h, v in comp.items() if v is not None}
    if len(known) >= 2:
        peers = LeaveOneOut(known.values())
        for h, v in known.items():
            out[h] = max(0, v - peers.median_without(v))
    return out


def find_straggler(accs: dict[str, dict], colls: list[dict], layers: dict, th: Thresholds) -> dict | None:
    """The host that kept the others waiting, or None on a clean step (shape ``{host, score, excess_ns,
    reason, group}``). Only collectives that pass the pairing check count.

    1. ``excess_ns`` = the largest lead (over the second-latest arrival) among the collectives it arrived
       last at with a lead beyond the clock uncertainty;
    2. else (no single host leads: several ranks late together) the last arriver of the collective with the
       largest lateness over the median arrival, that lateness as ``excess_ns``;
    3. without any collective joined across hosts, its compute time minus the median compute time of its
       peers.

    Named when ``excess_ns >= max(straggler_min_ns, straggler_rel * median host step time)``; no baseline
    is needed. ``group`` lists every host at least that late at the straggler's collective (itself
    included) as ``{host, late_ns}``, latest first (one entry when it was late alone). ``score`` = excess
    / median host step time, rounded to 3 places (the fraction of a step the others lost)."""
    if len(accs) < 2:
        return None
    step_times = [a["step_ns"] for a in accs.values() if a["step_ns"] is not None]
    ref = (
        median_int(step_times)
        if step_times
        else median_int([layers[h].get("pytorch", {}).get("time_ns", 0) for h in accs])
    )
    floor = max(th.straggler_min_ns, th.straggler_rel * ref)
    comp = {h: layers[h].get("pytorch", {}).get("time_ns") for h in accs}
    good = [c for c in colls if c["consistent"]]
    lead: dict[str, int] = {}
    last_n: dict[str, int] = {}
    for c in good:
        if c["lead_ns"] > c["lead_uncertainty_ns"]:
            h = c["last_host"]
            lead[h] = max(lead.get(h, 0), c["lead_ns"])
            last_n[h] = last_n.get(h, 0) + 1
    group: list[dict] = []
    if good:
        host = min(lead, key=lambda h: (-lead[h], h)) if lead else None
        if host is not None and lead[host] >= floor:
            excess = lead[host]
            at = max((c for c in good if c["last_host"] == host), key=lambda c: c["lead_ns"])
            reason = f"last at {last_n[host]}/{len(good)} collectives, kept peers waiting up to {excess / 1e6:.3f} ms"
        else:
            at = max(good, key=lambda c: (c["late"][c["last_host"]], -c["coll_seq"]))
            host, excess = at["last_host"], at["late"][at["last_host"]]
            if excess <= at["uncertainty_ns"]:
                return None
            reason = (
                f"last at {at['op']} pg={at['pg']} seq={at['coll_seq']}, {excess / 1e6:.3f} ms after the median arrival"
            )
        if excess < floor:
            return None
        group = sorted(
            ({"host": h, "late_ns": v} for h, v in at["late"].items() if v >= floor),
            key=lambda g: (-g["late_ns"], g["host"]),
        )
        if len(group) > 1:
            reason += f"; late group of {len(group)}: " + ", ".join(
                f"{g['host']} +{g['late_ns'] / 1e6:.3f} ms" for g in group
            )
    else:
        known = {h: v for h, v in comp.items() if v is not None}
        if len(known) < 2:
            return None
        loo = LeaveOneOut(known.values())
        excesses = {h: v - loo.median_without(v) for h, v in known.items()}
        host = min(excesses, key=lambda h: (-excesses[h], h))
        excess = excesses[host]
        reason = f"no collectives joined; compute {excess / 1e6:.3f} ms over the peer median"
        if excess < floor:
            return None
    if comp.get(host) is not None:
        peers = [v for h, v in comp.items() if h != host and v is not None]
        if peers and good:
            reason += f"; compute {(comp[host] - median_int(peers)) / 1e6:+.3f} ms vs peer median"
    score = round(excess / ref, 3) if ref > 0 else 0.0
    return {
        "host": host,
        "score": score,
        "excess_ns": excess,
        "reason": reason,
        "group": group or [{"host": host, "late_ns": excess}],
    }


def blame(straggler: str, layers: dict[str, dict[str, dict]], excess_ns: int, th: Thresholds) -> list[dict]:
    """Layer blame for ``straggler``: entries ``{host, layer, excess_ns, straggler_ns, peer_median_ns, count,
    max_ns}``, time-blamed layers by excess (largest first), then count-blamed layers by count excess.

    Per layer L: ``excess = time(straggler, L) - median(time(peer, L))`` (a peer without L counts 0). The
    pytorch layer's excess is what is left after subtracting the positive excesses of the other layers
    (its time is the whole compute time, which includes them). Time-blamed when ``excess >=
    max(blame_min_ns, blame_rel * excess_ns)``; count-blamed (``excess_ns`` 0) when the straggler's count is
    ``>= count_min`` and ``>= count_factor *`` the peers' median count.
    """
    mine = layers.get(straggler, {})
    peers = [h for h in layers if h != straggler]
    if not peers:
        return []
    names = sorted(set(mine) | {name for h in peers for name in layers[h]})
    stats = {}
    for name in names:
        m = mine.get(name, {"time_ns": 0, "count": 0, "max_ns": 0})
        pt = median_int([layers[h].get(name, {}).get("time_ns", 0) for h in peers])
        pc = median_int([layers[h].get(name, {}).get("count", 0) for h in peers])
        stats[name] = (m, pt, pc, m["time_ns"] - pt)
    lower = sum(max(0, ex) for name, (_m, _pt, _pc, ex) in stats.items() if name != Layer.PYTORCH.value)
    floor = max(th.blame_min_ns, th.blame_rel * excess_ns)
    timed, counted = [], []
    for name, (m, pt, pc, ex) in stats.items():
        if name == Layer.PYTORCH.value:
            ex = max(0, ex - lower)
        entry = {
            "host": straggler,
            "layer": name,
            "excess_ns": ex,
            "straggler_ns": m["time_ns"],
            "peer_median_ns": pt,
            "count": m["count"],
            "max_ns": m["max_ns"],
        }
        if ex >= floor:
            timed.append(entry)
        elif m["count"] >= th.count_min and m["count"] >= th.count_factor * pc:
            counted.append((m["count"] - pc, dict(entry, excess_ns=0)))
    timed.sort(key=lambda e: (-e["excess_ns"], e["layer"]))
    counted.sort(key=lambda ce: (-ce[0], ce[1]["layer"]))
    return timed + [e for _, e in counted]


def net_stats(
    accs: dict[str, dict], th: Thresholds, recent_directed: bool = False, window: dict | None = None
) -> tuple[dict[str, int], dict[str, int], bool, dict[str, int | None]]:
    """Per host ``(rx, rtt)``: the fewest retransmits and the lowest mean RTT (ns) over its busy
    connections (0 with fewer than 2 busy connections); definitions in ``net_blame``. The third value
    says whether the step's counts meet the directed view's condition (below). The fourth, per host and
    only with a ``window`` (else empty), ``ref``: the median retransmits of one connection among the busy
    connections (of any host) that do not end at the host, None when there are none: what one connection
    carries where the host is not involved, the reference of its ``rx`` in ``net_evidence``.

    Retransmits are read in the *directed view* when it applies: a retransmit is counted by its sender,
    so per host and busy connection there are those sent toward it and those it sent. When some host
    has at least ``net_count_min`` retransmits on every busy connection in one direction (all toward it:
    segments to it are lost; or all from it), every host's ``rx`` is the larger of its two directed
    minima. A neighbour of a lossy host shares one lossy connection whose retransmits go toward the
    lossy host, so its other connections must lose in the same direction by chance to count, instead of
    in either direction. Otherwise (traffic in one direction per connection, as in a one-way ring, or
    accumulators of an older worker without the direction) ``rx`` is the minimum of both directions
    together (docs/ANALYSIS.md "Network blame by connection"). With ``recent_directed`` (a recent step of
    the job met the condition: its traffic runs both ways on its connections) the directed view applies
    although no host meets it in this step: a step whose few retransmits toward the lossy host happen to
    miss one of its connections then blames nobody, instead of the neighbour that sends into the drops
    and saw a retransmit or two on its other connection.

    ``window`` (``net_window``, for a slowed step): the retransmits of the job's recent steps per
    connection, added to this step's on the connections this step has (which connections are busy is
    still this step's traffic), for the hosts with a retransmit of their own on one of their busy
    connections in this step (docs/ANALYSIS.md "Loss over a window of steps")."""
    owner: dict[str, str] = {}
    pairs: dict[str, list[int]] = {}
    for host, acc in accs.items():
        net = acc.get("net") or {}
        for addr in net.get("addrs") or {}:
            owner.setdefault(addr, host)
        for key, vals in (net.get("pairs") or {}).items():
            slot = pairs.setdefault(key, [0, 0, 0, 0, 0])
            for i, v in enumerate(vals[:5]):
                slot[i] += v
    base: dict[str, int] | None = None  # this step's own retransmits per connection, when a window adds
    if window:
        base = {key: vals[1] for key, vals in pairs.items()}
        for key, w in window.items():
            slot = pairs.get(key)
            if slot is not None:
                slot[1] += w[0]
                slot[3] += w[1]
                slot[4] += w[2]
    # per host: (pair values, retransmits toward the host, retransmits sent by the host, pair key)
    conns: dict[str, list[tuple[list[int], int, int, str]]] = {}
    for key, vals in pairs.items():
        a, _, b = key.partition("|")
        ha, hb = owner.get(a), owner.get(b)
        if ha is None or hb is None or ha == hb:
            continue
        conns.setdefault(ha, []).append((vals, vals[4], vals[3], key))
        conns.setdefault(hb, []).append((vals, vals[3], vals[4], key))
    rx: dict[str, int] = {}
    directed: dict[str, int] = {}
    rtt: dict[str, int] = {}
    busy_of: dict[str, list[str]] = {}
    for host in accs:
        cs = conns.get(host, [])
        top = max((c[0][0] for c in cs), default=0)
        busy = [c for c in cs if top > 0 and c[0][0] >= th.net_busy_rel * top]
        busy_of[host] = [c[3] for c in busy]
        if len(busy) >= 2:
            if base is not None and not any(base[c[3]] for c in busy):
                # no retransmit of this step on its busy connections (so none in this step's own counts
                # on all of them): the window's do not make it lossy now
                rx[host] = directed[host] = 0
            else:
                rx[host] = min(c[0][1] for c in busy)
                directed[host] = max(min(c[1] for c in busy), min(c[2] for c in busy))
            rtt[host] = min(c[0][2] // c[0][0] for c in busy)
        else:
            rx[host] = directed[host] = rtt[host] = 0
    own = any(v >= th.net_count_min for v in directed.values())
    # over a window, both directions together: its reference per connection (below) keeps a neighbour of
    # a lossy host from standing out, and a lossy host's connections carry retransmits both ways
    use_directed = (own or recent_directed) and not window
    if use_directed:
        rx = directed
    # the reference per host: the median over the busy connections (of any host) that do not end at it,
    # all of them sorted once and each host's own left out (O(E log E) for E connections, not O(H E))
    ref: dict[str, int | None] = {}
    if window:
        counts: dict[str, int] = {}
        ends: dict[str, list[int]] = {}
        for keys in busy_of.values():
            for key in keys:
                if key not in counts:
                    a, _, b = key.partition("|")
                    vals = pairs[key]
                    n = counts[key] = vals[1]
                    ends.setdefault(owner[a], []).append(n)
                    ends.setdefault(owner[b], []).append(n)
        loo = LeaveOneOut(counts.values())
        for host in accs:
            mine = ends.get(host, [])
            ref[host] = loo.median_without_all(mine) if len(counts) > len(mine) else None
    return rx, rtt, own, ref


def net_window_part(accs: dict[str, dict]) -> dict[str, list[int]]:
    """One step's share of a job's retransmit window: ``{"<a>|<b>": [retransmits, a_to_b, b_to_a]}``
    summed over the hosts' accumulators, only connections with a retransmit (a clean step adds nothing).
    The worker keeps the parts of a job's last ``Thresholds.net_window_steps`` closed steps and passes
    their sum (``net_window``) to ``summarize``."""
    out: dict[str, list[int]] = {}
    for acc in accs.values():
        for key, vals in ((acc.get("net") or {}).get("pairs") or {}).items():
            if len(vals) > 1 and vals[1] > 0:
                slot = out.setdefault(key, [0, 0, 0])
                slot[0] += vals[1]
                if len(vals) >= 5:
                    slot[1] += vals[3]
                    slot[2] += vals[4]
    return out


def net_window(parts: Iterable[dict[str, list[int]]]) -> dict[str, list[int]]:
    """The sum of ``net_window_part`` results: the retransmits per connection of a job's recent steps."""
    out: dict[str, list[int]] = {}
    for part in parts:
        for key, vals in part.items():
            slot = out.setdefault(key, [0, 0, 0])
            for i in range(3):
                slot[i] += vals[i]
    return out


def net_blame(
    accs: dict[str, dict], th: Thresholds, recent_directed: bool = False, stats: tuple | None = None
) -> list[dict]:
    """Network blame by connection (docs/ANALYSIS.md "Network blame by connection"): at most one entry
    ``{host, layer: "network", excess_ns, straggler_ns, peer_median_ns, count, max_ns: 0}``.

    Connections (undirected IPv4 address pairs) are summed over every host's accumulator ``net``: RTT
    samples (traffic), retransmits, RTT sum. A host's addresses are the source addresses of its own TCP
    events. A host's *busy* connections go to another host of the step and carry at least
    ``net_busy_rel`` of the RTT samples of its busiest one; it needs at least 2. Per host, over its busy
    connections: ``rx(h)`` = the fewest retransmits and ``rtt(h)`` = the lowest mean RTT (ns). A fault
    on h's link hits all of its connections; a fault elsewhere spares at least one, and a neighbour of
    the faulty host shares only one bad connection. Blamed, the host with the highest value:

    - by retransmits (``excess_ns`` 0, ``count`` = rx): ``rx >= count_min`` and ``>= count_factor *``
      the median rx of the other hosts (loss);
    - else by RTT (``straggler_ns`` = rtt, ``peer_median_ns`` = the others' median, ``excess_ns`` = the
      difference, ``count`` = rx): ``rtt >= net_rtt_min_ns`` and ``>= net_rtt_factor *`` that median
      (a slow or congested link).

    Needs >= 3 hosts (with 2, both ends share the one link). ``recent_directed``: see ``net_stats``;
    ``stats``: its result when the caller has it."""
    if len(accs) < 3:
        return []
    rx, rtt, _own, _ref = stats or net_stats(accs, th, recent_directed)
    host = min(rx, key=lambda h: (-rx[h], h))
    peers = median_int([v for h, v in rx.items() if h != host])
    if rx[host] >= th.count_min and rx[host] >= th.count_factor * peers:
        return [
            {
                "host": host,
                "layer": Layer.NETWORK.value,
                "excess_ns": 0,
                "straggler_ns": 0,
                "peer_median_ns": 0,
                "count": rx[host],
                "max_ns": 0,
            }
        ]
    host = min(rtt, key=lambda h: (-rtt[h], h))
    peers = median_int([v for h, v in rtt.items() if h != host])
    if rtt[host] >= th.net_rtt_min_ns and rtt[host] >= th.net_rtt_factor * peers:
        return [
            {
                "host": host,
                "layer": Layer.NETWORK.value,
                "excess_ns": rtt[host] - peers,
                "straggler_ns": rtt[host],
                "peer_median_ns": peers,
                "count": rx[host],
                "max_ns": 0,
            }
        ]
    return []


def quantile_int(values: list[int], q: float) -> int:
    """The ``q`` quantile (0 < q <= 1) by the nearest-rank method: the ``ceil(q n)``-th smallest value.
    0 for none."""
    if not values:
        return 0
    s = sorted(values)
    return s[min(len(s), max(1, math.ceil(q * len(s)))) - 1]


def baseline(history: list[list[int]], step: int, th: Thresholds) -> dict:
    """``{median_ns, p99_ns, n, spread_ns}`` over the last ``baseline_n`` entries ``[step,
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
    return {"median_ns": med, "p99_ns": p99_int(times), "n": len(times), "spread_ns": spread}


EVIDENCE_LAYERS = ("sched", "memory", "cuda", "nic", "network", "pytorch")
"""Layers the sequential evidence covers (``evidence``); each host entry carries all of them."""
TIME_EVIDENCE = ("sched", "memory", "cuda", "nic")
"""The time layers of the evidence: the host's own lost time that made it late."""


def evidence(
    accs: dict[str, dict],
    late: dict[str, int],
    layers: dict,
    bl: dict,
    th: Thresholds,
    recent_directed: bool = False,
    stats: tuple | None = None,
    window_stats: tuple | None = None,
) -> dict:
    """Per-step evidence for the rules' sequential test (docs/ANALYSIS.md "Sequential detection"):
    ``{"spread_ns": s, "hosts": {host: {layer: z}}}`` with ``z`` in units of the job's recent spread
    ``s`` (``bl["spread_ns"]``), clipped to ``[0, evidence_clip]``, rounded to 3 places; a host appears
    only when one of its values is above 0.

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
    spread late): then it keeps only the time layers. A slow link makes its host late without any
    run-queue or memory excess, while a host starved of CPU or stalled in reclaim answers its peers late,
    which raises the RTT of all of its connections. Lateness-based values need a
    baseline (``bl["n"] >= baseline_min_n``): the start of a job is noisy. ``recent_directed``, ``stats``:
    see ``net_evidence``."""
    s = max(1, int(bl.get("spread_ns") or th.spread_min_ns))
    clip = th.evidence_clip

    def layer_value(g: str, layer: str, field: str) -> int:
        return layers.get(g, {}).get(layer, {}).get(field, 0)

    out: dict[str, dict[str, float]] = {}

    def put(h: str, layer: str, z: float) -> None:
        z = round(min(clip, max(0.0, z)), 3)
        if z > 0:
            out.setdefault(h, dict.fromkeys(EVIDENCE_LAYERS, 0.0))[layer] = z

    if bl.get("n", 0) >= th.baseline_min_n and len(accs) >= 2:
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
    for h, (z_net, *_stats) in net_evidence(accs, th, recent_directed, stats, window_stats).items():
        mine = out.get(h, {})
        z_time = max((mine.get(layer, 0.0) for layer in TIME_EVIDENCE), default=0.0)
        if z_time >= min(1.0, z_net):
            continue  # its own CPU or memory made it late, and slow to answer on every connection
        # its connections explain its lateness (a slow link delays its own collectives): no other
        # layer of it is the culprit in this step
        out[h] = dict.fromkeys(EVIDENCE_LAYERS, 0.0)
        out[h]["network"] = z_net
    return {"spread_ns": s, "hosts": {h: out[h] for h in sorted(out)}}


def net_evidence(
    accs: dict[str, dict],
    th: Thresholds,
    recent_directed: bool = False,
    stats: tuple | None = None,
    window_stats: tuple | None = None,
) -> dict[str, tuple[float, int, int, int, int]]:
    """Connection-based network evidence per host (docs/ANALYSIS.md "Evidence per (host, layer)"):
    ``{host: (z, rx, m_rx, rtt_ns, m_rtt_ns)}`` for the hosts with ``z > 0``, where ``z`` is the larger of
    ``(rx(h) - m_rx) / sqrt(m_rx + 1)`` and ``(rtt(h) - m_rtt) / max(m_rtt, rtt_scale_ns)`` (``net_stats``;
    ``m_*`` the median over the other hosts, and for ``m_rx`` at least ``net_stats``' ``ref`` where it
    gives one), each counted only past its threshold (retransmits ``>= max(net_count_min, count_factor *
    m_rx)``, RTT ``>= max(net_rtt_min_ns, net_rtt_factor * m_rtt)``), clipped to ``evidence_clip`` and
    rounded to 3 places. Empty with fewer than 3 hosts (with 2, both ends share the one link).
    ``recent_directed``: see ``net_stats``; ``stats``: its result when the caller has it;
    ``window_stats``: ``net_stats`` with a ``window`` (a slowed step), whose retransmit value counts only
    from ``net_window_min`` and ``net_window_factor * m_rx``: each host gets the larger of the two values
    (docs/ANALYSIS.md "Loss over a window of steps")."""
    if len(accs) < 3:
        return {}
    out = _net_z(accs, th, stats or net_stats(accs, th, recent_directed))
    if window_stats is not None:
        for h, entry in _net_z(accs, th, window_stats, th.net_window_min, th.net_window_factor).items():
            if entry[0] > out.get(h, (0.0,))[0]:
                out[h] = entry
    return {h: out[h] for h in sorted(out)}


def _net_z(
    accs: dict[str, dict], th: Thresholds, stats: tuple, count_min: int = 0, factor: float | None = None
) -> dict[str, tuple[float, int, int, int, int]]:
    """``net_evidence`` from one ``net_stats`` result; ``count_min`` and ``factor`` (instead of
    ``count_factor``) gate the retransmit value over a window."""
    factor = th.count_factor if factor is None else factor
    out: dict[str, tuple[float, int, int, int, int]] = {}
    rx, rtt, _own, ref = stats
    loo_rx, loo_rtt = LeaveOneOut(rx[g] for g in accs), LeaveOneOut(rtt[g] for g in accs)
    for h in sorted(accs):
        # the retransmit reference: the other hosts' median, or, over a window, what one connection that
        # does not end at h carries when that is more: a neighbour of a lossy host shares one lossy
        # connection, and its other connection's count is one connection's noise, which the minimum over
        # two connections of a host far from the fault understates
        m_rx = max(loo_rx.median_without(rx[h]), ref.get(h) or 0)
        m_rtt = loo_rtt.median_without(rtt[h])
        # thresholds gate each (net_count_min, and net_blame's for the RTT): on a loaded machine a few
        # retransmits and RTT spikes happen on every host (spurious timeouts); only an outlier counts
        z_rx = (rx[h] - m_rx) / math.sqrt(m_rx + 1) if rx[h] >= max(th.net_count_min, count_min, factor * m_rx) else 0.0
        z_rtt = (
            (rtt[h] - m_rtt) / max(m_rtt, th.rtt_scale_ns)
            if rtt[h] >= max(th.net_rtt_min_ns, th.net_rtt_factor * m_rtt)
            else 0.0
        )
        z = round(min(th.evidence_clip, max(z_rx, z_rtt)), 3)
        if z > 0:
            out[h] = (z, rx[h], m_rx, rtt[h], m_rtt)
    return out


def running_check(
    accs: dict[str, dict],
    history: list[list[int]],
    step: int,
    opened_ns: int,
    now_ns: int,
    th: Thresholds = Thresholds(),
    stopped: dict[str, tuple] | None = None,
    recent_directed: bool = False,
    window: dict[str, list[int]] | None = None,
) -> dict | None:
    """Network evidence inside a step that is still running (docs/ANALYSIS.md "Inside a running step").

    ``accs``: the host accumulators received so far for the open step ``step`` (partial: each agent ships
    a running step's events at least every batch age bound); ``opened_ns``: CLOCK_REALTIME ns when the
    worker opened the step; ``now_ns``: CLOCK_REALTIME ns; ``stopped``: hosts with a process found
    frozen, stopped or exited (their step is a hang, not a slow link: no check); ``recent_directed``,
    ``window``: see ``net_stats`` (a step checked here is slowed: its retransmits are read with those of
    the job's previous steps).

    The step has run ``elapsed = now_ns - min(opened_ns, earliest STEP_BEGIN)``; it is checked once
    ``elapsed >= after = max(running_min_ns, running_factor * baseline median step time)``, with a
    baseline (``baseline_min_n`` steps), at least 3 hosts and one host not done with the step. Each host
    with connection evidence ``z`` (``net_evidence`` over the partial accumulators) is named unless its
    own time-layer excess in the step so far, ``Σ_L max(0, time(h, L) - median(time(peers, L)))`` over
    sched, memory, cuda and nic, reaches ``running_time_rel * elapsed`` (a host starved of CPU or stalled
    in reclaim answers late on every connection; its step is judged when it closes).

    Returns None, or ``{"elapsed_ns", "after_ns", "spread_ns", "hosts": {host: {"z", "rx", "peer_rx",
    "rtt_ns", "peer_rtt_ns", "time_excess_ns"}}}`` with at least one host."""
    if len(accs) < 3 or any(h in accs for h in (stopped or {})):
        return None
    if all(a["step_ns"] is not None for a in accs.values()):
        return None  # every host that sent data finished: the summary comes with the close
    bl = baseline(history, step, th)
    if bl["n"] < th.baseline_min_n:
        return None
    begins = [a["begin_rt"] for a in accs.values() if a.get("begin_rt") is not None]
    elapsed = now_ns - min([opened_ns, *begins])
    after = max(th.running_min_ns, int(th.running_factor * bl["median_ns"]))
    if elapsed < after:
        return None
    net = net_evidence(
        accs, th, recent_directed, window_stats=net_stats(accs, th, recent_directed, window) if window else None
    )
    if not net:
        return None
    layers = layer_table(accs)
    peer_time = {
        layer: LeaveOneOut(layers.get(g, {}).get(layer, {}).get("time_ns", 0) for g in accs) for layer in TIME_EVIDENCE
    }
    hosts = {}
    for h, (z, rx, m_rx, rtt, m_rtt) in net.items():
        own = 0
        for layer in TIME_EVIDENCE:
            mine = layers.get(h, {}).get(layer, {}).get("time_ns", 0)
            own += max(0, mine - peer_time[layer].median_without(mine))
        if own >= th.running_time_rel * elapsed:
            continue
        hosts[h] = {"z": z, "rx": rx, "peer_rx": m_rx, "rtt_ns": rtt, "peer_rtt_ns": m_rtt, "time_excess_ns": own}
    if not hosts:
        return None
    return {"elapsed_ns": elapsed, "after_ns": after, "spread_ns": bl["spread_ns"], "hosts": hosts}


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


def history_entry(summary: dict) -> list[int]:
    """The job-history entry of a closed step: ``[step, step_time_max_ns, late_max_ns]`` (the largest
    lateness of any host in the step, the sample of the job's spread of lateness)."""
    return [summary["step"], summary["step_time_max_ns"], int(summary.get("late_max_ns") or 0)]


def _with_net(entries: list[dict], accs: dict[str, dict], th: Thresholds, stats: tuple | None) -> list[dict]:
    """``entries`` plus the connection-based network blame, unless that host already has a network entry."""
    have = {(e["host"], e["layer"]) for e in entries}
    return entries + [e for e in net_blame(accs, th, stats=stats) if (e["host"], e["layer"]) not in have]


def summarize(
    job: str,
    step: int,
    accs: dict[str, dict],
    *,
    expected_hosts: list[str],
    history: list[list[int]],
    quality: dict,
    closed_by: str,
    closed_at_ns: int,
    th: Thresholds = Thresholds(),
    world_size: int = 0,
    recent_directed: bool = False,
    window: dict[str, list[int]] | None = None,
) -> dict:
    """The step summary (exactly the keys of ``schema.STEP_SUMMARY_FIELDS``) of ``job``/``step`` from its
    host accumulators ``{host: acc}``. ``history`` is the job's ``[[step, step_time_max_ns,
    late_max_ns], ...]`` (``history_entry``); ``quality`` holds ``lost_batches``, ``duplicate_batches``,
    ``late_events`` (``ringbuf_lost`` is summed here from the accumulators); ``world_size`` the job's
    registered world size (0 unknown: then the number of expected hosts); ``recent_directed``: a recent
    step of the job had ``net_directed`` (``net_stats``); ``window``: the retransmits of the job's
    previous closed steps (``net_window``), read with this step's when it is slowed (its longest host
    step time at least ``net_window_stall`` times the baseline median). Deterministic: the same inputs
    give the same output."""
    layers = layer_table(accs)
    colls = collectives(accs, th)
    step_time = {h: a["step_ns"] for h, a in sorted(accs.items()) if a["step_ns"] is not None}
    tmax = max(step_time.values(), default=0)
    strag = find_straggler(accs, colls, layers, th)
    bl = baseline(history, step, th)
    late = lateness(accs, colls, layers)
    slowed = bl["n"] >= th.baseline_min_n and tmax >= th.net_window_stall * bl["median_ns"] > 0
    stats = net_stats(accs, th, recent_directed) if len(accs) >= 3 else None
    wstats = net_stats(accs, th, recent_directed, window) if stats and slowed and window else None
    out = {
        "v": schema.SCHEMA_VERSION,
        "job": job,
        "step": step,
        "closed_by": closed_by,
        "closed_at_ns": closed_at_ns,
        "hosts": sorted(accs),
        "expected_hosts": sorted(expected_hosts),
        "missing_hosts": sorted(set(expected_hosts) - set(accs)),
        "world_size": int(world_size) or len(set(expected_hosts) | set(accs)),
        "step_time_ns": step_time,
        "step_time_max_ns": tmax,
        "straggler": strag,
        "blame": _with_net(blame(strag["host"], layers, strag["excess_ns"], th) if strag else [], accs, th, stats),
        "collectives": [
            {k: c[k] for k in ("pg", "coll_seq", "op", "skew_ns", "uncertainty_ns", "last_host")}
            for c in colls
            if c["consistent"]
        ],
        "inconsistent": [
            {"pg": c["pg"], "coll_seq": c["coll_seq"], "op": c["op"], "why": c["why"]}
            for c in colls
            if not c["consistent"]
        ],
        "late_max_ns": max(late.values(), default=0),
        "evidence": evidence(accs, late, layers, bl, th, recent_directed, stats, wstats),
        "net_directed": bool(stats and stats[2]),
        "hang": None,
        "culprit": None,
        "layers": layers,
        "baseline": bl,
        "stall": bool(bl["n"] >= th.baseline_min_n and tmax > bl["p99_ns"]),
        "stall_ratio": round(tmax / bl["median_ns"], 3) if bl["median_ns"] > 0 else 0.0,
        "quality": {
            "lost_batches": int(quality.get("lost_batches", 0)),
            "duplicate_batches": int(quality.get("duplicate_batches", 0)),
            "late_events": int(quality.get("late_events", 0)),
            "ringbuf_lost": sum(a["ringbuf_lost"] for a in accs.values()),
        },
    }
    out["culprit"] = culprit(out)
    compact.compact(out)  # wide steps keep layer rows of their outlier hosts only, plus layer_stats
    assert set(out) == set(schema.STEP_SUMMARY_FIELDS), "summary drifted from schema.STEP_SUMMARY_FIELDS"
    return out


def _last_phase(acc: dict | None) -> str:
    """Where a host is in its step: the collective it is inside, else the last phase it finished."""
    if acc is None:
        return "no data in this step"
    open_colls = [(c[1], k, c[0]) for k, c in acc["colls"].items() if c[1] is not None and c[2] is None]
    if open_colls:
        _t, k, op = max(open_colls)
        return f"in {op} pg={k.rpartition('#')[0]} seq={k.rpartition('#')[2]}"
    lp = acc.get("last_phase")
    return f"after {lp[1]}" if lp else "no data in this step"


def _exit_cascade(
    accs: dict[str, dict], stopped: dict[str, tuple], now_ns: int, th: Thresholds
) -> tuple[tuple[str, int, list[str]] | None, list[str]]:
    """The ranks that exited first when the ranks waiting in a collective exited after them: returns
    ``((collective key, waited_ns, [later hosts]), [first hosts])``, or ``(None, [])``. A later host had
    not finished the step, was inside the collective (arrived, not ended) and exited at least
    ``hang_exit_gap_ns`` after the earliest exit (``stopped[h][2]``, CLOCK_REALTIME ns). When no later
    host was inside a collective (they failed on the lost peer where no collective event shows, e.g. in
    DDP's gradient all-reduce during backward), the first ranks are still named when neither they nor
    the later ones had finished the step: the key is then the latest collective the later hosts reached
    in the step ("-#-1" for none) and ``waited_ns`` counts from the earliest exit. A job whose ranks all
    finished their last step before they exited is never named."""
    exits = {h: v[2] for h, v in stopped.items() if v[0] == "exited" and len(v) > 2}
    if len(exits) < 2:
        return None, []
    first = min(exits.values())
    early = sorted(h for h, t in exits.items() if t < first + th.hang_exit_gap_ns)
    waits: dict[str, dict[str, int]] = {}
    for h, t in exits.items():
        a = accs.get(h)
        if h in early or a is None or a["step_ns"] is not None:
            continue
        for k, c in a["colls"].items():
            if c[1] is not None and c[2] is None and c[1] < t:
                waits.setdefault(k, {})[h] = c[1]
    if not waits:
        # the others failed where no collective event shows (DDP's gradient all-reduce runs inside
        # backward): named when the first ranks and the later ones all exited inside the step
        later = sorted(h for h in exits if h not in early and h in accs and accs[h]["step_ns"] is None)
        if not later or any(h in accs and accs[h]["step_ns"] is not None for h in early):
            return None, []
        seen = [(c[1], k) for h in later for k, c in accs[h]["colls"].items() if c[1] is not None]
        return (max(seen)[1] if seen else "-#-1", now_ns - first, later), early
    k, who = max(waits.items(), key=lambda kv: (len(kv[1]), kv[0]))
    return (k, now_ns - max(who.values()), sorted(who)), early


def _stalled(
    accs: dict[str, dict], stopped: dict[str, tuple], opened_ns: int, bl: dict, now_ns: int, th: Thresholds
) -> tuple[tuple[str, int, list[str]] | None, list[str]]:
    """A frozen or stopped rank (not an exit) while the step has been open for ``max(hang_state_wait_ns,
    hang_factor * baseline median step time)`` and other hosts have not finished it: the job does not
    progress, though no collective shows whom the others wait for (they block where no collective event
    shows). Returns ``((latest collective key of the step, or "-#-1", waited_ns, [waiting hosts]),
    [stopped hosts])``, or ``(None, [])``."""
    held = sorted(h for h, v in stopped.items() if v[0] in ("frozen", "stopped"))
    others = sorted(h for h, a in accs.items() if h not in stopped and a["step_ns"] is None)
    waited = now_ns - opened_ns
    if not held or not others or waited < max(th.hang_state_wait_ns, int(th.hang_factor * bl["median_ns"])):
        return None, []
    seen = [(c[1], k) for a in accs.values() for k, c in a["colls"].items() if c[1] is not None]
    return (max(seen)[1] if seen else "-#-1", waited, others), held


def retransmits_toward(accs: dict[str, dict]) -> dict[str, int]:
    """Per host, the TCP retransmits the *other* hosts sent toward it in the step (``accs``: host ->
    accumulator; the directed counts of ``accumulate``: a retransmit is counted by its sender, the event's
    ``saddr``). A host whose own addresses are unknown in the step (no TCP event of its own) gets none.
    Accumulators of an older worker without the direction count nothing."""
    owner: dict[str, str] = {}
    for host, acc in accs.items():
        for addr in (acc.get("net") or {}).get("addrs") or {}:
            owner.setdefault(addr, host)
    toward: dict[str, int] = {}
    for acc in accs.values():
        for key, vals in ((acc.get("net") or {}).get("pairs") or {}).items():
            if len(vals) < 5:
                continue
            a, _, b = key.partition("|")
            ha, hb = owner.get(a), owner.get(b)
            if ha is None or hb is None or ha == hb:
                continue
            toward[hb] = toward.get(hb, 0) + vals[3]  # sent by a toward b
            toward[ha] = toward.get(ha, 0) + vals[4]
    return toward


def hang_check(
    accs: dict[str, dict],
    expected_hosts: list[str],
    seen_ns: dict[str, int],
    opened_ns: int,
    history: list[list[int]],
    step: int,
    now_ns: int,
    th: Thresholds = Thresholds(),
    stopped: dict[str, tuple] | None = None,
) -> dict | None:
    """Whether an open step hangs on a rank (docs/ANALYSIS.md "Hangs").

    By silence: for each process group, the highest sequence number any host reached in this step: the
    hosts with a COLLECTIVE_BEGIN there have *arrived*; an expected host without one is *hung* when it sent
    nothing (``seen_ns[host]``, CLOCK_REALTIME ns of its last data for the job; ``opened_ns`` when never
    seen) for ``hang_after = max(hang_min_ns, hang_factor * baseline median step time)`` and the last of
    the arrived hosts reached the collective at least ``hang_after / 2`` ago, and one of them has not
    finished the step (when all did, nobody waits: the job's last step, or a host that stopped). A missing
    host that still sends data is slow, not hung (the sequential evidence judges it), and while one does,
    no missing host is judged by silence: the missing ranks are blocked together before the collective
    (a communication stalled by retransmission timeouts on one host's lossy link leaves the ranks that
    have no retransmits of their own silent, while those that retransmit still send data), not behind
    one rank that stopped answering. A host judged by silence whose peers sent at least
    ``net_count_min`` retransmits toward it in the step (``retransmits_toward``) is *unreachable*, not
    stopped: segments to it are lost, so it cannot answer (a lossy or cut link; a frozen rank's kernel
    still acknowledges, an exited one resets its connections).

    By process state: ``stopped`` (``host -> (state, since_ns)``: a process its agent found frozen,
    stopped or exited) makes such a host hung without the silence, arrived or not, once another host
    that has not finished the step has been inside a collective (arrived, not ended) for
    ``hang_state_wait_ns``: the collective it holds up is the one the others wait in (a rank frozen inside
    a collective every rank reached included). When the others exited inside their collective too (they
    failed on the lost peer: ``stopped`` entries ``(state, since_ns, at_rt)`` with CLOCK_REALTIME ns of the
    exit), the host(s) that exited at least ``hang_exit_gap_ns`` before the first of them are named and
    those are listed as ``waiting``.

    Returns None, or ``{pg, coll_seq, op, hosts: [{host, last_step, last_phase, silent_ns, state[, toward]}],
    waiting: [host], waited_ns, after_ns}`` (``waiting``: the hosts blocked there, ``waited_ns``: now minus
    the latest of their arrivals; ``last_phase``: the collective the hung host is in, or the last phase it
    finished; ``state``: frozen, stopped, exited, "silent" when judged by silence, or "unreachable" when
    judged by silence while its peers retransmit toward it, with ``toward`` = those retransmits)."""
    bl = baseline(history, step, th)
    after = max(th.hang_min_ns, int(th.hang_factor * bl["median_ns"]))
    stopped = {h: v for h, v in (stopped or {}).items() if h in set(expected_hosts) | set(accs)}
    expected = set(expected_hosts) | set(accs)
    if len(expected) < 2:
        return None

    def hung_entry(h: str, state: str) -> dict:
        acc = accs.get(h)
        return {
            "host": h,
            "last_step": step if acc is not None else step - 1,
            "last_phase": _last_phase(acc),
            "silent_ns": now_ns - seen_ns.get(h, opened_ns),
            "state": state,
        }

    top: dict[str, int] = {}
    for acc in accs.values():
        for key, c in acc["colls"].items():
            if c[1] is not None:
                pg, _, seq = key.rpartition("#")
                top[pg] = max(top.get(pg, -1), int(seq))
    # stopped hosts that may be named: with exits, only once they settled and only the earliest ones
    exits = {h: v[2] for h, v in stopped.items() if v[0] == "exited" and len(v) > 2 and v[2]}
    first = min(exits.values(), default=0)
    settled = not exits or now_ns - first >= th.hang_exit_settle_ns
    culprits = [h for h in sorted(stopped) if h not in exits or exits[h] < first + th.hang_exit_gap_ns]
    best = None
    toward: dict[str, int] | None = None
    for pg, seq in sorted(top.items()):
        key = f"{pg}#{seq}"
        arrived = {
            h: a["colls"][key][1] for h, a in accs.items() if key in a["colls"] and a["colls"][key][1] is not None
        }
        waited = now_ns - max(arrived.values())
        if all(accs[h]["step_ns"] is not None for h in arrived):
            continue  # every arrived rank finished its step: nobody waits
        hung = []
        # it finished the step: it never joined that collective (a sampled trace), no hang
        missing = [h for h in sorted(expected - set(arrived)) if h not in accs or accs[h]["step_ns"] is None]
        # judged by silence only when every missing rank is silent: while one of them still sends data,
        # the missing ranks are blocked together before the collective (a communication stalled by
        # retransmission timeouts on a lossy link), not behind a rank that stopped answering
        quiet = [h for h in missing if now_ns - seen_ns.get(h, opened_ns) >= after]
        by_silence = not stopped and waited >= after // 2 and len(quiet) == len(missing)
        for h in missing:
            if h in stopped:  # judged by its state: no silence needed
                if settled and h in culprits and waited >= th.hang_state_wait_ns:
                    hung.append(hung_entry(h, stopped[h][0]))
                continue
            if by_silence and h in quiet:  # with a rank known stopped, the silent ones are its victims
                if toward is None:
                    toward = retransmits_toward(accs)
                if toward.get(h, 0) >= th.net_count_min:
                    hung.append(dict(hung_entry(h, "unreachable"), toward=toward[h]))
                else:
                    hung.append(hung_entry(h, "silent"))
        if hung and (best is None or waited > best["waited_ns"]):
            best = {
                "pg": pg,
                "coll_seq": seq,
                "op": accs[next(iter(arrived))]["colls"][key][0],
                "hosts": hung,
                "waiting": sorted(h for h in arrived if h not in culprits),
                "waited_ns": waited,
                "after_ns": after
                if any(e["state"] in ("silent", "unreachable") for e in hung)
                else th.hang_state_wait_ns,
            }
    if best is not None:
        return best
    if stopped:
        # the collective the others wait in: per host not stopped and not done with the step, its open
        # collective (arrived, not ended); the hang is on the one waited in longest
        waits: dict[str, dict[str, int]] = {}
        for h, a in accs.items():
            if h in stopped or a["step_ns"] is not None:
                continue
            for k, c in a["colls"].items():
                if c[1] is not None and c[2] is None:
                    waits.setdefault(k, {})[h] = c[1]
        pick = None
        for k, who in waits.items():
            w = now_ns - max(who.values())
            if w >= th.hang_state_wait_ns and (pick is None or w > pick[1]):
                pick = (k, w, sorted(who))
        if not settled:
            return None  # exits still being reported: wait until the earliest one is known
        if pick is None:
            pick, culprits = _exit_cascade(accs, stopped, now_ns, th)
        if pick is None:
            pick, culprits = _stalled(accs, stopped, opened_ns, bl, now_ns, th)
        if pick is not None:
            k, w, who = pick
            hung = [hung_entry(h, stopped[h][0]) for h in culprits]
            op = next((accs[h]["colls"][k][0] for h in who if k in accs[h]["colls"]), "step")
            pg, _, seq = k.rpartition("#")
            best = {
                "pg": pg,
                "coll_seq": int(seq),
                "op": op,
                "hosts": hung,
                "waiting": who,
                "waited_ns": w,
                "after_ns": th.hang_state_wait_ns,
            }
    return best
