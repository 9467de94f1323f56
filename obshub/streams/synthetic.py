"""Synthetic agent batches of a data-parallel training job with a known straggler and guilty layer.

Used by the streams tests, the demo and the benchmarks: the ground truth (which host, which layer, which
steps) is known, so the stream application's answer can be checked exactly.

Model of one step (synchronous data parallelism, docs/SCHEMA.md "TraceKey"): every host begins the step,
runs forward, then ``colls_per_step`` backward buckets each followed by a blocking all_reduce on process
group "0"; a collective starts when the last host arrives and lasts ``coll_ms``; then the optimizer. So
every host has (nearly) the same step time, and only the collective arrival skew shows who was late. At a
guilty step the straggler's forward takes ``extra_ms`` longer, and its events show where the time went:
``guilty_layer`` "sched" -> run-queue latency events, "memory" -> direct-reclaim stalls, "cuda" ->
synchronize calls, "nic" -> RDMA completion latency, "pytorch" -> nothing else (slower compute itself),
"network" -> TCP retransmits (a count; the delay comes with them); in a network scenario every host also
carries one RTT sample per step on its connection to every other host, and in a guilty step both ends of
each of the straggler's connections retransmit (``_link_events``).

Each host has its own monotonic clock (``offset_ns`` differs per host) and a clock uncertainty, like real
agents. Batches: per host, seq 0 carries the REGISTER event, then one batch per step.

Example::

    from obshub.streams import synthetic
    scn = synthetic.Scenario(job="demo", hosts=4, steps=50, straggler=2, guilty_steps=(10, 11, 30),
                             guilty_layer="sched")
    for key, batch in synthetic.generate(scn):
        producer.produce(topic, key=key, value=schema.encode_batch(batch))
    synthetic.expected(scn)   # {10: ("node2", "sched"), 11: (...), 30: (...)}
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from obshub.core import schema
from obshub.core.schema import Batch, Clock, Event, Kind

MS = 1_000_000
GUILTY_KINDS = {
    "sched": Kind.SCHED_RUNQ,
    "memory": Kind.MEM_RECLAIM,
    "cuda": Kind.CUDA_SYNC,
    "nic": Kind.RDMA_CQ_DONE,
    "network": Kind.TCP_RETRANSMIT,
    "pytorch": None,
}


@dataclass(frozen=True)
class Scenario:
    """Parameters of a synthetic run (times in ms; ``*_steps`` are step numbers).

    ``straggler``/``guilty_steps``/``guilty_layer``/``extra_ms``: who is slow, when, why, by how much.
    ``jitter_ms``: uniform noise on every compute segment of every host (clean steps stay below the
    straggler threshold with the defaults). ``stop_host``/``stop_after``: that host sends nothing for steps
    after ``stop_after``. ``first_step``: number of the first step. ``start_ns``: realtime of step 0.
    """

    job: str = "synthetic"
    hosts: int = 4
    steps: int = 50
    first_step: int = 0
    seed: int = 7
    forward_ms: float = 20.0
    bucket_ms: float = 10.0
    colls_per_step: int = 3
    coll_ms: float = 4.0
    optimizer_ms: float = 5.0
    jitter_ms: float = 0.3
    straggler: int = 2
    guilty_steps: tuple[int, ...] = ()
    guilty_layer: str = "sched"
    extra_ms: float = 40.0
    stop_host: int | None = None
    stop_after: int = -1
    clock_uncertainty_ns: int = 20_000
    start_ns: int = 1_780_000_000_000_000_000

    def host_name(self, i: int) -> str:
        """Host name of host index ``i`` (``node<i>``)."""
        return f"node{i}"

    def agent_id(self, i: int) -> str:
        """Agent instance id of host ``i`` (unique per job)."""
        return f"{self.job}/{self.host_name(i)}/a1"


def _offset(i: int) -> int:
    # realtime = monotonic + offset; hosts booted at different times, so offsets differ by hours
    return 1_700_000_000_000_000_000 + i * 3_600_123_456_789


def _ev(kind: Kind, rt: int, i: int, step: int, op_seq: int, **kw) -> Event:
    tk = schema.make_trace_key(i, max(step, 0), op_seq)
    return Event(
        int(kind),
        rt - _offset(i),
        kw.pop("dur", 0),
        tk,
        step,
        1000 + i,
        1000 + i,
        kw.pop("gpu", 0),
        kw.pop("value", 0),
        kw.pop("payload", None),
    )


def link_addr(i: int) -> str:
    """The address of host ``i`` on the job's network in network scenarios (``10.1.0.<i + 1>``)."""
    return "10.1.0.%d" % (i + 1)


