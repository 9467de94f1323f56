"""Build a Chrome-trace / Perfetto JSON timeline from obshub events and step summaries.

Output format: the Chrome Trace Event Format (JSON Object Format) as Perfetto's JSON importer reads it
(https://perfetto.dev/docs/getting-started/other-formats, the format document linked from there):

* one **process per host** (``pid`` 1.. in host order; ``process_name`` = host, ``process_labels`` =
  the straggler steps), one **thread track per layer** and source thread (``thread_name`` such as
  ``pytorch tid 59811``, ``gpu0 stream 7``, ``collectives``, ``sched``; ``tid`` = pid * 10000 + n, unique
  across processes); tracks are split into lanes
  (``... #2``) wherever slices would overlap without nesting, because the importer requires the complete
  (``"ph": "X"``) slices of one track to nest;
* events with a duration become ``X`` slices, others thread-scoped instants (``"ph": "i", "s": "t"``);
* ``ts`` / ``dur`` in µs *relative to the earliest event* (``otherData.origin_unix_ns``), so doubles keep
  ns precision; every event, metadata included, carries ``ph``, ``ts``, ``pid`` and ``tid``;
* **flows** (``"ph": "s"`` -> ``"ph": "f"``, ``"bp": "e"``, a shared ``id``) link each collective
  ``(pg, coll_seq)`` across hosts: from the last host to arrive to every host that waited for it;
* the **straggler** of each step (from its summary on ``obshub.steps.v1``) is a process-scoped instant
  ``straggler: <host>`` (``... rank <r>`` when the summary names its rank) with the summary's reason,
  score and blame in ``args``, and its step slice is named ``step N (straggler)``; the **blamed layer** is
  an instant ``blamed: <layer> +x ms`` on that layer's track;
* on a host of **several ranks** (pids from REGISTER events and the summaries' per-rank rows) each rank's
  tracks carry its global rank (``rank 3 steps``, ``rank 3 collectives``, ``rank 3 pytorch tid 17322``), so
  the straggler's step slice and the blame mark land on the straggler rank's tracks.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from obshub.core.schema import Event, Kind, Layer, event_layer

TID_STRIDE = 10_000
_LAYER_ORDER = [
    "steps",
    "collectives",
    Layer.PYTORCH.value,
    Layer.NCCL.value,
    Layer.CUDA.value,
    "gpu",
    Layer.SCHED.value,
    Layer.MEMORY.value,
    Layer.NETWORK.value,
    Layer.PCIE.value,
    Layer.NIC.value,
    Layer.AGENT.value,
]


@dataclass
class HostEvents:
    """One host's events (``ts_ns`` already on the realtime clock) and its host id."""

    host: str
    host_id: int
    events: list[Event] = field(default_factory=list)


def _track_of(ev: Event) -> tuple[str, str]:
    """(group, track label) of an event: the group orders tracks, the label names them."""
    k = ev.kind
    if k in (Kind.STEP_BEGIN, Kind.STEP_END):
        return "steps", "steps"
    if k in (Kind.COLLECTIVE_BEGIN, Kind.COLLECTIVE_END):
        return "collectives", "collectives"
    if k == Kind.NCCL_COLL:
        return Layer.NCCL.value, f"nccl tid {ev.tid}"
    layer = event_layer(k).value
    if layer == Layer.CUDA.value and ev.gpu >= 0:
        return "gpu", f"gpu{ev.gpu} stream {ev.tid}"
    if layer in (Layer.PYTORCH.value, Layer.CUDA.value):
        return layer, f"{layer} tid {ev.tid}"
    return layer, layer


def _name_of(ev: Event) -> str:
    p = ev.payload or {}
    k = Kind(ev.kind)
    for key in ("op", "symbol", "phase", "probe", "counter", "dev", "reason"):
        if isinstance(p.get(key), str) and p[key]:
            if k == Kind.PHASE:
                return f"phase {p[key]}"
            return p[key]
    return k.name.lower()


def _args_of(ev: Event) -> dict:
    a = {"kind": Kind(ev.kind).name, "step": ev.step, "trace_key": f"0x{ev.trace_key:016x}", "value": ev.value}
    if ev.gpu >= 0:
        a["gpu"] = ev.gpu
    for k, v in (ev.payload or {}).items():
        a[k] = v
    return a


