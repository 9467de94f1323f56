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
- baseline: median and p99 (nearest rank) of the job's last ``n`` step times before this step; stall.

All inputs and outputs are JSON-able dicts; nothing here touches Kafka or Faust.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from obshub.core import schema
from obshub.core.schema import Layer

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


def median_int(values: list[int]) -> int:
    """Median of integers, as an integer (mean of the two middle values, rounded down). 0 for none."""
    if not values:
        return 0
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2


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


def collectives(accs: dict[str, dict]) -> list[dict]:
    """Per collective seen (COLLECTIVE_BEGIN) by at least two hosts: ``{pg, coll_seq, op, skew_ns,
    uncertainty_ns, last_host, lead_ns, lead_uncertainty_ns}`` sorted by (pg, coll_seq). ``lead_ns`` is the
    last arriver's lead over the second-latest arrival (how long it alone kept the others waiting) and
    ``lead_uncertainty_ns`` the summed uncertainty of those two clocks. Ties break by host name."""
    by_key: dict[str, dict[str, tuple[int, int, str]]] = {}
    for host, acc in accs.items():
        for key, (op, arrive, _end, _dur) in acc["colls"].items():
            if arrive is not None:
                by_key.setdefault(key, {})[host] = (arrive, acc["unc_ns"], op)
    out = []
    for key, arr in by_key.items():
        if len(arr) < 2:
            continue
        pg, _, seq = key.rpartition("#")
        order = sorted(arr.items(), key=lambda kv: (kv[1][0], kv[0]))
        (_first_h, first), (_second_h, second), (last_h, last) = order[0], order[-2], order[-1]
        out.append({"pg": pg, "coll_seq": int(seq), "op": last[2],
                    "skew_ns": last[0] - first[0], "uncertainty_ns": last[1] + first[1], "last_host": last_h,
                    "lead_ns": last[0] - second[0], "lead_uncertainty_ns": last[1] + second[1]})
    out.sort(key=lambda c: (c["pg"], c["coll_seq"]))
    return out


def find_straggler(accs: dict[str, dict], colls: list[dict], layers: dict, th: Thresholds) -> dict | None:
    """The host that kept the others waiting, or None on a clean step (shape ``{host, score, excess_ns,
    reason}``). ``excess_ns`` = the largest lead (over the second-latest arrival) among the collectives it
    arrived last at with a lead beyond the clock uncertainty; without any collective joined across hosts,
    its compute time minus the median compute time of its peers. ``score`` = excess / median host step
    time, rounded to 3 places (the fraction of a step the others lost)."""
    if len(accs) < 2:
        return None
    step_times = [a["step_ns"] for a in accs.values() if a["step_ns"] is not None]
    ref = median_int(step_times) if step_times else median_int(
        [layers[h].get("pytorch", {}).get("time_ns", 0) for h in accs])
    comp = {h: layers[h].get("pytorch", {}).get("time_ns") for h in accs}
    lead: dict[str, int] = {}
    last_n: dict[str, int] = {}
    for c in colls:
        if c["lead_ns"] > c["lead_uncertainty_ns"]:
            h = c["last_host"]
            lead[h] = max(lead.get(h, 0), c["lead_ns"])
            last_n[h] = last_n.get(h, 0) + 1
    if colls:
        if not lead:
            return None
        host = min(lead, key=lambda h: (-lead[h], h))
        excess = lead[host]
        reason = f"last at {last_n[host]}/{len(colls)} collectives, kept peers waiting up to {excess / 1e6:.3f} ms"
    else:
        known = {h: v for h, v in comp.items() if v is not None}
        if len(known) < 2:
            return None
        excesses = {h: v - median_int([w for g, w in known.items() if g != h]) for h, v in known.items()}
        host = min(excesses, key=lambda h: (-excesses[h], h))
        excess = excesses[host]
        reason = f"no collectives joined; compute {excess / 1e6:.3f} ms over the peer median"
    if excess < max(th.straggler_min_ns, th.straggler_rel * ref):
        return None
    if comp.get(host) is not None:
        peers = [v for h, v in comp.items() if h != host and v is not None]
        if peers and colls:
            reason += f"; compute {(comp[host] - median_int(peers)) / 1e6:+.3f} ms vs peer median"
    score = round(excess / ref, 3) if ref > 0 else 0.0
    return {"host": host, "score": score, "excess_ns": excess, "reason": reason}


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
        entry = {"host": straggler, "layer": name, "excess_ns": ex, "straggler_ns": m["time_ns"],
                 "peer_median_ns": pt, "count": m["count"], "max_ns": m["max_ns"]}
        if ex >= floor:
            timed.append(entry)
        elif m["count"] >= th.count_min and m["count"] >= th.count_factor * pc:
            counted.append((m["count"] - pc, dict(entry, excess_ns=0)))
    timed.sort(key=lambda e: (-e["excess_ns"], e["layer"]))
    counted.sort(key=lambda ce: (-ce[0], ce[1]["layer"]))
    return timed + [e for _, e in counted]


