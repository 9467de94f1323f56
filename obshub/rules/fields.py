"""The documented fields a rule may read, per signal, and the functions that turn wire records into the
flat maps (CEL activations) that conditions and templates see.

Signals
-------
``steps``   one JSON step summary from ``obshub.steps.v1``; fields = ``schema.STEP_SUMMARY_FIELDS`` plus
            ``time_ns`` (= ``closed_at_ns``, the record's time for windows).
``events``  one event of a batch from ``obshub.events.v1``; fields = ``EVENT_VARS`` below (the event's
            ``schema.EVENT_FIELDS`` plus envelope fields, kind/layer names, TraceKey parts and units).
``health``  the rule engine's own view of its inputs, every few seconds per topic: consumer lag and
            idle time (``HEALTH_VARS``), so that silence is never mistaken for health.
"""

from __future__ import annotations

import math
from typing import Any

from obshub.core import schema

EVENT_VARS: dict[str, str] = {
    "kind": "event kind name, e.g. 'RDMA_CQ_DONE' (schema.Kind)",
    "kind_id": "numeric kind",
    "layer": "layer name of the kind: pytorch, cuda, nccl, sched, memory, network, pcie, nic, agent",
    "job": "job name (batch envelope)",
    "host": "host name (batch envelope)",
    "host_id": "16-bit host id (batch envelope)",
    "agent_id": "agent instance id",
    "batch_seq": "batch sequence number of the agent",
    "ts_ns": "CLOCK_MONOTONIC ns of the emitting host",
    "time_ns": "CLOCK_REALTIME ns (ts_ns + the batch's clock offset)",
    "duration_ns": "duration, ns (meaning per kind: schema.KIND_INFO)",
    "duration_us": "duration_ns / 1000 as a double, µs",
    "duration_ms": "duration_ns / 1e6 as a double, ms",
    "value": "value (meaning per kind: schema.KIND_INFO)",
    "trace_key": "64-bit TraceKey",
    "tk_host_id": "TraceKey host id part",
    "tk_step16": "TraceKey step mod 2**16 part",
    "op_seq": "TraceKey operation sequence part",
    "step": "full step number, -1 outside a step",
    "pid": "process id",
    "tid": "thread id",
    "gpu": "GPU index, -1 when none",
    "payload": "per-kind map (keys per kind: schema.KIND_INFO)",
}

STEP_VARS: dict[str, str] = {
    **schema.STEP_SUMMARY_FIELDS,
    "evidence": schema.STEP_SUMMARY_FIELDS["evidence"]
    + "; plus max: {layer: the largest z over hosts} (derived by the rule engine, evidence_max: a per-host "
    "rule's 'most evidence of all hosts' test in one look-up)",
    "time_ns": "closed_at_ns: CLOCK_REALTIME ns, the record's time for windows",
}

HEALTH_VARS: dict[str, str] = {
    "component": "always 'rules' (the engine measuring its own inputs)",
    "topic": "the input topic measured",
    "group": "the engine's consumer group",
    "lag_messages": "messages on the topic not yet consumed by the engine (sum over partitions)",
    "idle_s": "seconds since the engine last received a message on the topic (-1: none since start)",
    "uptime_s": "seconds since the engine started",
    "time_ns": "CLOCK_REALTIME ns of the measurement",
}

SIGNAL_VARS: dict[str, dict[str, str]] = {"steps": STEP_VARS, "events": EVENT_VARS, "health": HEALTH_VARS}

# documented members of nested step-summary fields (from STEP_SUMMARY_FIELDS' descriptions)
NESTED_VARS: dict[str, set[str]] = {
    "straggler": {"host", "rank", "local_rank", "gpu", "score", "excess_ns", "reason", "group"},
    "baseline": {"median_ns", "p99_ns", "n", "spread_ns"},
    "evidence": {"spread_ns", "hosts", "max", "ranks", "net_view"},
    "hang": {"pg", "coll_seq", "op", "hosts", "waiting", "waiting_ranks", "waited_ns", "after_ns"},
    "culprit": {
        "host",
        "rank",
        "layer",
        "evidence",
        "source",
        "why",
        "starved",
        "starved_rank",
        "burst",
        "burst_ns",
        "net_view",
        "runq_veto",
    },
    "memory_episode": {"host", "rank", "first_step", "steps", "lost_ns", "reclaim_ns", "peer_reclaim_ns"},
    "quality": {"lost_batches", "duplicate_batches", "late_events", "ringbuf_lost"},
}

KIND_NAMES = {k.name for k in schema.Kind}


def payload_keys(kinds: list[str] | None) -> set[str]:
    """Payload keys the given kinds may carry (all kinds when ``kinds`` is empty/None)."""
    sel = [schema.Kind[k] for k in kinds if k in KIND_NAMES] if kinds else list(schema.Kind)
    return {key for k in sel for key in schema.KIND_INFO[k].payload}


_STEP_DEFAULTS: dict[str, Any] = {
    "v": 1,
    "job": "",
    "step": -1,
    "closed_by": "complete",
    "life": 0,
    "closed_at_ns": 0,
    "hosts": [],
    "expected_hosts": [],
    "missing_hosts": [],
    "world_size": 0,
    "step_time_ns": {},
    "step_time_max_ns": 0,
    "straggler": None,
    "blame": [],
    "collectives": [],
    "inconsistent": [],
    "late_max_ns": 0,
    "net_directed": False,
    "evidence": {"spread_ns": 0, "hosts": {}, "max": {}},
    "hang": None,
    "culprit": None,
    "ambiguous": [],
    "unexplained_before": None,
    "memory_episode": None,
    "layers": {},
    "layer_stats": {},
    "ranks": {},
    "layers_omitted": 0,
    "baseline": {"median_ns": 0, "p99_ns": 0, "n": 0, "spread_ns": 0},
    "stall": False,
    "stall_ratio": 0.0,
    "stopped": {},
    "quality": {"lost_batches": 0, "duplicate_batches": 0, "late_events": 0, "ringbuf_lost": 0},
}


