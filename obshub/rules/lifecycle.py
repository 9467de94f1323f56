"""Alert identity and lifecycle: fingerprint, pending -> firing -> resolved, and the state-change record
published to ``obshub.alerts.v1``.

Identity: ``fingerprint(labels)`` = first 16 hex digits of SHA-256 over ``encode_labels(labels)``, an
unambiguous encoding of the label set (netstrings, below), which always includes ``alertname`` (the rule
id). Two different label sets never share the encoding, whatever their names and values contain
(newlines, ``=``, separators); the fingerprint is stable across restarts and versions (the encoding is
part of the documented format, docs/RULES.md). Label values must be identities (host,
layer, job), never measurements: measured values go to annotations, so one problem keeps one identity.

Lifecycle of one alert instance (each transition a small function, the engine calls ``advance``)::

    inactive --condition true--> pending --true for `for`--> firing --false for keep_firing_for--> resolved
       ^                            |                                                                  |
       +-------condition false------+           (a resolved instance that becomes true again: pending) +

``for: 0`` goes straight to firing. The condition of an instance is true until ``true_until_ns`` (the
engine computes it from the window: the time the aggregate stops reaching the threshold).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

INACTIVE, PENDING, FIRING, RESOLVED = "inactive", "pending", "firing", "resolved"


def _netstring(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    return b"%d:%s," % (len(raw), raw)


def encode_labels(labels: dict[str, str]) -> bytes:
    """The label set as bytes, injective: for each label in order of its name's UTF-8 bytes, the name and
    then the value as netstrings (``<byte length>:<UTF-8 bytes>,``). Example: ``{"host": "a=b"}`` ->
    ``b"4:host,3:a=b,"``. Values are taken as ``str(value)``."""
    items = sorted(((k.encode("utf-8", "surrogatepass"), k, str(v)) for k, v in labels.items()))
    return b"".join(_netstring(k) + _netstring(v) for _, k, v in items)


def fingerprint(labels: dict[str, str]) -> str:
    """Stable 16-hex-digit identity of an alert from its labels (order-independent): the first 16 hex
    digits of SHA-256 over ``encode_labels(labels)``."""
    return hashlib.sha256(encode_labels(labels)).hexdigest()[:16]


def rfc3339(ns: int) -> str:
    """CLOCK_REALTIME ns -> RFC 3339 UTC with milliseconds, e.g. ``2026-11-29T09:00:00.000Z``."""
    dt = datetime.fromtimestamp(ns / 1e9, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


@dataclass
class AlertInstance:
    """One alert (rule + labels). Times are CLOCK_REALTIME ns; 0 = not set."""

    fingerprint: str
    rule: str
    labels: dict[str, str]
    severity: str
    state: str = INACTIVE
    annotations: dict[str, str] = field(default_factory=dict)
    value: float = 0.0
    active_since_ns: int = 0
    fired_at_ns: int = 0
    true_until_ns: int = 0
    resolved_at_ns: int = 0
    updated_ns: int = 0
    renotified: int = 0  # firing notifications sent again on a new match during this firing (rule `renotify`)
    notified_ns: int = 0  # time of the latest firing notification (the first or a repeat)

    def to_dict(self) -> dict:
        """JSON-able form (for the state file)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "AlertInstance":
        """Inverse of ``to_dict``; unknown keys are ignored."""
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def become_true(inst: AlertInstance, now_ns: int, true_until_ns: int) -> str | None:
    """The condition holds at ``now_ns`` (until ``true_until_ns``). Returns the new state on a transition
    into pending, else None."""
    inst.true_until_ns = max(inst.true_until_ns, true_until_ns)
    if inst.state in (INACTIVE, RESOLVED):
        inst.state, inst.active_since_ns, inst.fired_at_ns, inst.resolved_at_ns = PENDING, now_ns, 0, 0
        inst.renotified = 0
        return PENDING
    return None


