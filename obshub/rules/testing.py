"""Rule unit tests (``obshub rules test FILE...``), in the spirit of ``promtool test rules``.

A test file::

    version: 1
    rule_files: [../rdma_straggler.yaml]      # relative to the test file
    tests:
      - name: slow RDMA completion on the straggler of a stalled step fires
        input:                                 # records at times relative to the test's start
          - at: 0s
            steps: {job: llm, step: 7, stall: true, straggler: {host: node2}}
          - at: 1s
            events: {kind: RDMA_CQ_DONE, job: llm, host: node2, step: 7, duration_ns: 45000}
            repeat: 3                          # optional: the same record 3 times ...
            every: 1s                          # ... 1 s apart
        expect:
          - at: 2s
            alerts:                            # every alert pending or firing at 2 s; [] = none
              - rule: rdma_slow_completion_on_straggler
                state: firing                  # default firing
                labels: {host: node2, layer: nic}          # these labels must match (others ignored)
                annotations: {step: "7"}       # these annotations must match exactly

Records are filled in: a step summary gets neutral defaults for every documented field missing, an event
gets defaults and its derived fields (layer, duration_us, time_ns). Time starts at ``BASE_NS``.
"""

from __future__ import annotations

import difflib
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from obshub.core import schema
from obshub.rules import fields, typecheck
from obshub.rules.durations import parse_duration_ns
from obshub.rules.engine import Engine
from obshub.rules.errors import Problem, RuleTestError
from obshub.rules.loader import _plain, load_ruleset, resolve_builtin
from obshub.rules.yamlfile import brief, load_yaml, position, read_text, yaml11_surprises, yaml_type

BASE_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
MAX_REPEAT = 100_000  # records one input may expand to (a larger `repeat:` is a typo, not a test)
_TEST_KEYS = {"name", "input", "expect"}
_INPUT_KEYS = {"at", "steps", "events", "health", "repeat", "every"}
_EXPECT_KEYS = {"at", "alerts"}
_ALERT_KEYS = {"rule", "state", "labels", "annotations"}
_EVENT_INTS = ("host_id", "batch_seq", "ts_ns", "duration_ns", "trace_key", "step", "pid", "tid", "gpu", "value")
_EVENT_STRS = ("kind", "job", "host", "agent_id")
_EVENT_KEYS = {*_EVENT_INTS, *_EVENT_STRS, "payload"}  # what the short form of an event reads
_HEALTH_KEYS = set(fields.HEALTH_VARS)
_STEP_KEYS = set(fields.STEP_VARS) | {"closed_at_ns", "v"}
_STATES = ("pending", "firing")


@dataclass
class TestResult:
    """Outcome of one test case: ``failures`` lists 'at T: expected ... got ...' texts (empty = pass)."""

    file: str
    name: str
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


class _Problems:
    """The problems of one test file, each at its file:line:col, collected so that one run names them all
    (a fix-one-rerun loop per typo is what ``promtool`` users complain of)."""

    def __init__(self, file: str, doc: Any):
        self.file, self.doc = file, doc
        self.found: list[Problem] = []

    def add(self, path: list, msg: str, *, key: bool = False) -> None:
        line, col = position(self.doc, path, key=key)
        self.found.append(Problem(self.file, line, col, msg))

    def keys(self, path: list, node: Any, allowed: set[str], what: str) -> bool:
        """Whether ``node`` is a mapping; each key not in ``allowed`` is a problem of its own."""
        if not isinstance(node, dict):
            self.add(path, f"{what} must be a mapping")
            return False
        for k in node:
            if k not in allowed:
                self.add(path + [k], f"unknown field '{k}' in {what} (allowed: {', '.join(sorted(allowed))})", key=True)
        return True

    def raise_any(self) -> None:
        """Raise RuleTestError listing every problem found, in file order (line, column)."""
        if self.found:
            ordered = sorted(self.found, key=lambda p: (p.line, p.col))
            raise RuleTestError("\n".join(map(str, ordered)), "see docs/RULES.md, section 'Testing a rule'")


def _what(v: Any) -> str:
    """``v`` as an error names it: its YAML type and value (``str 'one'``, ``mapping {'a': 1}``), a long
    value cut to its start and size (yamlfile.brief)."""
    return f"{yaml_type(v)} {brief(v)}"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and schema.I64_MIN <= v <= schema.I64_MAX


