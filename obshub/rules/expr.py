"""CEL conditions: macro and list expansion (with cycle detection), compilation, static field checks and
evaluation.

Implementation: ``common-expression-language`` (the ``cel`` module, Rust ``cel-interpreter`` bindings),
chosen over ``cel-python`` (``celpy``) by measurement on the builtin pack: see docs/ARCHITECTURE.md
"Choice of CEL implementation" and ``python -m bench.celbench``.

Macros and lists are expanded textually at identifier boundaries (never inside string literals or after
a ``.``): a macro name becomes ``(its expanded condition)``, a list name becomes a CEL list literal.
"""

from __future__ import annotations

import datetime
import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any

import cel

CEL_ERRORS = (RuntimeError, ArithmeticError, TypeError, LookupError, ValueError)
"""What the CEL implementation raises on a runtime error (a missing key or member: RuntimeError or
TypeError; a type mismatch: TypeError; ``1/0``, an int overflow: ArithmeticError; an index out of range:
LookupError; a value of no CEL type, a bad escape in a literal: ValueError)."""

# CEL's tokens, enough to find names, literals and operators (strings and comments are never looked into)
_LEX = re.compile(
    r"""
    (?P<str>[rRbB]*("""
    + '"""'
    + r"""[\s\S]*?"""
    + '"""'
    + r"""|'''[\s\S]*?'''|"(\\.|[^"\\])*"|'(\\.|[^'\\])*'))
  | (?P<comment>//[^\n]*)
  | (?P<num>0[xX][0-9a-fA-F]+[uU]?|\d+(\.\d*)?([eE][+-]?\d+)?[uU]?|\.\d+([eE][+-]?\d+)?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>==|!=|<=|>=|&&|\|\|)
  | (?P<space>\s+)
  | (?P<other>[\s\S])
""",
    re.VERBOSE,
)
_COMPREHENSION = re.compile(r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_]\w*)\s*,")
_CALL = re.compile(r"(?<!\w)([A-Za-z_]\w*)\s*\(")
_MEMBER = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\s*\.\s*([A-Za-z_]\w*)")
# literals and type names that may appear bare (``type(x) == int``); functions are always called, and a
# call ``name(`` is recognised as such, so ``duration`` alone is a field reference (and unknown)
_RESERVED = {
    "true",
    "false",
    "null",
    "in",
    "int",
    "uint",
    "double",
    "string",
    "bool",
    "bytes",
    "type",
    "dyn",
    "list",
    "map",
    "null_type",
}
_CEL_POS = re.compile(r"<input>:(\d+):(\d+):\s*(.*)")
_CEL_OPERATOR = {"and": "`&&`", "or": "`||`", "not": "`!`"}  # Python's words, in a CEL syntax error's hint
# The functions and macros the CEL implementation (``cel``, cel-interpreter) evaluates, called as
# ``f(x)`` or ``x.f()``: the CEL specification's standard definitions (github.com/google/cel-spec,
# doc/langdef.md "Standard Definitions") that it implements, each checked against it. A call to any other
# name compiles but fails on every evaluation ("Undefined variable or function"), so the loader rejects it.
CEL_FUNCTIONS = frozenset(
    {
        "size", "has", "matches", "contains", "startsWith", "endsWith",
        "int", "uint", "double", "string", "bytes", "type", "dyn", "duration", "timestamp",
        "all", "exists", "exists_one", "map", "filter",
        "getDate", "getDayOfMonth", "getDayOfWeek", "getDayOfYear", "getFullYear", "getHours",
        "getMilliseconds", "getMinutes", "getMonth", "getSeconds",
    }
)  # fmt: skip


class ExprError(ValueError):
    """A condition is invalid. ``line``/``col`` are 1-based within the expression text (0 if unknown)."""

    def __init__(self, message: str, line: int = 0, col: int = 0):
        super().__init__(message)
        self.line, self.col = line, col


def tokens(expr: str) -> list[tuple[str, str, int]]:
    """Split ``expr`` into (type, text, offset) with type in str / comment / num / ident / op / space /
    other; the texts joined give ``expr`` back. A number literal such as ``1u``, ``1.5e-3`` or ``0x1F`` is
    one ``num`` token, so its suffix is no identifier; a ``//`` comment, to the end of its line, is one
    ``comment`` token."""
    return [(m.lastgroup or "other", m.group(), m.start()) for m in _LEX.finditer(expr)]


