"""Agent-shaped load for the stream and scale benchmarks: the batches of ``hosts`` agents over ``steps``
training steps, built on ``streams.synthetic`` (known straggler and guilty layer) and shaped like what
``obshub agent`` really sends:

- ``events_per_step`` events per host and step (default 64, the agent's synthetic source default and
  the order of what one rank of ``ddp_train`` emits per step with every probe attached): the scenario's
  own ~13 structural events (step begin/end, phases, collectives) plus SCHED_RUNQ events below the
  alerting threshold, carrying the step's TraceKey, which the stream worker accumulates like any other;
- ``steps_per_batch`` consecutive steps of one host per Kafka message (the agent seals a batch every
  200 ms; at ~70 ms per step that is ~3 steps), ``seq`` contiguous per agent.

Shapes: :func:`build` returns :class:`Load` with ``messages`` = ``[(key bytes, value bytes)]`` in send
order (step-major, so hosts interleave like live agents), ``events`` and ``steps`` totals.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from obshub.core import schema
from obshub.core.schema import Batch, Event, Kind, make_trace_key, parse_trace_key
from obshub.streams import synthetic

RUNQ_NS = 20_000  # 20 µs run-queue waits: accumulated by the worker, far below any blame threshold


@dataclass
class Load:
    """Encoded batches plus what they contain (for checking that everything was processed)."""

    messages: list[tuple[bytes, bytes]]
    events: int
    steps: int
    hosts: int
    job: str
    step_ms: float

    @property
    def bytes(self) -> int:
        """Total value bytes (uncompressed msgpack)."""
        return sum(len(v) for _k, v in self.messages)


def _pad(batch: Batch, events_per_step: int) -> list[Event]:
    """The batch's events plus SCHED_RUNQ filler up to ``events_per_step`` per step it holds."""
    out = list(batch.events)
    by_step: dict[int, list[Event]] = {}
    for e in batch.events:
        if e.step >= 0:
            by_step.setdefault(e.step, []).append(e)
    for step, evs in by_step.items():
        begin = min(e.ts_ns for e in evs)
        end = max(e.ts_ns + e.duration_ns for e in evs)
        n = max(0, events_per_step - len(evs))
        host_id = parse_trace_key(evs[0].trace_key).host_id if evs[0].trace_key else batch.host_id
        span = max(1, end - begin)
        for j in range(n):
            ts = begin + span * (j + 1) // (n + 1)
            out.append(
                Event(
                    int(Kind.SCHED_RUNQ),
                    ts,
                    RUNQ_NS,
                    make_trace_key(host_id, step, 1 + j % 8),
                    step,
                    evs[0].pid,
                    evs[0].tid or evs[0].pid,
                    -1,
                    0,
                    None,
                )
            )
    out.sort(key=lambda e: e.ts_ns)
    return out


def build(
    hosts: int,
    steps: int,
    *,
    job: str = "bench",
    events_per_step: int = 64,
    steps_per_batch: int = 3,
    first_step: int = 0,
    guilty_steps: tuple[int, ...] = (),
    guilty_layer: str = "sched",
) -> Load:
    """Encode the batches of ``hosts`` agents for ``steps`` steps (see the module docstring). Raises
    ValueError for non-positive sizes."""
    if hosts < 1 or steps < 1 or steps_per_batch < 1:
        raise ValueError(f"hosts={hosts}, steps={steps}, steps_per_batch={steps_per_batch} must be >= 1")
    scn = synthetic.Scenario(
        job=job,
        hosts=hosts,
        steps=steps,
        first_step=first_step,
        straggler=min(2, hosts - 1),
        guilty_steps=guilty_steps,
        guilty_layer=guilty_layer,
    )
    per_host: dict[str, list[Batch]] = {}
    for _key, b in synthetic.generate(scn):
        per_host.setdefault(b.host, []).append(b)
    rounds: list[list[tuple[bytes, bytes]]] = []
    total = 0
    for host, batches in per_host.items():
        seq = 0
        for i in range(0, len(batches), steps_per_batch):
            group = batches[i : i + steps_per_batch]
            events = [e for b in group for e in _pad(b, events_per_step)]
            merged = replace(group[-1], events=events, seq=seq)
            seq += 1
            total += len(events)
            while len(rounds) <= i // steps_per_batch:
                rounds.append([])
            rounds[i // steps_per_batch].append((host.encode(), schema.encode_batch(merged)))
    step_ms = scn.forward_ms + scn.colls_per_step * (scn.bucket_ms + scn.coll_ms) + scn.optimizer_ms
    return Load([m for r in rounds for m in r], total, steps, hosts, job, step_ms)