def _input_problem(signal: str, spec: Any) -> str | None:
    """What is wrong with one input record of a test (as ``<signal>.<field>: reason``), or None. The
    checks are those production applies to the same record: a step summary goes through the steps
    topic's decoder, an event's fields must have its schema's types, and a field the record does not
    have is named (a misspelt field would otherwise be dropped and the test fail without a reason)."""
    if not isinstance(spec, dict):
        return f"{signal}: expected a mapping, got {_what(spec)}"
    allowed = {"steps": _STEP_KEYS, "events": _EVENT_KEYS, "health": _HEALTH_KEYS}[signal]
    for k in spec:
        if k not in allowed:
            near = difflib.get_close_matches(str(k), sorted(allowed), n=1)
            hint = f"; did you mean '{near[0]}'?" if near else f" (fields: {', '.join(sorted(allowed))})"
            return f"{signal}: unknown field '{k}'{hint}"
    if signal == "steps":
        try:
            schema.decode_step_summary(json.dumps(spec).encode())
        except (schema.SchemaError, TypeError, ValueError) as exc:
            return f"steps.{exc}"
        return None
    if signal == "events":
        for k in _EVENT_INTS:
            if k in spec and not _is_int(spec[k]):
                return f"events.{k}: expected a 64-bit integer, got {_what(spec[k])}"
        for k in _EVENT_STRS:
            if k in spec and not (isinstance(spec[k], str) and spec[k]):
                return f"events.{k}: expected a non-empty string, got {_what(spec[k])}"
        pl = spec.get("payload")
        if pl is not None and not (
            isinstance(pl, dict) and all(isinstance(v, (str, int, float, bool)) or v is None for v in pl.values())
        ):
            return "events.payload: expected a mapping of names to strings, numbers or booleans"
        return None
    for k in ("topic", "group", "component"):
        if k in spec and not isinstance(spec[k], str):
            return f"health.{k}: expected a string, got {_what(spec[k])}"
    for k in ("lag_messages", "time_ns"):
        if k in spec and not _is_int(spec[k]):
            return f"health.{k}: expected an integer, got {_what(spec[k])}"
    for k in ("idle_s", "uptime_s"):
        if k in spec and not (isinstance(spec[k], (int, float)) and not isinstance(spec[k], bool)):
            return f"health.{k}: expected a number, got {_what(spec[k])}"
    return None


_VALUE_WORDS = {"int": "an integer", "double": "a number", "string": "a string", "bool": "true or false"}


def _want(t: typecheck.T) -> str:
    """What a value of ``t`` is, as a problem says it (``an integer``, ``a number``, ``one of a, b``)."""
    if t.values:
        return f"one of {', '.join(sorted(t.values))}"
    return _VALUE_WORDS.get(t.kind, typecheck.article(t))


def _field_name(path: list) -> str:
    """``["steps", "evidence", "hosts", "node1"]`` as ``steps.evidence.hosts.node1``, list items ``[i]``."""
    return "".join(f"[{k}]" if isinstance(k, int) else (f".{k}" if i else str(k)) for i, k in enumerate(path))


def value_problem(path: list, t: typecheck.T, v: Any) -> tuple[list, str, bool] | None:
    """The first place where the plain value ``v`` (a field of a test's input record, as YAML gave it) has
    not the type ``t`` the rules read it as, as ``(path, reason, at_key)``: ``path`` is ``path`` extended by
    the keys and indexes down to the wrong value (for its file position; ``at_key``: the key's own, for an
    unknown member), ``reason`` reads ``steps.culprit.evidence: expected a number, got str 'high'``. None
    when it conforms. An int is accepted where a double is documented (CEL compares them); a map key must be
    a string; a member a record does not have (``straggler.hots``, a layer ``netwrk`` of
    ``evidence.hosts.<host>``) is a problem; ``dyn`` takes anything; null only where ``t`` is nullable."""
    where, k = _field_name(path), t.kind
    if k == "dyn" or (v is None and (t.nullable or k == "null")):
        return None
    if k in _VALUE_WORDS:
        ok = {
            "int": isinstance(v, int) and not isinstance(v, bool),
            "double": isinstance(v, (int, float)) and not isinstance(v, bool),
            "string": isinstance(v, str),
            "bool": isinstance(v, bool),
        }[k]
        if not ok:
            return path, f"{where}: expected {_want(t)}, got {_what(v)}", False
        if t.values and v not in t.values:
            return path, f"{where}: {brief(v)} is not one of {', '.join(sorted(t.values))}", False
        return None
    if k == "list":
        if not isinstance(v, list):
            return path, f"{where}: expected a list, got {_what(v)}", False
        return next((bad for i, x in enumerate(v) if (bad := value_problem(path + [i], t.elem or _DYN, x))), None)
    if k not in ("map", "record"):
        return None  # durations, timestamps: no record field holds one
    if not isinstance(v, dict):
        return path, f"{where}: expected a map, got {_what(v)}", False
    for key, x in v.items():
        if not isinstance(key, str):
            return (
                path + [key],
                f"{where}: key {brief(key)} is {yaml_type(key)}: a map's keys are strings (quote it)",
                True,
            )
        member = t.member(key) if k == "record" else (t.elem or _DYN)
        if member is None:
            near = difflib.get_close_matches(key, t.names, n=1)
            hint = f"; did you mean '{near[0]}'?" if near else f" (it has {', '.join(t.names)})"
            return path + [key], f"{where}: unknown field '{key}'{hint}", True
        if (bad := value_problem(path + [key], member, x)) is not None:
            return bad
    return None


