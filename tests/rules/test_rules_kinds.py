"""The rule engine decodes only the event kinds its rules read (obshub/rules/intake.py, "Event batches"): batches
without such events are skipped whole, mixed batches give records of the read kinds only (the same records
as the reference decoder's), a rule without ``kinds:`` reads every kind, and a batch the engine cannot use
(malformed envelope, a malformed event of a read kind, an event whose kind cannot be read) is refused
naming the field. The fast msgspec decoders and the field-by-field path agree on every generated batch.
The last test runs ``obshub rules serve`` on the real broker: skipped and mixed batches in, one alert out,
every unusable batch on the DLQ with its reason."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import msgpack
import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from obshub.core import schema
from obshub.core.schema import Kind
from obshub.rules import fields, intake
from obshub.rules.loader import load_ruleset
from obshub.rules.model import RuleSet
from obshub.rules.service import BUILTIN_DIR
from tests.conftest import consume_all

REPO = Path(__file__).resolve().parents[2]
BUILTIN_KINDS = {"RDMA_CQ_DONE", "MEM_RECLAIM", "MEM_COMPACTION", "PCIE_AER", "CUDA_SYNC", "AGENT_LOSS"}
READ = frozenset(int(Kind[k]) for k in BUILTIN_KINDS)
HYP = settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def event(kind: Kind, ts: int = 5, dur: int = 10, payload: dict | None = None) -> list:
    return [int(kind), ts, dur, 0, 1, 2, 3, 0, 7, payload]


def batch(events: list, **over) -> dict:
    b = {
        "v": 1,
        "job": "j",
        "host": "h",
        "host_id": 1,
        "agent_id": "a",
        "seq": 0,
        "sent_ns": 1,
        "clock": {"offset_ns": 1000, "uncertainty_ns": 0, "tai_offset_ns": 0},
        "events": events,
    }
    b.update(over)
    return b


def pack(b: dict) -> bytes:
    return msgpack.packb(b, use_bin_type=True)


def reference(raw: bytes, kinds: frozenset[int] | None) -> list[dict]:
    """The records of the reference decoder (every event validated), filtered by kind."""
    b = schema.decode_batch(raw)
    return [fields.event_record(b, e) for e in b.events if kinds is None or e.kind in kinds]


def refusal(raw: bytes, kinds: frozenset[int] | None = READ) -> schema.SchemaError:
    with pytest.raises(schema.SchemaError) as ei:
        intake.decode_event_batch(raw, kinds)
    return ei.value


def test_kinds_of_the_builtin_pack_and_of_other_rule_sets():
    rs = load_ruleset([BUILTIN_DIR])
    assert intake.event_kinds(rs) == READ
    steps_only = RuleSet({k: r for k, r in rs.rules.items() if r.signal != "events" and not r.correlate}, [], [])
    assert intake.event_kinds(steps_only) == frozenset()
    any_kind = dataclasses.replace(rs.rules["cuda_sync_stall"], kinds=frozenset())  # reads every kind
    assert intake.event_kinds(RuleSet({**rs.rules, "cuda_sync_stall": any_kind}, [], [])) is None
    corr = rs.rules["rdma_slow_completion_on_straggler"]  # RDMA_CQ_DONE is read on its correlate side only
    assert corr.signal == "steps" and intake.event_kinds(RuleSet({corr.id: corr}, [], [])) == {int(Kind.RDMA_CQ_DONE)}


def test_a_batch_without_read_kinds_is_skipped_whole():
    raw = pack(batch([event(Kind.SCHED_RUNQ), event(Kind.PHASE, payload={"phase": "forward"}), event(Kind.STEP_END)]))
    got = intake.decode_event_batch(raw, READ)
    assert got == intake.EventBatch([], 3, "j")
    assert intake.decode_event_batch(raw, frozenset()) == intake.EventBatch([], 3, "j")


def test_a_mixed_batch_gives_records_of_read_kinds_only_as_the_reference_builds_them():
    evs = [
        event(Kind.SCHED_RUNQ),
        event(Kind.CUDA_SYNC, dur=60_000_000, payload={"symbol": "cudaDeviceSynchronize"}),
        event(Kind.PHASE, payload={"phase": "backward"}),
        event(Kind.MEM_RECLAIM, payload={"reclaim": "direct"}),
        event(Kind.AGENT_LOSS, payload={"probe": "sched"}),
    ]
    raw = pack(batch(evs))
    got = intake.decode_event_batch(raw, READ)
    assert got.events == 5 and got.job == "j"
    assert [r["kind"] for r in got.records] == ["CUDA_SYNC", "MEM_RECLAIM", "AGENT_LOSS"]
    assert got.records == reference(raw, READ)
    assert got.records[0]["time_ns"] == 5 + 1000 and got.records[0]["payload"] == {"symbol": "cudaDeviceSynchronize"}
    # one kind read: only that one
    only = intake.decode_event_batch(raw, frozenset({int(Kind.MEM_RECLAIM)}))
    assert [r["kind"] for r in only.records] == ["MEM_RECLAIM"]


def test_a_rule_reading_every_kind_gets_every_event():
    raw = pack(batch([event(Kind.SCHED_RUNQ), event(Kind.CUDA_SYNC), event(Kind.STEP_BEGIN)]))
    assert intake.decode_event_batch(raw, None).records == reference(raw, None)
    assert [r["kind"] for r in intake.decode(schema.TOPIC_EVENTS, raw) if r[0] == "events" for r in [r[1]]] == [
        "SCHED_RUNQ",
        "CUDA_SYNC",
        "STEP_BEGIN",
    ]


def test_unusable_batches_are_refused_naming_the_field():
    ok = [event(Kind.SCHED_RUNQ), event(Kind.CUDA_SYNC)]
    # the envelope is read for every batch
    assert refusal(pack(batch(ok, job=""))).field == "job"
    assert refusal(pack(batch(ok, v=2))).field == "v"
    assert refusal(pack(batch(ok, host_id=70_000))).field == "host_id"
    assert refusal(pack({k: v for k, v in batch(ok).items() if k != "clock"})).field == "clock"
    assert refusal(pack(batch(ok, extra=1))).field == "extra"
    assert refusal(pack(batch({"a": 1}))).field == "events"
    assert refusal(b"\x01\x02\x03").field == "message"
    assert refusal(json.dumps(batch(ok)).encode()).field == "message"
    # an event of a read kind is checked field by field
    bad = event(Kind.CUDA_SYNC, dur=-1)
    assert refusal(pack(batch([event(Kind.SCHED_RUNQ), bad]))).field == "events[1].duration_ns"
    e = refusal(pack(batch([event(Kind.CUDA_SYNC, payload={"symbol": b"\x00" * 3})])))
    assert e.field == "events[0].payload.symbol" and "bytes" in e.reason
    assert refusal(pack(batch([event(Kind.CUDA_SYNC) + [1]]))).field == "events[0]"
    assert refusal(pack(batch([event(Kind.CUDA_SYNC)[:9]]))).field == "events[0]"
    late = pack(batch([event(Kind.CUDA_SYNC, ts=2**62)], clock={"offset_ns": 2**62, "uncertainty_ns": 0}))
    assert refusal(late).field == "events[0].ts_ns"
    # every event must tell its kind: unknown, missing or not an integer
    assert refusal(pack(batch([event(Kind.SCHED_RUNQ), [99, 1, 2]]))).field.startswith("events[1]")
    assert refusal(pack(batch([[]]))).field == "events[0]"
    assert refusal(pack(batch(["x"]))).field == "events[0]"
    assert refusal(pack(batch([[True] + event(Kind.SCHED_RUNQ)[1:]]))).field == "events[0].kind"


def test_events_of_kinds_no_rule_reads_are_not_checked_past_their_kind():
    odd = [int(Kind.SCHED_RUNQ), "not", {"a": "time"}]  # the reference decoder refuses it
    raw = pack(batch([odd, event(Kind.CUDA_SYNC)]))
    with pytest.raises(schema.SchemaError):
        schema.decode_batch(raw)
    got = intake.decode_event_batch(raw, READ)
    assert [r["kind"] for r in got.records] == ["CUDA_SYNC"] and got.events == 2
    # ... but with every kind read it is refused like the reference does
    assert refusal(raw, None).field == "events[0]"


def test_batches_the_fast_decoders_pass_on_are_decided_field_by_field():
    # unknown clock keys (accepted by the reference) and long strings make the fast decoders give up
    raw = pack(batch([event(Kind.CUDA_SYNC)], clock={"offset_ns": 0, "uncertainty_ns": 0, "note": "x"}))
    assert intake.decode_event_batch(raw, READ).records == reference(raw, READ)
    raw = pack(batch([event(Kind.CUDA_SYNC, payload={"symbol": "s" * 4000})], job="é" * 2000))
    got = intake.decode_event_batch(raw, READ)
    assert got.records[0]["job"] == "é" * 2000 and got.records[0]["payload"]["symbol"] == "s" * 4000
    assert refusal(pack(batch([event(Kind.CUDA_SYNC, payload={"symbol": "s" * 5000})]))).field == (
        "events[0].payload.symbol"
    )


_INT = st.one_of(
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from([-1, 0, 1, 255, 65535, 65536, 2**32, 2**63 - 1, 2**63]),
)
_VALUE = st.one_of(
    _INT, st.none(), st.booleans(), st.floats(allow_nan=False), st.text(max_size=5), st.binary(max_size=3)
)
_KIND = st.one_of(st.sampled_from([int(k) for k in Kind]), st.sampled_from([0, 99, 255, 256, -1]), _VALUE)


@st.composite
def _events(draw) -> list:
    out = []
    for _ in range(draw(st.integers(0, 4))):
        ev = event(Kind(draw(st.sampled_from([int(k) for k in Kind]))), payload=draw(st.sampled_from([None, {"a": 1}])))
        how = draw(st.integers(0, 5))
        if how == 1:
            ev[draw(st.integers(0, 9))] = draw(_VALUE)
        elif how == 2:
            ev[0] = draw(_KIND)
        elif how == 3:
            ev = ev[: draw(st.integers(0, 11))] + [draw(_VALUE)] * draw(st.integers(0, 1))
        elif how == 4:
            ev = draw(_VALUE)
        out.append(ev)
    return out


@st.composite
def _batches(draw) -> bytes:
    b = batch(draw(_events()))
    if draw(st.booleans()):
        key = draw(st.sampled_from(sorted(b) + ["clock.offset_ns", "clock.uncertainty_ns", "clock.x", "zz"]))
        value = draw(_VALUE)
        if key.startswith("clock."):
            b["clock"] = {**b["clock"], key[6:]: value}
        else:
            b[key] = value
    return pack(b)


@HYP
@given(_batches(), st.sampled_from([READ, frozenset(), None, frozenset({int(Kind.SCHED_RUNQ), int(Kind.PHASE)})]))
def test_fast_decoders_and_the_field_by_field_path_agree(raw, kinds):
    def outcome(fn):
        try:
            return fn()
        except schema.SchemaError as exc:
            assert exc.field or exc.reason
            return "refused"

    want = frozenset(intake.ALL_KINDS) if kinds is None else kinds
    fast = outcome(lambda: intake.decode_event_batch(raw, kinds))
    slow = outcome(lambda: intake._decode_checked(raw, want))
    assert fast == slow
    if fast != "refused" and kinds is None:
        assert fast.records == reference(raw, None)  # every kind read: exactly the reference's records


# -- the service on the real broker -----------------------------------------------------------------------


@pytest.mark.kafka
def test_serve_skips_unread_kinds_and_dead_letters_unusable_batches(kafka, tmp_path):
    job = f"kinds-{uuid.uuid4().hex[:8]}"
    rules = tmp_path / "rules.yaml"
    rules.write_text(f"""\
