"""Synthetic agents of one wide job, cheap enough for 2,048 hosts at 1 s steps (131,072 events/s): the
batches of every host are built and msgpack-encoded *before* the run from a few template steps of
``streams.synthetic`` (known straggler and guilty layer), then published on a wall-clock schedule by one
confluent-kafka producer, the way ``obshub agent`` would send them.

Shape of the load (``Shape``):

- ``hosts`` agents of job ``job``, one rank each; ``events_per_step`` events per host and step (default
  64, the stream benchmark's shape: the scenario's ~13 structural events plus SCHED_RUNQ filler, see
  bench/loadgen.py);
- steps of ``step_s`` seconds (wall clock and event time alike): compute ~0.74 s (0.94 s in a guilty
  step: every rank waits for the straggler in the step's collectives), then idle;
- one batch per host and step, published at that host's STEP_END: the real agent's policy
  (obshub/producer/batcher.py, docs/AGENT.md "Batches") seals the open batch at a step end (the step's
  aggregates right behind its STEP_END), once the batch is ``BATCH_STEP_MIN_AGE_MS`` old when the
  previous one was step-aligned too, and by age at ``BATCH_MAX_AGE_MS``; a step of this shape opens its
  batch with its STEP_BEGIN and ends 0.74-0.94 s later, between the two bounds, so the agent seals
  exactly one batch per step at its STEP_END. The batches of one step are published in groups by their
  STEP_END time (``TICK_S`` ticks) at ``T0 + s * step_s + end``;
- from step ``guilty_from`` (10) on, host ``straggler`` (``node2``) is slower by ``extra_ms`` each step,
  spent waiting for a CPU (run-queue events): the stream app must name it, blamed for ``sched``, and the
  builtin rule ``sched_contention_on_straggler`` must fire for it.

Templates: ``TEMPLATES`` clean steps and as many guilty ones (so jitter differs between steps); step ``s``
is a copy of a template with its times shifted to ``start_ns + s * step_s`` and its step number, TraceKey
step bits, step markers and collective sequence numbers rewritten. Every batch is a valid v1 batch
(``obshub.core.schema``), ``seq`` contiguous per agent from the REGISTER batch (seq 0).

Run as a process (what ``bench.width`` does)::

    python -m bench.fleet --bootstrap 127.0.0.1:9092 --hosts 512 --steps 90
    # stdout, JSON lines: {"ready": ...} once encoded; then, after "go <epoch_s>" on stdin,
    # {"step": s, "t_ns": ..., "events": ..., "messages": ..., "late_s": ...} after each step's last batch

``t_ns`` is the wall time at which every batch of the step was acknowledged by the broker (the step's
last event is in Kafka); ``late_s`` how far behind schedule the producer was (0 when it kept up).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from dataclasses import dataclass

from obshub.core import kafka, schema
from obshub.core.schema import Batch, Kind
from obshub.core.settings import BATCH_MAX_AGE_MS, BATCH_STEP_MIN_AGE_MS
from obshub.streams import synthetic

TEMPLATES = 2
TICK_S = 0.01  # publication groups: the hosts whose step ends in the same 10 ms go out together
RUNQ_NS = 20_000  # filler run-queue waits: accumulated by the worker, far below any blame threshold
RECLAIM_PER_RANK = 2  # a memory host's rank-step: this many of its filler events are reclaim stalls
RECLAIM_NS = 1_000_000  # of 1 ms each (2 ms a rank-step: pressure the step does not wait for)
STEP16 = 0xFFFF << 32
_MARKERS = (int(Kind.STEP_BEGIN), int(Kind.STEP_END))
_COLLS = (int(Kind.COLLECTIVE_BEGIN), int(Kind.COLLECTIVE_END))


@dataclass(frozen=True)
class Shape:
    """One job's load. Times: ``step_s`` seconds, ``extra_ms`` ms. See the module docstring."""

    hosts: int
    steps: int
    job: str = "wide"
    events_per_step: int = 64
    step_s: float = 1.0
    guilty_from: int = 10
    extra_ms: float = 200.0
    ranks_per_host: int = 1  # ranks per host: every host's batch holds each rank's events (per rank-step)
    guilty_layer: str = "sched"  # where the straggler's extra time goes (streams.synthetic.GUILTY_KINDS)
    mem_hosts: int = 0  # hosts (not the straggler) whose ranks stall in reclaim every step (MEM_RECLAIM filler)

    @property
    def mem_set(self) -> frozenset[int]:
        """Indexes of the ``mem_hosts`` hosts spread evenly over the job, the straggler left out."""
        if not 0 <= self.mem_hosts < self.hosts:
            raise ValueError(f"mem_hosts={self.mem_hosts}: expected 0 to {self.hosts - 1} (hosts={self.hosts})")
        others = [i for i in range(self.hosts) if i != self.straggler]
        return frozenset(others[k * len(others) // self.mem_hosts] for k in range(self.mem_hosts))

    @property
    def straggler(self) -> int:
        """Index of the slow host (``node2``, or the last host of a smaller job)."""
        return min(2, self.hosts - 1)

    @property
    def straggler_rank(self) -> int:
        """Global rank of the slow rank: local rank ``ranks_per_host // 2`` of the slow host."""
        return self.straggler * self.ranks_per_host + self.ranks_per_host // 2

    @property
    def straggler_host(self) -> str:
        return f"node{self.straggler}"

    @property
    def events_per_step_total(self) -> int:
        return self.hosts * self.ranks_per_host * self.events_per_step


def scenario(shape: Shape, start_ns: int) -> synthetic.Scenario:
    """The ``streams.synthetic`` scenario whose steps are the templates: ``TEMPLATES`` clean steps, then
    ``TEMPLATES`` guilty ones; a clean step lasts ~0.74 s, a guilty one ``extra_ms`` more (both < 1 s)."""
    return synthetic.Scenario(
        job=shape.job,
        hosts=shape.hosts * shape.ranks_per_host,
        steps=2 * TEMPLATES,
        straggler=shape.straggler_rank,
        guilty_steps=tuple(range(TEMPLATES, 2 * TEMPLATES)),
        guilty_layer=shape.guilty_layer,
        forward_ms=560.0,
        bucket_ms=40.0,
        coll_ms=10.0,
        optimizer_ms=30.0,
        extra_ms=shape.extra_ms,
        start_ns=start_ns,
    )


def _pad(batch: Batch, events_per_step: int, ranks: int = 1, mem: bool = False) -> list[list]:
    """The events of a one-step batch (as lists) plus SCHED_RUNQ filler up to ``events_per_step``, spread
    evenly over the step (before its STEP_END: what a rank's threads do after it belongs to the next
    step), sorted by time (bench/loadgen.py's shape, without its per-event checks). With ``ranks`` ranks
    per host (process ids 1000 + local rank, ``synthetic.generate_ranks``) the filler goes round-robin to
    them and ``events_per_step`` counts per rank. ``mem``: the first ``RECLAIM_PER_RANK`` filler events of
    each rank are MEM_RECLAIM stalls of ``RECLAIM_NS`` instead (a host under memory pressure)."""
    evs = [list(e) for e in batch.events]
    n = events_per_step * ranks - len(evs)
    if n > 0:
        e0 = evs[0]
        begin = min(e[1] for e in evs)
        span = max(1, max(e[1] for e in evs) - begin)
        tk = (batch.host_id << 48) | ((e0[4] & 0xFFFF) << 32)
        evs += [
            [
                int(Kind.MEM_RECLAIM) if mem and j < RECLAIM_PER_RANK * ranks else int(Kind.SCHED_RUNQ),
                begin + span * (j + 1) // (n + 1),
                RECLAIM_NS if mem and j < RECLAIM_PER_RANK * ranks else RUNQ_NS,
                tk | (1 + j % 8),
                e0[4],
                e0[5] if ranks == 1 else 1000 + j % ranks,
                e0[6] if ranks == 1 else 1000 + j % ranks,
                -1,
                0,
                None,
            ]
            for j in range(n)
        ]
    evs.sort(key=lambda e: e[1])
    return evs


class Fleet:
    """Templates of ``shape`` and the encoder of any step from them. ``start_ns``: realtime of step 0."""

    def __init__(self, shape: Shape, start_ns: int):
        if shape.hosts < 1 or shape.steps < 1:
            raise ValueError(f"hosts={shape.hosts}, steps={shape.steps} must be >= 1")
        self.shape, self.start_ns = shape, start_ns
        scn = scenario(shape, start_ns)
        self.step_ns = int(shape.step_s * 1e9)
        pairs = (
            synthetic.generate(scn)
            if shape.ranks_per_host == 1
            else synthetic.generate_ranks(scn, shape.ranks_per_host)
        )
        self.register = [b for _k, b in pairs[: shape.hosts]]
        # tmpl[t][i] = the events of host i in template step t: (event list, collective index or -1)
        self.tmpl: list[list[list[tuple[list, int]]]] = [[[] for _ in range(shape.hosts)] for _ in range(2 * TEMPLATES)]
        # end[t][i] = when host i's batch of template step t is sealed: its STEP_END (its last event), in
        # seconds after the step's begin
        self.end: list[list[float]] = [[0.0] * shape.hosts for _ in range(2 * TEMPLATES)]
        self.clock = {b.host_id: b.clock for b in self.register}
        begin_rt: dict[int, int] = {}  # realtime of each template step's begin: its earliest event
        for _k, b in pairs[shape.hosts :]:
            t = b.events[0].step
            rt = min(e.ts_ns for e in b.events) + b.clock.offset_ns
            begin_rt[t] = min(begin_rt.get(t, rt), rt)
        mem = shape.mem_set
        for _k, b in pairs[shape.hosts :]:
            evs = _pad(b, shape.events_per_step, shape.ranks_per_host, b.host_id in mem)
            t = b.events[0].step
            rt0 = b.clock.offset_ns
            self.tmpl[t][b.host_id] = [
                (e, e[9]["coll_seq"] - t * scn.colls_per_step if e[0] in _COLLS else -1) for e in evs
            ]
            end = max(e[1] for e in evs) + rt0 - begin_rt[t]
            age = max(e[1] for e in evs) - min(e[1] for e in evs)  # the batch's age at its STEP_END
            if not (BATCH_STEP_MIN_AGE_MS * 1e6 <= age < BATCH_MAX_AGE_MS * 1e6) or end >= self.step_ns:
                raise ValueError(
                    f"template step {t} of host {b.host_id} spans {age / 1e9:.3f} s and ends {end / 1e9:.3f} s "
                    f"into its {shape.step_s} s step: the agent would not seal one batch per step "
                    f"(step-aligned from {BATCH_STEP_MIN_AGE_MS} ms, by age at {BATCH_MAX_AGE_MS} ms)"
                )
            self.end[t][b.host_id] = end / 1e9
        self.begin_rt = begin_rt
        self.colls = scn.colls_per_step

    def template_of(self, step: int) -> int:
        """Template index of run step ``step``: clean before ``guilty_from``, guilty from it on."""
        return step % TEMPLATES + (TEMPLATES if step >= self.shape.guilty_from else 0)

    def register_messages(self) -> list[tuple[bytes, bytes]]:
        """The REGISTER batch (seq 0) of every host."""
        out = []
        for b in self.register:
            b2 = Batch(b.job, b.host, b.host_id, b.agent_id, 0, b.events, b.clock, self.start_ns)
            out.append((b.host.encode(), schema.encode_batch(b2)))
        return out

    def step_slots(self, step: int, seqs: list[int]) -> list[tuple[float, list[tuple[bytes, bytes]], int]]:
        """The batches of ``step``, one per host, in publication groups: ``(due, [(key, value)], events)``
        with ``due`` the group's STEP_END tick in seconds after the step's begin, in time order. ``seqs[i]``
        is host i's next batch seq (advanced here)."""
        t = self.template_of(step)
        shift = self.start_ns + step * self.step_ns - self.begin_rt[t]
        tk_step = (step & 0xFFFF) << 32
        base_coll = step * self.colls
        job = self.shape.job
        groups: dict[int, tuple[list[tuple[bytes, bytes]], list[int]]] = {}
        for b in self.register:
            i = b.host_id
            tick = int(self.end[t][i] / TICK_S) + 1  # sealed at its STEP_END, sent at the tick after it
            msgs, n = groups.setdefault(tick, ([], [0]))
            sent = self.start_ns + step * self.step_ns + int(tick * TICK_S * 1e9)
            evs = []
            for e, k in self.tmpl[t][i]:
                kind = e[0]
                p = e[9]
                if k >= 0:
                    p = {**p, "coll_seq": base_coll + k}
                evs.append(
                    [
                        kind,
                        e[1] + shift,
                        e[2],
                        (e[3] & ~STEP16) | tk_step,
                        step if e[4] >= 0 else e[4],
                        e[5],
                        e[6],
                        e[7],
                        step if kind in _MARKERS else e[8],
                        p,
                    ]
                )
            batch = Batch(job, b.host, i, b.agent_id, seqs[i], evs, b.clock, sent)
            seqs[i] += 1
            msgs.append((b.host.encode(), schema.encode_batch(batch)))
            n[0] += len(evs)
        return [(tick * TICK_S, msgs, n[0]) for tick, (msgs, n) in sorted(groups.items())]

    def encode_all(self) -> list[list[tuple[float, list[tuple[bytes, bytes]], int]]]:
        """Every step of the shape, encoded: ``[step][group] = (due, messages, events)``."""
        seqs = [1] * self.shape.hosts
        return [self.step_slots(s, seqs) for s in range(self.shape.steps)]


def one_step_batches(shape: Shape, step: int) -> list[Batch]:
    """The decoded batches of one run step (for measuring ``streams.analysis.summarize`` on the very data
    the pipeline gets)."""
    f = Fleet(Shape(**{**shape.__dict__, "steps": step + 1}), time.time_ns())
    seqs = [1] * shape.hosts
    return [schema.decode_batch(v) for _due, msgs, _n in f.step_slots(step, seqs) for _k, v in msgs]


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def publish(bootstrap: str, topic: str, shape: Shape, *, compression: str = "lz4") -> int:
    """Encode every step, report ready, wait for ``go <epoch_s>`` on stdin, publish on schedule (see the
    module docstring). Returns 0; SIGTERM stops after the current slot."""
    from confluent_kafka import Producer

    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("now", True))
    t0 = time.perf_counter()
    # event time of step 0: now, so events trail the wall clock by the encoding time (never lead it: a
    # record time ahead of the wall clock would move the rule engine's clock past the step summaries')
    start_ns = time.time_ns()
    fleet = Fleet(shape, start_ns)
    steps = fleet.encode_all()
    reg = fleet.register_messages()
    size = sum(len(v) for st in steps for _due, msgs, _n in st for _k, v in msgs)
    _emit(
        {
            "ready": True,
            "encode_s": time.perf_counter() - t0,
            "bytes": size,
            "messages": sum(len(msgs) for st in steps for _due, msgs, _n in st),
        }
    )
    line = sys.stdin.readline().split()
    if len(line) != 2 or line[0] != "go":
        return 2
    go = float(line[1])
    prod = Producer(
        kafka.producer_config(
            kafka.KafkaConnection(bootstrap=bootstrap),
            {
                "compression.type": compression,
                "linger.ms": 20,
                "enable.idempotence": True,
                "message.max.bytes": 16 << 20,
                "queue.buffering.max.messages": 1_000_000,
            },
        )
    )
    for k, v in reg:
        prod.produce(topic, key=k, value=v)
    prod.flush(30)
    events = messages = 0
    for s, groups in enumerate(steps):
        late = 0.0
        for end, msgs, n in groups:
            due = go + s * shape.step_s + end
            wait = due - time.time()
            if wait > 0:
                time.sleep(wait)
            else:
                late = max(late, -wait)
            if stop["now"]:
                prod.flush(10)
                return 0
            for k, v in msgs:
                prod.produce(topic, key=k, value=v)
            prod.flush(30)
            events += n
            messages += len(msgs)
        _emit({"step": s, "t_ns": time.time_ns(), "events": events, "messages": messages, "late_s": late})
    prod.flush(30)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line of the publishing process (see the module docstring)."""
    p = argparse.ArgumentParser(
        prog="python -m bench.fleet", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", default=schema.TOPIC_EVENTS)
    p.add_argument("--hosts", type=int, required=True)
    p.add_argument("--job", default="wide")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--events-per-step", type=int, default=64)
    p.add_argument("--step-s", type=float, default=1.0)
    p.add_argument("--guilty-from", type=int, default=10)
    p.add_argument("--ranks-per-host", type=int, default=1)
    a = p.parse_args(argv)
    shape = Shape(
        a.hosts,
        a.steps,
        job=a.job,
        events_per_step=a.events_per_step,
        step_s=a.step_s,
        guilty_from=a.guilty_from,
        ranks_per_host=a.ranks_per_host,
    )
    return publish(a.bootstrap, a.topic, shape)


if __name__ == "__main__":
    raise SystemExit(main())
