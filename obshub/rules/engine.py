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

import gc
import hashlib
import logging
from collections import deque
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Callable

import cel

from obshub.rules import lifecycle
from obshub.rules.expr import (
    Activation,
    Compiled,
    EvalError,
    compile_expr,
    field_paths,
    identifiers,
    item_entry_members,
    item_invariant,
    item_keyed_paths,
    project_item,
    string_literals,
)
from obshub.rules.lifecycle import FIRING, INACTIVE, PENDING, RESOLVED, AlertInstance, _netstring
from obshub.rules.model import Rule, RuleSet
from obshub.rules.window import MAX_HITS_PER_GROUP, Window

log = logging.getLogger("obshub.rules.engine")
Notify = Callable[[dict], None]
MAX_BUFFERED_PER_KEY = 1_000
MAX_FINGERPRINTS = 200_000  # cached group -> fingerprint entries per rule before the cache restarts
# an alert of a rule with a window in steps stays true this long after its latest match or step of its
# job while the window reaches the threshold: a job that stops sending steps does not keep it firing
STEP_HOLD_NS = 300 * 1_000_000_000
INTERIM = frozenset({"hang", "running"})  # closed_by of the interim records of an open step
JOB_RETENTION_NS = 3_600_000_000_000  # a job's groups are dropped this long after its last record (ns)
MAX_ERROR_TEXT = 300  # characters of a template's error shown in its annotation (a message may quote a value)
#: aggregates whose value is whole by definition (hits, incidents): annotation templates see it as an int
INTEGRAL_AGGREGATES = frozenset({"count", "incidents"})
_SKIP, _ERROR = "skip", "error"  # per-item outcomes: condition not true / an expression failed (counted)
_EMIT, _MARK = "obshub_emit__", "obshub_mark__"  # CEL functions of the one-pass foreach (see _ForeachPlan)
_ABSENT = object()  # no entry for the item in a map


class _RuleRuntime:
    """Window hits, correlation buffers and cached fingerprints of one rule."""

    def __init__(self) -> None:
        self.hits: dict[str, Window] = {}  # fingerprint -> hits of the group in the window
        self.this_buf: dict[str, deque] = {}  # correlation key -> deque[(t_ns, labels, activation, used)]
        self.other_buf: dict[str, deque] = {}  # correlation key -> deque[(t_ns, activation)]
        self.fps: dict[tuple, tuple[str, dict[str, str]]] = {}  # group-by values -> (fingerprint, labels)
        self.job_groups: dict[str, set[str]] = {}  # window in steps: job -> fingerprints of its groups
        self.job_of: dict[str, str | None] = {}  # fingerprint of a group with hits -> its ``job`` label


@dataclass
class _ForeachPlan:
    """How a ``foreach`` rule is evaluated without converting the record once per item.

    ``combined``: ``(condition) ? [true, group_by..., of] : [false]``, evaluated per item on a small
    context holding only ``body_names`` (the fields the rule's per-item expressions read) and ``item``.
    ``invariant``: every per-item expression is item-invariant (``expr.item_invariant``; a group-by that
    is just ``item`` takes the item's value): one evaluation for a sentinel item serves every item that
    none of the record's strings in ``body_names`` nor the expressions' literals mention; mentioned items
    are evaluated one by one. Otherwise ``one_pass`` walks the items once inside CEL on the record's
    shared context, handing each item's result to Python (``obshub_emit__``).
    ``keyed``: the maps read only by the item (``expr.item_keyed_paths``), each cut to the item's entry;
    ``members``: per keyed map, the members of an entry the expressions read (``expr.item_entry_members``;
    None: the whole entry), so items whose entries agree on them share one evaluation; ``reads``: per
    field, the member paths read (``expr.field_paths``; None: whole), the rest left out of a per-item
    context (issue #35: a wide slow step's per-item contexts were most of the pack's cost)."""

    combined: Compiled
    one_pass: Compiled
    body_names: frozenset[str]
    literals: frozenset[str]
    invariant: bool
    identity: tuple[bool, ...]
    keyed: frozenset[tuple[str, ...]] = frozenset()
    members: dict[tuple[str, ...], frozenset[str] | None] = field(default_factory=dict)
    reads: dict[str, frozenset[tuple[str, ...]] | None] = field(default_factory=dict)


