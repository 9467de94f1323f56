"""A synthetic event source: a real, in-process :class:`EventSource` (same interface as the BPF source of
obshub/producer/probes.py) that generates a training-shaped event stream at a set rate, without BPF.

Used by the transport tests (exact event counts end to end), the benchmarks, replays without a kernel,
and ``obshub agent --source synthetic --rate N``. Each synthetic training step is ``events_per_step``
events of one rank: STEP_BEGIN, a forward PHASE, scheduler events (SCHED_RUNQ / SCHED_OFFCPU) filling the
step, a backward PHASE, an all_reduce (COLLECTIVE_BEGIN / COLLECTIVE_END on process group "0" with a
per-group sequence number), an optimizer PHASE and STEP_END, each carrying the TraceKey
``make_trace_key(host_id, step, op_seq)`` that the in-process instrumentation would have set. Timestamps
are this host's CLOCK_MONOTONIC ns at generation time, so offsets and latencies look real.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, NamedTuple

from obshub.core.schema import Event, Kind, Layer, make_trace_key

try:  # the probe side defines ProbeStatus; the synthetic source must not depend on bcc being importable
    from obshub.producer.probes import ProbeStatus  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised only before/without obshub/producer/probes.py

    class ProbeStatus(NamedTuple):  # type: ignore[no-redef]
        """One probe's attach result: ``name``, ``layer``, ``attached``, ``reason`` (why skipped)."""

        name: str
        layer: str
        attached: bool
        reason: str = ""


_SCHED_PROBE = "synthetic"