def _link_events(scn: Scenario, i: int, step: int, start_rt: int, guilty: bool) -> list[Event]:
    """Host ``i``'s traffic in a network scenario: one RTT sample (80 µs) on its connection to every other
    host, every step. In a guilty step the straggler's link drops packets both ways, so both ends of each
    of its connections retransmit (3 segments each): the straggler towards every peer, every peer towards
    the straggler. Retransmits are counted by their sender, as the kernel's tracepoint does."""
    out = []
    for j in range(scn.hosts):
        if j == i:
            continue
        pay = {"saddr": link_addr(i), "daddr": link_addr(j), "sport": 41000 + i, "dport": 29500}
        out.append(_ev(Kind.TCP_RTT, start_rt + j, i, step, 1, dur=80_000, value=10_000, payload=pay))
        if guilty and scn.straggler in (i, j):
            out += [
                _ev(Kind.TCP_RETRANSMIT, start_rt + 100 + 10 * j + k, i, step, 1, value=1, payload={**pay, "state": 1})
                for k in range(3)
            ]
    return out


def _guilty_events(scn: Scenario, i: int, step: int, start_rt: int, extra_ns: int) -> list[Event]:
    kind = GUILTY_KINDS[scn.guilty_layer]
    if kind is None:
        return []
    if kind == Kind.TCP_RETRANSMIT:
        return [
            _ev(
                kind,
                start_rt + k * 1000,
                i,
                step,
                1,
                value=1,
                payload={"saddr": "10.0.0.%d" % i, "daddr": "10.0.0.9", "sport": 40000, "dport": 29500, "state": 1},
            )
            for k in range(12)
        ]
    part = extra_ns // 4
    pay = {"symbol": "cudaDeviceSynchronize"} if kind == Kind.CUDA_SYNC else None
    return [
        _ev(
            kind,
            start_rt + (k + 1) * part,
            i,
            step,
            1,
            dur=part,
            value=0 if kind != Kind.RDMA_CQ_DONE else k,
            payload=pay if kind != Kind.RDMA_CQ_DONE else {"qp": 7, "status": 0},
        )
        for k in range(4)
    ]