def _foreach_plan(rule: Rule) -> _ForeachPlan | None:
    if rule.foreach is None or rule.correlate is not None:
        return None
    parts = (
        [rule.condition.source]
        + [e.source for e in rule.group_by.values()]
        + ([rule.of.source] if rule.of is not None else [])
    )
    identity = tuple(e.source.strip() == "item" for e in rule.group_by.values())
    body = " ".join(parts)
    per_item = (
        [rule.condition.source]
        + [e.source for e, ident in zip(rule.group_by.values(), identity) if not ident]
        + ([rule.of.source] if rule.of is not None else [])
    )
    combined = "(" + parts[0] + ") ? [true" + "".join(f", ({p})" for p in parts[1:]) + "] : [false]"
    one_pass = f"({rule.foreach.source}).exists(item, {_MARK}() || {_EMIT}({combined}))"
    try:
        plan = _ForeachPlan(
            Compiled(combined, compile_expr(combined)),
            Compiled(one_pass, compile_expr(one_pass)),
            frozenset(identifiers(body)) - {"item"},
            frozenset().union(*(string_literals(p) for p in parts)),
            all(item_invariant(p) for p in per_item),
            identity,
            keyed := item_keyed_paths(combined),
            {p: item_entry_members(combined, p) for p in keyed},
            field_paths(combined),
        )
    except ValueError as exc:  # cannot happen for validated rules; the per-item path still works
        log.warning("rule %s: per-item evaluation (%s)", rule.id, exc)
        return None
    return plan


def _fingerprint_template(rule: Rule) -> tuple[dict[str, str], list]:
    """The rule's static labels, and ``lifecycle.encode_labels`` of a group's labels as parts: bytes for
    what every group shares (label names, static values), the index of the group-by value for the rest;
    joined with each value's netstring in place of its index, the bytes equal ``encode_labels`` of the
    group's labels (so the fingerprint is ``lifecycle.fingerprint``'s, computed without sorting)."""
    static = {"alertname": rule.id, "severity": rule.severity, **rule.labels}
    by = list(rule.group_by)
    names = sorted(set(static) | set(by), key=lambda n: n.encode("utf-8", "surrogatepass"))
    parts: list = []
    for name in names:
        parts.append(_netstring(name))
        parts.append(by.index(name) if name in by else _netstring(str(static[name])))
    merged: list = []
    for part in parts:  # runs of bytes joined once
        if merged and part.__class__ is bytes and merged[-1].__class__ is bytes:
            merged[-1] += part
        else:
            merged.append(part)
    return static, merged


def _names(rule: Rule) -> set[str]:
    """Top-level names any expression of ``rule`` may read."""
    exprs = [rule.condition, rule.foreach, rule.of, *rule.group_by.values()]
    if rule.correlate:
        c = rule.correlate
        exprs += [c.condition, *c.this_keys.values(), *c.other_keys.values()]
    out: set[str] = set()
    for e in exprs:
        if e is not None:
            out.update(identifiers(e.source))
    return out


