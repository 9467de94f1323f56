"""Network blame by connection: retransmit statistics per host and connection, the window of recent steps,
the network evidence and the retransmits toward a host (docs/ANALYSIS.md)."""

from __future__ import annotations

import math
from typing import Iterable

import msgspec

from obshub.core.schema import Layer
from obshub.streams.accumulate import HostNet, StepAcc, as_accs
from obshub.streams.analysis.stats import LeaveOneOut, median_int
from obshub.streams.analysis.thresholds import Thresholds

_NO_NET = HostNet()


def _net(acc: StepAcc) -> HostNet:
    """The :class:`~obshub.streams.accumulate.HostNet` of a host accumulator (an empty one for a rank row
    or a host without TCP data: links are per host)."""
    return getattr(acc, "net", None) or _NO_NET


class NetStats(msgspec.Struct):
    """A step's retransmit and RTT statistics per host over its busy connections (``net_stats``; not
    part of the summary). ``rx``: per host the fewest retransmits (a count); ``rtt``: per host the
    lowest mean RTT (ns); ``directed``: the step's counts meet the directed view's condition (the
    summary's ``net_directed``); ``ref``: per host, over a window only (else empty), the reference count
    of its ``rx`` (retransmits of one connection, None where there is none); ``drops``: per host with any,
    over a window only, its own dropped segments in the window's steps (``HostNet.drops``, a count: the
    reference of ``net_drops_evidence``)."""

    rx: dict[str, int]
    rtt: dict[str, int]
    directed: bool
    ref: dict[str, int | None]
    drops: dict[str, int] = {}


class NetEvidence(msgspec.Struct):
    """One host's connection-based network evidence (``net_evidence``): ``z`` the evidence (spreads,
    ``> 0``, clipped, 3 places); ``rx``/``m_rx`` its fewest retransmits over its busy connections and the
    reference it is compared with (counts); ``rtt_ns``/``m_rtt_ns`` its lowest mean RTT and the other
    hosts' median (ns); ``view``: which view of the connections gave ``z`` (a key of ``schema.NET_VIEWS``; ""
    where not known)."""

    z: float
    rx: int
    m_rx: int
    rtt_ns: int
    m_rtt_ns: int
    view: str = ""


class NetBlame(msgspec.Struct):
    """Network blame by connection (``net_blame``), encoded as the summary's ``blame`` entry of layer
    ``network`` (its fields in this order; ``summarize`` adds ``rank``). ``excess_ns``: RTT above the
    others' median (0 when blamed by retransmits); ``straggler_ns``/``peer_median_ns``: the host's lowest
    mean RTT and the others' median (ns, 0 when blamed by retransmits); ``count``: its fewest
    retransmits over its busy connections; ``max_ns``: always 0 (no single longest event)."""

    host: str
    layer: str
    excess_ns: int
    straggler_ns: int
    peer_median_ns: int
    count: int
    max_ns: int = 0


