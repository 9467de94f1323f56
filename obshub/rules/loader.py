"""Load rule files into a :class:`rules.model.RuleSet`, reporting every problem with file:line:column.

Order: files are read in the order given; a directory contributes its ``*.yaml``/``*.yml`` files sorted
by name (not its subdirectories, so ``builtin/tests/`` is not loaded as rules). Within the order, a later
file's list or macro of the same name replaces the earlier one; a rule id may be defined once, and later
files change it with ``overrides`` (append to its condition/labels/annotations/routes, or replace
severity, enabled, for, window, threshold, ...), as Falco does with ``override:``.

Checks beyond the JSON Schema: CEL syntax (at the position inside the expression), macro cycles, names
that are not documented fields of the signal (``rules.fields``), unknown event kinds, kinds on a
non-event signal, ``threshold.of`` missing for a non-count aggregate, correlation key names that differ,
annotation templates that do not compile or use unknown names, and settings that mean something else
than they say: a rule's own ``routes: []`` (every sink, not none), a ``window`` or correlation ``within``
of 0 (no match is kept or paired), a ``threshold.at_least`` that is not finite or that any match reaches (below 1 for ``count``, 0 or below
for ``cusum``), a ``condition`` that gives something other than true/false and a ``threshold.of`` that
gives a string, boolean, list or map on a record of the signal (:func:`sample_record`: every documented
field present, of the type the engine gives it), and a comparison of a field with a literal of another
type (``rules.expr.mismatched_comparisons``).
"""

from __future__ import annotations

import copy
import difflib
import math
import re
from pathlib import Path
from typing import Any

import jinja2
import jinja2.exceptions
import jinja2.meta
import jinja2.nodes
from ruamel.yaml.scalarstring import FoldedScalarString, LiteralScalarString

from obshub.rules import fields
from obshub.rules.durations import MAX_DURATION_NS, parse_duration_ns
from obshub.rules.errors import Problem, RuleValidationError
from obshub.rules.expr import (
    ARTICLE,
    Compiled,
    EvalError,
    ExprError,
    compile_expr,
    expand,
    line_col,
    mismatched_comparisons,
    tokens,
    unknown_references,
    value_type,
)
from obshub.rules.model import Correlation, InhibitRule, Rule, RuleSet
from obshub.rules.templates import (  # noqa: F401 - MAX_TEMPLATE_TEXT, template_env: where tests read them
    MAX_LOOP_DEPTH,
    MAX_TEMPLATE_TEXT,
    loop_depth,
    static_problems,
    template_env,
)
from obshub.rules.typecheck import Checker, T, signal_types
from obshub.rules.window import MAX_HITS_PER_GROUP
from obshub.rules.yamlfile import plain_value, position, read_rule_file

TEMPLATE_NAMES = {"record", "labels", "value", "count", "other", "rule", "severity", "hits"}


_ENV = template_env()


_MEASURE_NAMES = {
    "value",
    "step",
    "trace_key",
    "op_seq",
    "tk_step16",
    "ts_ns",
    "time_ns",
    "count",
    "score",
    "stall_ratio",
    "batch_seq",
    "lag_messages",
    "idle_s",
    "uptime_s",
}


def measurement_names(expr: str) -> list[str]:
    """Names in ``expr`` (identifiers and member names) that are measurements or per-step values, which
    must not become labels (alert identity): durations (``*_ns``, ``*_us``, ``*_ms``), values, steps."""
    names = [t for k, t, _ in tokens(expr) if k == "ident"]
    return [n for n in names if n in _MEASURE_NAMES or n.endswith(("_ns", "_us", "_ms"))]


#: The builtin rule pack, installed with the package (obshub/rules/builtin).
BUILTIN_DIR = Path(__file__).with_name("builtin")
#: The name that means the builtin pack on the command line and in a test file's ``rule_files``, wherever
#: obshub is installed (``obshub rules check builtin team.yaml``); a file or folder of that name wins.
BUILTIN_NAME = "builtin"


#: Opt-in packs installed with the package (obshub/rules/packs/NAME.yaml), named by NAME like ``builtin``.
PACKS_DIR = Path(__file__).with_name("packs")


def resolve_builtin(p: Path | str) -> Path:
    """``p``, or :data:`BUILTIN_DIR` when ``p`` is the bare name ``builtin``, or the opt-in pack
    ``packs/NAME.yaml`` when ``p`` is a bare ``NAME`` of one, and no such path exists."""
    p = Path(p)
    if p.exists() or p.parent != Path("."):
        return p
    if str(p) == BUILTIN_NAME:
        return BUILTIN_DIR
    pack = PACKS_DIR / f"{p}.yaml"
    return pack if pack.is_file() else p


def expand_paths(paths: list[Path | str]) -> list[Path]:
    """Rule files named by ``paths`` in load order (directories: their *.yaml/*.yml sorted by name); the
    name ``builtin`` is the builtin pack (:func:`resolve_builtin`)."""
    out: list[Path] = []
    for p in map(resolve_builtin, paths):
        if p.is_dir():
            out.extend(sorted(q for q in p.iterdir() if q.suffix in (".yaml", ".yml") and q.is_file()))
        else:
            out.append(p)
    return out


def _is_test_file(p: Path) -> bool:
    return p.name.endswith(("_test.yaml", "_test.yml"))


