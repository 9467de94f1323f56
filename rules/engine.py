"""Rule evaluation: records in, alert state changes out to an injected ``notify`` callable.

The engine never touches HTTP or Kafka (Prometheus' rules/manager.go splits it the same way): the
service feeds it records (``process``) and the clock (``tick``), and publishes what ``notify`` receives.

Per rule and group (the values of ``group_by``), matching records ("hits") are kept for ``window``; the
condition of the group's alert holds while the aggregate of the hits in the window reaches
``threshold.at_least`` (default: at least one hit). ``rules.lifecycle`` turns that into pending / firing /
resolved. With ``correlate``, a hit needs a match of the second signal with equal keys within
``within`` (in the given order); each record of the rule's own signal makes at most one hit.

Time: every record carries ``time_ns`` (CLOCK_REALTIME ns); windows use record time, state changes due
to the passage of time happen in ``tick(now_ns)``.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from typing import Callable

from rules import lifecycle
from rules.expr import Activation, EvalError
from rules.lifecycle import FIRING, INACTIVE, PENDING, RESOLVED, AlertInstance
from rules.model import Rule, RuleSet

log = logging.getLogger("obshub.rules.engine")
Notify = Callable[[dict], None]
MAX_HITS_PER_GROUP = 10_000
MAX_BUFFERED_PER_KEY = 1_000


class _RuleRuntime:
    """Window hits and correlation buffers of one rule."""

    def __init__(self) -> None:
        self.hits: dict[str, deque] = {}          # fingerprint -> deque[(t_ns, value)]
        self.this_buf: dict[str, deque] = {}      # correlation key -> deque[(t_ns, labels, activation, used)]
        self.other_buf: dict[str, deque] = {}     # correlation key -> deque[(t_ns, activation)]


class Engine:
    """Evaluates a RuleSet. ``notify(change)`` receives every state change record (see
    ``lifecycle.change_record``). ``external_url`` prefixes each alert's ``generator_url``."""

    def __init__(self, ruleset: RuleSet, notify: Notify, *, external_url: str = "http://localhost:9099/rules"):
        self.ruleset = ruleset
        self.notify = notify
        self.external_url = external_url.rstrip("/")
        self.instances: dict[str, AlertInstance] = {}
        self.runtime: dict[str, _RuleRuntime] = {rid: _RuleRuntime() for rid in ruleset.rules}
        self.now_ns = 0
        self.eval_errors = 0
        self.dirty = False

    # -- rule set ---------------------------------------------------------------------------------------
    def replace_rules(self, ruleset: RuleSet) -> None:
        """Swap in a new (validated) rule set. Alerts of rules that disappeared are resolved; the window
        state of rules that remain is kept."""
        for fp, inst in list(self.instances.items()):
            if inst.rule in ruleset.rules:
                continue
            if inst.state == FIRING:
                inst.state, inst.resolved_at_ns = RESOLVED, self.now_ns
            elif inst.state == PENDING:
                inst.state = INACTIVE
            self._emit(inst, inst.state, None)
            del self.instances[fp]
        self.runtime = {rid: self.runtime.get(rid, _RuleRuntime()) for rid in ruleset.rules}
        self.ruleset = ruleset

    # -- input --------------------------------------------------------------------------------------------
    def process(self, signal: str, record: dict) -> None:
        """Evaluate every rule that reads ``signal`` on ``record`` (a map from ``rules.fields``)."""
        t = int(record.get("time_ns") or 0) or self.now_ns  # a record without a time happens "now"
        self.now_ns = max(self.now_ns, t)
        kind = record.get("kind") if signal == "events" else None
        shared = Activation(record)  # one CEL conversion of the record for every rule
        for rule in self.ruleset.rules.values():
            if not rule.reads(signal, kind):
                continue
            if rule.signal == signal and (signal != "events" or kind in rule.kinds):
                for act in self._activations(rule, shared):
                    if rule.condition.test(act):
                        self._primary_match(rule, act, t)
            c = rule.correlate
            if c and c.signal == signal and (signal != "events" or kind in c.kinds) and c.condition.test(shared):
                self._other_match(rule, shared, t)

    def _activations(self, rule: Rule, shared: Activation) -> list[Activation]:
        if rule.foreach is None:
            return [shared]
        try:
            items = rule.foreach.eval(shared)
        except EvalError:
            self.eval_errors += 1
            return []
        return [Activation({**shared.data, "item": it}) for it in (items or [])]

    def _labels(self, rule: Rule, act: Activation) -> dict[str, str] | None:
        labels = {"alertname": rule.id, "severity": rule.severity, **rule.labels}
        for name, expr in rule.group_by.items():
            try:
                v = expr.eval(act)
            except EvalError:
                self.eval_errors += 1
                return None
            labels[name] = "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
        return labels

    @staticmethod
    def _key(exprs: dict, act: Activation) -> str | None:
        """Correlation key: the key values in the unambiguous label encoding (distinct values, distinct keys)."""
        try:
            return lifecycle.encode_labels({k: exprs[k].eval(act) for k in exprs}).decode("utf-8", "surrogatepass")
        except EvalError:
            return None

    def _primary_match(self, rule: Rule, act: Activation, t: int) -> None:
        labels = self._labels(rule, act)
        if labels is None:
            return
        c = rule.correlate
        if c is None:
            self._hit(rule, labels, act.data, t, None)
            return
        key = self._key(c.this_keys, act)
        if key is None:
            return
        rt = self.runtime[rule.id]
        entry = [t, labels, act.data, False]
        for (t_o, other) in reversed(rt.other_buf.get(key, ())):
            if self._in_order(c.order, t, t_o, c.within_ns):
                entry[3] = True
                self._hit(rule, labels, act.data, max(t, t_o), other)
                break
        buf = rt.this_buf.setdefault(key, deque(maxlen=MAX_BUFFERED_PER_KEY))
        buf.append(entry)

    def _other_match(self, rule: Rule, shared: Activation, t: int) -> None:
        c = rule.correlate
        key = self._key(c.other_keys, shared)
        if key is None:
            return
        record = shared.data
        rt = self.runtime[rule.id]
        rt.other_buf.setdefault(key, deque(maxlen=MAX_BUFFERED_PER_KEY)).append((t, record))
        for entry in rt.this_buf.get(key, ()):
            t_this, labels, act, used = entry
            if not used and self._in_order(c.order, t_this, t, c.within_ns):
                entry[3] = True
                self._hit(rule, labels, act, max(t, t_this), record)

    @staticmethod
    def _in_order(order: str, t_this: int, t_other: int, within_ns: int) -> bool:
        if abs(t_this - t_other) > within_ns:
            return False
        if order == "this_first":
            return t_this <= t_other
        if order == "other_first":
            return t_other <= t_this
        return True

    # -- windows and lifecycle ---------------------------------------------------------------------------
    def _hit(self, rule: Rule, labels: dict[str, str], act: dict, t: int, other: dict | None) -> None:
        fp = lifecycle.fingerprint(labels)
        value = 1.0
        if rule.of is not None:
            try:
                value = float(rule.of.eval(act))
            except (EvalError, TypeError, ValueError):
                self.eval_errors += 1
                return
        hits = self.runtime[rule.id].hits.setdefault(fp, deque(maxlen=MAX_HITS_PER_GROUP))
        hits.append((t, value))
        self._prune(hits, max(t, self.now_ns) - rule.window_ns)
        agg = _aggregate(rule.aggregate, [v for _, v in hits])
        self.dirty = True
        if agg < rule.at_least:
            return
        inst = self.instances.get(fp)
        if inst is None:
            inst = self.instances[fp] = AlertInstance(fp, rule.id, labels, rule.severity)
        inst.value = agg
        inst.annotations = self._render(rule, act, labels, agg, len(hits), other)
        until = _true_until(rule, list(hits))
        if lifecycle.become_true(inst, t, until) == PENDING and rule.for_ns > 0:
            self._emit(inst, PENDING, rule)  # with `for: 0` it fires at once: no pending change published
        self._advance(inst, rule, max(t, self.now_ns))

    @staticmethod
    def _prune(hits: deque, horizon: int) -> None:
        while hits and hits[0][0] <= horizon:
            hits.popleft()

    def _render(self, rule: Rule, act: dict, labels: dict, value: float, count: int, other: dict | None) -> dict:
        ctx = {**act, "labels": labels, "value": value, "count": count, "other": other or {}, "rule": rule.id,
               "severity": rule.severity, "hits": count}
        out = {}
        for name, tmpl in rule.annotations.items():
            try:
                out[name] = tmpl.render(ctx)
            except Exception as exc:  # a template error must not stop evaluation; show it in the alert
                out[name] = f"(template error: {type(exc).__name__}: {exc})"
        return out

    def _advance(self, inst: AlertInstance, rule: Rule, now: int) -> None:
        for state in lifecycle.advance(inst, now, rule.for_ns, rule.keep_firing_for_ns):
            self._emit(inst, state, rule)
            self.dirty = True
        if inst.state in (INACTIVE, RESOLVED):
            self.instances.pop(lifecycle.fingerprint(inst.labels), None)

    def _emit(self, inst: AlertInstance, status: str, rule: Rule | None) -> None:
        rule = rule or self.ruleset.rules.get(inst.rule)
        rec = lifecycle.change_record(
            inst, status, self.now_ns, description=rule.description if rule else "",
            runbook=rule.runbook if rule else "", routes=rule.routes if rule else [],
            generator_url=f"{self.external_url}#{inst.rule}")
        self.notify(rec)

    def tick(self, now_ns: int) -> None:
        """Advance time to ``now_ns``: fire pendings whose ``for`` elapsed, drop pendings whose condition
        ended, resolve firings past keep_firing_for, and forget expired window and correlation state."""
        self.now_ns = max(self.now_ns, now_ns)
        for inst in list(self.instances.values()):
            rule = self.ruleset.rules.get(inst.rule)
            if rule is not None:
                self._advance(inst, rule, self.now_ns)
        for rid, rt in self.runtime.items():
            rule = self.ruleset.rules[rid]
            for fp in list(rt.hits):
                self._prune(rt.hits[fp], self.now_ns - rule.window_ns)
                if not rt.hits[fp]:
                    del rt.hits[fp]
            if rule.correlate:
                horizon = self.now_ns - rule.correlate.within_ns
                for buf in (rt.this_buf, rt.other_buf):
                    for k in list(buf):
                        while buf[k] and buf[k][0][0] < horizon:
                            buf[k].popleft()
                        if not buf[k]:
                            del buf[k]

    def active(self) -> list[AlertInstance]:
        """Alerts pending or firing now, sorted by rule and labels."""
        return sorted((i for i in self.instances.values() if i.state in (PENDING, FIRING)),
                      key=lambda i: (i.rule, sorted(i.labels.items())))

    # -- persistence --------------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """JSON-able state: alert instances, window hits and correlation buffers, and the clock."""
        return {
            "v": 1, "now_ns": self.now_ns,
            "instances": [i.to_dict() for i in self.instances.values()],
            "runtime": {rid: {"hits": {fp: list(map(list, h)) for fp, h in rt.hits.items()},
                              "this_buf": {k: [list(e) for e in b] for k, b in rt.this_buf.items()},
                              "other_buf": {k: [list(e) for e in b] for k, b in rt.other_buf.items()}}
                        for rid, rt in self.runtime.items()},
        }

    def restore(self, snap: dict) -> None:
        """Load a ``snapshot``; state of rules no longer in the rule set is dropped."""
        self.now_ns = int(snap.get("now_ns", 0))
        renamed: dict[str, str] = {}
        for d in snap.get("instances", []):
            inst = AlertInstance.from_dict(d)
            if inst.rule in self.ruleset.rules:
                # indexed by the fingerprint of its labels; an alert saved by a version with another
                # fingerprint keeps that identity (sinks and dedup keys) until it resolves
                fp = lifecycle.fingerprint(inst.labels)
                renamed[inst.fingerprint] = fp
                self.instances[fp] = inst
        for rid, rt in snap.get("runtime", {}).items():
            if rid not in self.runtime:
                continue
            r = self.runtime[rid]
            r.hits = {renamed.get(fp, fp): deque((tuple(e) for e in h), maxlen=MAX_HITS_PER_GROUP)
                      for fp, h in rt["hits"].items()}
            r.this_buf = {k: deque((list(e) for e in b), maxlen=MAX_BUFFERED_PER_KEY) for k, b in rt["this_buf"].items()}
            r.other_buf = {k: deque((tuple(e) for e in b), maxlen=MAX_BUFFERED_PER_KEY)
                           for k, b in rt["other_buf"].items()}


def _aggregate(kind: str, values: list[float]) -> float:
    if not values:
        return 0.0
    if kind == "count":
        return float(len(values))
    if kind == "sum":
        return float(sum(values))
    if kind == "max":
        return float(max(values))
    if kind == "min":
        return float(min(values))
    return float(sum(values) / len(values))


def _true_until(rule: Rule, hits: list[tuple[int, float]]) -> int:
    """The time the window aggregate stops reaching the threshold, given the hits known now: the latest
    ``t + window`` (a hit ageing out) before which the hits still alive reach ``at_least``."""
    w = rule.window_ns
    if rule.aggregate == "count":
        n = max(1, math.ceil(rule.at_least))
        return hits[-n][0] + w if len(hits) >= n else 0
    best = 0
    for c in sorted(t + w for t, _ in hits):
        alive = [v for t, v in hits if c - w <= t < c]
        if alive and _aggregate(rule.aggregate, alive) >= rule.at_least:
            best = c
    return best


__all__ = ["Engine", "Notify"]