def net_stats(
    accs: dict[str, dict], th: Thresholds, recent_directed: bool = False, window: dict | None = None
) -> NetStats:
    """``NetStats``. Per host ``rx`` and ``rtt``: the fewest retransmits and the lowest mean RTT (ns) over
    its busy connections (0 with fewer than 2 busy connections); definitions in ``net_blame``.
    ``directed`` says whether the step's counts meet the directed view's condition (below). Per host and
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
    accs = as_accs(accs)
    owner: dict[str, str] = {}
    pairs: dict[str, list[int]] = {}
    for host, acc in accs.items():
        net = getattr(acc, "net", None)  # _net: a rank row or a host without TCP data has none
        if net is None:
            continue
        for addr in net.addrs:
            owner.setdefault(addr, host)
        for key, vals in net.pairs.items():
            slot = pairs.setdefault(key, [0, 0, 0, 0, 0])
            for i, v in enumerate(vals[:5]):
                slot[i] += v
    base: dict[str, int] | None = None  # this step's own retransmits per connection, when a window adds
    window_drops: dict[str, int] = {}
    if window:
        base = {key: vals[1] for key, vals in pairs.items()}
        for key, w in window.items():
            if key.startswith(_DROPS_KEY):  # a host's own dropped segments (net_window_part), no connection
                window_drops[key[len(_DROPS_KEY) :]] = w[0]
                continue
            have = pairs.get(key)
            if have is not None:
                have[1] += w[0]
                have[3] += w[1]
                have[4] += w[2]
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
        cs = conns.get(host)
        if not cs:  # no connection to another host (most hosts of a wide step without TCP data)
            busy_of[host] = []
            rx[host] = directed[host] = rtt[host] = 0
            continue
        top = max([c[0][0] for c in cs])
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
    return NetStats(rx, rtt, own, ref, window_drops)


_DROPS_KEY = "@"
"""``net_window_part``: the key prefix of a host's own dropped segments (``"@<host>"``; a connection's key
is two addresses joined by ``|``)."""


def net_window_part(accs: dict[str, dict]) -> dict[str, list[int]]:
    """One step's share of a job's retransmit window: ``{"<a>|<b>": [retransmits, a_to_b, b_to_a]}``
    summed over the hosts' accumulators, only connections with a retransmit (a clean step adds nothing),
    and ``{"@<host>": [drops, 0, 0]}`` for each host with dropped segments of its own (``HostNet.drops``).
    The worker keeps the parts of a job's last ``Thresholds.net_window_steps`` closed steps and passes
    their sum (``net_window``) to ``summarize``."""
    accs = as_accs(accs)
    out: dict[str, list[int]] = {}
    for host, acc in accs.items():
        net = getattr(acc, "net", None)  # as _net: none for a rank row or a host without TCP data (most)
        if not net:
            continue
        drops = net.drops
        if drops:
            out[_DROPS_KEY + host] = [drops, 0, 0]
        for key, vals in net.pairs.items():
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
    accs: dict[str, dict], th: Thresholds, recent_directed: bool = False, stats: NetStats | None = None
) -> list[NetBlame]:
    """Network blame by connection (docs/ANALYSIS.md "Network blame by connection"): at most one
    ``NetBlame`` (``host``, ``layer`` "network", ``excess_ns``, ``straggler_ns``, ``peer_median_ns``,
    ``count``, ``max_ns`` 0).

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
    accs = as_accs(accs)
    if len(accs) < 3:
        return []
    st = stats or net_stats(accs, th, recent_directed)
    rx, rtt = st.rx, st.rtt
    host = min(rx, key=lambda h: (-rx[h], h))
    peers = median_int([v for h, v in rx.items() if h != host])
    if rx[host] >= th.count_min and rx[host] >= th.count_factor * peers:
        return [NetBlame(host, Layer.NETWORK.value, 0, 0, 0, rx[host])]
    host = min(rtt, key=lambda h: (-rtt[h], h))
    peers = median_int([v for h, v in rtt.items() if h != host])
    if rtt[host] >= th.net_rtt_min_ns and rtt[host] >= th.net_rtt_factor * peers:
        return [NetBlame(host, Layer.NETWORK.value, rtt[host] - peers, rtt[host], peers, rx[host])]
    return []