def unread_paths(paths: list[Path | str]) -> list[str]:
    """What the folders among ``paths`` hold that looks like rules but :func:`expand_paths` does not read,
    each as ``"<path>: <why and what to do>"``: a file named ``.YAML``/``.Yml`` (the suffix is matched in
    lower case only), and a subfolder holding ``*.yaml``/``*.yml`` files other than rule tests
    (``*_test.yaml``, which ``rules test`` reads: the builtin pack's ``tests/``). Their rules would never
    run and ``rules check`` said OK; the CLI notes them and ``rules serve`` logs them."""
    out: list[str] = []
    for p in map(resolve_builtin, paths):
        if not p.is_dir():
            continue
        try:
            entries = sorted(p.iterdir())
        except OSError:
            continue  # the folder's own problem is the loader's to report
        for q in entries:
            if q.name.startswith("."):
                continue
            if q.is_file() and q.suffix.lower() in (".yaml", ".yml") and q.suffix not in (".yaml", ".yml"):
                out.append(f"{q}: not read: a folder's rule files end in .yaml or .yml (lower case); rename it")
            elif q.is_dir():
                try:
                    found = [f for f in q.rglob("*") if f.suffix.lower() in (".yaml", ".yml") and not _is_test_file(f)]
                except OSError:
                    continue
                if found:
                    out.append(
                        f"{q}: not read: a subfolder ({len(found)} YAML file(s)); a folder contributes only its own "
                        f"*.yaml / *.yml files: give {q} as a rule path too"
                    )
    return out


