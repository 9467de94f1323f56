"""Checks of a step that has not closed: a running step already slow (``running_check``) and a rank that
never arrived at a collective its peers reached (``hang_check``)."""

from __future__ import annotations

from obshub.streams import accumulate
from obshub.streams.accumulate import StepAcc, as_accs
from obshub.streams.analysis.culprit import running_own_work
from obshub.streams.analysis.evidence import TIME_EVIDENCE, Baseline, baseline
from obshub.streams.analysis.network import net_evidence, net_stats, retransmits_toward
from obshub.streams.analysis.ranks import rank_units, split_unit, unit_key
from obshub.streams.analysis.stats import LeaveOneOut
from obshub.streams.analysis.straggler import layer_table
from obshub.streams.analysis.thresholds import Thresholds


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
    in reclaim answers late on every connection; its step is judged when it closes), or it is behind its
    peers at its own work with evidence of a view a late host gives too (``culprit.running_own_work``, in
    jobs of one rank per host: a starved host's run-queue time is recorded only once it runs again).

    Returns None, or ``{"elapsed_ns", "after_ns", "spread_ns", "hosts": {host: {"z", "rx", "peer_rx",
    "rtt_ns", "peer_rtt_ns", "time_excess_ns", "view"}}}`` with at least one host (``view``: the view of its
    connections that gave ``z``, ``NetEvidence.view``)."""
    accs = as_accs(accs)
    if len(accs) < 3 or any(h in accs for h in (stopped or {})):
        return None
    if all(a.step_ns is not None for a in accs.values()):
        return None  # every host that sent data finished: the summary comes with the close
    bl = baseline(history, step, th)
    if bl.n < th.baseline_min_n:
        return None
    begins = [a.begin_rt for a in accs.values() if a.begin_rt is not None]
    elapsed = now_ns - min([opened_ns, *begins])
    after = max(th.running_min_ns, int(th.running_factor * bl.median_ns))
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
    # a host behind its peers at its own work, named by a view a late host gives too, may be late by its
    # own CPU (its run-queue time arrives once it runs again): judged at the close (running_own_work)
    counts = _work_counts(accs)
    for h, e in net.items():
        if running_own_work(h, e.view, counts):
            continue
        own = 0
        for layer in TIME_EVIDENCE:
            mine = layers.get(h, {}).get(layer, {}).get("time_ns", 0)
            own += max(0, mine - peer_time[layer].median_without(mine))
        if own >= th.running_time_rel * elapsed:
            continue
        hosts[h] = {
            "z": e.z,
            "rx": e.rx,
            "peer_rx": e.m_rx,
            "rtt_ns": e.rtt_ns,
            "peer_rtt_ns": e.m_rtt_ns,
            "time_excess_ns": own,
            "view": e.view,
        }
    if not hosts:
        return None
    return {"elapsed_ns": elapsed, "after_ns": after, "spread_ns": bl.spread_ns, "hosts": hosts}


def _work_counts(accs: dict[str, StepAcc]) -> dict[str, tuple[int, int]]:
    """``culprit.running_own_work``'s counts of the open step's host accumulators: per host its pytorch
    layer's event count (phases and ops ended so far, every rank's) and its ranks (its rank rows, 1 for a
    host of one rank); ``{}`` (nothing judged) when a host's rows are packed without a rank table."""
    out = {}
    for h, a in accs.items():
        if a.rb is not None:
            if a.rt is None:
                return {}
            n = accumulate.column_len(a.rt.r)
        else:
            n = len(a.ranks or ())
        out[h] = ((a.layers.get("pytorch") or (0, 0, 0))[1], max(1, n))
    return out


def _last_phase(acc: dict | None) -> str:
    """Where a host is in its step: the collective it is inside, else the last phase it finished."""
    if acc is None:
        return "no data in this step"
    open_colls = [(c[1], k, c[0]) for k, c in acc.colls.items() if c[1] is not None and c[2] is None]
    if open_colls:
        _t, k, op = max(open_colls)
        return f"in {op} pg={k.rpartition('#')[0]} seq={k.rpartition('#')[2]}"
    lp = acc.last_phase
    return f"after {lp[1]}" if lp else "no data in this step"


def past_data(acc: dict) -> bool:
    """Whether a host (or rank row) did work of its step beyond the data phase: a phase other than
    ``data`` ended, or a collective was reached. The step after a loop's last one holds only its data
    phase (the hooks open it at the last optimizer step and close it at exit: obshub/instrument/hooks.py),
    so ranks that exit one after the other there ended the job; they did not fail on a lost peer."""
    if any(c[1] is not None for c in acc.colls.values()):
        return True
    if any(p != "data" for p in acc.phases or {}):
        return True
    lp = acc.last_phase
    return bool(lp) and lp[1] != "data"


