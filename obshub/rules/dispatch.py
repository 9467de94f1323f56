"""From alert state changes to sink deliveries: inhibition, silences, grouping, per-sink workers and
acknowledgements for at-least-once delivery.

Flow of one change record (as read from ``obshub.alerts.v1``; ``token`` identifies the message)::

    submit(change, token) -> firing view updated -> pending/inactive: ack at once
                          -> into its group (labels of route.group_by)
    tick(now) -> group due? (group_wait for a new group, group_interval after a change,
                 repeat_interval while firing, resend_every per sink such as Alertmanager)
              -> drop silenced and inhibited alerts -> per sink: min severity and routes
              -> one job per sink queue (one worker thread per sink: an outage blocks only that sink)
    job done on every sink (delivered or given up) -> ``on_ack(tokens)``

Alertmanager-first (``passthrough``): one group for everything, no waits, no silences, no inhibition:
every firing/resolved change is sent at the next tick, firing alerts are re-sent every ``resend_every``
of the sink, and Alertmanager does the grouping, inhibition and silencing.

The service commits Kafka offsets only below the oldest token not yet acked, so a crash or restart
re-delivers every change that had not reached all its sinks (duplicates are possible; sinks dedup by
fingerprint / dedup_key). A change record read again by the same dispatcher (its consumer lost the
group while its commit failed, e.g. the group coordinator's broker died, and resumed from the last
committed offset) is not sent again: ``submit`` knows the records it already handed to the sinks
(``HANDED_PER_ALERT`` per fingerprint, ``HANDED_MAX`` fingerprints) and acks such a copy once that
delivery is done."""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx
from prometheus_client import Counter

from obshub.rules.durations import parse_duration_ns
from obshub.rules.model import InhibitRule
from obshub.rules.silences import SilenceStore
from obshub.rules.sinks.base import DeliveryPolicy, DeliveryResult, Notification, Sink
from obshub.rules.sinks.config import Route

log = logging.getLogger("obshub.rules.dispatch")
DELIVERIES = Counter("obshub_rules_deliveries", "notification deliveries by sink and outcome", ["sink", "outcome"])
MUTED = Counter("obshub_rules_muted", "alert notifications muted", ["reason"])
SILENCE_ERRORS = Counter(
    "obshub_rules_silence_errors", "alert notifications checked against a silences file that failed (sent unsilenced)"
)
#: change records remembered per alert (fingerprint) as handed to the sinks: a copy read again is not re-sent
HANDED_PER_ALERT = 8
#: alerts (fingerprints) whose handed records are remembered; the least recently handed is forgotten first
HANDED_MAX = 10_000