class _Lanes:
    """Assigns slices of one track to lanes so that slices within a lane nest (greedy, by start)."""

    def __init__(self) -> None:
        self.stacks: list[list[int]] = []

    def place(self, start: int, end: int) -> int:
        for i, stack in enumerate(self.stacks):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                return i
        self.stacks.append([end])
        return len(self.stacks) - 1


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


def build_trace(
    hosts: list[HostEvents], summaries: dict[int, dict], *, job: str, steps: tuple[int, int] | None = None
) -> dict:
    """The Chrome-trace JSON object for ``hosts`` (sorted as given) and the step ``summaries`` (step ->
    summary dict as on ``obshub.steps.v1``). Returns ``{"traceEvents": [...], "displayTimeUnit": "ms",
    "otherData": {...}}``; ``json.dump`` it. Hosts without events still get a process."""
    all_ts = [
        e.ts_ns - (e.duration_ns if e.kind in (Kind.STEP_END, Kind.COLLECTIVE_END) else 0)
        for h in hosts
        for e in h.events
    ]
    origin = min(all_ts) if all_ts else 0
    ranks = _ranks_of(hosts, summaries)
    out: list[dict] = []
    flows_src: dict[tuple[str, int], dict[str, tuple[int, int, int, int]]] = defaultdict(dict)
    step_slices: dict[tuple[str, int | None, int], dict] = {}  # (host, global rank or None, step) -> slice
    track_tid: dict[tuple[str, str], int] = {}  # (host, lane label) -> tid
    for pi, h in enumerate(hosts, start=1):
        out.append({"ph": "M", "name": "process_name", "ts": 0, "pid": pi, "tid": 0, "args": {"name": h.host}})
        out.append({"ph": "M", "name": "process_sort_index", "ts": 0, "pid": pi, "tid": 0, "args": {"sort_index": pi}})
        slices, instants = _host_slices(h, ranks.get(h.host))
        lanes: dict[str, _Lanes] = defaultdict(_Lanes)
        labels: dict[str, str] = {}
        placed = []
        for start, end, group, label, name, args, ev in sorted(slices, key=lambda s: (s[0], -(s[1] - s[0]))):
            lane = lanes[label].place(start, end)
            lab = label if lane == 0 else f"{label} #{lane + 1}"
            labels[lab] = group
            placed.append((start, end, lab, name, args, ev))
        for _, _, group, label, _, _, _ in instants:
            labels.setdefault(label, group)
        for i, lab in enumerate(
            sorted(labels, key=lambda x: (_LAYER_ORDER.index(labels[x]) if labels[x] in _LAYER_ORDER else 99, x)),
            start=1,
        ):
            i += pi * TID_STRIDE  # thread ids unique across processes: importers key threads by tid
            track_tid[(h.host, lab)] = i
            out.append({"ph": "M", "name": "thread_name", "ts": 0, "pid": pi, "tid": i, "args": {"name": lab}})
            out.append(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "ts": 0,
                    "pid": pi,
                    "tid": i,
                    "args": {"sort_index": i % TID_STRIDE},
                }
            )
        for start, end, lab, name, args, ev in placed:
            tid = track_tid[(h.host, lab)]
            x = {
                "ph": "X",
                "name": name,
                "cat": labels[lab],
                "ts": _us(start - origin),
                "dur": _us(end - start),
                "pid": pi,
                "tid": tid,
                "args": args,
            }
            out.append(x)
            if ev is not None and ev.kind == Kind.STEP_END:
                step_slices[(h.host, (ranks.get(h.host) or {}).get(ev.pid), ev.step)] = x
            if ev is not None and ev.kind == Kind.COLLECTIVE_END and ev.payload:
                key = (str(ev.payload.get("pg")), int(ev.payload.get("coll_seq", -1)))
                r = (ranks.get(h.host) or {}).get(ev.pid)
                flows_src[key][h.host if r is None else f"{h.host} rank {r}"] = (start, end, pi, tid, x)
        for ts, _, group, label, name, args, _ in instants:
            out.append(
                {
                    "ph": "i",
                    "s": "t",
                    "name": name,
                    "cat": group,
                    "ts": _us(ts - origin),
                    "pid": pi,
                    "tid": track_tid[(h.host, label)],
                    "args": args,
                }
            )
    out += _flows(flows_src, origin)
    pids = {h.host: i for i, h in enumerate(hosts, start=1)}
    marked = _mark_stragglers(out, summaries, pids, step_slices, track_tid, origin)
    other = {
        "job": job,
        "generator": "obshub trace export",
        "origin_unix_ns": origin,
        "steps": f"{steps[0]}-{steps[1]}" if steps else "all",
        "hosts": [h.host for h in hosts],
        "straggler_steps": marked,
        "steps_without_summary": sorted({s for (_, _, s) in step_slices} - set(summaries)),
    }
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": other}