version: 1
rules:
  - id: test_cuda_sync
    description: a CUDA synchronize over 50 ms (test rule, job {job})
    severity: warning
    signal: events
    kinds: [CUDA_SYNC]
    condition: job == '{job}' && duration_ns > 50000000
    group_by: {{job: job, host: host}}
    window: 1m
    labels: {{layer: cuda}}
    annotations: {{summary: "{{{{ host }}}} synced {{{{ duration_ns }}}} ns"}}
""")
    now = time.monotonic_ns()
    clock = {"offset_ns": time.time_ns() - now, "uncertainty_ns": 0, "tai_offset_ns": 0}
    runq = [event(Kind.SCHED_RUNQ, ts=now + i) for i in range(20)]
    slow = event(Kind.CUDA_SYNC, ts=now, dur=80_000_000, payload={"symbol": "cudaDeviceSynchronize"})
    good = {
        "skipped": batch(runq, job=job, host="h-skip", clock=clock),
        "mixed": batch(runq[:5] + [slow] + runq[5:], job=job, host="h-mixed", clock=clock, seq=1),
        "odd-unread": batch([[int(Kind.SCHED_RUNQ), "x"], slow], job=job, host="h-odd", clock=clock, seq=2),
    }
    bad = {
        "bad-envelope": (batch(runq, job=job, host_id=-1, clock=clock), "host_id"),
        "bad-read-event": (
            batch(runq + [event(Kind.CUDA_SYNC, dur=-5)], job=job, clock=clock),
            "events[20].duration_ns",
        ),
        "bad-kind": (batch([[250] + event(Kind.SCHED_RUNQ)[1:]], job=job, clock=clock), "events[0].kind"),
    }
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for key, b in good.items():
        p.produce(schema.TOPIC_EVENTS, key=f"{key}-{job}", value=pack(b))
    for key, (b, _field) in bad.items():
        p.produce(schema.TOPIC_EVENTS, key=f"{key}-{job}", value=pack(b))
    assert p.flush(30) == 0
    home = tmp_path / "home"
    env = {**os.environ, "OBSHUB_HOME": str(home), "OBSHUB_KAFKA_PORT": str(kafka.kafka_port)}
    log = tmp_path / "serve.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "obshub.cli", "rules", "serve", "-r", str(rules)]
        + ["--group-prefix", f"t-{job}", "--from-beginning"],
        cwd=REPO,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        fired, dead = [], {}
        while time.monotonic() < deadline and (len(dead) < len(bad) or len(fired) < 2):
            assert proc.poll() is None, log.read_text()[-3000:]
            fired = [
                json.loads(m.value())
                for m in consume_all(kafka, schema.TOPIC_ALERTS, timeout_s=3, to_end=True)
                if json.loads(m.value()).get("labels", {}).get("job") == job
            ]
            dead = {
                m.key().decode()[: -len(job) - 1]: {k: v.decode() for k, v in m.headers()}
                for m in consume_all(kafka, schema.TOPIC_DLQ, timeout_s=3, to_end=True)
                if m.key() and m.key().decode().endswith(job)
            }
        hosts = sorted({c["labels"]["host"] for c in fired if c["status"] == "firing"})
        assert hosts == ["h-mixed", "h-odd"], (fired, log.read_text()[-3000:])
        assert sorted(dead) == sorted(bad), dead
        for key, (_b, field) in bad.items():
            assert dead[key]["obshub.field"] == field, dead[key]
            assert dead[key]["obshub.consumer"] == f"t-{job}-engine"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