class SyntheticSource:
    """Generates ``rate`` events per second (steady, not bursty), up to ``total`` events (None: unbounded).

    ``host_id``, ``rank``, ``world_size``, ``job``: what the stream claims to come from. ``pid``: the
    pid put in events (default: this process). ``events_per_step``: events per synthetic step (>= 10).
    ``max_per_poll``: most events one :meth:`poll` returns (bounds the agent's per-turn latency).

    ``produced`` counts events returned so far; :meth:`add_loss` lets a test or a demo account events as
    lost (reported by :meth:`lost` exactly like in-kernel ring-buffer loss counters). ``on_done``: called
    once, from the :meth:`poll` that returns the last of ``total`` events (``obshub agent
    --synthetic-events`` passes ``Agent.stop``: the agent flushes and exits).
    Raises ValueError for a non-positive rate or fewer than 10 events per step.
    """

    def __init__(
        self,
        rate: float = 10_000.0,
        *,
        total: int | None = None,
        host_id: int = 0,
        rank: int = 0,
        world_size: int = 1,
        job: str = "synthetic",
        pid: int | None = None,
        events_per_step: int = 64,
        max_per_poll: int = 65_536,
        on_done: Callable[[], None] | None = None,
    ):
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        if events_per_step < 10:
            raise ValueError(f"events_per_step must be at least 10, got {events_per_step}")
        self.rate, self.total = float(rate), total
        self.host_id, self.rank, self.world_size, self.job = host_id, rank, world_size, job
        self.pid = os.getpid() if pid is None else pid
        self.events_per_step, self.max_per_poll = events_per_step, max_per_poll
        self.produced = 0
        self.on_done = on_done
        self.thresholds: dict[str, int] = {}
        self._lost: dict[str, int] = {_SCHED_PROBE: 0}
        self._lock = threading.Lock()
        self._t0: float | None = None
        self._closed = False
        self._pos = 0  # position within the current step
        self._step = 0
        self._op_seq = 0
        self._coll_seq = 0

    # -- EventSource ---------------------------------------------------------------------------------
    def start(self) -> list[ProbeStatus]:
        """Start generating (the rate clock starts now). Returns one attached pseudo-probe."""
        self._t0 = time.monotonic()
        return [
            ProbeStatus(
                "synthetic",
                Layer.AGENT.value,
                True,
                f"synthetic stream, {self.rate:g} events/s"
                + (f", {self.total} events" if self.total is not None else ""),
            )
        ]

    def poll(self, timeout_ms: int) -> list[Event]:
        """Events due by now at the configured rate; when none is due, waits up to ``timeout_ms`` for the
        next one. Returns [] once ``total`` events were produced or after :meth:`close`."""
        if self._t0 is None:
            self.start()
        if self._closed or (self.total is not None and self.produced >= self.total):
            time.sleep(min(timeout_ms, 50) / 1000)
            return []
        due = self._due()
        if due <= 0:
            wait = min(timeout_ms / 1000, (self.produced + 1) / self.rate - (time.monotonic() - self._t0))
            if wait > 0:
                time.sleep(wait)
            due = self._due()
            if due <= 0:
                return []
        out = self._generate(min(due, self.max_per_poll))
        if self.on_done is not None and self.total is not None and self.produced >= self.total:
            done, self.on_done = self.on_done, None
            done()
        return out

    def _due(self) -> int:
        due = int((time.monotonic() - self._t0) * self.rate) - self.produced
        if self.total is not None:
            due = min(due, self.total - self.produced)
        return due

    def lost(self) -> dict[str, int]:
        """Cumulative lost-event counts per probe (only what :meth:`add_loss` accounted)."""
        with self._lock:
            return dict(self._lost)

    def add_loss(self, n: int, probe: str = _SCHED_PROBE) -> None:
        """Account ``n`` events as lost by ``probe`` (as a full ring buffer would)."""
        with self._lock:
            self._lost[probe] = self._lost.get(probe, 0) + n

    def set_threshold(self, name: str, value: int) -> None:
        """Store a threshold (the synthetic stream does not filter on it; kept for the interface)."""
        self.thresholds[name] = int(value)

    def registrations(self) -> list[dict]:
        """The one registration this stream pretends to have seen."""
        return [
            {
                "job": self.job,
                "rank": self.rank,
                "world_size": self.world_size,
                "host_id": self.host_id,
                "pid": self.pid,
            }
        ]

    def close(self) -> None:
        """Stop generating."""
        self._closed = True

    # -- generation ----------------------------------------------------------------------------------
    def _generate(self, n: int) -> list[Event]:
        out: list[Event] = []
        append = out.append
        now = time.monotonic_ns()
        per = self.events_per_step
        pid, tid, host = self.pid, self.pid + 1, self.host_id
        step, op_seq, pos = self._step, self._op_seq, self._pos
        tk = make_trace_key(host, step, op_seq)
        for i in range(n):
            ts = now + i
            if pos == 0:
                op_seq = 0
                tk = make_trace_key(host, step, 0)
                append(Event(Kind.STEP_BEGIN, ts, 0, tk, step, pid, tid, -1, step, None))
            elif pos == per - 1:
                append(Event(Kind.STEP_END, ts, 1_000_000, tk, step, pid, tid, -1, step, None))
            elif pos in (1, per // 2, per - 3):
                op_seq += 1
                tk = make_trace_key(host, step, op_seq)
                phase = "forward" if pos == 1 else ("backward" if pos == per // 2 else "optimizer")
                append(Event(Kind.PHASE, ts, 100_000, tk, step, pid, tid, -1, 0, {"phase": phase}))
            elif pos in (per - 5, per - 4):
                if pos == per - 5:
                    op_seq += 1
                    tk = make_trace_key(host, step, op_seq)
                kind = Kind.COLLECTIVE_BEGIN if pos == per - 5 else Kind.COLLECTIVE_END
                append(
                    Event(
                        kind,
                        ts,
                        0 if kind == Kind.COLLECTIVE_BEGIN else 50_000,
                        tk,
                        step,
                        pid,
                        tid,
                        -1,
                        4096,
                        {"pg": "0", "coll_seq": self._coll_seq, "op": "all_reduce"},
                    )
                )
                if kind == Kind.COLLECTIVE_END:
                    self._coll_seq += 1
            elif pos & 1:
                append(Event(Kind.SCHED_RUNQ, ts, 5_000 + (pos * 37) % 3_000, tk, step, pid, tid, -1, pos % 2, None))
            else:
                append(Event(Kind.SCHED_OFFCPU, ts, 20_000 + (pos * 53) % 9_000, tk, step, pid, tid, -1, 1, None))
            pos += 1
            if pos == per:
                pos = 0
                step += 1
        self._step, self._op_seq, self._pos = step, op_seq, pos
        self.produced += n
        return out