def step_record(summary: dict) -> dict:
    """A step summary (decoded JSON) as the map rules see: documented fields only, each present (missing
    ones get neutral defaults: empty lists, 0, null straggler), plus ``time_ns``. ``stall_ratio`` is a
    double. Unknown extra fields are dropped so a rule cannot depend on undocumented output."""
    rec = {k: summary.get(k, _STEP_DEFAULTS[k]) for k in _STEP_DEFAULTS}
    for k in ("baseline", "quality", "evidence"):
        rec[k] = {**_STEP_DEFAULTS[k], **(rec[k] or {})}
    rec["evidence"]["max"] = evidence_max(rec["evidence"]["hosts"])
    rec["stall_ratio"] = float(rec["stall_ratio"] or 0.0)
    rec["time_ns"] = int(rec["closed_at_ns"] or 0)
    return rec


def evidence_max(hosts: Any) -> dict[str, Any]:
    """``evidence.max`` of a step record: per layer, the largest value of ``evidence.hosts[h][layer]``
    over every host ``h`` (spreads, or the network evidence's own units; a map of at most the evidence's
    6 layers). Derived here, once per record in O(hosts x layers), so that a per-host rule can ask "is
    this host the one with the most evidence in the layer" as ``evidence.hosts[item].network >=
    evidence.max.network``, one look-up, instead of ``evidence.hosts.all(h, ...)``, a pass over every
    host per host (quadratic: 5 s per 1,024-host slow step, issue #35). A rule on the max means what the
    ``all`` comprehension meant: a layer's max is ``None`` (null: a comparison with it fails, as the
    comprehension did) when some host entry is no map, lacks the layer, or holds no number there, and
    NaN when a value is NaN (every comparison with it is false). Not in the stream app's summary: an
    older recorded summary gets it too."""
    if not isinstance(hosts, dict) or not hosts:
        return {}
    entries = list(hosts.values())
    if not all(e.__class__ is dict for e in entries):
        return dict.fromkeys({k for e in entries if isinstance(e, dict) for k in e if isinstance(k, str)})
    layers = {k for e in entries for k in e}
    out: dict[str, Any] = {}
    for layer in layers:
        if not isinstance(layer, str):
            continue
        best: Any = None
        for e in entries:
            v = e.get(layer, None)
            if v.__class__ is not float and (v.__class__ is not int):
                best = None  # missing, null, bool, string, nested: no max (the comprehension failed too)
                break
            if v != v:  # NaN: every comparison with the max is false, as with that host in `all`
                best = math.nan
                break
            if best is None or v > best:
                best = v
        out[layer] = best
    return out


def event_record(batch: schema.Batch, ev: schema.Event) -> dict:
    """One event of ``batch`` as the map rules see (``EVENT_VARS``)."""
    kind = schema.Kind(ev.kind)
    tk = schema.parse_trace_key(ev.trace_key)
    return {
        "kind": kind.name,
        "kind_id": int(kind),
        "layer": schema.KIND_INFO[kind].layer.value,
        "job": batch.job,
        "host": batch.host,
        "host_id": batch.host_id,
        "agent_id": batch.agent_id,
        "batch_seq": batch.seq,
        "ts_ns": ev.ts_ns,
        "time_ns": schema.to_realtime_ns(ev.ts_ns, batch.clock),
        "duration_ns": ev.duration_ns,
        "duration_us": ev.duration_ns / 1e3,
        "duration_ms": ev.duration_ns / 1e6,
        "value": ev.value,
        "trace_key": ev.trace_key,
        "tk_host_id": tk.host_id,
        "tk_step16": tk.step16,
        "op_seq": tk.op_seq,
        "step": ev.step,
        "pid": ev.pid,
        "tid": ev.tid,
        "gpu": ev.gpu,
        "payload": dict(ev.payload or {}),
    }


def event_record_from_test(spec: dict) -> dict:
    """An event record from a rule unit test's short form (``kind`` name plus any EVENT_VARS); the rest
    gets defaults and derived fields (layer, duration_us) are computed. Raises KeyError on unknown kind."""
    kind = schema.Kind[spec["kind"]]
    batch = schema.Batch(
        job=spec.get("job", "job"),
        host=spec.get("host", "host"),
        host_id=int(spec.get("host_id", 0)),
        agent_id=spec.get("agent_id", "test"),
        seq=int(spec.get("batch_seq", 0)),
        events=[],
    )
    ev = schema.Event(
        int(kind),
        int(spec.get("ts_ns", 0)),
        int(spec.get("duration_ns", 0)),
        int(spec.get("trace_key", 0)),
        int(spec.get("step", -1)),
        int(spec.get("pid", 0)),
        int(spec.get("tid", 0)),
        int(spec.get("gpu", -1)),
        int(spec.get("value", 0)),
        dict(spec.get("payload") or {}),
    )
    return event_record(batch, ev)


def health_record(topic: str, group: str, lag: int, idle_s: float, uptime_s: float, now_ns: int) -> dict:
    """One health measurement as the map rules see (``HEALTH_VARS``)."""
    return {
        "component": "rules",
        "topic": topic,
        "group": group,
        "lag_messages": int(lag),
        "idle_s": float(idle_s),
        "uptime_s": float(uptime_s),
        "time_ns": int(now_ns),
    }