def identifiers(expr: str) -> list[str]:
    """Identifiers of ``expr`` that are not member names (not preceded by ``.``) nor inside strings."""
    out, prev = [], ""
    for kind, text, _ in tokens(expr):
        if kind == "ident" and prev != ".":
            out.append(text)
        if not text.isspace() and kind != "comment":
            prev = text
    return out


def _literal(items: list) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def expand(expr: str, macros: dict[str, str], lists: dict[str, list], _stack: tuple[str, ...] = ()) -> str:
    """Replace macro and list names in ``expr``. Raises ExprError naming the cycle when a macro uses
    itself directly or through others (``a -> b -> a``)."""
    out, prev = [], ""
    for kind, text, _ in tokens(expr):
        if kind == "comment":  # dropped: in a macro it would swallow the closing parenthesis
            continue
        if kind == "ident" and prev != ".":
            if text in macros:
                if text in _stack:
                    cycle = " -> ".join(_stack[_stack.index(text) :] + (text,))
                    raise ExprError(f"macro cycle: {cycle}")
                text = "(" + expand(macros[text], macros, lists, _stack + (text,)) + ")"
            elif text in lists:
                text = _literal(list(lists[text]))
        out.append(text)
        if not text.isspace():
            prev = text
    return "".join(out)


def compile_expr(expr: str) -> cel.Program:
    """Compile ``expr``; raises ExprError with the position inside the expression on a syntax error."""
    try:
        return cel.compile(expr)
    except (ValueError, RuntimeError, TypeError) as exc:
        text = str(exc)
        m = _CEL_POS.search(text)
        if m:
            why = m.group(3).strip()
            words = [w for w in dict.fromkeys(identifiers(expr)) if w in _CEL_OPERATOR]
            if words:  # Python's and/or/not: CEL has && || ! (a new user's first condition, newuser15)
                why += "; CEL writes " + ", ".join(f"{_CEL_OPERATOR[w]} for {w}" for w in words)
            raise ExprError(f"CEL syntax error: {why}", int(m.group(1)), int(m.group(2))) from None
        raise ExprError(f"CEL syntax error: {text.splitlines()[0]}") from None


def regex_problem(literal: str) -> str | None:
    """Why the CEL string ``literal`` (as written, quotes and escapes included: ``"a.*b"``) is no regex
    the engine's ``matches()`` accepts, or None when it is one. The CEL implementation compiles the
    pattern (Rust ``regex``: RE2 syntax, no look-around or backreferences) only when it evaluates the
    call, and then fails on every record; this compiles it once by evaluating ``"".matches(literal)``,
    so what is refused is exactly what the engine refuses. The reason is the regex parser's own line
    (``unclosed group``, ``look-around ... is not supported``); a literal CEL cannot parse gives None
    (the syntax check reports it)."""
    try:
        cel.evaluate(f'"".matches({literal})', {})
    except (ValueError, RuntimeError, TypeError) as exc:
        text = str(exc)
        if "not a valid regex" not in text:
            return None
        why = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("error:")]
        reason = why[0].removeprefix("error:").strip() if why else text.splitlines()[0]
        reason = reason.split(". Check function arguments")[0]
        return reason
    return None