class _Ctx:
    """Accumulates definitions across files and the problems found."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.lists: dict[str, list] = {}
        self.macros: dict[str, str] = {}
        self.macro_at: dict[str, tuple[str, int, int]] = {}
        self.macro_doc: dict[str, Any] = {}
        self.raw_rules: dict[str, dict] = {}  # id -> {"spec", "file", "doc", "path", "line"}
        self.inhibit: list[InhibitRule] = []
        self.empty: list[str] = []  # files that say they hold no rules (`rules: []` and nothing else)

    def add(self, file: str, line: int, col: int, msg: str, rule: str | None = None) -> None:
        self.problems.append(Problem(file, line, col, msg, rule))


def _expr_pos(doc: Any, path: list, err: ExprError, file: str = "") -> tuple[int, int]:
    """1-based position in the file of ``err``'s (line, col) inside the expression at ``path``.

    YAML changes an expression's text on its way from the file: a block scalar (``|``, ``>``) loses its
    indentation, ``>`` and a plain or quoted scalar over several lines are folded (a line break becomes a
    space), a quoted scalar loses its quotes and escapes. So the word at the point (up to 12 characters,
    to the first blank) is looked up in the file: if it occurs k times in the text before the point, the
    position is its (k+1)-th occurrence from the value's start. When the file cannot be read or the
    word is not found, the position is computed as for a scalar on one line."""
    line, col = position(doc, path)
    node = doc
    try:
        for step in path:
            node = node[step]
    except (KeyError, IndexError, TypeError):
        node = None
    text = str(node) if isinstance(node, str) else ""
    lines = text.split("\n")
    at = _offset(text, err.line, err.col)
    word = re.match(r"\S{0,12}", text[at:]).group() if text and at < len(text) else ""
    if word and file:
        try:
            src = Path(file).read_text().splitlines()
        except (OSError, UnicodeDecodeError):
            src = []
        k = text.count(word, 0, at)
        for i in range(max(line - 1, 0), min(len(src), line + len(lines) + 200)):
            start = col - 1 if i == line - 1 else 0
            j = src[i].find(word, start)
            while j >= 0:
                if k == 0:
                    return i + 1, j + 1
                k -= 1
                j = src[i].find(word, j + len(word))
    if isinstance(node, (LiteralScalarString, FoldedScalarString)):
        return line + max(err.line, 1), max(err.col, 1)
    quote = 1 if type(node).__name__.endswith("QuotedScalarString") else 0
    return line + max(err.line - 1, 0), col + quote + max(err.col - 1, 0)


_ENGINE_LABELS = {"alertname": "the rule id", "severity": "the rule's `severity:`"}


def _check_label_names(ctx: "_Ctx", raw: dict, spec: dict, rid: str) -> None:
    """Refuse the label names the engine sets, ``alertname`` and ``severity``, in ``labels`` or
    ``group_by``: they replaced the rule id and severity (`obshub alerts --rule`, silences, routes and
    inhibitions by alertname no longer found the alert, two rules with one alertname shared one alert's
    fingerprint, a severity label said otherwise than the alert's severity). A name in both ``labels``
    and ``group_by`` stays allowed: the group-by value is the label's."""
    for key in ("group_by", "labels"):
        names = spec.get(key) or {}
        if not isinstance(names, dict):
            continue
        for name in names:
            if name in _ENGINE_LABELS:
                ctx.add(
                    *_name_at(raw, key, name),
                    f"{key}/{name}: the engine sets label '{name}' to {_ENGINE_LABELS[name]}; a rule cannot "
                    "set it (alerts, silences, routes and inhibitions find a rule's alerts by it)"
                    + ("; set `severity:` instead" if name == "severity" else "; name the label otherwise"),
                    rid,
                )


def _at(raw: dict, key: str) -> tuple[str, Any, list]:
    """``(file, doc, path)`` where the rule's top-level ``key`` was last written: an override's
    ``replace`` or the rule itself."""
    return raw["at"].get(key) or (raw["file"], raw["doc"], raw["path"] + [key])


def _name_at(raw: dict, key: str, name: str) -> tuple[str, int, int]:
    """``(file, line, col)`` of entry ``name`` of the rule's mapping ``key`` (``labels``,
    ``annotations``): in the override whose ``append`` added it last, else where ``key`` was written (an
    appended label was reported at the builtin rule's ``labels:``, in a file the user never wrote)."""
    hit = raw["names_at"].get((key, name))
    if hit is not None:
        file, doc, path = hit
        return file, *position(doc, path)
    file, doc, path = _at(raw, key)
    return file, *position(doc, path + [name])


def _route_at(raw: dict, name: str) -> tuple[str, int, int]:
    """``(file, line, col)`` where route ``name`` of the rule was written by an override: its item in the
    ``append`` that added it first, or in the ``replace`` that gave the routes; a route of the rule's own
    ``routes:`` is at the rule (its ``id``'s line, column 1, as ``rules serve`` has always said)."""
    hit = raw["names_at"].get(("routes", name))
    if hit is not None:
        file, doc, path = hit
        return file, *position(doc, path)
    if "routes" not in raw["at"]:
        return raw["file"], raw["line"], 1
    file, doc, path = raw["at"]["routes"]
    try:
        return file, *position(doc, path + [list(raw["spec"]["routes"]).index(name)])
    except (KeyError, TypeError, ValueError):
        return file, *position(doc, path)


def _cond_where(raw: dict, text: str, off: int) -> tuple[str, int, int]:
    """``(file, line, col)`` of offset ``off`` of the rule's (possibly appended-to) condition ``text``:
    in the part of the file (the rule, or an override's ``append``) that holds it."""
    start, file, doc, path, node_start = next(p for p in reversed(raw["cond_parts"]) if p[0] <= off)
    node = doc
    for step in path:
        node = node[step]
    node_text = str(node)
    return (file, *_expr_pos(doc, path, ExprError("", *line_col(node_text, off - start + node_start)), file))


def _offset(text: str, line: int, col: int) -> int:
    """Offset in ``text`` of 1-based (line, col)."""
    lines = text.split("\n")
    return sum(len(x) + 1 for x in lines[: max(line, 1) - 1]) + max(col, 1) - 1


#: the top-level keys that give a rule file content (a file of macros or lists only is a library)
_CONTENT_KEYS = ("rules", "macros", "lists", "overrides", "inhibit")
#: what a file without any says: an SRE who loads a pack of no rules has almost always named the wrong file
#: or a truncated copy, and an engine that serves it watches nothing while it looks healthy
_NO_RULES_HINT = (
    "a rule file without rules is almost always a mistake (a wrong or truncated file); if it is meant, "
    "say so with `rules: []` under `version: 1`"
)


def _read_files(ctx: _Ctx, files: list[Path]) -> None:
    for path in files:
        doc, problems = read_rule_file(path)
        ctx.problems.extend(problems)
        file = str(path)
        if doc is None and not problems:
            ctx.add(file, 0, 0, f"no rules: the file is empty (only blanks or comments); {_NO_RULES_HINT}")
        if doc is None or problems:
            continue
        if not any(k in doc for k in _CONTENT_KEYS):
            ctx.add(file, 0, 0, f"no rules: the file holds only `version:`; {_NO_RULES_HINT}")
            continue
        if not doc.get("rules") and "rules" in doc and not any(doc.get(k) for k in _CONTENT_KEYS):
            ctx.empty.append(file)  # `rules: []`: no rules, as written
        for name, items in (doc.get("lists") or {}).items():
            ctx.lists[str(name)] = [i if isinstance(i, (int, float)) else str(i) for i in items]
        for name, cond in (doc.get("macros") or {}).items():
            ctx.macros[str(name)] = str(cond)
            ctx.macro_at[str(name)] = (file, *position(doc, ["macros", name]))
            ctx.macro_doc[str(name)] = doc
        for i, spec in enumerate(doc.get("rules") or []):
            rid = str(spec["id"])
            line, col = position(doc, ["rules", i, "id"])
            if rid in ctx.raw_rules:
                prev = ctx.raw_rules[rid]
                ctx.add(
                    file,
                    line,
                    col,
                    f"rule id already defined at {prev['file']}:{prev['line']}; "
                    "change it with `overrides:` instead of redefining it",
                    rid,
                )
                continue
            ctx.raw_rules[rid] = {
                "spec": _plain(spec),
                "file": file,
                "doc": doc,
                "path": ["rules", i],
                "line": line,
                "cond_at": (file, doc, ["rules", i, "condition"]),
                # where each part of the condition was written: (offset in the whole condition, file, doc,
                # path, offset in the node's text); an override's `append` adds a part
                "cond_parts": [(0, file, doc, ["rules", i, "condition"], 0)],
                "at": {},  # key -> (file, doc, path) for keys an override replaced
                "names_at": {},  # (key, name) -> (file, doc, path) for labels/annotations an override appended
            }
        for i, ov in enumerate(doc.get("overrides") or []):
            _apply_override(ctx, file, doc, i, _plain(ov))
        for inh in doc.get("inhibit") or []:
            ctx.inhibit.append(
                InhibitRule(
                    {str(k): str(v) for k, v in inh["source"].items()},
                    {str(k): str(v) for k, v in inh["target"].items()},
                    [str(e) for e in inh["equal"]],
                )
            )


_plain = plain_value  # ruamel containers/scalars -> plain python (the loader's and the tests' name)


def _apply_override(ctx: _Ctx, file: str, doc: Any, i: int, ov: dict) -> None:
    rid = ov["rule"]
    line, col = position(doc, ["overrides", i, "rule"])
    target = ctx.raw_rules.get(rid)
    if target is None:
        near = difflib.get_close_matches(str(rid), sorted(ctx.raw_rules), n=1)
        hint = f"; did you mean '{near[0]}'?" if near else ""
        ctx.add(
            file,
            line,
            col,
            f"override of a rule that no earlier file defines (check the file order and the id){hint}",
            rid,
        )
        return
    spec = copy.deepcopy(target["spec"])
    app = ov.get("append") or {}
    if "condition" in app:
        head, tail = spec["condition"].rstrip(), app["condition"]
        spec["condition"] = f"{head} {tail.strip()}"
        where = ["overrides", i, "append", "condition"]
        target["cond_at"] = (file, doc, where)
        target["cond_parts"] = target["cond_parts"] + [
            (len(head) + 1, file, doc, where, len(tail) - len(tail.lstrip()))
        ]
    for key in ("labels", "annotations"):
        if key in app:
            spec[key] = {**spec.get(key, {}), **app[key]}
            target["names_at"] = {
                **target["names_at"],
                **{(key, name): (file, doc, ["overrides", i, "append", key, name]) for name in app[key]},
            }
    for key in ("routes", "tags"):
        if key in app:
            spec[key] = list(spec.get(key, [])) + list(app[key])
    for j, name in enumerate(app.get("routes") or []):
        if ("routes", name) not in target["names_at"]:
            target["names_at"] = {
                **target["names_at"],
                ("routes", name): (file, doc, ["overrides", i, "append", "routes", j]),
            }
    for key, val in (ov.get("replace") or {}).items():
        spec[key] = val
        target["at"] = {**target["at"], key: (file, doc, ["overrides", i, "replace", key])}
        if key == "routes":  # the routes appended before are gone; the replacement's are at its own key
            target["names_at"] = {k: v for k, v in target["names_at"].items() if k[0] != "routes"}
        if key == "condition":
            target["cond_at"] = (file, doc, ["overrides", i, "replace", "condition"])
            target["cond_parts"] = [(0, file, doc, ["overrides", i, "replace", "condition"], 0)]
    target["spec"] = spec


def _check_macros(ctx: _Ctx) -> None:
    for name, cond in ctx.macros.items():
        file, line, col = ctx.macro_at[name]
        try:
            compile_expr(cond)
            expand(name, ctx.macros, ctx.lists)
        except ExprError as err:
            ctx.add(file, line, col + max(err.col - 1, 0), f"macro '{name}': {err}")


def _compile(
    ctx: _Ctx,
    raw: dict,
    key: str,
    text: str,
    allowed: set[str],
    nested: dict,
    payload: set[str] | None,
    extra: set[str] = frozenset(),
    record: dict[str, Any] | None = None,
    types: "dict[str, T] | None" = None,
    want: str = "any",
) -> Compiled | None:
    """Compile one expression of a rule; on error record a problem at its position and return None.
    With ``record`` (:func:`sample_record` of the expression's signal) a comparison of a field with a
    literal of another type (``rules.expr.mismatched_comparisons``) is a problem too. With ``types``
    (the field types of the signal, ``rules.typecheck.signal_types``, plus ``item``) the expression is
    type-checked (``rules.typecheck``): ``want`` ``bool`` (a condition), ``number`` (``threshold.of``) or
    ``any``; a type problem inside a macro is reported at the macro."""
    rid = raw["spec"]["id"]
    top, *rest = key.split("/")
    if key == "condition":
        file, doc, path = raw["cond_at"]
    else:
        file, doc, base = _at(raw, top)
        path = base + rest

    def where(off: int) -> tuple[str, int, int]:
        if key == "condition":
            return _cond_where(raw, text, off)
        return (file, *_expr_pos(doc, path, ExprError("", *line_col(text, off)), file))

    try:
        compile_expr(text)  # syntax first, on the text as written, for exact positions
    except ExprError as err:
        ctx.add(*where(_offset(text, err.line, err.col)), f"{key}: {err}", rid)
        return None
    names = set(ctx.macros) | set(ctx.lists) | set(extra)
    found = unknown_references(text, allowed, names, nested, payload)
    if record is not None and not found:
        found = mismatched_comparisons(text, record)
    for msg, off in found:
        ctx.add(*where(off), f"{key}: {msg}", rid)
    try:
        source = expand(text, ctx.macros, ctx.lists)
        seen = {m for m, _ in found}
        later = unknown_references(source, allowed, set(extra), nested, payload)
        if record is not None and not later:
            later = mismatched_comparisons(source, record)
        for msg, _ in later:
            if msg not in seen:  # a macro uses a field this rule's signal does not have, or mistypes one
                ctx.add(file, *position(doc, path), f"{key} (in a macro it uses): {msg}", rid)
        if types is not None and not found and not later and _type_problems(ctx, raw, key, text, types, want, where):
            return None
        return Compiled(source, compile_expr(source))
    except ExprError as err:
        ctx.add(file, *position(doc, path), f"{key}: {err}", rid)
        return None


def _type_problems(ctx: _Ctx, raw: dict, key: str, text: str, types: "dict[str, T]", want: str, where) -> bool:
    """Type-check ``text`` (``rules.typecheck``), recording each problem at its position (in the rule, or
    in the macro that holds it); True when there was one."""
    rid = raw["spec"]["id"]
    sig = raw["spec"]["signal"] if not key.startswith("correlate/") else raw["spec"]["correlate"]["signal"]
    aggregate = str((raw["spec"].get("threshold") or {}).get("aggregate", ""))
    typed = Checker(types, ctx.macros, ctx.lists).check(text, want, _record_of(sig), aggregate)
    for tp in typed:
        if tp.whole:
            file, doc, path = raw["cond_at"] if key == "condition" else _key_at(raw, key)
            ctx.add(file, *position(doc, path), f"{key}: {tp.message}", rid)
        elif tp.macro is None:
            ctx.add(*where(tp.offset), f"{key}: {tp.message}", rid)
        else:
            at = _macro_pos(ctx, tp.macro, tp.offset)
            ctx.add(*at, f"{key} (in macro '{tp.macro}', on {_record_of(sig)}): {tp.message}", rid)
    return bool(typed)


def _key_at(raw: dict, key: str) -> tuple[str, Any, list]:
    """``(file, doc, path)`` of the rule's expression ``key`` (``threshold/of``, ``correlate/condition``)."""
    top, *rest = key.split("/")
    file, doc, base = _at(raw, top)
    return file, doc, base + rest


def _macro_pos(ctx: _Ctx, name: str, off: int) -> tuple[str, int, int]:
    """``(file, line, col)`` of offset ``off`` inside the text of macro ``name``."""
    file, _line, _col = ctx.macro_at[name]
    doc = ctx.macro_doc[name]
    text = ctx.macros[name]
    return (file, *_expr_pos(doc, ["macros", name], ExprError("", *line_col(text, off)), file))


def _kinds(ctx: _Ctx, raw: dict, signal: str, kinds: list[str] | None, where: str) -> frozenset[str]:
    rid = raw["spec"]["id"]
    line, col = position(raw["doc"], raw["path"] + where.split("/")[:-1] + ["signal"])
    if signal == "events" and not kinds:
        ctx.add(raw["file"], line, col, f"{where}: signal 'events' needs `kinds:` (one or more of schema.Kind)", rid)
    if signal != "events" and kinds:
        ctx.add(raw["file"], line, col, f"{where}: `kinds:` only applies to signal 'events'", rid)
    for k in kinds or []:
        if k not in fields.KIND_NAMES:
            ctx.add(
                raw["file"],
                *position(raw["doc"], raw["path"] + where.split("/")),
                f"unknown event kind '{k}' (known: {', '.join(sorted(fields.KIND_NAMES))})",
                rid,
            )
    return frozenset(kinds or [])


def _build_rule(ctx: _Ctx, raw: dict) -> Rule | None:
    spec, file, doc, path = raw["spec"], raw["file"], raw["doc"], raw["path"]
    rid, signal = spec["id"], spec["signal"]
    n_before = len(ctx.problems)
    kinds = _kinds(ctx, raw, signal, spec.get("kinds"), "kinds")
    allowed = set(fields.SIGNAL_VARS[signal])
    nested = fields.NESTED_VARS if signal == "steps" else {}
    payload = fields.payload_keys(sorted(kinds)) if signal == "events" else None
    extra = {"item"} if spec.get("foreach") else set()
    record = sample_record(signal, kinds)
    types = signal_types(signal, kinds)
    foreach = None
    if spec.get("foreach"):
        foreach = _compile(ctx, raw, "foreach", spec["foreach"], allowed, nested, payload, types=types)
        types = {**types, "item": item_type(types, ctx.macros, ctx.lists, spec["foreach"])}
    cond = _compile(ctx, raw, "condition", spec["condition"], allowed, nested, payload, extra, record, types, "bool")
    if spec.get("routes") == [] and "routes" not in raw["at"]:  # the rule's own `routes: []` (an override's
        # `replace: {routes: []}` resets the routes an earlier file gave, on purpose)
        ctx.add(
            file,
            *position(doc, path + ["routes"]),
            "routes: [] sends this rule's alerts to every sink, as no `routes:` does (it does not mean none); "
            "name the sinks, leave it out, or `enabled: false` for no alerts",
            rid,
        )
    group_by = {}
    for label, text in (spec.get("group_by") or {}).items():
        group_by[label] = _compile(ctx, raw, f"group_by/{label}", text, allowed, nested, payload, extra, types=types)
        measured = measurement_names(text)
        if measured:
            ctx.add(
                file,
                *position(doc, path + ["group_by", label]),
                f"group_by/{label}: '{measured[0]}' is a measurement, not an identity: as a label it would "
                "make a new alert for every value; group by host/job/device and show it in annotations",
                rid,
            )
    _check_label_names(ctx, raw, spec, rid)
    thr = spec.get("threshold") or {}
    aggregate, at_least = thr.get("aggregate", "count"), float(thr.get("at_least", 1))
    _check_threshold(ctx, raw, aggregate, at_least)
    of = None
    if aggregate != "count":
        if not thr.get("of"):
            t_file, t_doc, t_path = _at(raw, "threshold")
            ctx.add(
                t_file,
                *position(t_doc, t_path),
                f"threshold: aggregate '{aggregate}' needs `of:` (the expression to aggregate, e.g. duration_ns)",
                rid,
            )
        else:
            of = _compile(
                ctx, raw, "threshold/of", thr["of"], allowed, nested, payload, extra, types=types, want="number"
            )
    corr = None
    if spec.get("correlate"):
        corr = _build_correlation(ctx, raw, allowed, nested, payload, extra, types)
    annotations, sources = {}, {}
    names = allowed | TEMPLATE_NAMES | extra
    for name, text in (spec.get("annotations") or {}).items():
        try:
            ast = _ENV.parse(text)
            depth = loop_depth(ast)
            if depth > MAX_LOOP_DEPTH:
                ctx.add(
                    *_name_at(raw, "annotations", name),
                    f"annotations/{name}: {{% for %}} loops nested {depth} deep (at most {MAX_LOOP_DEPTH}: nested "
                    "loops multiply into minutes of rendering per alert change); use one loop with a filter "
                    "(`selectattr`, `join`)",
                    rid,
                )
            for why in static_problems(ast):
                ctx.add(file, *position(doc, path + ["annotations", name]), f"annotations/{name}: {why}", rid)
            unknown = sorted(jinja2.meta.find_undeclared_variables(ast) - names)
            if unknown:
                ctx.add(
                    *_name_at(raw, "annotations", name),
                    f"annotations/{name}: unknown name(s) {', '.join(unknown)} in template",
                    rid,
                )
            annotations[name], sources[name] = _ENV.from_string(text), text
        except jinja2.TemplateSyntaxError as exc:
            ctx.add(
                *_name_at(raw, "annotations", name),
                f"annotations/{name}: template syntax error on its line {exc.lineno}: {exc.message}",
                rid,
            )
    if len(ctx.problems) == n_before:
        _check_results(ctx, raw, cond, of if aggregate != "count" else None, record)
    window_steps = _check_step_options(ctx, raw)
    _check_durations(ctx, raw)
    renotify = spec.get("renotify") or {}
    if len(ctx.problems) > n_before:
        return None
    return Rule(
        id=rid,
        description=spec["description"],
        severity=spec["severity"],
        signal=signal,
        kinds=kinds,
        condition=cond,
        group_by=group_by,
        window_ns=0 if window_steps else parse_duration_ns(spec.get("window", "1m")),
        aggregate=aggregate,
        of=of,
        at_least=at_least,
        for_ns=parse_duration_ns(spec.get("for", "0s")),
        keep_firing_for_ns=parse_duration_ns(spec.get("keep_firing_for", "0s")),
        labels={str(k): str(v) for k, v in (spec.get("labels") or {}).items()},
        annotations=annotations,
        annotation_sources=sources,
        foreach=foreach,
        correlate=corr,
        runbook=spec.get("runbook", ""),
        routes=list(spec.get("routes", [])),
        tags=list(spec.get("tags", [])),
        enabled=spec.get("enabled", True),
        file=file,
        line=raw["line"],
        routes_at={name: _route_at(raw, name) for name in spec.get("routes", [])},
        window_steps=window_steps,
        interim=bool(spec.get("interim", False)),
        warmup_steps=int(spec.get("warmup_steps", 0)),
        renotify_limit=int(renotify.get("limit", 0)),
        renotify_after_ns=parse_duration_ns(renotify.get("after", "0s")),
    )


_STEPS = re.compile(r"^([1-9][0-9]*) steps?$")


def window_steps_of(window: Any) -> int:
    """N for a ``window`` of ``N steps`` (or ``1 step``), 0 for a time window."""
    m = _STEPS.match(str(window)) if window is not None else None
    return int(m.group(1)) if m else 0


#: the durations of a rule, each at most ``MAX_DURATION_NS``
_DURATION_KEYS = (
    ("window", None),
    ("for", None),
    ("keep_firing_for", None),
    ("renotify", "after"),
    ("correlate", "within"),
)


def _check_durations(ctx: _Ctx, raw: dict) -> None:
    """A duration of the rule longer than ``MAX_DURATION_NS`` is a problem at its file:line:col."""
    spec, rid = raw["spec"], raw["spec"]["id"]
    for key, sub in _DURATION_KEYS:
        text = spec.get(key) if sub is None else (spec.get(key) or {}).get(sub)
        if not isinstance(text, str) or window_steps_of(text):
            continue
        try:
            ns = parse_duration_ns(text)
        except ValueError:
            continue  # reported by the structure check
        if ns > MAX_DURATION_NS:
            file, doc, path = _at(raw, key)
            name = f"{key}/{sub}" if sub else key
            ctx.add(
                file,
                *position(doc, path + ([sub] if sub else [])),
                f"{name}: {text} is longer than 3650d (10 years), the longest a rule may give "
                "(the engine's clock counts ns in 64 bits)",
                rid,
            )


def _check_step_options(ctx: _Ctx, raw: dict) -> int:
    """Check the options that only some signals have (a window in steps: steps and events; ``interim``
    and ``warmup_steps``: steps) and a correlation with a window in steps; return the window's steps
    (0 for a time window)."""
    spec, rid = raw["spec"], raw["spec"]["id"]
    steps = window_steps_of(spec.get("window"))
    if steps and spec["signal"] == "health":
        file, doc, path = _at(raw, "window")
        ctx.add(file, *position(doc, path), "window: health records have no step: give a time (e.g. 5m)", rid)
    if steps and spec.get("correlate"):
        file, doc, path = _at(raw, "window")
        ctx.add(file, *position(doc, path), "window: a correlated rule needs a time window (e.g. 5m)", rid)
    for key in ("interim", "warmup_steps"):
        if key in spec and spec["signal"] != "steps":
            file, doc, path = _at(raw, key)
            ctx.add(file, *position(doc, path, key=True), f"{key}: only applies to signal 'steps'", rid)
    return steps


def item_type(types: "dict[str, T]", macros: dict[str, str], lists: dict[str, list], foreach: str) -> T:
    """The type of ``item`` in a rule with ``foreach``: the element of the list (or the key of the map)
    that ``foreach`` gives; ``dyn`` when that cannot be told."""
    t = Checker(types, macros, lists).type_of(foreach)
    if t.kind == "list" and t.elem is not None:
        return t.elem
    if t.kind == "map" and t.key is not None:
        return t.key
    if t.kind == "record":
        return T("string")
    return T("dyn")


def sample_record(signal: str, kinds: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A record of ``signal`` as the engine gives it to a rule: every documented field present, of its run
    time type, with neutral values (steps: ``fields.step_record({})``; events: an event of the first of
    ``kinds``; health: a measurement with no lag). Used to find, before a rule runs, a condition that gives
    something other than true/false and a ``threshold.of`` that gives no number."""
    if signal == "steps":
        return fields.step_record({})
    if signal == "events":
        known = sorted(k for k in kinds if k in fields.KIND_NAMES)
        return fields.event_record_from_test({"kind": known[0] if known else "STEP_BEGIN"})
    return fields.health_record("topic", "group", 0, 0.0, 0.0, 0)


def _cel_type(value: Any) -> str:
    """CEL's name for the type of an evaluation result with its article: ``a bool``, ``an int``, ``a
    double``, ``a string``, ``a list``, ``a map``, ``null``."""
    t = value_type(value)
    return "null" if value is None else ARTICLE.get(t, t) if t else f"a {type(value).__name__}"


def _record_of(signal: str) -> str:
    return f"{'an' if signal == 'events' else 'a'} {signal} record"


def _check_threshold(ctx: _Ctx, raw: dict, aggregate: str, at_least: float) -> None:
    """A window of 0 (the rule never fires) and an ``at_least`` that is not finite or that any match
    reaches are problems."""
    spec, rid = raw["spec"], raw["spec"]["id"]
    window = spec.get("window", "1m")
    if not window_steps_of(window) and parse_duration_ns(window) == 0:
        w_file, w_doc, w_path = _at(raw, "window")
        ctx.add(
            w_file,
            *position(w_doc, w_path),
            f"window: {window} keeps no match: a rule counts the matches of the last `window` (e.g. 30s, 1m)",
            rid,
        )
    file, doc, path = _at(raw, "threshold")
    where = position(doc, path + ["at_least"])
    if not math.isfinite(at_least):
        effect = "any match reaches it" if at_least < 0 else "no aggregate reaches it: the rule never fires"
        ctx.add(file, *where, f"threshold/at_least: {at_least} is not a finite number ({effect})", rid)
    elif aggregate in ("count", "incidents") and at_least < 1:
        ctx.add(
            file,
            *where,
            f"threshold/at_least: {at_least:g} is below 1: a group exists only once it has a match, so this "
            "is at_least: 1 (the default, any match); a rule cannot fire on the absence of matches (for "
            "silence, use a `health` rule on idle_s or lag_messages)",
            rid,
        )
    elif aggregate in ("count", "incidents") and at_least > MAX_HITS_PER_GROUP:
        ctx.add(
            file,
            *where,
            f"threshold/at_least: {at_least:g} is above {MAX_HITS_PER_GROUP:,}, the most matches a group keeps in "
            "its window, so the rule never fires (count fewer matches, or group them less finely)",
            rid,
        )
    elif aggregate == "cusum" and at_least <= 0:
        ctx.add(
            file,
            *where,
            f"threshold/at_least: {at_least:g} is not above 0: a CUSUM is never below 0, so any match "
            "reaches it (for that, use aggregate: count)",
            rid,
        )


def _result(expr: Compiled, record: dict) -> tuple[bool, Any]:
    """``(evaluated, value)`` of ``expr`` on ``record``; ``(False, None)`` when the evaluation fails."""
    try:
        return True, expr.eval(record)
    except EvalError:
        return False, None


def _check_condition(
    ctx: _Ctx, rid: str, where: tuple, key: str, cond: Compiled | None, signal: str, record: dict
) -> None:
    """A condition that gives a number, string, list, map or null on ``record`` (:func:`sample_record`)
    matches nothing: a rule matches where it is ``true``. ``where``: (file, doc, path) of the condition.
    An evaluation that fails on the sample (a null member, a missing key) is not judged."""
    done, got = _result(cond, record) if cond is not None else (False, None)
    if done and not isinstance(got, bool):
        file, doc, path = where
        ctx.add(
            file,
            *position(doc, path),
            f"{key}: gives {_cel_type(got)}, not true or false, on {_record_of(signal)}: a rule "
            "matches only where its condition is true (compare the value, e.g. `duration_us > 20.0`)",
            rid,
        )


def _check_results(ctx: _Ctx, raw: dict, cond: Compiled | None, of: Compiled | None, record: dict) -> None:
    """Evaluate the condition and ``threshold.of`` on ``record`` (:func:`sample_record`): see
    :func:`_check_condition`; an ``of`` that gives anything but a number (a string, boolean, list, map,
    duration or timestamp) has no aggregate. Rules with ``foreach`` are not judged (their expressions
    read ``item``)."""
    spec, rid = raw["spec"], raw["spec"]["id"]
    if spec.get("foreach"):
        return
    _check_condition(ctx, rid, raw["cond_at"], "condition", cond, spec["signal"], record)
    done, got = _result(of, record) if of is not None else (False, None)
    if done and got is not None and (isinstance(got, bool) or not isinstance(got, (int, float))):
        file, doc, path = _at(raw, "threshold")
        ctx.add(
            file,
            *position(doc, path + ["of"]),
            f"threshold/of: gives {_cel_type(got)} on {_record_of(spec['signal'])}; aggregate "
            f"'{(spec.get('threshold') or {}).get('aggregate')}' needs a number (an int or a double)",
            rid,
        )


def _build_correlation(
    ctx: _Ctx,
    raw: dict,
    allowed: set[str],
    nested: dict,
    payload: set[str] | None,
    extra: set[str],
    types: "dict[str, T]",
) -> Correlation | None:
    spec, rid = raw["spec"]["correlate"], raw["spec"]["id"]
    osig = spec["signal"]
    okinds = _kinds(ctx, raw, osig, spec.get("kinds"), "correlate/kinds")
    o_allowed = set(fields.SIGNAL_VARS[osig])
    o_nested = fields.NESTED_VARS if osig == "steps" else {}
    o_payload = fields.payload_keys(sorted(okinds)) if osig == "events" else None
    c_file, c_doc, c_path = _at(raw, "correlate")
    if set(spec["this_keys"]) != set(spec["other_keys"]):
        ctx.add(
            c_file,
            *position(c_doc, c_path + ["other_keys"]),
            f"correlate: this_keys {sorted(spec['this_keys'])} and other_keys {sorted(spec['other_keys'])} "
            "must name the same keys",
            rid,
        )
    if parse_duration_ns(spec["within"]) == 0:
        ctx.add(
            c_file,
            *position(c_doc, c_path + ["within"]),
            f"correlate/within: {spec['within']} pairs only records of the very same ns time, which two signals "
            "practically never have: give the time a match may be apart (e.g. 30s)",
            rid,
        )
    o_record = sample_record(osig, okinds)
    n_before = len(ctx.problems)
    o_types = signal_types(osig, okinds)
    cond = _compile(
        ctx,
        raw,
        "correlate/condition",
        spec["condition"],
        o_allowed,
        o_nested,
        o_payload,
        record=o_record,
        types=o_types,
        want="bool",
    )
    if len(ctx.problems) == n_before:
        where = (c_file, c_doc, c_path + ["condition"])
        _check_condition(ctx, rid, where, "correlate/condition", cond, osig, o_record)
    this_keys = {
        k: _compile(ctx, raw, f"correlate/this_keys/{k}", v, allowed, nested, payload, extra, types=types)
        for k, v in spec["this_keys"].items()
    }
    other_keys = {
        k: _compile(ctx, raw, f"correlate/other_keys/{k}", v, o_allowed, o_nested, o_payload, types=o_types)
        for k, v in spec["other_keys"].items()
    }
    return Correlation(
        osig, okinds, cond, this_keys, other_keys, parse_duration_ns(spec["within"]), spec.get("order", "any")
    )


def load_ruleset(paths: list[Path | str]) -> RuleSet:
    """Load, validate and compile the rule files of ``paths`` (see the module docstring for the order).
    Returns the RuleSet of enabled rules. Raises RuleValidationError listing every problem, or when no
    file was given."""
    files = expand_paths(paths)
    ctx = _Ctx()
    if not files:
        unread = unread_paths(paths)
        raise RuleValidationError(
            [
                Problem(
                    ",".join(map(str, paths)) or "(none)",
                    0,
                    0,
                    "no rule files found" + "".join(f"; {u}" for u in unread),
                )
            ]
        )
    _read_files(ctx, files)
    _check_macros(ctx)
    rules: dict[str, Rule] = {}
    for rid, raw in ctx.raw_rules.items():
        rule = _build_rule(ctx, raw)
        if rule is not None and rule.enabled:
            rules[rid] = rule
    if ctx.problems:
        raise RuleValidationError(
            sorted(dict.fromkeys(ctx.problems), key=lambda p: (files_index(files, p.file), p.line, p.col))
        )
    return RuleSet(rules, ctx.inhibit, [str(f) for f in files], ctx.empty, unread_paths(paths))


def files_index(files: list[Path], file: str) -> int:
    """Position of ``file`` in the load order (for sorting problems)."""
    names = [str(f) for f in files]
    return names.index(file) if file in names else len(names)