def _ranks_of(hosts: list[HostEvents], summaries: dict[int, dict]) -> dict[str, dict[int, int]]:
    """``host -> pid -> global rank`` for the hosts that run two or more ranks, from the REGISTER events
    exported (``value`` = the rank) and the step summaries' per-rank rows (``ranks[host][rank]["pid"]``,
    docs/ANALYSIS.md "Several ranks per host"). A host of one rank is left out: its tracks keep their
    plain names."""
    found: dict[str, dict[int, int]] = defaultdict(dict)
    for h in hosts:
        for ev in h.events:
            if ev.kind == Kind.REGISTER and ev.pid:
                found[h.host][ev.pid] = int(ev.value)
    for sm in summaries.values():
        rows = sm.get("ranks") if isinstance(sm, dict) else None
        for host, per in (rows or {}).items() if isinstance(rows, dict) else ():
            for rank, row in (per or {}).items() if isinstance(per, dict) else ():
                pid = row.get("pid") if isinstance(row, dict) else None
                if isinstance(pid, int) and pid > 0 and str(rank).lstrip("-").isdigit():
                    found[host].setdefault(pid, int(rank))
    return {h: m for h, m in found.items() if len(set(m.values())) >= 2}


def _host_slices(h: HostEvents, ranks: dict[int, int] | None = None):
    """(slices, instants) of one host: tuples ``(start_ns, end_ns, group, label, name, args, event)``;
    STEP_BEGIN/END and COLLECTIVE_BEGIN/END pairs become one slice (from the END's duration). On a host of
    several ranks (``ranks``: pid -> global rank) the tracks of a rank's events are named after it
    (``rank 3 steps``, ``rank 3 pytorch tid 17322``); events of no rank (kernel threads, softirq TCP) keep
    the host's."""
    slices, instants = [], []
    for ev in h.events:
        k = ev.kind
        if k in (Kind.STEP_BEGIN, Kind.COLLECTIVE_BEGIN, Kind.REGISTER):
            continue  # the END event carries begin and duration; REGISTER is identity, not time
        group, label = _track_of(ev)
        if ranks and ev.pid in ranks:
            label = f"rank {ranks[ev.pid]} {label}"
        args = _args_of(ev)
        if k == Kind.STEP_END:
            slices.append((ev.ts_ns - ev.duration_ns, ev.ts_ns, group, label, f"step {ev.step}", args, ev))
        elif k == Kind.COLLECTIVE_END:
            p = ev.payload or {}
            name = f"{p.get('op', 'collective')} #{p.get('coll_seq', '?')}"
            slices.append((ev.ts_ns - ev.duration_ns, ev.ts_ns, group, label, name, args, ev))
        elif ev.duration_ns > 0:
            slices.append((ev.ts_ns, ev.ts_ns + ev.duration_ns, group, label, _name_of(ev), args, ev))
        else:
            instants.append((ev.ts_ns, ev.ts_ns, group, label, _name_of(ev), args, ev))
    return slices, instants