def unknown_references(
    expr: str, allowed: set[str], names: set[str], nested: dict[str, set[str]], payload: set[str] | None
) -> list[tuple[str, int]]:
    """``(message, offset in expr)`` for every name in ``expr`` that is not a documented field
    (``allowed``), a macro/list or extra name (``names``), a comprehension variable or a CEL literal;
    and for members of documented nested fields (``straggler.hostt``, ``payload.qpp``) that do not
    exist."""
    toks = tokens(expr)
    stripped = "".join(t if k not in ("str", "comment") else " " * len(t) for k, t, _ in toks)  # same offsets
    bound = set(_COMPREHENSION.findall(stripped))
    msgs = []
    offsets = {}
    prev = ""
    for kind, text, off in toks:
        if kind == "ident" and prev != ".":
            offsets.setdefault(text, off)
        if not text.isspace() and kind != "comment":
            prev = text
    for name in dict.fromkeys(identifiers(expr)):
        if name in allowed or name in names or name in bound or name in _RESERVED:
            continue
        if re.search(rf"(?<![\w.]){re.escape(name)}\s*\(", stripped):
            continue  # a function call: checked against CEL_FUNCTIONS below
        near = difflib.get_close_matches(name, sorted(allowed | names), n=1)
        hint = f"; did you mean '{near[0]}'?" if near else ""
        msgs.append((f"unknown field '{name}'{hint}", offsets.get(name, 0)))
    for m in _CALL.finditer(stripped):
        name = m.group(1)
        if name not in CEL_FUNCTIONS and name != "in":  # `x in (list)`: an operator, not a call
            near = difflib.get_close_matches(name, sorted(CEL_FUNCTIONS), n=1)
            hint = f"; did you mean '{near[0]}'?" if near else " (docs/RULES.md lists the CEL functions)"
            msgs.append((f"unknown function '{name}'{hint}", m.start()))
    for m in _MEMBER.finditer(stripped):
        base, member = m.group(1), m.group(2)
        if base in bound:
            continue
        known = payload if base == "payload" else nested.get(base)
        if known is not None and base in allowed and member not in known and member not in _RESERVED:
            near = difflib.get_close_matches(member, sorted(known), n=1)
            hint = f"; did you mean '{near[0]}'?" if near else ""
            msgs.append(
                (f"unknown field '{base}.{member}' (documented: {', '.join(sorted(known)) or 'none'}){hint}", m.start())
            )
    return msgs


_ORDERING = {"<", "<=", ">", ">="}
_NUMERIC = {"int", "uint", "double"}
_ARITH = {"+", "-", "*", "/", "%", "!"}
# a CEL type name with its article, for messages
ARTICLE = {"int": "an int", "uint": "a uint", "double": "a double", "string": "a string", "bool": "a bool"}
ARTICLE |= {"list": "a list", "map": "a map", "bytes": "bytes", "duration": "a duration", "timestamp": "a timestamp"}