def net_blame(accs: dict[str, dict], th: Thresholds) -> list[dict]:
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

    Needs >= 3 hosts (with 2, both ends share the one link)."""
    owner: dict[str, str] = {}
    pairs: dict[str, list[int]] = {}
    for host, acc in accs.items():
        net = acc.get("net") or {}
        for addr in net.get("addrs") or {}:
            owner.setdefault(addr, host)
        for key, vals in (net.get("pairs") or {}).items():
            slot = pairs.setdefault(key, [0, 0, 0])
            for i, v in enumerate(vals[:3]):
                slot[i] += v
    conns: dict[str, list[list[int]]] = {}
    for key, vals in pairs.items():
        a, _, b = key.partition("|")
        ha, hb = owner.get(a), owner.get(b)
        if ha is None or hb is None or ha == hb:
            continue
        conns.setdefault(ha, []).append(vals)
        conns.setdefault(hb, []).append(vals)
    rx: dict[str, int] = {}
    rtt: dict[str, int] = {}
    for host in accs:
        cs = conns.get(host, [])
        top = max((c[0] for c in cs), default=0)
        busy = [c for c in cs if top > 0 and c[0] >= th.net_busy_rel * top]
        rx[host] = min(c[1] for c in busy) if len(busy) >= 2 else 0
        rtt[host] = min(c[2] // c[0] for c in busy) if len(busy) >= 2 else 0
    if len(accs) < 3:
        return []
    host = min(rx, key=lambda h: (-rx[h], h))
    peers = median_int([v for h, v in rx.items() if h != host])
    if rx[host] >= th.count_min and rx[host] >= th.count_factor * peers:
        return [{"host": host, "layer": Layer.NETWORK.value, "excess_ns": 0, "straggler_ns": 0,
                 "peer_median_ns": 0, "count": rx[host], "max_ns": 0}]
    host = min(rtt, key=lambda h: (-rtt[h], h))
    peers = median_int([v for h, v in rtt.items() if h != host])
    if rtt[host] >= th.net_rtt_min_ns and rtt[host] >= th.net_rtt_factor * peers:
        return [{"host": host, "layer": Layer.NETWORK.value, "excess_ns": rtt[host] - peers,
                 "straggler_ns": rtt[host], "peer_median_ns": peers, "count": rx[host], "max_ns": 0}]
    return []


def baseline(history: list[list[int]], step: int, th: Thresholds) -> dict:
    """``{median_ns, p99_ns, n}`` over the last ``baseline_n`` entries ``[step, step_time_max_ns]`` of the
    job's history with a step number below ``step``."""
    prior = sorted((s, t) for s, t in history if s < step)[-th.baseline_n:]
    times = [t for _s, t in prior]
    return {"median_ns": median_int(times), "p99_ns": p99_int(times), "n": len(times)}


def _with_net(entries: list[dict], accs: dict[str, dict], th: Thresholds) -> list[dict]:
    """``entries`` plus the connection-based network blame, unless that host already has a network entry."""
    have = {(e["host"], e["layer"]) for e in entries}
    return entries + [e for e in net_blame(accs, th) if (e["host"], e["layer"]) not in have]


def summarize(job: str, step: int, accs: dict[str, dict], *, expected_hosts: list[str], history: list[list[int]],
              quality: dict, closed_by: str, closed_at_ns: int, th: Thresholds = Thresholds()) -> dict:
    """The step summary (exactly the keys of ``schema.STEP_SUMMARY_FIELDS``) of ``job``/``step`` from its
    host accumulators ``{host: acc}``. ``history`` is the job's ``[[step, step_time_max_ns], ...]``;
    ``quality`` holds ``lost_batches``, ``duplicate_batches``, ``late_events`` (``ringbuf_lost`` is
    summed here from the accumulators). Deterministic: the same inputs give the same output."""
    layers = layer_table(accs)
    colls = collectives(accs)
    step_time = {h: a["step_ns"] for h, a in sorted(accs.items()) if a["step_ns"] is not None}
    tmax = max(step_time.values(), default=0)
    strag = find_straggler(accs, colls, layers, th)
    bl = baseline(history, step, th)
    out = {
        "v": schema.SCHEMA_VERSION,
        "job": job,
        "step": step,
        "closed_by": closed_by,
        "closed_at_ns": closed_at_ns,
        "hosts": sorted(accs),
        "expected_hosts": sorted(expected_hosts),
        "missing_hosts": sorted(set(expected_hosts) - set(accs)),
        "step_time_ns": step_time,
        "step_time_max_ns": tmax,
        "straggler": strag,
        "blame": _with_net(blame(strag["host"], layers, strag["excess_ns"], th) if strag else [], accs, th),
        "collectives": [{k: c[k] for k in ("pg", "coll_seq", "op", "skew_ns", "uncertainty_ns", "last_host")}
                        for c in colls],
        "layers": layers,
        "baseline": bl,
        "stall": bool(bl["n"] >= th.baseline_min_n and tmax > bl["p99_ns"]),
        "stall_ratio": round(tmax / bl["median_ns"], 3) if bl["median_ns"] > 0 else 0.0,
        "quality": {"lost_batches": int(quality.get("lost_batches", 0)),
                    "duplicate_batches": int(quality.get("duplicate_batches", 0)),
                    "late_events": int(quality.get("late_events", 0)),
                    "ringbuf_lost": sum(a["ringbuf_lost"] for a in accs.values())},
    }
    assert set(out) == set(schema.STEP_SUMMARY_FIELDS), "summary drifted from schema.STEP_SUMMARY_FIELDS"
    return out
