"""CEL conditions: macro and list expansion (with cycle detection), compilation, static field checks and
evaluation.

Implementation: ``common-expression-language`` (the ``cel`` module, Rust ``cel-interpreter`` bindings),
chosen over ``cel-python`` (``celpy``) by measurement on the builtin pack: see docs/RULES.md
"Choice of CEL implementation" and ``python -m bench.celbench``.

Macros and lists are expanded textually at identifier boundaries (never inside string literals or after
a ``.``): a macro name becomes ``(its expanded condition)``, a list name becomes a CEL list literal.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from typing import Any

import cel

_TOKEN = re.compile(r"""
    (?P<str>[rRbB]*("""+'"""'+r"""[\s\S]*?"""+'"""'+r"""|'''[\s\S]*?'''|"(\\.|[^"\\])*"|'(\\.|[^'\\])*'))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<other>[\s\S])
""", re.VERBOSE)
_COMPREHENSION = re.compile(r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_]\w*)\s*,")
_MEMBER = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\s*\.\s*([A-Za-z_]\w*)")
# literals and type names that may appear bare (``type(x) == int``); functions are always called, and a
# call ``name(`` is recognised as such, so ``duration`` alone is a field reference (and unknown)
_RESERVED = {"true", "false", "null", "in", "int", "uint", "double", "string", "bool", "bytes", "type",
             "dyn", "list", "map", "null_type"}
_CEL_POS = re.compile(r"<input>:(\d+):(\d+):\s*(.*)")


class ExprError(ValueError):
    """A condition is invalid. ``line``/``col`` are 1-based within the expression text (0 if unknown)."""

    def __init__(self, message: str, line: int = 0, col: int = 0):
        super().__init__(message)
        self.line, self.col = line, col


def tokens(expr: str) -> list[tuple[str, str, int]]:
    """Split ``expr`` into (type, text, offset) with type in str / ident / other."""
    return [(m.lastgroup or "other", m.group(), m.start()) for m in _TOKEN.finditer(expr)]


def identifiers(expr: str) -> list[str]:
    """Identifiers of ``expr`` that are not member names (not preceded by ``.``) nor inside strings."""
    out, prev = [], ""
    for kind, text, _ in tokens(expr):
        if kind == "ident" and prev != ".":
            out.append(text)
        if not text.isspace():
            prev = text
    return out


def _literal(items: list) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def expand(expr: str, macros: dict[str, str], lists: dict[str, list], _stack: tuple[str, ...] = ()) -> str:
    """Replace macro and list names in ``expr``. Raises ExprError naming the cycle when a macro uses
    itself directly or through others (``a -> b -> a``)."""
    out, prev = [], ""
    for kind, text, _ in tokens(expr):
        if kind == "ident" and prev != ".":
            if text in macros:
                if text in _stack:
                    cycle = " -> ".join(_stack[_stack.index(text):] + (text,))
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
            raise ExprError(f"CEL syntax error: {m.group(3).strip()}", int(m.group(1)), int(m.group(2))) from None
        raise ExprError(f"CEL syntax error: {text.splitlines()[0]}") from None


def unknown_references(expr: str, allowed: set[str], names: set[str], nested: dict[str, set[str]],
                       payload: set[str] | None) -> list[tuple[str, int]]:
    """``(message, offset in expr)`` for every name in ``expr`` that is not a documented field
    (``allowed``), a macro/list or extra name (``names``), a comprehension variable or a CEL literal;
    and for members of documented nested fields (``straggler.hostt``, ``payload.qpp``) that do not
    exist."""
    bound = set(_COMPREHENSION.findall(expr))
    msgs = []
    offsets = {}
    prev = ""
    for kind, text, off in tokens(expr):
        if kind == "ident" and prev != ".":
            offsets.setdefault(text, off)
        if not text.isspace():
            prev = text
    for name in dict.fromkeys(identifiers(expr)):
        if name in allowed or name in names or name in bound or name in _RESERVED:
            continue
        if re.search(rf"(?<![\w.]){re.escape(name)}\s*\(", expr):
            continue  # a function call (CEL's own functions are checked by the compiler at run time)
        near = difflib.get_close_matches(name, sorted(allowed | names), n=1)
        hint = f"; did you mean '{near[0]}'?" if near else ""
        msgs.append((f"unknown field '{name}'{hint}", offsets.get(name, 0)))
    stripped = "".join(t if k != "str" else " " * len(t) for k, t, _ in tokens(expr))  # keeps offsets
    for m in _MEMBER.finditer(stripped):
        base, member = m.group(1), m.group(2)
        if base in bound:
            continue
        known = payload if base == "payload" else nested.get(base)
        if known is not None and base in allowed and member not in known and member not in _RESERVED:
            near = difflib.get_close_matches(member, sorted(known), n=1)
            hint = f"; did you mean '{near[0]}'?" if near else ""
            msgs.append((f"unknown field '{base}.{member}' (documented: {', '.join(sorted(known)) or 'none'}){hint}",
                         m.start()))
    return msgs


def line_col(expr: str, offset: int) -> tuple[int, int]:
    """1-based (line, col) of ``offset`` in ``expr``."""
    line = expr.count("\n", 0, offset) + 1
    return line, offset - (expr.rfind("\n", 0, offset) + 1) + 1


@dataclass
class Compiled:
    """A compiled expression with its source (after expansion) for messages."""

    source: str
    program: cel.Program

    def eval(self, activation: "dict[str, Any] | Activation") -> Any:
        """Evaluate on a map or an :class:`Activation`; raises ``EvalError`` (never another exception) on
        a runtime error such as a missing key or a type mismatch."""
        try:
            if isinstance(activation, Activation):
                return self.program.execute(activation.ctx)
            return self.program.execute(activation)
        except Exception as exc:  # cel raises RuntimeError/TypeError/ValueError/KeyError
            raise EvalError(f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from None

    def test(self, activation: "dict[str, Any] | Activation") -> bool:
        """Evaluate as a condition: true only for the boolean ``true``; errors count as false."""
        try:
            return self.eval(activation) is True
        except EvalError:
            return False


class Activation:
    """One record prepared for evaluation: ``data`` (the map, also used by templates) and a ``cel.Context``
    built on first use and shared by every expression evaluated on the record. Converting a record to
    CEL values is most of the cost of an evaluation (measured: ~20-60 µs per record, ~0.3 µs per
    expression after that; docs/RULES.md), so it is done once per record, not once per expression."""

    __slots__ = ("data", "_ctx")

    def __init__(self, data: dict[str, Any]):
        self.data = data
        self._ctx = None

    @property
    def ctx(self) -> cel.Context:
        if self._ctx is None:
            self._ctx = cel.Context(variables=self.data)
        return self._ctx


class EvalError(ValueError):
    """Evaluating an expression on one record failed (missing key, null member, type mismatch)."""