def value_type(value: Any) -> str | None:
    """CEL type name of a value (``bool``, ``int``, ``double``, ``string``, ``bytes``, ``list``, ``map``,
    ``duration``, ``timestamp``); None for null (its type is not known) and anything else."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    names = {int: "int", float: "double", str: "string", bytes: "bytes", list: "list", dict: "map"}
    names |= {datetime.timedelta: "duration", datetime.datetime: "timestamp"}
    return names.get(type(value))


def _literal_type(kind: str, text: str) -> str | None:
    if kind == "str":
        return "bytes" if text[:1] in "bB" or text[:2].lower() in ("rb", "br") else "string"
    if kind == "num":
        if text[-1] in "uU":
            return "uint"
        return "double" if any(c in text for c in ".eE") and not text.lower().startswith("0x") else "int"
    if text in ("true", "false"):
        return "bool"
    return None


def mismatched_comparisons(expr: str, record: dict[str, Any]) -> list[tuple[str, int]]:
    """``(message, offset in expr)`` for every comparison of a top-level field with a literal of another
    type, e.g. ``host == 5`` or ``duration_ns > "20"``: CEL compares no string with a number (int, uint and
    double compare with each other), so an ``==`` of that kind is false on every record, a ``!=`` true
    on every record, and an ordering fails on every record. ``record``: a record of the signal with each
    field of its run time type (``rules.loader.sample_record``); fields that are null there, members
    (``a.b``), comprehension variables and macros are not judged."""
    bound = set(_COMPREHENSION.findall(expr))
    toks = [t for t in tokens(expr) if t[0] not in _BLANK]
    out = []
    for i, (_, op, _) in enumerate(toks):
        if op not in ("==", "!=") and op not in _ORDERING:
            continue
        if 0 < i < len(toks) - 1 and op in ("<", ">") and (toks[i - 1][1] == "<" or toks[i + 1][1] in "<>="):
            continue
        for f, lit in ((i - 1, i + 1), (i + 1, i - 1)):
            if not (0 <= f < len(toks) and 0 <= lit < len(toks)):
                continue
            fkind, name, off = toks[f]
            if fkind != "ident" or name in bound or name not in record or name in _RESERVED:
                continue
            before, after = toks[f - 1][1] if f > 0 else "", toks[f + 1][1] if f + 1 < len(toks) else ""
            if before == "." or after in (".", "[", "("):
                continue  # a member, an index or a call: its type is not the field's
            if before in _ARITH or (f > i and after in _ARITH):
                continue  # part of a larger operand
            lk, lt, _ = toks[lit]
            if lit > i:  # the token after a right-hand literal, before a left-hand one
                near = toks[lit + 1][1] if lit + 1 < len(toks) else ""
            else:
                near = toks[lit - 1][1] if lit > 0 else ""
            if near in _ARITH or near in ((".", "[", "(") if lit > i else (".",)):
                continue  # the literal is part of a larger operand
            ft, ltype = value_type(record[name]), _literal_type(lk, lt)
            if ft is None or ltype is None or ft == ltype or (ft in _NUMERIC and ltype in _NUMERIC):
                continue
            if op == "==":
                effect = "false on every record"
            elif op == "!=":
                effect = "true on every record"
            else:
                effect = "an error on every record (no match)"
            text = f"{name} {op} {lt}" if f < i else f"{lt} {op} {name}"
            what = ARTICLE.get(ltype, ltype)
            out.append((f"`{text}` compares the {ft} field '{name}' with {what}: {effect}", off))
            break
    return out


def line_col(expr: str, offset: int) -> tuple[int, int]:
    """1-based (line, col) of ``offset`` in ``expr``."""
    line = expr.count("\n", 0, offset) + 1
    return line, offset - (expr.rfind("\n", 0, offset) + 1) + 1


@dataclass
class Compiled:
    """A compiled expression with its source (after expansion) for messages."""

    source: str
    program: cel.Program
    errors: int = field(default=0, compare=False)  # evaluations by :meth:`test` that failed (counted as false)
    last_error: str = field(default="", compare=False)  # the latest (``rules test`` shows it on a failure)

    def eval(self, activation: "dict[str, Any] | Activation") -> Any:
        """Evaluate on a map or an :class:`Activation`; raises ``EvalError`` (never another exception) on
        a runtime error such as a missing key or a type mismatch."""
        try:
            if isinstance(activation, Activation):
                return self.program.execute(activation.ctx)
            return self.program.execute(activation)
        except CEL_ERRORS as exc:
            raise EvalError(f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from None

    def test(self, activation: "dict[str, Any] | Activation") -> bool:
        """Evaluate as a condition: true only for the boolean ``true``; errors count as false."""
        try:
            return self.eval(activation) is True
        except EvalError as exc:
            self.errors += 1
            self.last_error = str(exc)
            return False


class Activation:
    """One record prepared for evaluation: ``data`` (the map, also used by templates) and a ``cel.Context``
    built on first use and shared by every expression evaluated on the record. Converting a record to
    CEL values is most of the cost of an evaluation (measured: ~20-60 µs per record of 8 hosts, ~0.3 µs
    per expression after that; docs/RULES.md), so it is done once per record, not once per expression.

    ``names``: when given, only these top-level fields are converted (the fields the rules that read
    the record reference; a wide step summary's per-host tables cost milliseconds to convert and most
    rules never read them). ``functions``: extra CEL functions (name -> Python callable) of the context."""

    __slots__ = ("data", "names", "functions", "_ctx", "_strings")

    def __init__(
        self, data: dict[str, Any], names: "frozenset[str] | None" = None, functions: "dict[str, Any] | None" = None
    ):
        self.data = data
        self.names = names
        self.functions = functions
        self._ctx = None
        self._strings: dict[Any, Any] = {}  # memo: strings of fields, entry keys of maps

    @property
    def ctx(self) -> cel.Context:
        if self._ctx is None:
            data = self.data if self.names is None else {k: self.data[k] for k in self.names if k in self.data}
            self._ctx = (
                cel.Context(variables=data, functions=self.functions) if self.functions else cel.Context(variables=data)
            )
        return self._ctx

    def strings(self, name: str) -> frozenset[str]:
        """Every string (values and map keys, at any depth) of the field ``name`` (memoised)."""
        out = self._strings.get(name)
        if out is None:
            out = self._strings[name] = frozenset(_strings_in(self.data.get(name)))
        return out

    def entry_keys(self, path: tuple[str, ...], members: "frozenset[str] | None" = None) -> "dict[Any, Any] | None":
        """For the map at ``path``: each key -> :func:`frozen` of its entry (cut down to ``members``,
        :func:`cut_entry`; None for an entry with no hashable form); None when ``path`` leads to no map
        (memoised: the rules reading the same members of the same map on one record share it)."""
        memo = ("entry_keys", None if members is None else tuple(sorted(members)), *path)
        if memo not in self._strings:
            m = resolve_path(self.data, path)
            out: "dict[Any, Any] | None" = None
            if isinstance(m, dict):
                out = {}
                for k, v in m.items():
                    try:
                        out[k] = frozen(cut_entry(v, members))
                    except TypeError:
                        out[k] = None
            self._strings[memo] = out  # type: ignore[assignment]
        return self._strings[memo]  # type: ignore[return-value]

    def cut(self, name: str, paths: "frozenset[tuple[str, ...]] | None") -> Any:
        """:func:`cut_paths` of the field ``name`` (memoised: the rules reading the same paths share it)."""
        memo = ("cut", name, paths)
        if memo not in self._strings:
            self._strings[memo] = cut_paths(self.data.get(name), paths)
        return self._strings[memo]

    def strings_read(
        self, name: str, reads: "frozenset[tuple[str, ...]] | None", paths: "list[tuple[str, ...]]"
    ) -> frozenset[str]:
        """The strings of the field ``name`` a per-item context can see: :meth:`cut` to the member paths
        ``reads`` (None: whole), then without the keys of the maps at ``paths`` (:meth:`strings_outside`'s
        rule; memoised). A string outside what a rule reads cannot equal its item in any comparison."""
        memo = ("read", name, reads, *sorted(paths))
        out = self._strings.get(memo)
        if out is None:
            value = self.cut(name, reads)
            for path in paths:
                value = _keys_dropped(value, path[1:])
            out = self._strings[memo] = frozenset(_strings_in(value))
        return out

    def strings_outside(self, name: str, paths: "list[tuple[str, ...]]") -> frozenset[str]:
        """:meth:`strings` of the field ``name`` leaving out the keys (not the values) of the maps at
        ``paths`` (each starting with ``name``; memoised)."""
        memo = (name, *sorted(paths))
        out = self._strings.get(memo)
        if out is None:
            value = self.data.get(name)
            for path in paths:
                value = _keys_dropped(value, path[1:])
            out = self._strings[memo] = frozenset(_strings_in(value))
        return out


def _keys_dropped(value: Any, path: tuple[str, ...]) -> Any:
    """``value`` with the map at ``path`` replaced by the list of its values (copies along the path)."""
    if not isinstance(value, dict):
        return value
    if not path:
        return list(value.values())
    if path[0] not in value:
        return value
    return {**value, path[0]: _keys_dropped(value[path[0]], path[1:])}


def _strings_in(value: Any, out: "set[str] | None" = None) -> set[str]:
    out = set() if out is None else out
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            out.add(v)
        elif isinstance(v, dict):
            out.update(k for k in v if isinstance(k, str))
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return out


# -- item invariance ----------------------------------------------------------------------------------
# A `foreach` rule evaluates its expressions once per item. When an expression uses ``item`` only as an
# operand of ``==``, ``!=`` or ``in`` against a field path or a literal (and builds no new strings), its
# value is the same for every item that equals none of the strings the record and the expression hold:
# each comparison with ``item`` is then false (``!=`` true) whatever the item is. The engine evaluates such
# an expression once for a sentinel item and only the "mentioned" items separately (docs/RULES.md,
# "Cost of foreach").
_BLANK = {"space", "comment"}  # tokens that separate and mean nothing (a `//` comment runs to the line's end)
_LOW = {"", "(", "&&", "||", "?", ":", ",", "["}  # tokens that bind looser than a relation
_END = {"", ")", "&&", "||", "?", ":", ",", "]"}
_BOOL_CALLS = {
    "exists",
    "all",
    "exists_one",
    "filter",
    "size",
    "has",
    "int",
    "uint",
    "double",
    "startsWith",
    "endsWith",
    "contains",
    "matches",
}  # calls that build no new string


def _lex(expr: str) -> list[tuple[str, str]]:
    return [(m.lastgroup or "other", m.group()) for m in _LEX.finditer(expr) if m.lastgroup not in _BLANK]


def _operand_after(toks: list[tuple[str, str]], i: int) -> int:
    """Index just past a field path / literal / list of literals starting at ``i``; -1 if none there."""
    if i >= len(toks):
        return -1
    kind, text = toks[i]
    if kind in ("str", "num"):
        return i + 1
    if text == "[":
        j = i + 1
        while j < len(toks) and toks[j][0] in ("str", "num"):
            j += 1
            if j < len(toks) and toks[j][1] == ",":
                j += 1
        return j + 1 if j < len(toks) and toks[j][1] == "]" else -1
    if kind != "ident":
        return -1
    j = i + 1
    while j < len(toks):
        if (
            toks[j][1] == "."
            and j + 1 < len(toks)
            and toks[j + 1][0] == "ident"
            and not (j + 2 < len(toks) and toks[j + 2][1] == "(")
        ):
            j += 2
        elif toks[j][1] == "[" and j + 2 < len(toks) and toks[j + 1][0] in ("str", "num") and toks[j + 2][1] == "]":
            j += 3
        else:
            break
    return j


def _operand_before(toks: list[tuple[str, str]], i: int) -> int:
    """Index of the first token of a field path / literal ending at ``i`` (inclusive); -1 if none."""
    if i < 0:
        return -1
    kind, text = toks[i]
    if kind in ("str", "num"):
        return i
    j = i
    while j >= 0:
        if toks[j][0] == "ident":
            if j >= 2 and toks[j - 1][1] == ".":
                j -= 2
                continue
            return j
        if toks[j][1] == "]" and j >= 3 and toks[j - 1][0] in ("str", "num") and toks[j - 2][1] == "[":
            j -= 3
            continue
        return -1
    return -1


def item_invariant(expr: str, var: str = "item") -> bool:
    """True when ``expr`` uses ``var`` only in comparisons ``var ==|!=|in P`` / ``P ==|!= var`` and as a
    key ``P[var]``, with P a field path or literal, binds no comprehension variable of that name, and
    calls nothing that can build a new string (no ``+``, only the calls in ``_BOOL_CALLS``). Then every
    ``var`` outside the strings of the record (values and map keys) and of ``expr`` gives the same value
    (or the same error)."""
    toks = _lex(expr)
    texts = [t for _, t in toks]
    if "+" in texts or re.search(rf"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*{var}\s*,", expr):
        return False
    for i, (kind, text) in enumerate(toks):
        if kind == "ident" and i + 1 < len(toks) and texts[i + 1] == "(" and text not in _BOOL_CALLS:
            return False
        if kind != "ident" or text != var or (i > 0 and texts[i - 1] == "."):
            continue
        prev = texts[i - 1] if i > 0 else ""
        nxt = texts[i + 1] if i + 1 < len(toks) else ""
        if nxt in ("==", "!=", "in") and prev in _LOW:
            end = _operand_after(toks, i + 2)
            if end < 0 or (texts[end] if end < len(toks) else "") not in _END:
                return False
        elif prev in ("==", "!=") and nxt in _END:
            start = _operand_before(toks, i - 2)
            if start < 0 or (texts[start - 1] if start > 0 else "") not in _LOW:
                return False
        elif (
            prev == "["
            and nxt == "]"
            and i >= 2
            and _operand_before(toks, i - 2) >= 0
            and toks[i - 2][0] not in ("str", "num")
            and texts[i - 2] not in _RESERVED
        ):
            # ``P[var]``: for a var that is no key of P (P's keys are among the record's strings) the
            # look-up fails the same way whatever the var is
            continue
        else:
            return False
    return True


def item_keyed_paths(expr: str, var: str = "item") -> frozenset[tuple[str, ...]]:
    """The field paths P (dotted names, e.g. ``("evidence", "hosts")``) that ``expr`` reads only as
    ``P[var]`` or ``var in P``: neither P nor a path through it or a part of it is used any other way, and
    no comprehension binds a name. For such a P, evaluating ``expr`` with P's map cut down to the entry
    of ``var`` (or to no entry when it has none) gives the same value, so a per-item evaluation needs to
    convert one entry of P, not all of them (:func:`project_item`)."""
    toks = _lex(expr)
    texts = [t for _, t in toks]
    if re.search(r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(", expr):
        return frozenset()
    paths: list[tuple[tuple[str, ...], int, int]] = []  # (path, first token, index past it)
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        if kind != "ident" or (i > 0 and texts[i - 1] == ".") or text in _RESERVED or text == var:
            i += 1
            continue
        parts, j = [text], i + 1
        while (
            j + 1 < len(toks)
            and texts[j] == "."
            and toks[j + 1][0] == "ident"
            and not (j + 2 < len(toks) and texts[j + 2] == "(")
        ):
            parts.append(texts[j + 1])
            j += 2
        if j < len(toks) and texts[j] == "(":  # a function call, not a field
            i = j
            continue
        paths.append((tuple(parts), i, j))
        i = j
    keyed = set()
    for path, start, end in paths:
        indexed = end + 2 < len(toks) and texts[end] == "[" and texts[end + 1] == var and texts[end + 2] == "]"
        tested = start >= 2 and texts[start - 1] == "in" and texts[start - 2] == var
        if len(path) > 1 and (indexed or tested):
            keyed.add(path)
    out = set()
    for p in keyed:
        ok = True
        for path, start, end in paths:
            if path[0] != p[0]:
                continue
            if path == p:
                indexed = end + 2 < len(toks) and texts[end] == "[" and texts[end + 1] == var and texts[end + 2] == "]"
                tested = start >= 2 and texts[start - 1] == "in" and texts[start - 2] == var
                if indexed or tested:
                    continue
                ok = False
            elif path[: len(p)] == p or p[: len(path)] == path:
                ok = False  # a path through P, or a part of P read whole
            if not ok:
                break
        if ok:
            out.add(p)
    return frozenset(out)


def item_entry_members(expr: str, path: tuple[str, ...], var: str = "item") -> frozenset[str] | None:
    """The members ``expr`` reads of the entry ``P[var]`` of the keyed path ``P`` (``item_keyed_paths``):
    ``{"sched"}`` when every ``P[var]`` is followed by ``.sched``; None when some ``P[var]`` is used
    another way (whole, indexed, called on), so the whole entry counts. Evaluating ``expr`` with each
    entry cut down to those members (the ones it has) gives the same value: a member read is the only
    use, and a member the entry lacks stays missing. Two hosts whose entries agree on the members read
    then share one evaluation (``evidence.hosts[item].sched`` needs only the sched value)."""
    toks = _lex(expr)
    texts = [t for _, t in toks]
    members: set[str] = set()
    for i in range(len(toks)):
        if texts[i] != path[0] or toks[i][0] != "ident" or (i > 0 and texts[i - 1] == "."):
            continue
        j, ok = i + 1, True
        for part in path[1:]:
            if j + 1 < len(toks) and texts[j] == "." and texts[j + 1] == part:
                j += 2
            else:
                ok = False
                break
        if not ok or not (j + 2 < len(toks) and texts[j] == "[" and texts[j + 1] == var):
            continue
        if texts[j + 2] != "]":
            return None
        k = j + 3
        if (
            k + 1 < len(toks)
            and texts[k] == "."
            and toks[k + 1][0] == "ident"
            and not (k + 2 < len(toks) and texts[k + 2] == "(")
        ):
            members.add(texts[k + 1])
        else:
            return None
    return frozenset(members)


def field_paths(expr: str) -> dict[str, "frozenset[tuple[str, ...]] | None"]:
    """Per top-level name of ``expr``: the dotted member paths below it that ``expr`` reads
    (``evidence.max.network`` -> ``("max", "network")``; a path ends before an index, a call or an
    operator), or None when the name is used bare (``size(evidence)``, ``evidence['max']``,
    ``evidence.all(...)``): the whole value. A map cut down to those paths (``cut_paths``) evaluates
    ``expr`` the same way: every read goes through one of them, whole below its end."""
    toks = _lex(expr)
    texts = [t for _, t in toks]
    out: dict[str, set[tuple[str, ...]] | None] = {}
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        if kind != "ident" or (i > 0 and texts[i - 1] == ".") or text in _RESERVED:
            i += 1
            continue
        if i + 1 < len(toks) and texts[i + 1] == "(":  # a function call
            i += 1
            continue
        parts, j = [], i + 1
        while (
            j + 1 < len(toks)
            and texts[j] == "."
            and toks[j + 1][0] == "ident"
            and not (j + 2 < len(toks) and texts[j + 2] == "(")
        ):
            parts.append(texts[j + 1])
            j += 2
        seen = out.setdefault(text, set())
        if not parts:
            out[text] = None
        elif seen is not None:
            seen.add(tuple(parts))
        i = j
    return {k: (None if v is None else frozenset(v)) for k, v in out.items()}


def cut_paths(value: Any, paths: "frozenset[tuple[str, ...]] | None") -> Any:
    """``value`` with only the members along ``paths`` (``field_paths``), each whole below its end;
    itself when ``paths`` is None or it is no map (copies, ``value`` is left as it is)."""
    if paths is None or value.__class__ is not dict:
        return value
    whole = {p[0] for p in paths if len(p) == 1}
    deeper: dict[str, set[tuple[str, ...]]] = {}
    for p in paths:
        if len(p) > 1 and p[0] not in whole:
            deeper.setdefault(p[0], set()).add(p[1:])
    out = {k: value[k] for k in whole if k in value}
    for k, rest in deeper.items():
        if k in value:
            out[k] = cut_paths(value[k], frozenset(rest))
    return out


def cut_entry(entry: Any, members: frozenset[str] | None) -> Any:
    """``entry`` cut down to ``members`` (those it has); itself when ``members`` is None or it is no map."""
    if members is None or entry.__class__ is not dict:
        return entry
    return {k: entry[k] for k in members if k in entry}


def resolve_path(data: dict[str, Any], path: tuple[str, ...]) -> Any:
    """The value at ``path`` in ``data`` (nested maps), None when a step of it is missing."""
    v: Any = data
    for key in path:
        if not isinstance(v, dict) or key not in v:
            return None
        v = v[key]
    return v


_SCALARS = frozenset({str, int, float, bool, type(None), bytes})


def frozen(value: Any) -> Any:
    """A hashable equivalent of ``value`` (maps, lists and scalars; type-tagged so ``1``, ``1.0`` and
    ``True`` stay apart, as they do in CEL; floats by their exact bits). Raises TypeError for anything
    else."""
    if type(value) is dict and all(v.__class__ in _SCALARS for v in value.values()):
        # a map of scalars (the common case): one pass
        return frozenset(
            (k.__class__, k, v.__class__, v.hex() if v.__class__ is float else v) for k, v in value.items()
        )
    if value is None or isinstance(value, (str, bytes)):
        return value
    if isinstance(value, float):
        return ("float", value.hex())  # -0.0 and 0.0 apart (1 / x differs), a NaN equal to itself
    if isinstance(value, (bool, int)):
        return (type(value).__name__, value)
    if isinstance(value, dict):
        return ("map", frozenset((frozen(k), frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return ("list", tuple(frozen(v) for v in value))
    raise TypeError(f"no hashable form for {type(value).__name__}")


def project_item(
    data: dict[str, Any],
    paths: "frozenset[tuple[str, ...]]",
    item: Any,
    key_as: Any = None,
    members: "dict[tuple[str, ...], frozenset[str] | None] | None" = None,
) -> dict[str, Any]:
    """``data`` (top-level fields) with the map at each of ``paths`` cut down to ``item``'s entry (none
    when it has none), filed under ``key_as`` (default: ``item``); the maps along a path are copied,
    ``data`` itself is left as it is. A path that does not lead to a map, or an item that cannot be a
    key, is left whole. ``members``: per path, the members of the entry to keep (``cut_entry``; none
    given: the whole entry)."""
    if not paths or not isinstance(item, (str, int, float, bool)):
        return data
    key_as = item if key_as is None else key_as
    out = dict(data)
    for path in paths:
        if path[0] not in out:
            continue
        chain = [out[path[0]]]
        for key in path[1:]:
            parent = chain[-1]
            if not isinstance(parent, dict) or key not in parent:
                chain = []
                break
            chain.append(parent[key])
        if not chain or not isinstance(chain[-1], dict):
            continue
        m = chain[-1]
        value: Any = {key_as: cut_entry(m[item], members.get(path) if members else None)} if item in m else {}
        for parent, key in zip(reversed(chain[:-1]), reversed(path[1:])):
            value = {**parent, key: value}
        out[path[0]] = value
    return out


def string_literals(expr: str) -> frozenset[str]:
    """The values of the string literals of ``expr`` (escapes resolved by the CEL implementation)."""
    out = set()
    for kind, text in _lex(expr):
        if kind == "str" and not text.lower().startswith(("b", "rb", "br")):
            try:
                v = cel.compile(text).execute({})
            except CEL_ERRORS:  # not a literal the implementation accepts: the compile of expr rejects it too
                continue
            if isinstance(v, str):
                out.add(v)
    return frozenset(out)


class EvalError(ValueError):
    """Evaluating an expression on one record failed (missing key, null member, type mismatch)."""