def change_key(change: dict) -> str:
    """The identity of one change record: SHA-256 of its canonical JSON (every field: status, times,
    labels, annotations, value, ``renotified``). A record read twice, or the same transition evaluated
    again from the same input (the engine's time is its records' time), has the same key; a new
    transition, a renotification or a resolve does not."""
    return hashlib.sha256(json.dumps(change, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class _Group:
    key: str
    labels: dict[str, str]
    created_ns: int
    alerts: dict[str, dict] = field(default_factory=dict)  # fingerprint -> latest change
    tokens: list[Any] = field(default_factory=list)  # messages absorbed since the last flush
    changed: bool = False
    last_flush_ns: int = 0
    last_sent_ns: dict[str, int] = field(default_factory=dict)  # sink -> time


class _Job:
    """One flush: the tokens it covers and how many sinks still owe a result."""

    def __init__(self, tokens: list[Any], n_sinks: int, on_done: Callable[["_Job"], None]):
        self.tokens, self.left, self.results = tokens, n_sinks, []
        self._lock, self._on_done = threading.Lock(), on_done
        self.finished = False

    def done(self, res: DeliveryResult | None) -> None:
        with self._lock:
            if res is not None:
                self.results.append(res)
            self.left -= 1
            finished = self.finished = self.left <= 0
        if finished:
            self._on_done(self)

    def join(self, token: Any) -> bool:
        """Add ``token`` to the tokens acked when this job is done; False (not added) when it is done."""
        with self._lock:
            if self.finished:
                return False
            self.tokens.append(token)
            return True


class _SinkWorker(threading.Thread):
    def __init__(self, sink: Sink, policy: DeliveryPolicy):
        super().__init__(name=f"sink-{sink.name}", daemon=True)
        self.sink, self.policy = sink, policy
        self.q: queue.Queue = queue.Queue()
        self.client = httpx.Client(follow_redirects=False, headers={"User-Agent": "obshub-rules"})

    def run(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                break
            notification, job = item
            res = self.sink.send(self.client, notification, self.policy)
            DELIVERIES.labels(self.sink.name, "ok" if res.ok else "gave_up").inc()
            job.done(res)
        self.client.close()


def _ns(d: str) -> int:
    return parse_duration_ns(d)


class Dispatcher:
    """Groups changes and delivers them. ``on_ack(tokens)`` is called (from any thread) with the tokens
    whose changes reached every sink (or were muted or needed no delivery). ``passthrough``: the
    Alertmanager-first mode (module docstring): ``route``, ``inhibit`` and ``silences`` are ignored."""

    def __init__(
        self,
        sinks: list[Sink],
        route: Route,
        inhibit: list[InhibitRule],
        silences: SilenceStore | None,
        policy: DeliveryPolicy,
        on_ack: Callable[[list[Any]], None],
        passthrough: bool = False,
    ):
        self.sinks, self.route, self.inhibit, self.silences = sinks, route, list(inhibit), silences
        self.on_ack, self.passthrough = on_ack, passthrough
        self.group_wait, self.group_interval = _ns(route.group_wait), _ns(route.group_interval)
        self.repeat_interval = _ns(route.repeat_interval)
        if passthrough:
            self.group_wait = self.group_interval = 0
            self.repeat_interval = 1 << 62  # re-sends come from each sink's resend_every
            self.silences = None
        self.groups: dict[str, _Group] = {}
        self.firing: dict[str, dict] = {}  # fingerprint -> latest change record of every firing alert
        # fingerprint -> {change_key: the job that carried it, None when no sink wanted it}: what was handed
        self.handed: OrderedDict[str, dict[str, _Job | None]] = OrderedDict()
        self.workers = {s.name: _SinkWorker(s, policy) for s in sinks}
        for w in self.workers.values():
            w.start()
        self._lock = threading.Lock()
        self.results: deque[DeliveryResult] = deque(maxlen=1000)  # recent outcomes, for tests and status

    # -- input ---------------------------------------------------------------------------------------------
    def submit(self, change: dict, token: Any, now_ns: int | None = None) -> None:
        """Take one change record. Pending/inactive changes need no delivery and are acked at once; a
        firing or resolved record this dispatcher already handed to its sinks (the same ``change_key``:
        read again after its consumer resumed from an older committed offset) is not sent again, its
        ``token`` acked once that delivery is done."""
        now_ns = now_ns or time.time_ns()
        status, fp = change.get("status"), change.get("fingerprint", "")
        with self._lock:
            handed, job = self._handed(fp, change) if status in ("firing", "resolved") else (False, None)
            if handed:
                if job is not None and job.join(token):
                    return  # acked with that delivery, still in flight
                ack = [token]
            else:
                if status == "firing":
                    self.firing[fp] = change
                elif status in ("resolved", "inactive"):
                    self.firing.pop(fp, None)
                if status not in ("firing", "resolved"):
                    ack = [token]
                else:
                    ack = []
                    g = self._group_for(change, now_ns)
                    g.alerts[fp] = change  # the latest change of an alert wins (dedup within a group)
                    g.tokens.append(token)
                    g.changed = True
        if ack:
            self.on_ack(ack)

    def _handed(self, fp: str, change: dict) -> tuple[bool, "_Job | None"]:
        """Whether this dispatcher handed that very record ``change`` to its sinks already, and the job
        that carried it (None where no sink wanted it, or it was muted); ``(False, None)`` otherwise."""
        seen = self.handed.get(fp)
        if not seen:
            return False, None
        key = change_key(change)
        return (True, seen[key]) if key in seen else (False, None)

    def _hand(self, alerts: list[dict], job: "_Job | None") -> None:
        """Remember ``alerts``' records as handed to the sinks by ``job`` (lock held)."""
        for a in alerts:
            fp = a.get("fingerprint", "")
            seen = self.handed.pop(fp, None) or {}
            seen[change_key(a)] = job
            while len(seen) > HANDED_PER_ALERT:
                del seen[next(iter(seen))]
            self.handed[fp] = seen
        while len(self.handed) > HANDED_MAX:
            self.handed.popitem(last=False)

    def _group_for(self, change: dict, now_ns: int) -> _Group:
        labels = change.get("labels", {})
        glabels = {} if self.passthrough else {k: labels.get(k, "") for k in self.route.group_by}
        key = hashlib.sha256(json.dumps(glabels, sort_keys=True).encode()).hexdigest()[:16]
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = _Group(key, glabels, now_ns)
        return g

    # -- muting --------------------------------------------------------------------------------------------
    def _inhibited(self, labels: dict[str, str]) -> bool:
        for rule in self.inhibit:
            if not all(labels.get(k) == v for k, v in rule.target.items()):
                continue
            for change in self.firing.values():
                src = change.get("labels", {})
                if src is labels or src == labels:
                    continue
                if all(src.get(k) == v for k, v in rule.source.items()) and all(
                    src.get(e, "") == labels.get(e, "") for e in rule.equal
                ):
                    return True
        return False

    def _muted(self, alert: dict, now_ns: int) -> str | None:
        if self.passthrough:
            return None
        labels = alert.get("labels", {})
        if self.silences is not None:
            try:
                if self.silences.muted_by(labels, now_ns):
                    return "silenced"
            except Exception as exc:  # noqa: BLE001 - a hand-edited silences file of any shape must not stop
                # alerting (SilenceError, OSError, TypeError, AttributeError, re.error...): logged, counted
                SILENCE_ERRORS.inc()
                log.error("silences unreadable, not applying them: %s", exc)
        if alert["status"] == "firing" and self._inhibited(labels):
            return "inhibited"
        return None

    # -- time ------------------------------------------------------------------------------------------------
    def tick(self, now_ns: int | None = None) -> None:
        """Flush every group that is due at ``now_ns``."""
        now_ns = now_ns or time.time_ns()
        with self._lock:
            for key in list(self.groups):
                self._maybe_flush(self.groups[key], now_ns)

    def _maybe_flush(self, g: _Group, now_ns: int) -> None:
        firing = any(a["status"] == "firing" for a in g.alerts.values())
        if g.changed:
            due = now_ns >= (
                g.created_ns + self.group_wait if g.last_flush_ns == 0 else g.last_flush_ns + self.group_interval
            )
            if due:
                self._flush(g, now_ns, [s for s in self.sinks])
        elif firing and now_ns >= g.last_flush_ns + self.repeat_interval:
            self._flush(g, now_ns, [s for s in self.sinks])
        elif firing:
            resend = [
                s
                for s in self.sinks
                if s.resend_every_s > 0 and now_ns >= g.last_sent_ns.get(s.name, 0) + int(s.resend_every_s * 1e9)
            ]
            if resend:
                self._flush(g, now_ns, resend, repeat_only=True)
        if not g.alerts and not g.tokens:
            self.groups.pop(g.key, None)

    def _flush(self, g: _Group, now_ns: int, sinks: list[Sink], repeat_only: bool = False) -> None:
        alerts = []
        for a in g.alerts.values():
            reason = self._muted(a, now_ns)
            if reason:
                MUTED.labels(reason).inc()
            else:
                alerts.append(a)
        tokens, g.tokens, g.changed = g.tokens, [], False
        if not repeat_only:
            g.last_flush_ns = now_ns
        plan = []
        for s in sinks:
            wanted = [a for a in alerts if s.wants(a)]
            if wanted:
                plan.append((s, Notification(g.key, dict(g.labels), wanted, s.name)))
                g.last_sent_ns[s.name] = now_ns
        handed = list(g.alerts.values())
        for fp in [fp for fp, a in g.alerts.items() if a["status"] == "resolved"]:
            del g.alerts[fp]
        if not plan:
            if not repeat_only:
                self._hand(handed, None)
            if tokens:
                self.on_ack(tokens)
            return
        job = _Job(tokens, len(plan), self._job_done)
        if not repeat_only:  # a repeat re-sends records handed before; their first delivery stays theirs
            self._hand(handed, job)
        for s, n in plan:
            self.workers[s.name].q.put((n, job))

    def _job_done(self, job: _Job) -> None:
        with self._lock:
            self.results.extend(job.results)
        if job.tokens:
            self.on_ack(job.tokens)

    # -- state -------------------------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """JSON-able state: the latest change of every firing alert."""
        with self._lock:
            return {"v": 2, "firing": dict(self.firing)}

    def restore(self, snap: dict, now_ns: int | None = None) -> None:
        """Load a ``snapshot``: firing alerts are back in their groups as if notified at ``now_ns``, so
        inhibition holds, ``repeat_interval`` and per-sink re-sends (Alertmanager, which would otherwise
        expire them) continue after a restart."""
        now_ns = now_ns or time.time_ns()
        with self._lock:
            for fp, change in (snap.get("firing") or {}).items():
                if "labels" not in change:  # not a change record
                    continue
                self.firing[fp] = change
                g = self._group_for(change, now_ns)
                g.alerts[fp] = change
                g.last_flush_ns = now_ns
                g.last_sent_ns = {s.name: now_ns for s in self.sinks}

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the sink workers (work still queued is not acked, so it is re-delivered after a restart)."""
        for w in self.workers.values():
            w.q.put(None)
        for w in self.workers.values():
            w.join(timeout_s)