def net_evidence(
    accs: dict[str, dict],
    th: Thresholds,
    recent_directed: bool = False,
    stats: NetStats | None = None,
    window_stats: NetStats | None = None,
) -> dict[str, NetEvidence]:
    """Connection-based network evidence per host (docs/ANALYSIS.md "Evidence per (host, layer)"):
    ``{host: NetEvidence(z, rx, m_rx, rtt_ns, m_rtt_ns)}`` for the hosts with ``z > 0``, where ``z`` is the larger of
    ``(rx(h) - m_rx) / sqrt(m_rx + 1)`` and ``(rtt(h) - m_rtt) / max(m_rtt, rtt_scale_ns)`` (``net_stats``;
    ``m_*`` the median over the other hosts, and for ``m_rx`` at least ``net_stats``' ``ref`` where it
    gives one), each counted only past its threshold (retransmits ``>= max(net_count_min, count_factor *
    m_rx)``, RTT ``>= max(net_rtt_min_ns, net_rtt_factor * m_rtt)``), clipped to ``evidence_clip`` and
    rounded to 3 places. Empty with fewer than 3 hosts (with 2, both ends share the one link).
    ``recent_directed``: see ``net_stats``; ``stats``: its result when the caller has it;
    ``window_stats``: ``net_stats`` with a ``window`` (a slowed step), whose retransmit value counts only
    from ``net_window_min`` and ``net_window_factor * m_rx``: each host gets the larger of the two values
    (docs/ANALYSIS.md "Loss over a window of steps"), of ``net_toward_evidence`` (a slowed step: a
    blackout's retransmits toward its host) and of ``net_drops_evidence`` (a slowed step: the host's own
    dropped segments; not when the toward view names another host); on a tie the view named first keeps
    it."""
    accs = as_accs(accs)
    if len(accs) < 3:
        return {}
    out = _net_z(accs, th, stats or net_stats(accs, th, recent_directed))
    if window_stats is not None:
        slowed = list(_net_z(accs, th, window_stats, th.net_window_min, th.net_window_factor, "window").items())
        toward = net_toward_evidence(accs, th)
        slowed += list(toward.items())
        drops = net_drops_evidence(accs, th, window_stats.drops)
        if not toward or toward.keys() == drops.keys():
            # the peers' back-off toward another host names that host's link: a sender's drops (its own
            # segments, dropped in its context on their way into the receiver) are no evidence against it
            slowed += list(drops.items())
        for h, entry in slowed:
            have = out.get(h)
            if have is None or entry.z > have.z:
                out[h] = entry
    return {h: out[h] for h in sorted(out)}


def net_toward_evidence(accs: dict[str, dict], th: Thresholds) -> dict[str, NetEvidence]:
    """Network evidence of a slowed step from the retransmits sent *toward* each host (docs/ANALYSIS.md
    "A blackout's retransmits toward its host"): ``{host: NetEvidence(z, toward, second, 0, 0)}`` for at most one
    host, ``z = (toward - second) / sqrt(second + 1)`` clipped to ``net_toward_clip`` (and
    ``evidence_clip``) and rounded to 3 places, where ``toward`` is the retransmits the other hosts sent toward it in the step (a retransmit
    is counted by its sender: ``retransmits_toward``) and ``second`` the most any other host received.

    A blackout of a host's link (every segment to and from it dropped for hundreds of ms) makes the peers
    that were sending to it back off: the same connection retransmits again and again (RTO 200 ms, then
    400, 800 ...) while the host itself, blocked in the collective, may send little. In a ring, only one
    neighbour may be sending when the blackout starts, so the host's fewest retransmits over its busy
    connections (``net_stats``) can be 0 or 1 and the step names nobody, although every retransmit of it
    went toward the one host. Counted only when the host received at least ``net_count_min`` on one
    connection (a back-off: the same connection timed out again; not one spurious timeout per connection,
    which a stopped or starved rank's peers may show), and at least ``count_factor`` times what any other host
    received (the neighbour whose segments to it were dropped receives nothing extra), and only when the
    host did not keep the others waiting at a collective for ``net_toward_late_rel`` of its step time or
    more (a blackout's host waits in the collective with the others; a rank stopped with SIGSTOP arrives
    late, and its peers' retransmits toward it, one or two tail-loss probes per connection, are not its
    link's fault). The evidence goes to the **sender** instead, the host that sent the most of the
    retransmits toward the one host, when that sender's own egress queue held a watched socket's segment
    for at least ``net_queue_min_ns`` in the step (``HostNet.queue_max_ns``, the agent's TCP_QUEUE): a link
    that queues (tbf) delays its own host's sends, which then retransmit toward a healthy peer; a
    receiver's loss or blackout queues nothing at the sender. ``net_evidence``
    reads it for a slowed step only (``window_stats`` given); a host whose own CPU or memory time made it
    late keeps its time layers (``evidence``)."""
    accs = as_accs(accs)
    owner: dict[str, str] = {}
    for host, acc in accs.items():
        for addr in _net(acc).addrs:
            owner.setdefault(addr, host)
    pairs: dict[str, list[int]] = {}
    for acc in accs.values():
        for key, vals in _net(acc).pairs.items():
            if len(vals) < 5:
                continue
            slot = pairs.setdefault(key, [0, 0])
            slot[0] += vals[3]
            slot[1] += vals[4]
    toward: dict[str, int] = {}
    most: dict[str, int] = {}
    senders: dict[str, dict[str, int]] = {}  # receiver -> sender -> retransmits sent toward it
    for key, (a_to_b, b_to_a) in pairs.items():
        a, _, b = key.partition("|")
        ha, hb = owner.get(a), owner.get(b)
        if ha is None or hb is None or ha == hb:
            continue
        for h, sender, n in ((hb, ha, a_to_b), (ha, hb, b_to_a)):
            toward[h] = toward.get(h, 0) + n
            most[h] = max(most.get(h, 0), n)
            by = senders.setdefault(h, {})
            by[sender] = by.get(sender, 0) + n
    if not toward:
        return {}
    ranked = sorted(toward, key=lambda h: (-toward[h], h))
    best = ranked[0]
    n = toward[best]
    second = toward[ranked[1]] if len(ranked) > 1 else 0
    if most[best] < th.net_count_min or n < th.count_factor * max(second, 1):
        return {}
    lead = _lead_ns(accs, best)
    if lead > 0 and lead >= th.net_toward_late_rel * int(accs[best].step_ns or 0):
        return {}  # it kept the others waiting itself (stopped, frozen): a blackout's host is waited on by nobody
    z = round(min(th.evidence_clip, th.net_toward_clip, (n - second) / math.sqrt(second + 1)), 3)
    if z <= 0:
        return {}
    by = senders[best]
    sender = min(by, key=lambda h: (-by[h], h))
    if (_net(accs[sender]).queue_max_ns or 0) >= th.net_queue_min_ns:
        return {sender: NetEvidence(z, n, second, 0, 0, "sender_queue")}  # its own egress queued: its link
    return {best: NetEvidence(z, n, second, 0, 0, "toward")}