def generate(scn: Scenario) -> list[tuple[bytes, Batch]]:
    """All batches of the scenario as ``(kafka key, Batch)`` in publication order (register batches first,
    then step by step, host by host). Deterministic for a given ``seed``."""
    rng = random.Random(scn.seed)
    jit = lambda: int(rng.uniform(0, scn.jitter_ms) * MS)  # noqa: E731
    out: list[tuple[bytes, Batch]] = []
    seq = [0] * scn.hosts
    clock = lambda i: Clock(_offset(i), scn.clock_uncertainty_ns, 37_000_000_000)  # noqa: E731

    def emit(i: int, events: list[Event], sent_rt: int) -> None:
        out.append(
            (
                scn.host_name(i).encode(),
                Batch(scn.job, scn.host_name(i), i, scn.agent_id(i), seq[i], events, clock(i), sent_rt),
            )
        )
        seq[i] += 1

    t = scn.start_ns
    for i in range(scn.hosts):
        emit(
            i,
            [
                _ev(
                    Kind.REGISTER,
                    t,
                    i,
                    -1,
                    0,
                    value=i,
                    payload={"world_size": scn.hosts, "job": scn.job, "host_id": i, "local_rank": 0},
                )
            ],
            t,
        )
    for step in range(scn.first_step, scn.first_step + scn.steps):
        guilty = step in scn.guilty_steps
        evs: list[list[Event]] = [[] for _ in range(scn.hosts)]
        begin = [t + jit() for _ in range(scn.hosts)]
        arrive = []
        for i in range(scn.hosts):
            extra = int(scn.extra_ms * MS) if guilty and i == scn.straggler else 0
            fwd = int(scn.forward_ms * MS) + jit() + extra
            evs[i].append(_ev(Kind.STEP_BEGIN, begin[i], i, step, 0, value=step))
            evs[i].append(_ev(Kind.PHASE, begin[i] + fwd, i, step, 1, dur=fwd, payload={"phase": "forward"}))
            evs[i].append(_ev(Kind.SCHED_RUNQ, begin[i] + 1000, i, step, 1, dur=15_000 + jit() // 100, value=i))
            evs[i].append(
                _ev(
                    Kind.TCP_RTT,
                    begin[i] + 2000,
                    i,
                    step,
                    1,
                    dur=80_000,
                    value=10_000,
                    payload={"saddr": "10.0.0.%d" % i, "daddr": "10.0.0.9", "sport": 40000, "dport": 29500},
                )
            )
            if scn.guilty_layer == "network":
                evs[i] += _link_events(scn, i, step, begin[i] + 3000, guilty)
            if extra:
                evs[i] += _guilty_events(scn, i, step, begin[i], extra)
            arrive.append(begin[i] + fwd)
        for k in range(scn.colls_per_step):
            arrive = [a + int(scn.bucket_ms * MS) + jit() for a in arrive]
            start = max(arrive)
            end = start + int(scn.coll_ms * MS)
            coll_seq = (step - scn.first_step) * scn.colls_per_step + k
            pay = {"pg": "0", "coll_seq": coll_seq, "op": "all_reduce"}
            for i in range(scn.hosts):
                evs[i].append(_ev(Kind.COLLECTIVE_BEGIN, arrive[i], i, step, 2 + 2 * k, value=4 << 20, payload=pay))
                evs[i].append(
                    _ev(Kind.COLLECTIVE_END, end, i, step, 3 + 2 * k, dur=end - arrive[i], value=4 << 20, payload=pay)
                )
            arrive = [end] * scn.hosts
        ends = []
        for i in range(scn.hosts):
            opt = int(scn.optimizer_ms * MS) + jit()
            bwd_start = evs[i][1].ts_ns + _offset(i)
            evs[i].append(
                _ev(Kind.PHASE, arrive[i], i, step, 90, dur=arrive[i] - bwd_start, payload={"phase": "backward"})
            )
            end_i = arrive[i] + opt
            evs[i].append(_ev(Kind.PHASE, end_i, i, step, 91, dur=opt, payload={"phase": "optimizer"}))
            evs[i].append(_ev(Kind.STEP_END, end_i, i, step, 92, dur=end_i - begin[i], value=step))
            ends.append(end_i)
        for i in range(scn.hosts):
            if scn.stop_host == i and step > scn.stop_after:
                continue
            emit(i, evs[i], max(ends))
        t = max(ends) + MS
    return out


def expected(scn: Scenario) -> dict[int, tuple[str, str]]:
    """Ground truth: ``{step: (straggler host name, guilty layer)}`` for every guilty step."""
    return {s: (scn.host_name(scn.straggler), scn.guilty_layer) for s in scn.guilty_steps}


def generate_ranks(scn: Scenario, ranks_per_host: int) -> list[tuple[bytes, Batch]]:
    """The batches of ``scn`` with ``ranks_per_host`` ranks per host: ``scn.hosts`` counts *ranks* (the
    job's world size, a multiple of ``ranks_per_host``) and ``scn.straggler`` the slow global rank.
    Global rank ``u`` runs on host ``u // ranks_per_host`` as local rank ``u % ranks_per_host``, process id
    ``1000 + local rank``; one agent per host sends one batch per step holding every rank's events (on the
    host's clock, ``Batch.host_id`` = host index). Host names ``node<i>``; REGISTER per rank with its
    ``local_rank``. The straggler's host is ``scn.straggler // ranks_per_host``."""
    if ranks_per_host < 1 or scn.hosts % ranks_per_host:
        raise ValueError(f"hosts ({scn.hosts} ranks) must be a multiple of ranks_per_host ({ranks_per_host})")
    n_hosts = scn.hosts // ranks_per_host
    per_host: dict[int, list[list[Event]]] = {}  # host -> its batches' events, in order
    sent: dict[int, list[int]] = {}
    for _key, b in generate(scn):
        u = b.host_id
        i, lr = divmod(u, ranks_per_host)
        shift = _offset(u) - _offset(i)
        evs = []
        for e in b.events:
            e = e._replace(ts_ns=e.ts_ns + shift, pid=1000 + lr, tid=1000 + lr)
            if e.kind == Kind.REGISTER:
                e = e._replace(payload={"world_size": scn.hosts, "job": scn.job, "host_id": i, "local_rank": lr})
            evs.append(e)
        rows = per_host.setdefault(i, [])
        times = sent.setdefault(i, [])
        k = b.seq
        while len(rows) <= k:
            rows.append([])
            times.append(0)
        rows[k].extend(evs)
        times[k] = max(times[k], b.sent_ns)
    out = []
    order = sorted((k, i) for i, rows in per_host.items() for k in range(len(rows)))
    for k, i in order:
        evs = sorted(per_host[i][k], key=lambda e: e.ts_ns)
        clock = Clock(_offset(i), scn.clock_uncertainty_ns, 37_000_000_000)
        name = scn.host_name(i)
        out.append((name.encode(), Batch(scn.job, name, i, f"{scn.job}/{name}/a1", k, evs, clock, sent[i][k])))
    assert len(per_host) == n_hosts
    return out