class Engine:
    """Evaluates a RuleSet. ``notify(change)`` receives every state change record (see
    ``lifecycle.change_record``). ``external_url`` prefixes each alert's ``generator_url``."""

    def __init__(
        self,
        ruleset: RuleSet,
        notify: Notify,
        *,
        external_url: str = "http://localhost:9099/rules",
        retention_ns: int = JOB_RETENTION_NS,
    ):
        self.ruleset = ruleset
        self.notify = notify
        self.external_url = external_url.rstrip("/")
        self.instances: dict[str, AlertInstance] = {}
        self.runtime: dict[str, _RuleRuntime] = {rid: _RuleRuntime() for rid in ruleset.rules}
        self.now_ns = 0
        self.eval_errors = 0
        self.template_errors = 0  # annotations whose template failed to render (the alert shows the error)
        self.dirty = False
        self._emitted: list = []
        self._marks = 0
        self._functions = {_EMIT: self._emit_item, _MARK: self._mark_item}
        # signal -> job -> the largest step seen in records of that signal (windows in steps); per signal,
        # since a job's events of step N+1 arrive before the summary of step N is closed
        self.job_steps: dict[str, dict[str, int]] = {"steps": {}, "events": {}}
        # job -> its latest life (a step summary's ``life``: a torchrun restart, a resume, an elastic resize
        # number their steps again; docs/STREAMS.md "Restarts, resumes and world-size changes")
        self.job_life: dict[str, int] = {}
        # retention (docs/RULES.md "Retention"): job -> time_ns of its latest record; swept in ``tick``
        self.retention_ns = retention_ns
        self.job_seen: dict[str, int] = {}
        self._swept_ns = 0
        self._compile_plans()

    def _emit_item(self, result: Any) -> bool:
        self._emitted.append(result)
        return False

    def _mark_item(self) -> bool:
        self._marks += 1
        return False

    def _compile_plans(self) -> None:
        self._plans = {rid: _foreach_plan(r) for rid, r in self.ruleset.rules.items()}
        self._rule_names = {rid: frozenset(_names(r)) for rid, r in self.ruleset.rules.items()}
        self._shared_names = {rid: self._names_shared(r) for rid, r in self.ruleset.rules.items()}
        self._reading: dict[tuple[str, str | None], tuple[list[Rule], frozenset[str]]] = {}
        self._fp_templates: dict[str, tuple[dict[str, str], list]] = {}
        self._step_rules = [r for r in self.ruleset.rules.values() if r.window_steps]

    def _names_shared(self, rule: Rule) -> frozenset[str]:
        """The fields ``rule`` reads on a record's shared context: all of its fields, except for a
        ``foreach`` rule whose per-item expressions are item-invariant (``_ForeachPlan``): those are
        evaluated on small per-item contexts, so only its ``foreach`` expression reads the shared one (a
        wide summary's ``evidence`` is then never converted whole)."""
        plan = self._plans[rule.id]
        if plan is None or not plan.invariant or rule.foreach is None:
            return self._rule_names[rule.id]
        return frozenset(identifiers(rule.foreach.source))

    def _reads(self, signal: str, kind: str | None) -> tuple[list[Rule], frozenset[str]]:
        """The rules that read ``signal``/``kind`` and the fields their shared context needs (cached)."""
        key = (signal, kind)
        got = self._reading.get(key)
        if got is None:
            rules = [r for r in self.ruleset.rules.values() if r.reads(signal, kind)]
            names = frozenset().union(*(self._shared_names[r.id] for r in rules))
            got = self._reading[key] = (rules, names)
        return got

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
        runtime = {}
        for rid, rule in ruleset.rules.items():
            old = self.ruleset.rules.get(rid)
            if old is not None and old.window_steps != rule.window_steps:
                self.runtime.pop(rid, None)  # hits on another axis (steps vs. time): start afresh
            rt = runtime[rid] = self.runtime.get(rid, _RuleRuntime())
            rt.fps = {}  # labels (severity, static labels) may have changed
            for fp, w in list(rt.hits.items()):
                if w.kind != rule.aggregate:
                    rt.hits[fp] = Window.from_list(rule.aggregate, MAX_HITS_PER_GROUP, w.to_list())
        self.runtime = runtime
        self.ruleset = ruleset
        self._compile_plans()

    # -- input --------------------------------------------------------------------------------------------
    def process(self, signal: str, record: dict) -> None:
        """Evaluate every rule that reads ``signal`` on ``record`` (a map from ``rules.fields``).

        The record is converted to CEL values once, and only the fields the rules reading it reference;
        a ``foreach`` rule does not convert it again per item (``_ForeachPlan``), so the cost grows with
        the items, not with items x record size."""
        t = int(record.get("time_ns") or 0) or self.now_ns  # a record without a time happens "now"
        self.now_ns = max(self.now_ns, t)
        job = record.get("job")
        if job.__class__ is str and self.job_seen.get(job, 0) < t:
            self.job_seen[job] = t
        kind = record.get("kind") if signal == "events" else None
        rules, names = self._reads(signal, kind)
        if self._step_rules and signal != "health":
            self._job_step(signal, record)
        if not rules:
            return
        shared = Activation(record, names, self._functions)  # one CEL conversion for every rule
        for rule in rules:
            if (
                rule.signal == signal
                and (signal != "events" or kind in rule.kinds)
                and (signal != "steps" or self._admits(rule, record))
            ):
                if rule.foreach is None:
                    if rule.condition.test(shared):
                        self._primary_match(rule, shared, t)
                else:
                    self._foreach(rule, shared, t)
            c = rule.correlate
            if c and c.signal == signal and (signal != "events" or kind in c.kinds) and c.condition.test(shared):
                self._other_match(rule, shared, t)

    @staticmethod
    def _admits(rule: Rule, record: dict) -> bool:
        """Whether ``rule`` reads ``record`` of its own signal: a steps rule skips interim records unless
        it has ``interim: true``, and records before its warm-up (``warmup_steps``: baseline.n)."""
        if rule.signal != "steps":
            return True
        if not rule.interim and record.get("closed_by") in INTERIM:
            return False
        if rule.warmup_steps:
            n = (record.get("baseline") or {}).get("n", 0)
            return isinstance(n, int) and n >= rule.warmup_steps
        return True

    def _job_step(self, signal: str, record: dict) -> None:
        """Track the job's largest step in records of ``signal``; when it advances, the windows in steps
        of the job's groups of the rules reading ``signal`` move on."""
        step, job = record.get("step"), record.get("job")
        if type(step) is not int or step < 0 or not isinstance(job, str):
            return
        life = record.get("life")
        if type(life) is int and life != self.job_life.get(job, 0):
            if life < self.job_life.get(job, 0):
                return  # a late record of an earlier life moves no window
            self._new_life(job, life)
        steps = self.job_steps.setdefault(signal, {})
        last = steps.get(job)
        if last is not None and step <= last:
            return
        steps[job] = step
        if last is None:
            return
        for rule in self._step_rules:
            if rule.signal != signal:
                continue
            rt = self.runtime[rule.id]
            fps = rt.job_groups.get(job)
            if not fps:
                continue
            horizon = step - rule.window_steps
            for fp in list(fps):
                w = rt.hits.get(fp)
                if w is not None:
                    w.prune(horizon)
                    if not w.times:
                        del rt.hits[fp]
                        w = None
                inst = self.instances.get(fp)
                if inst is not None and inst.state in (PENDING, FIRING):
                    if w is not None and w.value(rule.at_least) >= rule.at_least:
                        inst.true_until_ns = max(inst.true_until_ns, self.now_ns + STEP_HOLD_NS)
                    else:
                        inst.true_until_ns = self.now_ns  # the window moved past the matches
                        self._advance(inst, rule, self.now_ns)
                if w is None and fp not in self.instances:
                    fps.discard(fp)
            if not fps:
                del rt.job_groups[job]

    def _new_life(self, job: str, life: int) -> None:
        """``job`` started life ``life`` (its step numbers start again): its windows in steps are emptied
        and their step counters reset, so steps of two lives never count in one window; an alert they
        held resolves as when its window moves past its matches."""
        self.job_life[job] = life
        for steps in self.job_steps.values():
            steps.pop(job, None)
        for rule in self._step_rules:
            rt = self.runtime[rule.id]
            for fp in rt.job_groups.pop(job, ()):
                rt.hits.pop(fp, None)
                inst = self.instances.get(fp)
                if inst is not None and inst.state in (PENDING, FIRING):
                    inst.true_until_ns = self.now_ns
                    self._advance(inst, rule, self.now_ns)
        self.dirty = True

    def _add_step_hit(
        self, rule: Rule, fp: str, labels: dict, t: int, value: float, data: Callable[[], dict], other: dict | None
    ) -> None:
        """A hit of a rule with a window in steps: placed at its record's step (a record with no step,
        -1, is no hit); ``count`` counts steps with a match."""
        rec = data()
        step, job = rec.get("step"), rec.get("job")
        if type(step) is not int or step < 0:
            return
        life = rec.get("life")
        if type(life) is int and isinstance(job, str) and life < self.job_life.get(job, 0):
            return  # a record of an earlier life of the job
        rt = self.runtime[rule.id]
        job = job if isinstance(job, str) else ""
        last = max(self.job_steps.get(rule.signal, {}).get(job, step), step)
        horizon = last - rule.window_steps
        if step <= horizon:
            return  # older than the window: a late record
        w = rt.hits.get(fp)
        if w is None:
            w = rt.hits[fp] = Window(rule.aggregate, MAX_HITS_PER_GROUP)
        rt.job_groups.setdefault(job, set()).add(fp)
        rt.job_of[fp] = labels.get("job")  # retention: the group's job (expire_jobs)
        self.dirty = True
        if rule.aggregate == "count" and step in w.times:
            w.prune(horizon)
            agg = w.value(rule.at_least)
        else:
            agg = w.push(step, value, horizon, rule.at_least)
        if agg >= rule.at_least:
            self._reached(rule, fp, labels, t, w, data, other)

    def _activations(self, rule: Rule, shared: Activation) -> list[Activation]:
        """One activation per ``foreach`` item, each a full conversion (only correlated foreach rules)."""
        try:
            items = rule.foreach.eval(shared)
        except EvalError:
            self.eval_errors += 1
            return []
        names = self._rule_names[rule.id] | {"item"}
        return [Activation({**shared.data, "item": it}, names) for it in (items or [])]

    def _foreach(self, rule: Rule, shared: Activation, t: int) -> None:
        plan = self._plans[rule.id]
        if plan is None:
            for act in self._activations(rule, shared):
                if rule.condition.test(act):
                    self._primary_match(rule, act, t)
            return
        try:
            items = rule.foreach.eval(shared)
        except EvalError:
            self.eval_errors += 1
            return
        items = list(items or [])
        if not items:
            return
        if plan.invariant and all(type(it) is str for it in items):
            # the keys of the maps the rule reads only by item (plan.keyed) are no mention: an item that
            # is one of them and mentioned nowhere else gets the outcome of the sentinel item holding
            # its entry, computed once per distinct entry
            mentioned = set(plan.literals)
            for name in plan.body_names:
                paths = [p for p in plan.keyed if p[0] == name]
                if name in plan.reads:  # only the members the rule reads reach a per-item context
                    mentioned |= shared.strings_read(name, plan.reads[name], paths)
                else:
                    mentioned |= shared.strings_outside(name, paths) if paths else shared.strings(name)
            maps = [k for p in plan.keyed if (k := shared.entry_keys(p, plan.members.get(p))) is not None]
            sentinel = "\x00obshub:item"
            while sentinel in mentioned or any(sentinel in m for m in maps):
                sentinel += "\x00"
            common = None
            by_entry: dict[Any, Any] = {}
            outcomes = []
            one = maps[0] if len(maps) == 1 else None  # the usual case: one keyed map
            for it in items:
                if it in mentioned:
                    outcomes.append((it, self._eval_item(rule, plan, shared, it), False))
                elif one is not None and it in one or one is None and maps and any(it in m for m in maps):
                    if one is not None:
                        key = one[it]
                        unhashable = key is None
                    else:
                        key = tuple((it in m, m.get(it, _ABSENT)) for m in maps)
                        unhashable = any(k[0] and k[1] is None for k in key)
                    if unhashable:  # an entry with no hashable form: this item alone
                        outcomes.append((it, self._eval_item(rule, plan, shared, it), False))
                        continue
                    res = by_entry.get(key, _ABSENT)
                    if res is _ABSENT:
                        res = by_entry[key] = self._eval_item(rule, plan, shared, sentinel, entry_of=it)
                    outcomes.append((it, res, True))
                else:
                    if common is None:
                        common = self._eval_item(rule, plan, shared, sentinel)
                    outcomes.append((it, common, True))
            self._apply(rule, plan, outcomes, shared, t)
            return
        self._emitted, self._marks = [], 0
        whole = shared
        if shared.names is not None and not self._rule_names[rule.id] <= shared.names:
            # an item-invariant rule with items that are not all strings: its fields on a wider context
            whole = Activation(shared.data, shared.names | self._rule_names[rule.id], self._functions)
        try:
            plan.one_pass.eval(whole)
        except EvalError:
            pass  # the item being evaluated failed: it and the rest go one by one below
        results = self._emitted
        done = len(results) if len(results) == self._marks else self._marks - 1
        self._apply(
            rule,
            plan,
            [
                (
                    it,
                    self._result(rule, plan, results[i]) if i < done else self._eval_item(rule, plan, shared, it),
                    False,
                )
                for i, it in enumerate(items)
            ],
            shared,
            t,
        )

    @staticmethod
    def _result(rule: Rule, plan: _ForeachPlan, out: Any) -> Any:
        if not isinstance(out, list) or not out or out[0] is not True:
            return _SKIP
        n = len(rule.group_by)
        return out[1 : 1 + n], (out[1 + n] if rule.of is not None else 1.0)

    def _eval_item(self, rule: Rule, plan: _ForeachPlan, shared: Activation, item: Any, entry_of: Any = None) -> Any:
        """``(group_by values, of value)`` of one item, or _SKIP / _ERROR, on a context of the rule's
        per-item fields only, each map of ``plan.keyed`` cut down to the item's entry (``entry_of``: the
        entries of that item instead, under ``item``'s key)."""
        data, reads = shared.data, plan.reads
        own = project_item(
            {k: shared.cut(k, reads[k]) if k in reads else data[k] for k in plan.body_names if k in data},
            plan.keyed,
            item if entry_of is None else entry_of,
            key_as=item,
            members=plan.members,
        )
        ctx = cel.Context(variables={**own, "item": item})
        try:
            return self._result(rule, plan, plan.combined.eval(ctx))
        except EvalError:
            pass
        # which part failed decides the outcome: a condition error is no match, a group-by or `of` error counts
        if not rule.condition.test(ctx):
            return _SKIP
        try:
            vals = [e.eval(ctx) for e in rule.group_by.values()]
            value = rule.of.eval(ctx) if rule.of is not None else 1.0
        except EvalError:
            return _ERROR
        return vals, value

    def _apply(
        self, rule: Rule, plan: _ForeachPlan, outcomes: list[tuple[Any, Any, bool]], shared: Activation, t: int
    ) -> None:
        """Record the items' outcomes ``(item, outcome, substitute)``: a hit of the item's group
        (``substitute``: the outcome was computed for the sentinel item; group-bys that are just ``item``
        take this item). The per-item path of a wide foreach: kept to dictionary look-ups and one window
        update per item."""
        rt = self.runtime[rule.id]
        fps, hits = rt.fps, rt.hits
        subst = [i for i, ident in enumerate(plan.identity) if ident]
        has_of, at_least = rule.of is not None, rule.at_least
        horizon = max(t, self.now_ns) - rule.window_ns
        for item, res, substitute in outcomes:
            if res is _SKIP:
                continue
            if res is _ERROR:
                self.eval_errors += 1
                continue
            vals, value = res
            if substitute and subst:
                key = list(vals)
                for i in subst:
                    key[i] = item
                key = tuple(key)
            else:
                key = tuple(vals)
            got = fps.get(key) or self._fingerprint(rule, key)
            if has_of:
                try:
                    value = float(value)
                except (TypeError, ValueError):
                    self.eval_errors += 1
                    continue
            fp = got[0]
            if rule.window_steps:
                self._add_step_hit(rule, fp, got[1], t, value, lambda it=item: {**shared.data, "item": it}, None)
                continue
            w = hits.get(fp)
            if w is None:
                w = hits[fp] = Window(rule.aggregate, MAX_HITS_PER_GROUP)
                rt.job_of[fp] = got[1].get("job")
            self.dirty = True
            if w.push(t, value, horizon, at_least) >= at_least:
                self._reached(rule, fp, got[1], t, w, lambda it=item: {**shared.data, "item": it}, None)

    def _fingerprint(self, rule: Rule, key: tuple) -> tuple[str, dict[str, str]]:
        """``(fingerprint, labels)`` of the group whose group-by values are ``key`` (cached per rule)."""
        fps = self.runtime[rule.id].fps
        got = fps.get(key)
        if got is None:
            if len(fps) >= MAX_FINGERPRINTS:
                fps.clear()
            template = self._fp_templates.get(rule.id)
            if template is None:
                template = self._fp_templates[rule.id] = _fingerprint_template(rule)
            static, parts = template
            values = [v if v.__class__ is str else str(v).lower() if isinstance(v, bool) else str(v) for v in key]
            labels = dict(static)
            if None in key:  # a null value is no label (a rank not known): the alert carries none, not ""
                labels.update((n, v) for n, v, k in zip(rule.group_by, values, key) if k is not None)
                got = fps[key] = (lifecycle.fingerprint(labels), labels)
                return got
            labels.update(zip(rule.group_by, values))
            encoded = b"".join([p if p.__class__ is bytes else _netstring(values[p]) for p in parts])
            got = fps[key] = (hashlib.sha256(encoded).hexdigest()[:16], labels)
        return got

    def _labels(self, rule: Rule, act: Activation) -> dict[str, str] | None:
        vals = []
        for expr in rule.group_by.values():
            try:
                vals.append(expr.eval(act))
            except EvalError:
                self.eval_errors += 1
                return None
        return self._fingerprint(rule, tuple(vals))[1]

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
        for t_o, other in reversed(rt.other_buf.get(key, ())):
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
    def _hit(self, rule: Rule, labels: dict[str, str], act: "Activation | dict", t: int, other: dict | None) -> None:
        """A hit of the group ``labels`` at ``t``; ``act`` is the matching record (its ``of`` is evaluated)."""
        if not isinstance(act, Activation):
            act = Activation(act, self._rule_names[rule.id])
        value = 1.0
        if rule.of is not None:
            try:
                value = float(rule.of.eval(act))
            except (EvalError, TypeError, ValueError):
                self.eval_errors += 1
                return
        fp = lifecycle.fingerprint(labels)
        self._add_hit(rule, fp, labels, t, value, lambda: act.data, other)

    def _add_hit(
        self,
        rule: Rule,
        fp: str,
        labels: dict[str, str],
        t: int,
        value: float,
        data: Callable[[], dict],
        other: dict | None,
    ) -> None:
        """Add ``(t, value)`` to the group's window and update the alert when the aggregate reaches the
        threshold (annotations rendered from ``data()``, the record as templates see it)."""
        rt = self.runtime[rule.id]
        if rule.window_steps:
            self._add_step_hit(rule, fp, labels, t, value, data, other)
            return
        hits = rt.hits.get(fp)
        if hits is None:
            hits = rt.hits[fp] = Window(rule.aggregate, MAX_HITS_PER_GROUP)
            rt.job_of[fp] = labels.get("job")
        self.dirty = True
        if hits.push(t, value, max(t, self.now_ns) - rule.window_ns, rule.at_least) >= rule.at_least:
            self._reached(rule, fp, labels, t, hits, data, other)

    def _reached(
        self,
        rule: Rule,
        fp: str,
        labels: dict[str, str],
        t: int,
        hits: Window,
        data: Callable[[], dict],
        other: dict | None,
    ) -> None:
        """The group's aggregate reaches the threshold at ``t``: the alert becomes (or stays) true."""
        agg = hits.value(rule.at_least)
        inst = self.instances.get(fp)
        if inst is None:
            inst = self.instances[fp] = AlertInstance(fp, rule.id, dict(labels), rule.severity)
        was_firing = inst.state == FIRING
        inst.value = agg
        inst.annotations = self._render(rule, data(), labels, agg, len(hits), other)
        if rule.window_steps:
            until = max(t, self.now_ns) + STEP_HOLD_NS  # ends when the job's steps move past (_job_step)
        else:
            until = hits.true_until(rule.at_least, rule.window_ns)
        if lifecycle.become_true(inst, t, until) == PENDING and rule.for_ns > 0:
            self._emit(inst, PENDING, rule)  # with `for: 0` it fires at once: no pending change published
        if (
            was_firing
            and rule.renotify_limit
            and lifecycle.maybe_renotify(inst, max(t, self.now_ns), rule.renotify_limit, rule.renotify_after_ns)
        ):
            self._emit(inst, FIRING, rule)  # a new match of a firing alert: notify again
            self.dirty = True
        self._advance(inst, rule, max(t, self.now_ns))

    def _render(self, rule: Rule, act: dict, labels: dict, value: float, count: int, other: dict | None) -> dict:
        if rule.aggregate in INTEGRAL_AGGREGATES and float(value).is_integer():
            # a count of hits or incidents is whole by definition: `{{ value }}` says 2, not 2.0 (walk24);
            # the alert's own value (JSON, Alertmanager) stays the aggregate as computed
            value = int(value)
        ctx = {
            **act,
            "record": act,  # the matched record whole: its own `value` (`value` below is the aggregate's)
            "labels": labels,
            "value": value,
            "count": count,
            "other": other or {},
            "rule": rule.id,
            "severity": rule.severity,
            "hits": count,
        }
        out = {}
        for name, tmpl in rule.annotations.items():
            try:
                out[name] = tmpl.render(ctx)
            except Exception as exc:  # noqa: BLE001 - a sandboxed template's filters may raise anything on
                # the record's values; evaluation goes on, the alert shows the error, template_errors counts it
                self.template_errors += 1
                why = str(exc)
                why = why if len(why) <= MAX_ERROR_TEXT else why[: MAX_ERROR_TEXT - 1] + "…"
                out[name] = f"(template error: {type(exc).__name__}: {why}; rule {rule.id}, annotations/{name})"
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
            inst,
            status,
            self.now_ns,
            description=rule.description if rule else "",
            runbook=rule.runbook if rule else "",
            routes=rule.routes if rule else [],
            generator_url=f"{self.external_url}#{inst.rule}",
        )
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
            horizon = self.now_ns - rule.window_ns
            for fp, w in [] if rule.window_steps else list(rt.hits.items()):
                if w.times and w.times[0] <= horizon:
                    w.prune(horizon)
                if not w.times:
                    del rt.hits[fp]
                    rt.job_of.pop(fp, None)
            if rule.correlate:
                horizon = self.now_ns - rule.correlate.within_ns
                for buf in (rt.this_buf, rt.other_buf):
                    for k in list(buf):
                        while buf[k] and buf[k][0][0] < horizon:
                            buf[k].popleft()
                        if not buf[k]:
                            del buf[k]
        if self.now_ns - self._swept_ns >= min(self.retention_ns // 10, 60_000_000_000):
            self._swept_ns = self.now_ns
            self.expire_jobs()

    def expire_jobs(self) -> list[str]:
        """Drop the state of every job without a record for ``retention_ns`` (engine time): its alerts are
        resolved first (a firing alert publishes ``resolved``, a pending one ``inactive``), then its groups'
        windows and cached fingerprints go. A group's job is its ``job`` label. Cached fingerprints of
        groups with neither a window nor an alert are dropped too (the cache holds live groups only). An
        alert whose job has no record seen by this engine (a state restored from an older version) counts
        from now. Returns the jobs dropped."""
        now = self.now_ns
        for inst in self.instances.values():
            job = inst.labels.get("job")
            if job is not None and job not in self.job_seen:
                self.job_seen[job] = now
        gone = {j for j, t in self.job_seen.items() if now - t >= self.retention_ns}
        for j in gone:
            del self.job_seen[j]
        if gone:
            for fp, inst in list(self.instances.items()):
                if inst.labels.get("job") not in gone:
                    continue
                rule = self.ruleset.rules.get(inst.rule)
                if inst.state == FIRING:
                    inst.state, inst.resolved_at_ns = RESOLVED, now
                    self._emit(inst, RESOLVED, rule)
                elif inst.state == PENDING:
                    inst.state = INACTIVE
                    self._emit(inst, INACTIVE, rule)
                del self.instances[fp]
                self.dirty = True
            log.info("dropped the state of %d job(s) without a record for %.0f s", len(gone), self.retention_ns / 1e9)
        for steps in self.job_steps.values():  # windows in steps: the job's step counters
            for j in gone & steps.keys():
                del steps[j]
        for j in gone & self.job_life.keys():
            del self.job_life[j]
        for rt in self.runtime.values():
            if gone:
                for fp in [fp for fp, job in rt.job_of.items() if job in gone]:
                    rt.hits.pop(fp, None)
                    del rt.job_of[fp]
                    self.dirty = True
                for j in gone & rt.job_groups.keys():
                    for fp in rt.job_groups.pop(j):
                        rt.hits.pop(fp, None)
            rt.fps = {k: v for k, v in rt.fps.items() if v[0] in rt.hits or v[0] in self.instances}
        return sorted(gone)

    def resolve_all(self) -> int:
        """Resolve every alert now, as ``expire_jobs`` does for a job gone (a firing alert publishes
        ``resolved``, a pending one ``inactive``) and forget them; windows and correlation state stay.
        For an engine that stops for good (``obshub rules serve --resolve-on-exit``: the demo, a CI
        stack), so the alerts topic does not keep its alerts firing. Returns the alerts resolved."""
        now, n = self.now_ns, 0
        for fp, inst in list(self.instances.items()):
            rule = self.ruleset.rules.get(inst.rule)
            if inst.state == FIRING:
                inst.state, inst.resolved_at_ns = RESOLVED, now
                self._emit(inst, RESOLVED, rule)
                n += 1
            elif inst.state == PENDING:
                inst.state = INACTIVE
                self._emit(inst, INACTIVE, rule)
            del self.instances[fp]
            self.dirty = True
        return n

    def active(self) -> list[AlertInstance]:
        """Alerts pending or firing now, sorted by rule and labels."""
        return sorted(
            (i for i in self.instances.values() if i.state in (PENDING, FIRING)),
            key=lambda i: (i.rule, sorted(i.labels.items())),
        )

    # -- persistence --------------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """JSON-able (and msgpack-able) state: alert instances, window hits and correlation buffers, the
        clock, and ``jobs`` (job -> time_ns of its latest record, for retention: a dropped job is in none). Version 3 holds each rule's window hits as flat columns: ``fps`` (group fingerprints),
        ``n`` (hits per group), ``t`` and ``v`` (every group's hit times, ns, and values, in ``fps``
        order). A wide job has thousands of groups of a few dozen hits each; flat columns are built and
        encoded in bulk (2,048 hosts: ~10 ms instead of ~50 ms for a list per group); ``job`` holds each
        group's ``job`` label (null: none), in ``fps`` order, for retention."""
        runtime = {}
        for rid, rt in self.runtime.items():
            ws = list(rt.hits.values())
            runtime[rid] = {
                "fps": list(rt.hits),
                "job": [rt.job_of.get(fp) for fp in rt.hits],
                "n": [len(w.times) for w in ws],
                "t": list(chain.from_iterable(w.times for w in ws)),
                "v": list(chain.from_iterable(w.values for w in ws)),
                "job_groups": {k: sorted(v) for k, v in rt.job_groups.items()},
                "this_buf": {k: [list(e) for e in b] for k, b in rt.this_buf.items()},
                "other_buf": {k: [list(e) for e in b] for k, b in rt.other_buf.items()},
            }
        return {
            "v": 3,
            "now_ns": self.now_ns,
            "job_steps": {sig: dict(jobs) for sig, jobs in self.job_steps.items()},
            "instances": [i.to_dict() for i in self.instances.values()],
            "runtime": runtime,
            "jobs": dict(self.job_seen),
            "lives": dict(self.job_life),
        }

    def restore(self, snap: dict) -> None:
        """Load a ``snapshot`` (versions 1 to 3); state of rules no longer in the rule set is dropped."""
        columns = snap.get("v", 1) == 2
        self.now_ns = int(snap.get("now_ns", 0))
        saved = snap.get("job_steps") or {}
        self.job_steps = {"steps": {}, "events": {}}
        for sig, jobs in saved.items():
            if isinstance(jobs, dict):
                self.job_steps[str(sig)] = {str(k): int(v) for k, v in jobs.items()}
        self.job_seen = {str(j): int(t) for j, t in (snap.get("jobs") or {}).items()}
        self.job_life = {str(j): int(n) for j, n in (snap.get("lives") or {}).items()}
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
            kind = self.ruleset.rules[rid].aggregate
            if "fps" in rt:  # version 3: flat columns
                r.hits, i = {}, 0
                times, values = rt["t"], rt["v"]
                for fp, n in zip(rt["fps"], rt["n"]):
                    r.hits[renamed.get(fp, fp)] = Window.from_list(
                        kind, MAX_HITS_PER_GROUP, list(zip(times[i : i + n], values[i : i + n]))
                    )
                    i += n
                r.job_of = {renamed.get(fp, fp): job for fp, job in zip(rt["fps"], rt.get("job") or ())}
            else:
                r.hits = {
                    renamed.get(fp, fp): Window.from_list(kind, MAX_HITS_PER_GROUP, list(zip(*h)) if columns else h)
                    for fp, h in rt["hits"].items()
                }
            r.job_groups = {k: {renamed.get(fp, fp) for fp in v} for k, v in (rt.get("job_groups") or {}).items()}
            r.this_buf = {
                k: deque((list(e) for e in b), maxlen=MAX_BUFFERED_PER_KEY) for k, b in rt["this_buf"].items()
            }
            r.other_buf = {
                k: deque((tuple(e) for e in b), maxlen=MAX_BUFFERED_PER_KEY) for k, b in rt["other_buf"].items()
            }


def freeze_heap() -> None:
    """Collect garbage, then exclude every object alive now from Python's cyclic garbage collector
    (``gc.freeze``): the modules, the compiled rules and a restored engine state are then never traversed
    again by a full collection. What the engine creates later (a wide job's windows) still is. Called once
    a service has loaded its rules and state; a full collection over an unfrozen heap cost ~15 ms more of
    a step's CPU at 2,048 hosts (docs/BENCHMARKS.md 4c, docs/ARCHITECTURE.md "Cost at width")."""
    gc.collect()
    gc.freeze()


def cusum(values: list[float]) -> float:
    """Page's one-sided CUSUM of ``values`` in order: ``S_0 = 0``, ``S_n = max(0, S_{n-1} + x_n)``, the
    final ``S``. The drift ``k`` is part of the rule's ``of`` (``x_n = evidence_n - k``); the alarm is
    ``S >= at_least`` (E. S. Page, "Continuous inspection schemes", Biometrika 41, 1954). The running
    window (``rules.window``) computes the same."""
    s = 0.0
    for v in values:
        s = max(0.0, s + v)
    return s


__all__ = ["Engine", "Notify", "freeze_heap"]