def net_drops_evidence(accs: dict[str, dict], th: Thresholds, window_drops: dict[str, int]) -> dict[str, NetEvidence]:
    """Network evidence of a slowed step from each host's *own* dropped segments (docs/ANALYSIS.md "A
    blacked-out host's own drops"): ``{host: NetEvidence(z, drops, ref, 0, 0, "drops")}`` for at most one
    host, the one with the most (``HostNet.drops``: its watched sockets' segments dropped on their way,
    netfilter, a qdisc, the device, in the step; ties: host name), with ``ref = max(second, window)`` (the
    most any other host dropped in the step; its own drops in the job's recent steps, ``window_drops``: host
    -> count, ``NetStats.drops``) and ``z = (drops - ref) / sqrt(ref + 1)`` clipped to ``net_toward_clip``
    (and ``evidence_clip``), rounded to 3 places. Counted only from ``net_drops_min`` drops and
    ``count_factor`` times ``max(ref, 1)``, and only when the host did not keep the others waiting at a
    collective for ``net_toward_late_rel`` of its step time or more (as ``net_toward_evidence``).

    A blackout of a host's link (netfilter dropping every segment to and from it inside its namespace) drops
    the host's own sends and the segments that reach it, and its agent sees both (its sockets own them),
    while the peers' retransmits toward it can be one per connection or none (a ring neighbour that was not
    sending): the toward view then names nobody. A host whose drops are its usual noise (``window_drops``)
    or that drops about as much as another host (a fault beyond one host) gets none; a receiver's discards
    of a sender's excess (a spurious retransmit's duplicate, ``TCP_OLD_DATA``) are no drops of its own
    (``accumulate.link_drop``). ``net_evidence`` reads it for a slowed step only."""
    accs = as_accs(accs)
    drops = {}  # the hosts with drops (a few of a wide step's): the others' count is 0
    for h, a in accs.items():
        net = getattr(a, "net", None)  # as _net
        if net and net.drops:
            drops[h] = net.drops
    if len(accs) < 3 or not drops:
        return {}
    best = min(drops, key=lambda h: (-drops[h], h))
    n = drops[best]
    others = [d for h, d in drops.items() if h != best] + ([0] if len(drops) < len(accs) else [])
    second = max(others)  # the most any other host dropped (>= 2 others: 3 hosts or more)
    ref = max(second, int(window_drops.get(best, 0)))
    if n < th.net_drops_min or n < th.count_factor * max(ref, 1):
        return {}
    lead = _lead_ns(accs, best)
    if lead > 0 and lead >= th.net_toward_late_rel * int(accs[best].step_ns or 0):
        return {}  # it kept the others waiting itself (stopped, frozen): not its link
    z = round(min(th.evidence_clip, th.net_toward_clip, (n - ref) / math.sqrt(ref + 1)), 3)
    return {best: NetEvidence(z, n, ref, 0, 0, "drops")} if z > 0 else {}