_DYN = typecheck.DYN


@functools.cache
def _step_types() -> dict[str, typecheck.T]:
    return typecheck.step_types()


def _step_problem(spec: dict) -> tuple[list, str, bool] | None:
    """The first field of a step summary input, at any depth, whose value has not the type the rules read
    it as (``typecheck.STEP_TYPES``: ``culprit.evidence: "high"``, ``evidence.hosts.node1`` a list, a member
    ``straggler.hots``), as ``value_problem`` gives it; None when every field has its type. The wire
    decoder checks the top level only, so such a record reached the rules and failed their conditions
    silently (counted as false: a test expecting no alert passed)."""
    types = _step_types()
    for k, v in spec.items():
        if k in types and (bad := value_problem(["steps", k], types[k], v)) is not None:
            return bad
    return None


def _record(signal: str, spec: dict, t_ns: int) -> dict:
    if signal == "steps":
        return fields.step_record({**spec, "closed_at_ns": spec.get("closed_at_ns", t_ns)})
    if signal == "events":
        rec = fields.event_record_from_test({**spec, "ts_ns": spec.get("ts_ns", t_ns)})
        return rec
    return {
        **fields.health_record(
            spec.get("topic", ""),
            spec.get("group", ""),
            spec.get("lag_messages", 0),
            spec.get("idle_s", -1),
            spec.get("uptime_s", 0),
            t_ns,
        ),
        **spec,
        "time_ns": t_ns,
    }


def _check_case(pr: _Problems, i: int, t: dict, seen: dict[str, int]) -> None:
    """A test case has a name of its own (a non-empty string no other case of the file uses: results are
    reported by name) and at least one expectation (a case that expects nothing passes whatever the rules
    do). ``seen`` maps the names met so far to their lines and gains this one. Problems go to ``pr``."""
    for part, what in (("input", "records"), ("expect", "expectations")):
        if part in t and t[part] is not None and not isinstance(t[part], list):  # a mapping read as its keys
            pr.add(["tests", i, part], f"`{part}:` is a list of {what} (`- at: ...`), not {_what(t[part])}")
    name = t.get("name")
    if not isinstance(name, str) or not name.strip():
        where = ["tests", i] + (["name"] if "name" in t else [])
        got = f"not {_what(name)}" if "name" in t else "it has none"
        pr.add(where, f"a test needs a `name:` (a non-empty string); {got}")
    elif name in seen:
        pr.add(["tests", i, "name"], f"duplicate test name {name!r} (first used at line {seen[name]})")
    else:
        seen[name] = position(pr.doc, ["tests", i, "name"])[0]
    if not t.get("expect"):
        where = ["tests", i] + (["expect"] if "expect" in t else [])
        pr.add(
            where,
            f"test {name!r} expects nothing: it needs `expect:` with at least one `- at: ...` and its `alerts:`"
            " (`alerts: []` = none)",
        )


def _items(t: dict, part: str) -> list:
    """The records or expectations of a test case as a list (a malformed one, already reported: none)."""
    got = t.get(part)
    return got if isinstance(got, list) else []


