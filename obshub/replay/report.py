"""The replay's own per-step diagnosis, computed from the obshub events it publishes.

For every step and rank: step start (``STEP_BEGIN.ts_ns``), step duration (``STEP_END.duration_ns``),
and the *first collective* of the step: the (process group, sequence number) with the lowest sequence
number that every rank of the step reached. Its arrival on a rank is ``COLLECTIVE_BEGIN.ts_ns`` (the NCCL
kernel start: when that rank's GPU got to the collective); a rank waits there for the last one:

    wait_ns(rank) = max_r arrival(r) - arrival(rank)

The **straggler** (with at least two ranks) is the rank that arrived last (its wait is 0; the others
waited for it). This is how Flight Recorder / HTA reason about collectives; it needs comparable clocks,
which holds for ranks of
one host (one CLOCK_REALTIME) and within NTP/PTP error across hosts. The kernel time of the collective
(``COLLECTIVE_END.duration_ns``) is the same wait plus the transfer, a check that needs no clocks.

This table always names the last arrival. The stream application's summary is stricter: it names a
straggler only when the last arrival's lead over the *second*-latest exceeds its threshold
(``streams.analysis.Thresholds``), so a step where several ranks are late together is "clean" there.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from obshub.core.schema import Event, Kind


@dataclass
class RankStep:
    """One rank in one step. Times in ns; ``first_coll_*`` None when the step had no collective on all
    ranks."""

    host: str
    step: int
    start_ns: int | None = None
    duration_ns: int | None = None
    first_coll_arrival_ns: int | None = None
    first_coll_kernel_ns: int | None = None
    wait_ns: int | None = None
    straggler: bool = False


@dataclass
class StepDiagnosis:
    """A step: its ranks (sorted by host), the first collective ``(pg, coll_seq, op)`` and the
    straggler host (None without a shared collective)."""

    step: int
    ranks: list[RankStep]
    first_collective: tuple[str, int, str] | None
    straggler: str | None
    skew_ns: int | None


class ReplayReport:
    """Feed every published event to :meth:`observe`; :meth:`steps` gives the diagnosis."""

    def __init__(self) -> None:
        self._rs: dict[tuple[int, str], RankStep] = {}
        # step -> (pg, seq) -> host -> (arrival_ns, kernel_ns, op)
        self._coll: dict[int, dict[tuple[str, int], dict[str, list]]] = defaultdict(lambda: defaultdict(dict))

    def _get(self, host: str, step: int) -> RankStep:
        return self._rs.setdefault((step, host), RankStep(host, step))

    def observe(self, host: str, ev: Event) -> None:
        """Account one event of ``host``."""
        k = ev.kind
        if k == Kind.STEP_BEGIN:
            self._get(host, ev.step).start_ns = ev.ts_ns
        elif k == Kind.STEP_END:
            self._get(host, ev.step).duration_ns = ev.duration_ns
        elif k in (Kind.COLLECTIVE_BEGIN, Kind.COLLECTIVE_END) and ev.step >= 0 and ev.payload:
            key = (str(ev.payload.get("pg")), int(ev.payload.get("coll_seq", -1)))
            rec = self._coll[ev.step][key].setdefault(host, [None, None, ev.payload.get("op", "?")])
            if k == Kind.COLLECTIVE_BEGIN:
                rec[0] = ev.ts_ns
            else:
                rec[1] = ev.duration_ns

    def steps(self) -> list[StepDiagnosis]:
        """The diagnosis of every step seen, by step number."""
        out = []
        for step in sorted({s for s, _ in self._rs}):
            ranks = sorted((rs for (s, _), rs in self._rs.items() if s == step), key=_host_order)
            hosts = {r.host for r in ranks}
            first, straggler, skew = None, None, None
            shared = [
                (key, by_host)
                for key, by_host in self._coll.get(step, {}).items()
                if hosts <= set(by_host) and all(v[0] is not None for v in by_host.values())
            ]
            if shared:
                key, by_host = min(shared, key=lambda kv: (kv[0][1], kv[0][0]))
                first = (key[0], key[1], next(iter(by_host.values()))[2])
                last = max(by_host[h][0] for h in hosts)
                skew = last - min(by_host[h][0] for h in hosts)
                for r in ranks:
                    arr, kern, _ = by_host[r.host]
                    r.first_coll_arrival_ns, r.first_coll_kernel_ns, r.wait_ns = arr, kern, last - arr
                if len(hosts) >= 2:  # one rank alone waits for nobody it can see
                    straggler = max(hosts, key=lambda h: (by_host[h][0], h))
                    for r in ranks:
                        r.straggler = r.host == straggler
            out.append(StepDiagnosis(step, ranks, first, straggler, skew))
        return out


def _host_order(r: RankStep):
    h = r.host
    return (0, int(h[4:])) if h.startswith("rank") and h[4:].isdigit() else (1, h)