def maybe_fire(inst: AlertInstance, now_ns: int, for_ns: int) -> str | None:
    """Pending whose condition held for ``for_ns`` -> firing (at the time it crossed, not later)."""
    if (
        inst.state == PENDING
        and inst.true_until_ns > inst.active_since_ns + for_ns - 1
        and now_ns >= inst.active_since_ns + for_ns
    ):
        inst.state, inst.fired_at_ns = FIRING, inst.active_since_ns + for_ns
        inst.notified_ns = max(now_ns, inst.fired_at_ns)
        return FIRING
    return None


def maybe_drop(inst: AlertInstance, now_ns: int) -> str | None:
    """Pending whose condition ended before ``for`` elapsed -> inactive."""
    if inst.state == PENDING and now_ns >= inst.true_until_ns:
        inst.state = INACTIVE
        return INACTIVE
    return None


def maybe_resolve(inst: AlertInstance, now_ns: int, keep_firing_for_ns: int) -> str | None:
    """Firing whose condition ended ``keep_firing_for_ns`` ago -> resolved (at that time)."""
    end = inst.true_until_ns + keep_firing_for_ns
    if inst.state == FIRING and now_ns >= end:
        inst.state, inst.resolved_at_ns = RESOLVED, end
        return RESOLVED
    return None


def maybe_renotify(inst: AlertInstance, now_ns: int, limit: int, after_ns: int) -> str | None:
    """A new match of a firing alert -> notify again (a new ``firing`` change): at most ``limit`` times per
    firing, at least ``after_ns`` after the previous notification (rule ``renotify``)."""
    if inst.state == FIRING and inst.renotified < limit and now_ns >= inst.notified_ns + after_ns:
        inst.renotified += 1
        inst.notified_ns = now_ns
        return FIRING
    return None


def advance(inst: AlertInstance, now_ns: int, for_ns: int, keep_firing_for_ns: int) -> list[str]:
    """Apply every time-driven transition due at ``now_ns``; returns the states entered, in order."""
    out = []
    for step in (
        lambda: maybe_fire(inst, now_ns, for_ns),
        lambda: maybe_drop(inst, now_ns),
        lambda: maybe_resolve(inst, now_ns, keep_firing_for_ns),
    ):
        s = step()
        if s:
            out.append(s)
    return out


def change_record(
    inst: AlertInstance,
    status: str,
    now_ns: int,
    *,
    description: str = "",
    runbook: str = "",
    routes: list[str] | None = None,
    generator_url: str = "",
) -> dict:
    """The JSON record of one state change (value of an ``obshub.alerts.v1`` message, key = fingerprint).

    Fields: ``v`` (1), ``fingerprint``, ``rule``, ``status`` (pending|firing|resolved|inactive),
    ``severity``, ``labels`` (with ``alertname`` and ``severity``), ``annotations`` (with ``description`` and
    ``runbook`` when set), ``starts_at``/``ends_at`` (RFC 3339, ends_at empty unless resolved) and their
    ``*_ns`` twins, ``updated_at_ns``, ``value``, ``routes`` (sink names; empty = all), ``generator_url``;
    ``renotified`` (k) on the k-th repeat of a firing notification on a new match (rule ``renotify``)."""
    starts = inst.fired_at_ns or inst.active_since_ns
    ends = inst.resolved_at_ns if status == RESOLVED else 0
    ann = dict(inst.annotations)
    if description:
        ann.setdefault("description", description)
    if runbook:
        ann.setdefault("runbook", runbook)
    rec = {
        "v": 1,
        "fingerprint": inst.fingerprint,
        "rule": inst.rule,
        "status": status,
        "severity": inst.severity,
        "labels": dict(inst.labels),
        "annotations": ann,
        "starts_at": rfc3339(starts) if starts else "",
        "ends_at": rfc3339(ends) if ends else "",
        "starts_at_ns": starts,
        "ends_at_ns": ends,
        "updated_at_ns": now_ns,
        "value": inst.value,
        "routes": list(routes or []),
        "generator_url": generator_url,
    }
    if status == FIRING and inst.renotified:
        rec["renotified"] = inst.renotified
    return rec