#: a test event's integer field -> the schema field whose range it has (the batch's sequence is `seq`)
_EVENT_INT_SCHEMA = {k: ("seq" if k == "batch_seq" else k) for k in _EVENT_INTS}


def _event_range_problems(pr: _Problems, where: list, spec: dict) -> None:
    """Each integer field of a test event outside the range the event schema gives it (``duration_ns: -5``,
    ``gpu: -3``, ``step: -7``: production's decoder refuses such an event, so a test must not feed it to the
    rules) is a problem at the field's value, naming the field and its range (the schema's own check,
    ``schema.check_event_int``)."""
    for k, name in _EVENT_INT_SCHEMA.items():
        if k in spec:
            try:
                schema.check_event_int(name, spec[k], f"events.{k}")
            except schema.SchemaError as exc:
                pr.add(where + [k], f"{exc}: the event schema (obshub/core/schema.py) refuses such an event")


def _check_input(pr: _Problems, i: int, j: int, inp: Any) -> None:
    """One input record of test ``i``: `at:`, exactly one signal whose record production would take, a
    sane `repeat:`. Problems go to ``pr``."""
    where = ["tests", i, "input", j]
    if not pr.keys(where, inp, _INPUT_KEYS, "an input"):
        return
    sigs = [s for s in ("steps", "events", "health") if s in inp]
    if len(sigs) != 1 or "at" not in inp:
        pr.add(where, "an input needs `at:` and exactly one of steps, events, health")
    if len(sigs) == 1:
        sig = sigs[0]
        why = _input_problem(sig, inp[sig])
        nested = _step_problem(inp[sig]) if why is None and sig == "steps" else None
        if why is not None:
            pr.add(where + [sig], why)
        elif nested is not None:  # at the wrong value's own line (a key: the key's)
            pr.add(where + nested[0], nested[1], key=nested[2])
        elif sig == "events":
            _event_range_problems(pr, where + ["events"], inp["events"])
        if why is None and sig == "events" and str(inp["events"].get("kind", "")) not in fields.KIND_NAMES:
            at = where + ["events"] + (["kind"] if "kind" in inp["events"] else [])
            got = f"`kind: {inp['events']['kind']}` is not one" if "kind" in inp["events"] else "it has no `kind:`"
            known = sorted(fields.KIND_NAMES)
            near = difflib.get_close_matches(str(inp["events"].get("kind", "")), known, n=1)
            pr.add(
                at,
                f"an event needs a known `kind:`; {got}"
                + (f" (did you mean '{near[0]}'?)" if near else "")
                + f"; known kinds: {', '.join(known)}",
            )
    rep = inp.get("repeat", 1)
    if not (_is_int(rep) and 1 <= rep <= MAX_REPEAT):
        pr.add(where + ["repeat"], f"`repeat:` must be 1..{MAX_REPEAT}")


def _check_expect(pr: _Problems, i: int, j: int, exp: Any) -> None:
    """One expectation of test ``i``: `at:` and a list of `alerts:` of known states. Problems go to ``pr``."""
    where = ["tests", i, "expect", j]
    if not pr.keys(where, exp, _EXPECT_KEYS, "an expectation"):
        return
    if "alerts" not in exp:  # a missing list would pass as "no alerts": say so instead
        pr.add(where, "an expectation needs `alerts:` (a list; `alerts: []` = none)")
        return
    if not isinstance(exp["alerts"], list) and exp["alerts"] is not None:
        pr.add(where + ["alerts"], f"`alerts:` is a list of alerts (`- rule: ...`), not {_what(exp['alerts'])}")
        return
    for k, a in enumerate(exp.get("alerts") or []):
        at = where + ["alerts", k]
        if not pr.keys(at, a, _ALERT_KEYS, "an expected alert"):
            continue
        if a.get("state", "firing") not in _STATES:
            pr.add(
                at + ["state"],
                f"`state:` is pending or firing, not {a.get('state')!r} (a resolved alert is no longer listed)",
            )
        # a missing `rule:` or a `labels:` / `annotations:` that is no mapping was a KeyError / AttributeError
        # traceback when the expectation was compared; a `rule:` that is no id matched nothing, silently
        if "rule" not in a:
            pr.add(at, "an expected alert needs `rule:` (the id of the rule that fires it)")
        elif not isinstance(a["rule"], str) or not a["rule"].strip():
            pr.add(at + ["rule"], f"`rule:` is the id of a rule, not {_what(a['rule'])}")
        for part in ("labels", "annotations"):
            m = a.get(part)
            if m is not None and not isinstance(m, dict):
                pr.add(at + [part], f"`{part}:` is a mapping of name: value, not {_what(m)}")
                continue
            for name, v in (m or {}).items():
                if isinstance(v, (dict, list)) or v is None:  # compared as text: a list or map never matches
                    pr.add(at + [part, name], f"`{part}.{name}:` is a value (text or a number), not {_what(v)}")