def past_data_phase(acc: StepAcc) -> bool:
    """Whether a host (or rank row) ended a phase of its step other than ``data`` (forward, backward,
    optimizer). Collectives do not count here: a collective the rank reached and ended shows it went on
    (a job's closing ``barrier`` after its last step is one), not that it was cut off mid-step."""
    if any(p != "data" for p in acc.phases):
        return True
    lp = acc.last_phase
    return bool(lp) and lp[1] != "data"


def _exit_cascade(
    accs: dict[str, dict], stopped: dict[str, tuple], now_ns: int, th: Thresholds
) -> tuple[tuple[str, int, list[str]] | None, list[str]]:
    """The ranks that exited first when the ranks waiting in a collective exited after them: returns
    ``((collective key, waited_ns, [later hosts]), [first hosts])``, or ``(None, [])``. A later host had
    not finished the step, was inside the collective (arrived, not ended) and exited at least
    ``hang_exit_gap_ns`` after the earliest exit (``stopped[h][2]``, CLOCK_REALTIME ns). When no later
    host was inside a collective (they failed on the lost peer where no collective event shows, e.g. in
    DDP's gradient all-reduce during backward), the first ranks are still named when neither they nor
    the later ones had finished the step, and a later host ended a phase of the step other than its data
    phase (``past_data_phase``; collectives they reached and ended do not count): the key is then the latest collective the later hosts reached in the step ("-#-1"
    for none) and ``waited_ns`` counts from the earliest exit. A job whose ranks all finished their last
    step before they exited is never named, nor are ranks that exit one after the other in the data phase
    of the step after their last (a training loop's normal end)."""
    exits = {h: v[2] for h, v in stopped.items() if v[0] == "exited" and len(v) > 2}
    if len(exits) < 2:
        return None, []
    first = min(exits.values())
    early = sorted(h for h, t in exits.items() if t < first + th.hang_exit_gap_ns)
    waits: dict[str, dict[str, int]] = {}
    for h, t in exits.items():
        a = accs.get(h)
        if h in early or a is None or a.step_ns is not None:
            continue
        for k, c in a.colls.items():
            if c[1] is not None and c[2] is None and c[1] < t:
                waits.setdefault(k, {})[h] = c[1]
    if not waits:
        # the others failed where no collective event shows (DDP's gradient all-reduce runs inside
        # backward): named when the first ranks and the later ones all exited inside the step
        later = sorted(h for h in exits if h not in early and h in accs and accs[h].step_ns is None)
        if not later or any(h in accs and accs[h].step_ns is not None for h in early):
            return None, []
        if not any(past_data_phase(accs[h]) for h in later):
            # the loop's end: the step after the last one holds only its data phase, and the collectives
            # the ranks reached there (a closing barrier) all ended: nobody was cut off by the first exit
            return None, []
        seen = [(c[1], k) for h in later for k, c in accs[h].colls.items() if c[1] is not None]
        return (max(seen)[1] if seen else "-#-1", now_ns - first, later), early
    k, who = max(waits.items(), key=lambda kv: (len(kv[1]), kv[0]))
    return (k, now_ns - max(who.values()), sorted(who)), early


def _stalled(
    accs: dict[str, dict], stopped: dict[str, tuple], opened_ns: int, bl: Baseline, now_ns: int, th: Thresholds
) -> tuple[tuple[str, int, list[str]] | None, list[str]]:
    """A frozen or stopped rank (not an exit) while the step has been open for ``max(hang_state_wait_ns,
    hang_factor * baseline median step time)`` and other hosts have not finished it: the job does not
    progress, though no collective shows whom the others wait for (they block where no collective event
    shows). Returns ``((latest collective key of the step, or "-#-1", waited_ns, [waiting hosts]),
    [stopped hosts])``, or ``(None, [])``."""
    held = sorted(h for h, v in stopped.items() if v[0] in ("frozen", "stopped"))
    others = sorted(h for h, a in accs.items() if h not in stopped and a.step_ns is None)
    waited = now_ns - opened_ns
    if not held or not others or waited < max(th.hang_state_wait_ns, int(th.hang_factor * bl.median_ns)):
        return None, []
    seen = [(c[1], k) for a in accs.values() for k, c in a.colls.items() if c[1] is not None]
    return (max(seen)[1] if seen else "-#-1", waited, others), held