def _flows(src: dict, origin: int) -> list[dict]:
    """Flow arrows from the last arriver at each collective to every other host's slice of it (every
    other rank's, ``"<host> rank <r>"``, on hosts of several ranks); each collective slice gets
    ``last_to_arrive`` and ``waited_for_last_ns`` in its args."""
    out, fid = [], 0
    for (pg, seq), by_host in sorted(src.items()):
        if len(by_host) < 2:
            continue
        last = max(by_host, key=lambda hh: (by_host[hh][0], hh))
        ls, le, lpid, ltid, _ = by_host[last]
        s_ts = ls + min(1000, (le - ls) // 2)
        for host, (s, e, pid, tid, x) in sorted(by_host.items()):
            x["args"]["last_to_arrive"] = last
            x["args"]["waited_for_last_ns"] = ls - s
            if host == last:
                continue
            fid += 1
            f_ts = max(s, e - min(1000, (e - s) // 2))
            common = {"name": f"pg {pg} seq {seq}", "cat": "collective", "id": fid}
            out.append({"ph": "s", "ts": _us(s_ts - origin), "pid": lpid, "tid": ltid, **common})
            out.append({"ph": "f", "bp": "e", "ts": _us(f_ts - origin), "pid": pid, "tid": tid, **common})
    return out


def _mark_stragglers(
    out: list[dict], summaries: dict[int, dict], pids: dict[str, int], step_slices: dict, track_tid: dict, origin: int
) -> list[int]:
    """Add straggler / blame marks for every summary naming a straggler among the exported hosts."""
    marked = []
    labels_for: dict[int, list[str]] = defaultdict(list)
    for step in sorted(summaries):
        sm = summaries[step]
        st = sm.get("straggler") if isinstance(sm, dict) else None
        if not isinstance(st, dict) or st.get("host") not in pids:
            continue
        host, pid = st["host"], pids[st["host"]]
        rank = st.get("rank") if isinstance(st.get("rank"), int) else None
        sl = step_slices.get((host, rank, step)) or step_slices.get((host, None, step))
        if sl is None:  # the straggler's rank unknown (or not exported): the host's first rank's step
            sl = next(
                (
                    v
                    for (hh, _r, ss), v in sorted(step_slices.items(), key=lambda kv: str(kv[0]))
                    if hh == host and ss == step
                ),
                None,
            )
        ts = sl["ts"] + sl["dur"] if sl else _us(int(sm.get("closed_at_ns", origin)) - origin)
        tid = sl["tid"] if sl else track_tid.get((host, "steps"), 0)
        blame = [b for b in sm.get("blame") or [] if isinstance(b, dict)]
        args = {
            "step": step,
            "host": host,
            "rank": rank,
            "reason": st.get("reason"),
            "score": st.get("score"),
            "excess_ms": round((st.get("excess_ns") or 0) / 1e6, 3),
            "blame": blame,
        }
        out.append(
            {
                "ph": "i",
                "s": "p",
                "name": f"straggler: {host}" + (f" rank {rank}" if rank is not None else ""),
                "cat": "diagnosis",
                "ts": ts,
                "pid": pid,
                "tid": tid,
                "args": args,
            }
        )
        if sl:
            sl["name"] = f"step {step} (straggler)"
            sl["args"] = {
                **sl["args"],
                "straggler": True,
                "straggler_reason": st.get("reason"),
                "blamed_layer": blame[0].get("layer") if blame else None,
            }
        if blame:
            b = blame[0]
            layer = str(b.get("layer"))
            brank = b.get("rank") if isinstance(b.get("rank"), int) else rank
            # the blamed layer's track of the blamed rank on a host of several ranks, else the host's
            prefixes = ([f"rank {brank} "] if brank is not None else []) + [""]
            lt = next(
                (
                    t
                    for pre in prefixes
                    for (hh, lab), t in sorted(track_tid.items(), key=lambda kv: kv[1])
                    if hh == host and (lab == pre + layer or lab.startswith(pre + layer + " "))
                ),
                tid,
            )
            out.append(
                {
                    "ph": "i",
                    "s": "t",
                    "name": f"blamed: {layer} +{(b.get('excess_ns') or 0) / 1e6:.3f} ms",
                    "cat": "diagnosis",
                    "ts": ts,
                    "pid": pid,
                    "tid": lt,
                    "args": b,
                }
            )
        labels_for[pid].append(f"straggler at step {step}")
        marked.append(step)
    for pid, labels in labels_for.items():
        out.append(
            {"ph": "M", "name": "process_labels", "ts": 0, "pid": pid, "tid": 0, "args": {"labels": ", ".join(labels)}}
        )
    return marked