def load_test_file(path: Path) -> tuple[list[Path], list[dict], str]:
    """Read and check a test file; returns (rule files, test cases as plain dicts, file name). Raises
    RuleTestError naming every problem of a malformed file, each at its file:line:col, in file order
    (a file that is not UTF-8 or not YAML: its first such problem, nothing after it can be read)."""
    file = str(path)
    text, problems = read_text(path)
    if text is None:
        hint = "check the path" if problems[0].line == 0 else "a test file is UTF-8 YAML"
        raise RuleTestError("\n".join(map(str, problems)), hint)
    doc, problems = load_yaml(text, file)
    problems = problems or (yaml11_surprises(doc, file) if doc is not None else [])
    if problems:
        raise RuleTestError("\n".join(map(str, problems)), "fix the test file")
    rule_keys = [k for k in ("rules", "overrides", "inhibit") if isinstance(doc, dict) and k in doc]
    if rule_keys and "rule_files" not in doc and "tests" not in doc:
        # a rule file given to `rules test` (walk24): say so, as `rules check` does for a test file
        line, col = position(doc, [rule_keys[0]], key=True)
        raise RuleTestError(
            str(
                Problem(
                    file,
                    line,
                    col,
                    f"this is a rule file (it has `{rule_keys[0]}:`), not a test file: check it with "
                    f"`obshub rules check {file}`, or give its tests",
                )
            ),
            f"a test file has `rule_files: [{path.name}]` and `tests:` (docs/RULES.md 'Testing a rule')",
        )
    pr = _Problems(file, doc)
    if not pr.keys([], doc, {"version", "rule_files", "tests"}, "a test file"):
        pr.raise_any()
    if doc.get("version") != 1:
        pr.add(["version"], "test files need `version: 1`")
    named = doc.get("rule_files")
    if named is not None and not isinstance(named, list):
        pr.add(["rule_files"], f"`rule_files:` is a list of rule files, not {_what(named)}")
        named = None
    elif not named:
        pr.add([], "`rule_files:` must name at least one rule file")
    paths = []
    for j, p in enumerate(named or []):
        if not isinstance(p, str) or not p:
            pr.add(["rule_files", j], f"a rule file is a path, not {_what(p)}")
        else:
            paths.append(p)
    # relative to the test file; the name `builtin` is the installed builtin pack (loader.resolve_builtin)
    rule_files = [
        resolve_builtin(p)
        if not (path.parent / p).exists() and resolve_builtin(p) != Path(p)
        else (path.parent / p).resolve()
        for p in paths
    ]
    tests = doc.get("tests")
    if tests is not None and not isinstance(tests, list):
        pr.add(["tests"], f"`tests:` is a list of tests, not {_what(tests)}")
        tests = None
    tests = tests or []
    seen: dict[str, int] = {}  # test name -> line of its first use
    for i, t in enumerate(tests):
        if not pr.keys(["tests", i], t, _TEST_KEYS, "a test"):
            continue
        _check_case(pr, i, t, seen)
        for j, inp in enumerate(_items(t, "input")):
            _check_input(pr, i, j, inp)
        for j, exp in enumerate(_items(t, "expect")):
            _check_expect(pr, i, j, exp)
        for part in ("input", "expect"):
            for j, node in enumerate(_items(t, part)):
                if not isinstance(node, dict):
                    continue
                for key in ("at", "every"):
                    if key not in node and (key == "every" or part == "input"):  # a missing input `at:`: above
                        continue
                    try:
                        parse_duration_ns(str(node.get(key)))
                    except ValueError as exc:  # reported at the bad value's own line
                        where = ["tests", i, part, j] + ([key] if key in node else [])
                        pr.add(where, f"`{key}:` {exc}")
    pr.raise_any()
    return rule_files, _plain(tests), file


SHOWN_ANNOTATION = 300
"""Characters of an annotation a failing test shows (an annotation may be 64 KiB: rules.templates)."""