def _went_on_without(accs: dict[str, dict], arrived: dict[str, int], key: str, state: tuple) -> bool:
    """True when a host in ``state`` (a ``stopped`` entry) exited before every host that arrived at
    collective ``key`` (``pg#seq``) ended it (CLOCK_REALTIME ns): a collective that completes after a
    rank's exit does not include that rank (a rank that ended before its peers, which go on without it),
    so the rank holds up nothing there."""
    if state[0] != "exited" or len(state) < 3 or not state[2] or not arrived:
        return False
    ends = [accs[h].colls[key][2] for h in arrived]
    return all(e is not None and e > state[2] for e in ends)


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
    those are listed as ``waiting``. An exited host is never named at a collective that every arrived host
    ended after its exit (it finished before its peers, which went on without it).

    A step whose latest collective arrival or end (with no collective, its latest exit) is older than
    ``hang_hold_ns`` is history (read long after it ran: a worker started on retained input, or catching
    up a backlog) and never hangs: the
    step's own window closes it, as a live hang's does ``hang_hold_ns`` after it opened.

    Returns None, or ``{pg, coll_seq, op, hosts: [{host, last_step, last_phase, silent_ns, state[, toward]}],
    waiting: [host], waited_ns, after_ns}`` (``waiting``: the hosts blocked there, ``waited_ns``: now minus
    the latest of their arrivals; ``last_phase``: the collective the hung host is in, or the last phase it
    finished; ``state``: frozen, stopped, exited, "silent" when judged by silence, or "unreachable" when
    judged by silence while its peers retransmit toward it, with ``toward`` = those retransmits)."""
    accs = as_accs(accs)
    bl = baseline(history, step, th)
    after = max(th.hang_min_ns, int(th.hang_factor * bl.median_ns))
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
    newest = 0  # CLOCK_REALTIME ns of the step's latest collective arrival or end
    for acc in accs.values():
        for key, c in acc.colls.items():
            if c[1] is not None:
                pg, _, seq = key.rpartition("#")
                top[pg] = max(top.get(pg, -1), int(seq))
                newest = max(newest, c[1])
            if c[2] is not None:
                newest = max(newest, c[2])
    if not newest:  # no collective in the step: its latest event is its ranks' latest exit, if any
        newest = max((v[2] for v in stopped.values() if v[0] == "exited" and len(v) > 2 and v[2]), default=0)
    if newest and now_ns - newest > th.hang_hold_ns:
        return None  # history: a step read long after it ran (a new worker on retained input, a backlog)
    # stopped hosts that may be named: with exits, only once they settled and only the earliest ones
    exits = {h: v[2] for h, v in stopped.items() if v[0] == "exited" and len(v) > 2 and v[2]}
    first = min(exits.values(), default=0)
    settled = not exits or now_ns - first >= th.hang_exit_settle_ns
    culprits = [h for h in sorted(stopped) if h not in exits or exits[h] < first + th.hang_exit_gap_ns]
    best = None
    toward: dict[str, int] | None = None
    for pg, seq in sorted(top.items()):
        key = f"{pg}#{seq}"
        arrived = {h: a.colls[key][1] for h, a in accs.items() if key in a.colls and a.colls[key][1] is not None}
        waited = now_ns - max(arrived.values())
        if all(accs[h].step_ns is not None for h in arrived):
            continue  # every arrived rank finished its step: nobody waits
        hung = []
        # it finished the step: it never joined that collective (a sampled trace), no hang
        missing = [h for h in sorted(expected - set(arrived)) if h not in accs or accs[h].step_ns is None]
        # judged by silence only when every missing rank is silent: while one of them still sends data,
        # the missing ranks are blocked together before the collective (a communication stalled by
        # retransmission timeouts on a lossy link), not behind a rank that stopped answering
        quiet = [h for h in missing if now_ns - seen_ns.get(h, opened_ns) >= after]
        by_silence = not stopped and waited >= after // 2 and len(quiet) == len(missing)
        for h in missing:
            if h in stopped:  # judged by its state: no silence needed
                if _went_on_without(accs, arrived, key, stopped[h]):
                    continue  # its peers finished the collective after it exited: it holds up nothing
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
                "op": accs[next(iter(arrived))].colls[key][0],
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
            if h in stopped or a.step_ns is not None:
                continue
            for k, c in a.colls.items():
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
            op = next((accs[h].colls[k][0] for h in who if k in accs[h].colls), "step")
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


def hang_ranks(
    found: dict | None,
    accs: dict[str, dict],
    pids: dict[str, dict[int, tuple[int, int]]] | None = None,
    states: dict[str, dict[int, tuple]] | None = None,
) -> dict | None:
    """``found`` (``hang_check``'s result) with the rank of each hung host entry (``rank``, None when
    unknown; docs/ANALYSIS.md "Several ranks per host"): for a host named by its process state, the rank
    of its earliest frozen, stopped or exited process (``states``: ``host -> pid -> (state, received_ns,
    at_rt)``; ``pids``: ``host -> pid -> (global rank, local rank)``); by silence, its first rank row that
    has not reached the collective; a host of one known rank, that rank. Adds ``waiting_ranks``: the ranks
    registered on the waiting hosts (a host of unknown ranks counts one) plus a hung host's own ranks that
    wait too (its rank rows that reached the collective; where no row knows the collective, e.g. a stopped
    rank found outside one, its registered ranks other than those in the hung state), the count a page can give as "N of world_size ranks wait" (``waiting`` lists
    hosts: a host with one rank behind has not arrived; 4 hosts x 2 ranks with one rank stopped: 7)."""
    accs = as_accs(accs)
    if found is None:
        return None
    key = f"{found['pg']}#{found['coll_seq']}"
    out = []
    also = 0  # ranks of the hung hosts that wait too
    for e in found["hosts"]:
        h = e["host"]
        rank = None
        held = {pid: v for pid, v in ((states or {}).get(h) or {}).items() if v[0] == e["state"]}
        known = (pids or {}).get(h) or {}
        if held:
            pid = min(held, key=lambda p: (held[p][2] if len(held[p]) > 2 else 0, p))
            rank = known[pid][0] if pid in known else None
        acc = accs.get(h)
        rows = accumulate.rank_rows(acc) if rank is None and acc is not None else {}
        if rank is None and rows:
            behind = sorted(int(r) for r, row in rows.items() if (row.colls.get(key) or [None, None])[1] is None)
            rank = behind[0] if behind else None
        if rank is None and acc is not None and acc.rank:
            rank = int(acc.rank[0])
        if rank is None and len(known) == 1:
            rank = next(iter(known.values()))[0]
        out.append(dict(e, rank=rank))
        if len(known) > 1 or rows:
            rows = rows or (accumulate.rank_rows(acc) if acc is not None else {})
            hung = {known[p][0] for p in held if p in known} | {rank}
            if any(key in row.colls for row in rows.values()):  # its ranks that reached the collective
                also += sum(
                    1
                    for r, row in rows.items()
                    if int(r) not in hung and (row.colls.get(key) or [None, None])[1] is not None
                )
            elif held:  # a hang found by state outside a collective its rows know: its other ranks wait
                also += sum(1 for p in known if p not in held)
    waiting = also + sum(max(len((pids or {}).get(h) or {}), 1) for h in found["waiting"])
    return dict(found, hosts=out, waiting_ranks=waiting)


def one_node_hang(
    accs: dict[str, dict],
    expected_hosts: list[str],
    seen_ns: dict[str, int],
    opened_ns: int,
    history: list[list[int]],
    step: int,
    now_ns: int,
    th: Thresholds,
    pids: dict[str, dict[int, tuple[int, int]]],
    states: dict[str, dict[int, tuple]],
) -> dict | None:
    """``hang_check`` of a one-node job (one host, two or more ranks): its ranks are judged as hosts
    would be (``"<host>#<rank>"`` units of ``ranks.rank_units``, each silent while its host is, a rank's
    process state from ``states``), the result mapped back to the host with each entry's ``rank``;
    ``waiting`` lists the host once and ``waiting_ranks`` counts its ranks that wait. None when the job is
    not one such host or nothing hangs."""
    accs = as_accs(accs)
    names = set(expected_hosts) | set(accs)
    if len(names) != 1:
        return None
    host = next(iter(names))
    known = pids.get(host) or {}
    units = rank_units({host: accs[host]} if host in accs else {})
    if len(known) < 2 and len(units) < 2:
        return None
    expected = sorted(set(units) | {unit_key(host, r) for r, _l in known.values()})
    seen = {u: seen_ns.get(host, opened_ns) for u in expected}
    stopped = {}
    for pid, v in (states.get(host) or {}).items():
        if pid in known:
            stopped[unit_key(host, known[pid][0])] = v
    found = hang_check(units, expected, seen, opened_ns, history, step, now_ns, th, stopped=stopped)
    if found is None:
        return None
    hosts = []
    for e in found["hosts"]:
        h, r = split_unit(e["host"])
        hosts.append(dict(e, host=h, rank=r))
    return dict(
        found,
        hosts=hosts,
        waiting=sorted({split_unit(u)[0] for u in found["waiting"]}),
        waiting_ranks=len(found["waiting"]),
    )