def _net_z(
    accs: dict[str, dict],
    th: Thresholds,
    stats: NetStats,
    count_min: int = 0,
    factor: float | None = None,
    rx_view: str = "rx",
) -> dict[str, NetEvidence]:
    """``net_evidence`` from one ``net_stats`` result; ``count_min`` and ``factor`` (instead of
    ``count_factor``) gate the retransmit value over a window; ``rx_view``: the ``view`` of a ``z`` the
    retransmits gave ("window" over a window; "rtt" where the RTT gave it)."""
    factor = th.count_factor if factor is None else factor
    out: dict[str, NetEvidence] = {}
    rx, rtt, ref = stats.rx, stats.rtt, stats.ref
    loo_rx, loo_rtt = LeaveOneOut(rx[g] for g in accs), LeaveOneOut(rtt[g] for g in accs)
    rx_floor, rtt_floor = max(th.net_count_min, count_min), th.net_rtt_min_ns
    for h in sorted(accs):
        if rx[h] < rx_floor and rtt[h] < rtt_floor:
            continue  # below both gates whatever the peers' medians (below): z is 0, as computed there
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
            out[h] = NetEvidence(z, rx[h], m_rx, rtt[h], m_rtt, rx_view if z_rx >= z_rtt else "rtt")
    return out


def _lead_ns(accs: dict[str, dict], host: str) -> int:
    """How long ``host`` kept the others waiting at one collective of the step, at most (ns): its arrival
    (``colls``) minus the latest other arrival, over the collectives it and at least one other host reached;
    0 when it was never the last."""
    lead = 0
    for key, c in accs[host].colls.items():
        if c[1] is None:
            continue
        others = [a.colls[key][1] for h, a in accs.items() if h != host and a.colls.get(key)]
        others = [t for t in others if t is not None]
        if others:
            lead = max(lead, c[1] - max(others))
    return lead


def retransmits_toward(accs: dict[str, dict]) -> dict[str, int]:
    """Per host, the TCP retransmits the *other* hosts sent toward it in the step (``accs``: host ->
    accumulator; the directed counts of ``accumulate``: a retransmit is counted by its sender, the event's
    ``saddr``). A host whose own addresses are unknown in the step (no TCP event of its own) gets none.
    Accumulators of an older worker without the direction count nothing."""
    accs = as_accs(accs)
    owner: dict[str, str] = {}
    for host, acc in accs.items():
        for addr in _net(acc).addrs:
            owner.setdefault(addr, host)
    toward: dict[str, int] = {}
    for acc in accs.values():
        for key, vals in _net(acc).pairs.items():
            if len(vals) < 5:
                continue
            a, _, b = key.partition("|")
            ha, hb = owner.get(a), owner.get(b)
            if ha is None or hb is None or ha == hb:
                continue
            toward[hb] = toward.get(hb, 0) + vals[3]  # sent by a toward b
            toward[ha] = toward.get(ha, 0) + vals[4]
    return toward