def _shown(v: Any) -> str:
    if not isinstance(v, str) or len(v) <= SHOWN_ANNOTATION:
        return repr(v)
    return f"{v[:SHOWN_ANNOTATION]!r}... ({len(v):,} characters)"


def _fmt_alert(a: dict) -> str:
    labels = ", ".join(f"{k}={v}" for k, v in sorted(a.get("labels", {}).items()))
    ann = a.get("annotations") or {}
    extra = ("; " + ", ".join(f"{k}={_shown(v)}" for k, v in sorted(ann.items()))) if ann else ""
    return f"{a.get('rule')} [{a.get('state', 'firing')}] {{{labels}}}{extra}"


def _matches(exp: dict, got: dict) -> bool:
    if exp["rule"] != got["rule"] or exp.get("state", "firing") != got["state"]:
        return False
    if any(got["labels"].get(k) != str(v) for k, v in (exp.get("labels") or {}).items()):
        return False
    return all(got["annotations"].get(k) == str(v) for k, v in (exp.get("annotations") or {}).items())


def _compare(expected: list[dict], got: list[dict]) -> bool:
    remaining = list(got)
    for e in expected:
        for g in remaining:
            if _matches(e, g):
                remaining.remove(g)
                break
        else:
            return False
    return not remaining


def run_case(ruleset, case: dict, file: str) -> TestResult:
    """Run one test case against a fresh engine; returns its result."""
    res = TestResult(file, case.get("name", "(unnamed)"))
    engine = Engine(ruleset, notify=lambda _c: None)
    for rule in ruleset.rules.values():
        rule.condition.errors, rule.condition.last_error = 0, ""
    timeline: list[tuple[int, int, Any]] = []
    for inp in case.get("input") or []:
        start, every = parse_duration_ns(inp["at"]), parse_duration_ns(inp.get("every", "1s"))
        sig = next(s for s in ("steps", "events", "health") if s in inp)
        for n in range(int(inp.get("repeat", 1))):
            timeline.append((start + n * every, 0, (sig, inp[sig])))
    for exp in case.get("expect") or []:
        timeline.append((parse_duration_ns(exp["at"]), 1, exp))
    for at, order, item in sorted(timeline, key=lambda x: (x[0], x[1])):
        now = BASE_NS + at
        if order == 0:
            sig, spec = item
            engine.process(sig, _record(sig, spec, now))
            continue
        engine.tick(now)
        got = [
            {"rule": i.rule, "state": i.state, "labels": i.labels, "annotations": i.annotations}
            for i in engine.active()
        ]
        expected = item.get("alerts") or []
        if not _compare(expected, got):
            lines = [f"at {item['at']}:", "  expected:"]
            lines += [f"    {_fmt_alert(e)}" for e in expected] or ["    (no alerts)"]
            lines.append("  got:")
            lines += [f"    {_fmt_alert(g)}" for g in got] or ["    (no alerts)"]
            res.failures.append("\n".join(lines))
    if res.failures:  # an expected rule id that no rule file defines (a typo) can never match: say so
        for rid in sorted({e["rule"] for exp in case.get("expect") or [] for e in exp.get("alerts") or []}):
            if rid not in ruleset.rules:
                near = difflib.get_close_matches(rid, list(ruleset.rules), n=1)
                res.failures.append(
                    f"rule {rid}: no rule of this id in the test's rule_files"
                    + (f" (did you mean '{near[0]}'?)" if near else f" ({len(ruleset.rules)} rule(s) loaded)")
                )
    if res.failures:  # a condition that cannot be evaluated is the likeliest reason for "(no alerts)"
        for rid, rule in sorted(ruleset.rules.items()):
            if rule.condition.errors:
                res.failures.append(
                    f"rule {rid}: its condition failed to evaluate {rule.condition.errors} time(s), counted as"
                    f" false; last: {rule.condition.last_error}"
                )
    return res


def run_test_file(path: Path) -> list[TestResult]:
    """Run every case of one test file. Raises RuleTestError (malformed test file) or
    RuleValidationError (its rule files are invalid)."""
    rule_files, cases, file = load_test_file(path)
    ruleset = load_ruleset(rule_files)
    return [run_case(ruleset, c, file) for c in cases]


__all__ = ["run_test_file", "run_case", "TestResult", "BASE_NS"]
