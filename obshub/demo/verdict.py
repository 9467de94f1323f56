"""The demo's verdict: did obshub name the host and layer of the injected fault, how fast, and did
anything wrong fire.

Input: the fault (kind, host name, layer, injection time t0 in CLOCK_REALTIME ns, or no fault) and the
alert state changes read from ``obshub.alerts.v1`` (records of ``rules.lifecycle.change_record``), each
with ``received_ns`` added by the demo (when the record reached the demo: Kafka's message timestamp).

Rules of the verdict:

- only ``status == "firing"`` records count (pending, resolved and inactive are lifecycle noise);
- a **correct** alert names the fault's host (label ``host``) and layer (label ``layer``) and fired at or
  after t0; the first one gives t1 and the time to detection ``TTD = t1 - t0`` (seconds);
- every other firing alert is **wrong**: another host, another layer, no host/layer label, or before t0;
  each distinct alert (fingerprint) is counted once, with the reason;
- a fault on one rank (``--fault-rank``: ``rank`` is its global rank) also needs the rank: an alert of the
  right host and layer whose ``rank`` label names **another** rank is wrong ("wrong rank"); one without a
  rank label (a host-level rule, e.g. the sched CUSUM, or a layer that is the host's) is judged by host and
  layer alone;
- ``ok`` only when a correct alert fired and nothing wrong did; for ``none`` only when nothing fired;
- ``hang`` (the rank is frozen, then thawed): the correct alert must also resolve after the rank was
  thawed (``check_resolved``): an alert that outlives the hang would page for a healthy job;
- ``stall`` (sporadic: one short stall every period, ``judge_stalls``): **every** stall must be named:
  stall i is named by the first correct alert received from its start to the next stall's start (the
  last one: to the end of the run), its TTD from its own start; ``ok`` only when every stall was named
  and nothing wrong fired; ``ttd_s`` is the median TTD over the stalls, ``worst_s`` the largest.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class AlertSeen:
    """One firing alert as the demo shows it. ``received_ns`` CLOCK_REALTIME ns."""

    received_ns: int
    rule: str
    host: str
    layer: str
    step: str
    evidence: str
    summary: str
    fingerprint: str
    severity: str = ""
    rank: str = ""  # the ``rank`` label: a global rank as text, "" when the alert names none

    @classmethod
    def from_record(cls, rec: dict, received_ns: int) -> "AlertSeen":
        """From an ``obshub.alerts.v1`` record (labels/annotations as the rule engine writes them)."""
        labels, ann = rec.get("labels") or {}, rec.get("annotations") or {}
        return cls(
            received_ns=received_ns,
            rule=str(rec.get("rule") or labels.get("alertname", "?")),
            host=str(labels.get("host", "")),
            layer=str(labels.get("layer", "")),
            step=str(ann.get("step", "")),
            evidence=str(ann.get("evidence", "")),
            summary=str(ann.get("summary", "")),
            fingerprint=str(rec.get("fingerprint", "")),
            severity=str(rec.get("severity", labels.get("severity", ""))),
            rank=str(labels.get("rank") or ""),
        )


@dataclass
class Verdict:
    """The result. Times: ``t0_ns``/``t1_ns`` CLOCK_REALTIME ns, ``ttd_s`` seconds (None: not detected).
    ``wrong`` lists ``{"alert": AlertSeen-as-dict, "why": str}``."""

    fault: str
    host: str | None
    layer: str | None
    t0_ns: int | None
    t1_ns: int | None = None
    ttd_s: float | None = None
    first_correct: dict | None = None
    correct_count: int = 0
    wrong: list[dict] = field(default_factory=list)
    ok: bool = False
    reason: str = ""
    resolved_s: float | None = None
    stalls: list[dict] = field(default_factory=list)
    named: int = 0
    worst_s: float | None = None

    @property
    def wrong_count(self) -> int:
        return len(self.wrong)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["wrong_count"] = self.wrong_count
        return d


def judge(
    fault: str,
    host: str | None,
    layer: str | None,
    t0_ns: int | None,
    alerts: list[AlertSeen],
    rank: int | None = None,
) -> Verdict:
    """Score ``alerts`` against the fault (see the module docstring). ``fault == "none"`` expects no
    alert; otherwise ``host``, ``layer`` and ``t0_ns`` must be given (t0 None = the fault never got
    injected: nothing can be correct). ``rank``: the global rank a one-rank fault hits (None: the host's)."""
    v = Verdict(fault=fault, host=host, layer=layer, t0_ns=t0_ns)
    seen_wrong: set[str] = set()
    for a in sorted(alerts, key=lambda a: a.received_ns):
        why = _wrong_because(fault, host, layer, t0_ns, a, rank)
        if why is None:
            v.correct_count += 1
            if v.first_correct is None:
                v.first_correct = asdict(a)
                v.t1_ns = a.received_ns
                v.ttd_s = round((a.received_ns - t0_ns) / 1e9, 3)
        elif (a.fingerprint or id(a)) not in seen_wrong:
            seen_wrong.add(a.fingerprint or str(id(a)))
            v.wrong.append({"alert": asdict(a), "why": why})
    if fault == "none":
        v.ok = not v.wrong
        v.reason = "no alert fired" if v.ok else f"{v.wrong_count} alert(s) fired on a clean run"
    elif t0_ns is None:
        v.reason = "the fault was never injected"
    elif v.first_correct is None:
        v.reason = f"no alert named {host} in layer {layer}" + (f"; {v.wrong_count} wrong alert(s)" if v.wrong else "")
    elif v.wrong:
        v.reason = f"detected after {v.ttd_s} s, but {v.wrong_count} wrong alert(s) fired"
    else:
        v.ok = True
        v.reason = f"{host} / {layer} named {v.ttd_s} s after the fault; nothing wrong fired"
    return v


def judge_stalls(
    host: str,
    layer: str,
    starts_ns: list[int],
    alerts: list[AlertSeen],
    until_ns: int | None = None,
    rank: int | None = None,
) -> Verdict:
    """Score ``alerts`` against sporadic stalls of ``host``/``layer`` that started at ``starts_ns``
    (CLOCK_REALTIME ns, ascending; see the module docstring). ``until_ns``: the end of the last stall's
    window (default: no end). ``stalls`` lists per stall ``{t0_ns, ttd_s, rule}`` (``ttd_s`` None: not
    named); ``named`` counts the named ones. ``rank``: the global rank the stalls hit (None: the host's)."""
    v = Verdict(fault="stall", host=host, layer=layer, t0_ns=starts_ns[0] if starts_ns else None)
    bounds = list(starts_ns[1:]) + [until_ns if until_ns is not None else 2**63]
    ordered = sorted(alerts, key=lambda a: a.received_ns)
    for t0, end in zip(starts_ns, bounds):
        hit = next(
            (
                a
                for a in ordered
                if t0 <= a.received_ns < end and _wrong_because("stall", host, layer, t0, a, rank) is None
            ),
            None,
        )
        v.stalls.append(
            {
                "t0_ns": t0,
                "ttd_s": round((hit.received_ns - t0) / 1e9, 3) if hit else None,
                "rule": hit.rule if hit else "",
            }
        )
    seen_wrong: set[str] = set()
    for a in ordered:
        why = _wrong_because("stall", host, layer, v.t0_ns, a, rank)
        if why is None:
            v.correct_count += 1
            if v.first_correct is None:
                v.first_correct, v.t1_ns = asdict(a), a.received_ns
        elif (a.fingerprint or str(id(a))) not in seen_wrong:
            seen_wrong.add(a.fingerprint or str(id(a)))
            v.wrong.append({"alert": asdict(a), "why": why})
    ttds = sorted(s["ttd_s"] for s in v.stalls if s["ttd_s"] is not None)
    v.named = len(ttds)
    if ttds:
        v.ttd_s = (
            ttds[len(ttds) // 2] if len(ttds) % 2 else round((ttds[len(ttds) // 2 - 1] + ttds[len(ttds) // 2]) / 2, 3)
        )
        v.worst_s = ttds[-1] if v.named == len(v.stalls) else None
    if not starts_ns:
        v.reason = "no stall was injected"
    elif v.named < len(starts_ns):
        v.reason = f"{v.named} of {len(starts_ns)} stalls named {host} in layer {layer}" + (
            f"; {v.wrong_count} wrong alert(s)" if v.wrong else ""
        )
    elif v.wrong:
        v.reason = (
            f"every stall named (median {v.ttd_s} s, worst {v.worst_s} s), but {v.wrong_count} wrong alert(s) fired"
        )
    else:
        v.ok = True
        v.reason = (
            f"{host} / {layer}: all {v.named} stalls named, median {v.ttd_s} s, worst {v.worst_s} s after each "
            "stall's start; nothing wrong fired"
        )
    return v


def _wrong_because(
    fault: str, host: str | None, layer: str | None, t0_ns: int | None, a: AlertSeen, rank: int | None = None
) -> str | None:
    if fault == "none":
        return "an alert on a clean run"
    if t0_ns is None or a.received_ns < t0_ns:
        return "fired before the fault was injected"
    if a.host != host and a.layer != layer:
        return f"wrong host ({a.host or 'none'}) and layer ({a.layer or 'none'})"
    if a.host != host:
        return f"wrong host ({a.host or 'none'}, fault on {host})"
    if a.layer != layer:
        return f"wrong layer ({a.layer or 'none'}, fault in {layer})"
    if rank is not None and a.rank and a.rank != str(rank):
        return f"wrong rank ({a.rank}, fault on rank {rank})"
    return None


def check_resolved(v: Verdict, records: list[dict], removed_ns: int) -> Verdict:
    """For a fault that ends (``hang``: thawed at ``removed_ns``, CLOCK_REALTIME ns): the first correct
    alert must have a ``resolved`` record (same fingerprint) received after ``removed_ns``. Sets
    ``resolved_s`` (seconds from removal to that record) or clears ``ok`` with the reason. ``records``:
    every alert state change the demo read (``received_ns`` added)."""
    if v.first_correct is None:
        return v
    fp = v.first_correct["fingerprint"]
    done = sorted(
        r["received_ns"]
        for r in records
        if r.get("fingerprint") == fp and r.get("status") == "resolved" and r["received_ns"] >= removed_ns
    )
    if done:
        v.resolved_s = round((done[0] - removed_ns) / 1e9, 3)
        if v.ok:
            v.reason += f"; resolved {v.resolved_s} s after training resumed"
    else:
        v.ok = False
        v.reason += "; the alert did not resolve after training resumed"
    return v
