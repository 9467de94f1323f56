"""Static type check of CEL conditions against the record types of a signal.

A small recursive-descent parser over :func:`obshub.rules.expr.tokens` builds the expression tree (the
CEL grammar of github.com/google/cel-spec doc/langdef.md: ternary, ``||``, ``&&``, relations, ``+ -``,
``* / %``, unary ``! -``, member/index/call, literals, lists, maps), then a type inference walks it with
the types of the signal's fields (:func:`signal_types`). It reports, with the offset in the expression
and a fix, every part that fails on every record or can never be true:

- a member a record does not have (``straggler.hostt``, ``b.layerr`` in ``blame.exists(b, ...)``);
- arithmetic across numeric types (``5.0 * baseline.median_ns``: CEL has no implicit int/double
  conversion), or on strings/bools;
- an ordering (``<``) of a string with a number, an ``==``/``!=`` of a string with a number or a bool
  (false/true on every record), ``&&``/``||``/``!`` on something that is no bool;
- a condition whose value is not a bool, a ``threshold.of`` that gives no number.

Types follow the engine's records (``rules.fields``): JSON integers are CEL ``int``, JSON reals ``double``.
A part the checker cannot type (``dyn``: a macro variable of unknown type, a function it does not know)
is never reported; the parser gives up (no problem) on text it does not parse, since the CEL compiler has
already accepted it. Macros are typed by checking their expansion; a problem inside a macro is reported
against the macro (:class:`TypeProblem.macro`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from obshub.core import schema
from obshub.rules import fields
from obshub.rules.expr import regex_problem, tokens


# -- types --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class T:
    """A CEL type: ``kind`` one of int, uint, double, string, bool, bytes, null, duration, timestamp,
    type, dyn, list, map, record. ``elem``: a list's element or a map's value; ``key``: a map's key;
    ``fields``: a record's members (a CEL map with known string keys: another key fails); a record keyed by
    layer name also has ``key``/``elem`` (string -> the type of each member); ``nullable``: the value may be
    null (``straggler``, ``hang``); ``what``: the record's name in messages; ``values``: the values a
    string field takes (``closed_by``, ``layer``, ``kind``), empty when any."""

    kind: str
    elem: "T | None" = None
    key: "T | None" = None
    fields: tuple[tuple[str, "T"], ...] = ()
    nullable: bool = False
    what: str = ""
    values: frozenset[str] = frozenset()  # a string of one of these values (closed_by, layer, kind)

    def member(self, name: str) -> "T | None":
        for n, t in self.fields:
            if n == name:
                return t
        return None

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.fields]

    def __str__(self) -> str:
        if self.kind == "list":
            return f"list({self.elem})"
        if self.kind == "map":
            return f"map({self.key}, {self.elem})"
        if self.kind == "record":
            return "map"
        return self.kind


INT, UINT, DOUBLE, STRING, BOOL = T("int"), T("uint"), T("double"), T("string"), T("bool")
BYTES, NULL, DYN, DURATION, TIMESTAMP, TYPE = T("bytes"), T("null"), T("dyn"), T("duration"), T("timestamp"), T("type")
NUMERIC = {"int", "uint", "double"}
_ARTICLE = {"int": "an int", "uint": "a uint", "double": "a double", "string": "a string", "bool": "a bool"}
_ARTICLE |= {"list": "a list", "map": "a map", "record": "a map", "bytes": "bytes", "null": "null"}
_ARTICLE |= {"duration": "a duration", "timestamp": "a timestamp", "type": "a type"}


def article(t: T) -> str:
    """``an int``, ``a double``, ``a string``, ... for messages."""
    return _ARTICLE.get(t.kind, t.kind)


def list_of(t: T) -> T:
    return T("list", elem=t)


def map_of(k: T, v: T) -> T:
    return T("map", key=k, elem=v)


def record(what: str, nullable: bool = False, **members: T) -> T:
    return T("record", fields=tuple(sorted(members.items())), nullable=nullable, what=what)


LAYERS = tuple(sorted(layer.value for layer in schema.Layer))


def enum(*values: str) -> T:
    """A string that takes one of ``values``."""
    return T("string", values=frozenset(values))


def by_layer(t: T, what: str) -> T:
    """A map keyed by layer name (``evidence.hosts[h]``, ``layer_stats``): a record of every layer, each
    of type ``t`` (a misspelt layer is an unknown member)."""
    return T("record", key=STRING, elem=t, fields=tuple((name, t) for name in LAYERS), what=what)


LAYER = enum(*LAYERS)
NET_VIEW = enum(*schema.NET_VIEWS)
KIND = enum(*(k.name for k in schema.Kind))

# the step summary's fields (schema.STEP_SUMMARY_FIELDS, as rules.fields.step_record gives them)
_LAYER_CELL = record("a layers cell", time_ns=INT, count=INT, max_ns=INT)
RANK = T("int", nullable=True)  # a global or local rank: null when the agent did not register one
_LAYER_STAT = record(
    "a layer_stats entry",
    hosts=INT,
    time_p50_ns=INT,
    time_p90_ns=INT,
    time_p99_ns=INT,
    time_max_ns=INT,
    max_host=STRING,
    count_p50=INT,
    count_p90=INT,
    count_p99=INT,
    count_max=INT,
)
STEP_TYPES: dict[str, T] = {
    "v": INT,
    "job": STRING,
    "step": INT,
    "closed_by": enum("complete", "window", "hang", "running", "restart"),
    "life": INT,
    "closed_at_ns": INT,
    "hosts": list_of(STRING),
    "expected_hosts": list_of(STRING),
    "missing_hosts": list_of(STRING),
    "world_size": INT,
    "step_time_ns": map_of(STRING, INT),
    "step_time_max_ns": INT,
    "straggler": record(
        "straggler",
        nullable=True,
        host=STRING,
        rank=RANK,
        local_rank=RANK,
        gpu=INT,
        score=DOUBLE,
        excess_ns=INT,
        reason=STRING,
        group=list_of(record("a straggler.group entry", host=STRING, rank=RANK, late_ns=INT)),
    ),
    "blame": list_of(
        record(
            "a blame entry",
            host=STRING,
            rank=RANK,
            layer=LAYER,
            excess_ns=INT,
            straggler_ns=INT,
            peer_median_ns=INT,
            count=INT,
            max_ns=INT,
        )
    ),
    "collectives": list_of(
        record(
            "a collectives entry",
            pg=STRING,
            coll_seq=INT,
            op=STRING,
            skew_ns=INT,
            uncertainty_ns=INT,
            last_host=STRING,
        )
    ),
    "inconsistent": list_of(record("an inconsistent entry", pg=STRING, coll_seq=INT, op=STRING, why=STRING)),
    "late_max_ns": INT,
    "net_directed": BOOL,
    "evidence": record(
        "evidence",
        spread_ns=INT,
        hosts=map_of(STRING, by_layer(DOUBLE, "a host's evidence (by layer)")),
        max=by_layer(DOUBLE, "the largest evidence of each layer over the hosts"),
        ranks=map_of(STRING, INT),
        net_view=map_of(STRING, NET_VIEW),
    ),
    "culprit": record(
        "culprit",
        nullable=True,
        host=STRING,
        rank=RANK,
        layer=STRING,
        evidence=DOUBLE,
        source=enum("stopped", "evidence", "blame", "memlimit", "layers", "persistent", "hang", "running", "burst"),
        why=STRING,
        starved=BOOL,
        starved_rank=BOOL,
        burst=BOOL,
        burst_ns=INT,
        net_view=NET_VIEW,
        runq_veto=BOOL,
    ),
    "memory_episode": record(
        "memory_episode",
        nullable=True,
        host=STRING,
        rank=RANK,
        first_step=INT,
        steps=INT,
        lost_ns=INT,
        reclaim_ns=INT,
        peer_reclaim_ns=INT,
    ),
    "hang": record(
        "hang",
        nullable=True,
        pg=STRING,
        coll_seq=INT,
        op=STRING,
        hosts=list_of(
            record(
                "a hang.hosts entry",
                host=STRING,
                rank=RANK,
                last_step=INT,
                last_phase=STRING,
                silent_ns=INT,
                state=enum("frozen", "stopped", "exited", "silent", "unreachable"),
                toward=INT,
            )
        ),
        waiting=list_of(STRING),
        waiting_ranks=INT,
        waited_ns=INT,
        after_ns=INT,
    ),
    "layers": map_of(STRING, by_layer(_LAYER_CELL, "a host's layers")),
    "layer_stats": by_layer(_LAYER_STAT, "layer_stats"),
    "ranks": map_of(
        STRING,
        map_of(
            STRING,
            record(
                "a ranks row",
                local_rank=INT,
                pid=INT,
                gpu=INT,
                step_ns=T("int", nullable=True),
                late_ns=INT,
                last_n=INT,
                layers=by_layer(_LAYER_CELL, "a rank's layers"),
            ),
        ),
    ),
    "layers_omitted": INT,
    "baseline": record("baseline", median_ns=INT, p99_ns=INT, n=INT, spread_ns=INT),
    "stall": BOOL,
    "stall_ratio": DOUBLE,
    "stopped": map_of(STRING, record("a stopped entry", ns=INT, rank=RANK)),
    "quality": record("quality", lost_batches=INT, duplicate_batches=INT, late_events=INT, ringbuf_lost=INT),
    "time_ns": INT,
}

EVENT_SCALARS: dict[str, T] = {
    "kind": KIND,
    "kind_id": INT,
    "layer": LAYER,
    "job": STRING,
    "host": STRING,
    "host_id": INT,
    "agent_id": STRING,
    "batch_seq": INT,
    "ts_ns": INT,
    "time_ns": INT,
    "duration_ns": INT,
    "duration_us": DOUBLE,
    "duration_ms": DOUBLE,
    "value": INT,
    "trace_key": INT,
    "tk_host_id": INT,
    "tk_step16": INT,
    "op_seq": INT,
    "step": INT,
    "pid": INT,
    "tid": INT,
    "gpu": INT,
}

HEALTH_TYPES: dict[str, T] = {
    "component": STRING,
    "topic": STRING,
    "group": STRING,
    "lag_messages": INT,
    "idle_s": DOUBLE,
    "uptime_s": DOUBLE,
    "time_ns": INT,
}

_PY = {int: INT, float: DOUBLE, str: STRING, bool: BOOL, bytes: BYTES}


def payload_type(kinds: "list[str] | frozenset[str] | None") -> T:
    """The ``payload`` of an event of ``kinds`` (all kinds when empty): a record of the keys they may
    carry (schema.KIND_INFO); a key two kinds type differently is ``dyn``."""
    names = {k.name for k in schema.Kind}
    sel = [schema.Kind[k] for k in kinds if k in names] if kinds else list(schema.Kind)
    members: dict[str, T] = {}
    for k in sel:
        for key, py in schema.KIND_INFO[k].payload.items():
            t = _PY.get(py, DYN)
            members[key] = t if members.get(key, t) == t else DYN
    return record("payload", **members)


_SHAPES = {
    "int": INT,
    "str": STRING,
    "bool": BOOL,
    "list[str]": list_of(STRING),
    "list[map]": list_of(map_of(STRING, DYN)),
    "map[int]": map_of(STRING, INT),
    "map[map]": map_of(STRING, map_of(STRING, DYN)),
    "map": map_of(STRING, DYN),
    "map?": map_of(STRING, DYN),
}


def step_types() -> dict[str, T]:
    """The type of every step-summary field a rule reads: ``STEP_TYPES``, and for a documented field it
    does not hold yet, a record of its documented members (``fields.NESTED_VARS``, each ``dyn``) or the
    type of its shape in the decoder (``schema._STEP_SHAPE``), else ``dyn``."""
    shapes = getattr(schema, "_STEP_SHAPE", {})
    out = {}
    for name in fields.STEP_VARS:
        shape = shapes.get(name, "")
        if name in STEP_TYPES:
            out[name] = STEP_TYPES[name]
        elif fields.NESTED_VARS.get(name):
            out[name] = record(name, nullable=shape.endswith("?"), **{m: DYN for m in fields.NESTED_VARS[name]})
        else:
            out[name] = _SHAPES.get(shape, DYN)
    return out


def signal_types(signal: str, kinds: "frozenset[str] | list[str] | None" = None) -> dict[str, T]:
    """The type of every field a rule of ``signal`` reads (steps, events, health)."""
    if signal == "steps":
        return step_types()
    if signal == "events":
        known = sorted(k for k in (kinds or ()) if k in schema.Kind.__members__)
        out = {**EVENT_SCALARS, "payload": payload_type(kinds)}
        if known:  # a rule reads only events of its kinds
            out["kind"] = enum(*known)
            out["layer"] = enum(*{schema.KIND_INFO[schema.Kind[k]].layer.value for k in known})
        return out
    return dict(HEALTH_TYPES)


# -- parser -------------------------------------------------------------------------------------------
class _Unparsed(Exception):
    pass


@dataclass
class Node:
    """An expression tree node: ``op`` (lit, ident, select, call, index, list, map, unary, binary, cond),
    ``args`` (children or values), ``start``/``end`` offsets in the text."""

    op: str
    args: tuple
    start: int
    end: int


_REL = {"==", "!=", "<", "<=", ">", ">=", "in"}


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.toks = [t for t in tokens(text) if t[0] not in ("space", "comment")]
        self.i = 0

    def peek(self, k: int = 0) -> tuple[str, str, int]:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else ("eof", "", len(self.text))

    def take(self, s: "str | None" = None) -> tuple[str, str, int]:
        tok = self.peek()
        if s is not None and tok[1] != s:
            raise _Unparsed(s)
        if tok[0] == "eof":
            raise _Unparsed("eof")
        self.i += 1
        return tok

    def end_of(self) -> int:
        kind, s, off = self.toks[self.i - 1]
        return off + len(s)

    def parse(self) -> Node:
        node = self.expr()
        if self.peek()[0] != "eof":
            raise _Unparsed("trailing")
        return node

    def expr(self) -> Node:
        c = self.or_()
        if self.peek()[1] == "?":
            self.take()
            a = self.or_()
            self.take(":")
            b = self.expr()
            return Node("cond", (c, a, b), c.start, b.end)
        return c

    def or_(self) -> Node:
        left = self.and_()
        while self.peek()[1] == "||":
            self.take()
            right = self.and_()
            left = Node("binary", ("||", left, right), left.start, right.end)
        return left

    def and_(self) -> Node:
        left = self.rel()
        while self.peek()[1] == "&&":
            self.take()
            right = self.rel()
            left = Node("binary", ("&&", left, right), left.start, right.end)
        return left

    def rel_op(self) -> "str | None":
        s = self.peek()[1]
        if s in ("==", "!=", "<=", ">=", "in"):
            return s
        if s in ("<", ">"):
            return s
        return None

    def rel(self) -> Node:
        left = self.add()
        while (op := self.rel_op()) is not None:
            self.take()
            right = self.add()
            left = Node("binary", (op, left, right), left.start, right.end)
        return left

    def add(self) -> Node:
        left = self.mul()
        while self.peek()[1] in ("+", "-"):
            op = self.take()[1]
            right = self.mul()
            left = Node("binary", (op, left, right), left.start, right.end)
        return left

    def mul(self) -> Node:
        left = self.unary()
        while self.peek()[1] in ("*", "/", "%"):
            op = self.take()[1]
            right = self.unary()
            left = Node("binary", (op, left, right), left.start, right.end)
        return left

    def unary(self) -> Node:
        if self.peek()[1] in ("!", "-"):
            _, op, off = self.take()
            x = self.unary()
            if op == "-" and x.op == "lit":
                return Node("lit", x.args, off, x.end)
            return Node("unary", (op, x), off, x.end)
        return self.member()

    def args(self, close: str) -> list[Node]:
        out: list[Node] = []
        while self.peek()[1] != close:
            out.append(self.expr())
            if self.peek()[1] == ",":
                self.take()
            elif self.peek()[1] != close:
                raise _Unparsed(close)
        self.take(close)
        return out

    def member(self) -> Node:
        node = self.primary()
        while True:
            s = self.peek()[1]
            if s == ".":
                self.take()
                kind, name, off = self.take()
                if kind != "ident":
                    raise _Unparsed("member")
                if self.peek()[1] == "(":
                    self.take()
                    args = self.args(")")
                    node = Node("call", (node, name, tuple(args), off), node.start, self.end_of())
                else:
                    node = Node("select", (node, name, off), node.start, off + len(name))
            elif s == "[":
                self.take()
                idx = self.expr()
                self.take("]")
                node = Node("index", (node, idx), node.start, self.end_of())
            else:
                return node

    def primary(self) -> Node:
        kind, s, off = self.take()
        if kind in ("str", "num"):
            return Node("lit", (kind, s), off, off + len(s))
        if kind == "ident":
            if s in ("true", "false", "null"):
                return Node("lit", (kind, s), off, off + len(s))
            if self.peek()[1] == "(":
                self.take()
                args = self.args(")")
                return Node("call", (None, s, tuple(args), off), off, self.end_of())
            return Node("ident", (s,), off, off + len(s))
        if s == "(":
            node = self.expr()
            self.take(")")
            return Node(node.op, node.args, off, self.end_of())
        if s == "[":
            items = self.args("]")
            return Node("list", tuple(items), off, self.end_of())
        if s == "{":
            entries = []
            while self.peek()[1] != "}":
                k = self.expr()
                self.take(":")
                v = self.expr()
                entries.append((k, v))
                if self.peek()[1] == ",":
                    self.take()
                elif self.peek()[1] != "}":
                    raise _Unparsed("}")
            self.take("}")
            return Node("map", tuple(entries), off, self.end_of())
        raise _Unparsed(s)


def parse(text: str) -> "Node | None":
    """The expression tree of ``text``; None when this parser does not follow it (then nothing is
    checked: the CEL compiler is the judge of syntax)."""
    try:
        return _Parser(text).parse()
    except (_Unparsed, IndexError, RecursionError):
        return None


# -- inference ----------------------------------------------------------------------------------------
@dataclass
class TypeProblem:
    """A type error: ``message`` (with the fix), ``offset`` in the checked text, and ``macro``: the macro
    whose text holds it (None: the checked text itself)."""

    message: str
    offset: int
    macro: "str | None" = None
    whole: bool = False  # about the value of the whole expression (reported where the value starts)


_COMPREHENSIONS = {"all", "exists", "exists_one", "map", "filter"}
_LIT_TYPES = {"true": BOOL, "false": BOOL, "null": NULL}


def _lit_type(kind: str, s: str) -> T:
    if kind == "str":
        return BYTES if s[:1] in "bB" or s[:2].lower() in ("rb", "br") else STRING
    if kind == "num":
        if s[-1] in "uU":
            return UINT
        return DOUBLE if any(c in s for c in ".eE") and not s.lower().startswith("0x") else INT
    return _LIT_TYPES.get(s, DYN)


def _value_type(v: Any) -> T:
    if isinstance(v, bool):
        return BOOL
    return _PY.get(type(v), DYN)


def _join(a: T, b: T) -> T:
    """The type of a value that is ``a`` or ``b`` (a ternary's branches, a list's items)."""
    if a == b:
        return a
    if a.kind == "null":
        return b if b.kind != "record" else T(b.kind, b.elem, b.key, b.fields, True, b.what)
    if b.kind == "null":
        return _join(b, a)
    return DYN


class Checker:
    """Infers types of expressions over ``env`` (name -> :class:`T`), with ``macros`` (name -> text,
    typed by checking their expansion) and ``lists`` (name -> values)."""

    def __init__(self, env: dict[str, T], macros: "dict[str, str] | None" = None, lists: "dict | None" = None):
        self.env = env
        self.macros = macros or {}
        self.lists = lists or {}
        self._macro_types: dict[str, T] = {}
        self._stack: list[str] = []
        self.problems: list[TypeProblem] = []
        self._macro: "str | None" = None
        self.text = ""
        self._on = self._aggregate = ""

    # entry points
    def check(self, text: str, want: str = "bool", on: str = "", aggregate: str = "") -> list[TypeProblem]:
        """Problems of ``text``; ``want``: ``bool`` (a condition), ``number`` (a threshold's ``of``),
        ``any`` (a key, a foreach). ``on`` (``a steps record``) and ``aggregate`` (``max``) name the
        record and the aggregate in messages."""
        self._on, self._aggregate = on, aggregate
        self.problems = []
        t, node = self._check_text(text, None)
        if node is not None and not self.problems:
            self.text = text
            self._want(t, want, node)
        self._on = self._aggregate = ""
        return self.problems

    def type_of(self, text: str) -> T:
        """The type of ``text`` (``dyn`` when it cannot be told)."""
        saved = self.problems
        self.problems = []
        t, _ = self._check_text(text, None)
        self.problems = saved
        return t

    def _want(self, t: T, want: str, node: Node) -> None:
        on = f" on {self._on}" if self._on else ""
        if want == "bool" and t.kind not in ("bool", "dyn"):
            eg = _compare_example(self._src(node), t)
            self._add(
                f"gives {article(t)}, not true or false{',' + on if on else ''}: a rule matches only where its condition is true "
                f"(compare the value, e.g. `{eg}`)",
                node.start,
                True,
            )
        if want == "number" and t.kind not in NUMERIC | {"dyn"}:
            agg = f"aggregate '{self._aggregate}'" if self._aggregate else "an aggregate"
            self._add(f"gives {article(t)}{on}; {agg} needs a number (an int or a double)", node.start, True)

    def _check_text(self, text: str, macro: "str | None") -> tuple[T, "Node | None"]:
        node = parse(text)
        if node is None:
            return DYN, None
        saved = (self.text, self._macro)
        self.text, self._macro = text, macro
        try:
            return self.infer(node, {}), node
        finally:
            self.text, self._macro = saved

    def _add(self, msg: str, off: int, whole: bool = False) -> None:
        p = TypeProblem(msg, off, self._macro, whole)
        if all((q.message, q.offset, q.macro) != (p.message, p.offset, p.macro) for q in self.problems):
            self.problems.append(p)

    def _src(self, node: Node) -> str:
        return " ".join(self.text[node.start : node.end].split())

    def _macro_type(self, name: str) -> T:
        if name in self._macro_types:
            return self._macro_types[name]
        if name in self._stack:
            return DYN  # a cycle: reported by the loader
        self._stack.append(name)
        try:
            t, _ = self._check_text(self.macros[name], name)
        finally:
            self._stack.pop()
        self._macro_types[name] = t
        return t

    # inference
    def infer(self, n: Node, scope: dict[str, T]) -> T:
        fn = getattr(self, "_" + n.op)
        return fn(n, scope)

    def _lit(self, n: Node, scope: dict[str, T]) -> T:
        return _lit_type(*n.args)

    def _ident(self, n: Node, scope: dict[str, T]) -> T:
        name = n.args[0]
        if name in scope:
            return scope[name]
        if name in self.env:
            return self.env[name]
        if name in self.macros:
            return self._macro_type(name)
        if name in self.lists:
            items = {_value_type(v) for v in self.lists[name]}
            return list_of(items.pop() if len(items) == 1 else DYN)
        if name in ("int", "uint", "double", "string", "bool", "bytes", "list", "map", "null_type", "type"):
            return TYPE
        return DYN  # unknown names: reported by rules.expr.unknown_references

    def _select(self, n: Node, scope: dict[str, T]) -> T:
        base, name, off = n.args
        t = self.infer(base, scope)
        return self._member(t, name, off, base)

    def _member(self, t: T, name: str, off: int, base: Node) -> T:
        if t.kind == "record":
            m = t.member(name)
            if m is None:
                near = difflib.get_close_matches(name, t.names, n=1)
                hint = f"; did you mean '{near[0]}'?" if near else ""
                where = t.what or self._src(base)
                self._add(
                    f"unknown field '{self._src(base)}.{name}': {where} has {', '.join(t.names) or 'no fields'}{hint}",
                    off,
                )
                return DYN
            return m
        if t.kind == "map":
            return t.elem or DYN
        if t.kind in ("dyn", "null"):
            return DYN
        self._add(
            f"'{self._src(base)}' is {article(t)}, which has no fields: `.{name}` fails on every record",
            off,
        )
        return DYN

    def _index(self, n: Node, scope: dict[str, T]) -> T:
        base, idx = n.args
        t, it = self.infer(base, scope), self.infer(idx, scope)
        if t.kind == "list":
            if it.kind not in ("int", "uint", "dyn"):
                self._add(f"a list index must be an int, not {article(it)}: `{self._src(n)}` fails", idx.start)
            return t.elem or DYN
        if t.kind == "map":
            return t.elem or DYN
        if t.kind == "record":
            if idx.op == "lit" and it.kind == "string":
                return self._member(t, _unquote(idx.args[1]), idx.start, base)
            return t.elem or DYN
        if t.kind == "dyn":
            return DYN
        self._add(f"'{self._src(base)}' is {article(t)}: it cannot be indexed (`{self._src(n)}` fails)", idx.start)
        return DYN

    def _list(self, n: Node, scope: dict[str, T]) -> T:
        elem: "T | None" = None
        for item in n.args:
            t = self.infer(item, scope)
            elem = t if elem is None else _join(elem, t)
        return list_of(elem or DYN)

    def _map(self, n: Node, scope: dict[str, T]) -> T:
        key = val = None
        for k, v in n.args:
            kt, vt = self.infer(k, scope), self.infer(v, scope)
            key = kt if key is None else _join(key, kt)
            val = vt if val is None else _join(val, vt)
        return map_of(key or DYN, val or DYN)

    def _unary(self, n: Node, scope: dict[str, T]) -> T:
        op, x = n.args
        t = self.infer(x, scope)
        if op == "!":
            if t.kind not in ("bool", "dyn"):
                self._add(f"`!` needs a bool, but '{self._src(x)}' is {article(t)}: it fails on every record", n.start)
                return DYN
            return BOOL
        if t.kind in ("int", "double", "duration", "dyn"):
            return t
        self._add(f"`-` needs an int or a double, but '{self._src(x)}' is {article(t)}", n.start)
        return DYN

    def _cond(self, n: Node, scope: dict[str, T]) -> T:
        c, a, b = n.args
        ct = self.infer(c, scope)
        if ct.kind not in ("bool", "dyn"):
            self._add(
                f"the test of `? :` must be a bool, but '{self._src(c)}' is {article(ct)}: it fails on every record",
                c.start,
            )
        return _join(self.infer(a, scope), self.infer(b, scope))

    def _binary(self, n: Node, scope: dict[str, T]) -> T:
        op, a, b = n.args
        at, bt = self.infer(a, scope), self.infer(b, scope)
        if op in ("&&", "||"):
            for side, t in ((a, at), (b, bt)):
                if t.kind not in ("bool", "dyn"):
                    self._add(
                        f"`{op}` needs bools, but '{self._src(side)}' is {article(t)} (compare it, e.g. "
                        f"`{_compare_example(self._src(side), t)}`)",
                        side.start,
                    )
            return BOOL
        if op in ("==", "!="):
            for field_t, lit in ((at, b), (bt, a)):
                if field_t.values and lit.op == "lit" and lit.args[0] == "str":
                    value = _unquote(lit.args[1])
                    if value not in field_t.values:
                        other = a if lit is b else b
                        near = difflib.get_close_matches(value, sorted(field_t.values), n=1)
                        hint = f"; did you mean '{near[0]}'?" if near else ""
                        effect = "false" if op == "==" else "true"
                        self._add(
                            f"`{self._src(n)}` is {effect} on every record: '{self._src(other)}' is one of "
                            f"{', '.join(sorted(field_t.values))}{hint}",
                            lit.start,
                        )
            if not _comparable(at, bt):
                effect = "false" if op == "==" else "true"
                self._add(
                    f"`{self._src(n)}` compares {article(at)} with {article(bt)}: CEL never finds them equal, "
                    f"so it is {effect} on every record; {_fix(at, bt, a, b, self._src)}",
                    n.start,
                )
            return BOOL
        if op in ("<", "<=", ">", ">="):
            if not _orderable(at, bt):
                self._add(
                    f"`{self._src(n)}` orders {article(at)} and {article(bt)}: CEL has no such comparison, so it "
                    f"fails on every record (no match); {_fix(at, bt, a, b, self._src)}",
                    n.start,
                )
            return BOOL
        if op == "in":
            if at.values and b.op == "list":
                for item in b.args:
                    if item.op == "lit" and item.args[0] == "str" and _unquote(item.args[1]) not in at.values:
                        value = _unquote(item.args[1])
                        near = difflib.get_close_matches(value, sorted(at.values), n=1)
                        hint = f"; did you mean '{near[0]}'?" if near else ""
                        self._add(
                            f"'{value}' in `{self._src(n)}` never matches: '{self._src(a)}' is one of "
                            f"{', '.join(sorted(at.values))}{hint}",
                            item.start,
                        )
            if bt.kind == "list":
                if bt.elem is not None and not _comparable(at, bt.elem):
                    self._add(
                        f"`{self._src(n)}` looks for {article(at)} in a list of {_plural(bt.elem)}: false on "
                        "every record",
                        n.start,
                    )
            elif bt.kind == "map":
                if bt.key is not None and not _comparable(at, bt.key):
                    self._add(
                        f"`{self._src(n)}` looks for {article(at)} among map keys that are {_plural(bt.key)}: "
                        "false on every record",
                        n.start,
                    )
            elif bt.kind not in ("dyn", "record"):
                self._add(
                    f"`in` needs a list or a map on its right, but '{self._src(b)}' is {article(bt)}: it fails on "
                    "every record",
                    b.start,
                )
            return BOOL
        return self._arith(n, op, a, b, at, bt)

    def _arith(self, n: Node, op: str, a: Node, b: Node, at: T, bt: T) -> T:
        if "dyn" in (at.kind, bt.kind):
            return DYN
        if at.kind in NUMERIC and bt.kind in NUMERIC:
            if at.kind != bt.kind:
                self._add(
                    f"`{self._src(n)}` mixes {article(at)} and {article(bt)}: CEL has no implicit int/double "
                    f"conversion, so it fails on every record; {_conv_fix(at, bt, a, b, op, self._src)}",
                    n.start,
                )
                return DYN
            if op == "%" and at.kind == "double":
                self._add(f"`{self._src(n)}`: `%` is defined for ints only (not doubles)", n.start)
                return DYN
            return at
        if op == "+" and at.kind == bt.kind and at.kind in ("string", "bytes", "list"):
            if at.kind == "list":
                return list_of(_join(at.elem or DYN, bt.elem or DYN))
            return at
        if {at.kind, bt.kind} <= {"duration", "timestamp"} and op in ("+", "-"):
            if at.kind == bt.kind == "timestamp":
                return DURATION if op == "-" else DYN
            return TIMESTAMP if "timestamp" in (at.kind, bt.kind) else DURATION
        self._add(
            f"`{self._src(n)}`: `{op}` is not defined for {article(at)} and {article(bt)}, so it fails on every "
            "record"
            + ("; to join text, both sides must be strings" if op == "+" and "string" in (at.kind, bt.kind) else ""),
            n.start,
        )
        return DYN

    def _call(self, n: Node, scope: dict[str, T]) -> T:
        target, name, args, off = n.args
        if target is not None and name in _COMPREHENSIONS and len(args) in (2, 3) and args[0].op == "ident":
            return self._comprehension(n, scope)
        tt = self.infer(target, scope) if target is not None else None
        if name == "has" and target is None and len(args) == 1:
            arg = args[0]
            if arg.op == "select":
                base_t = self.infer(arg.args[0], scope)
                if base_t.kind == "record" and base_t.member(arg.args[1]) is None:
                    self._member(base_t, arg.args[1], arg.args[2], arg.args[0])
            return BOOL
        ats = [self.infer(x, scope) for x in args]
        if name == "size":
            x, xt = (target, tt) if target is not None else (args[0] if args else None, ats[0] if ats else DYN)
            if x is not None and xt is not None and xt.kind not in ("string", "bytes", "list", "map", "record", "dyn"):
                self._add(f"size() needs a string, list or map, but '{self._src(x)}' is {article(xt)}", x.start)
            return INT
        if name in ("contains", "startsWith", "endsWith", "matches"):
            recv = tt if target is not None else (ats[0] if ats else DYN)
            rest = ats if target is not None else ats[1:]
            rnode = target if target is not None else (args[0] if args else n)
            if recv is not None and recv.kind not in ("string", "dyn"):
                self._add(
                    f"{name}() is a string function, but '{self._src(rnode)}' is {article(recv)}: it fails on every "
                    "record",
                    rnode.start,
                )
            for x, xt in zip(args[-len(rest) :] if rest else [], rest):
                if xt.kind not in ("string", "dyn"):
                    self._add(f"{name}() needs a string argument, but '{self._src(x)}' is {article(xt)}", x.start)
                elif name == "matches" and x.op == "lit" and x.args[0] == "str":
                    why = regex_problem(x.args[1])
                    if why is not None:  # the engine compiles it on each call: it would fail on every record
                        self._add(
                            f"matches(): {x.args[1]} is no regex the engine accepts ({why}; its syntax is RE2's), so "
                            "the call fails on every record",
                            x.start,
                        )
            return BOOL
        conv = {"int": INT, "uint": UINT, "double": DOUBLE, "string": STRING, "bytes": BYTES, "bool": BOOL}
        if name in conv and target is None:
            return conv[name]
        if name == "duration":
            return DURATION
        if name == "timestamp":
            return TIMESTAMP
        if name == "type":
            return TYPE
        if name == "dyn" and ats:
            return DYN
        if name.startswith("get"):
            return INT
        return DYN

    def _comprehension(self, n: Node, scope: dict[str, T]) -> T:
        target, name, args, off = n.args
        rt = self.infer(target, scope)
        if rt.kind == "list":
            var_t = rt.elem or DYN
        elif rt.kind == "map":
            var_t = rt.key or DYN
        elif rt.kind == "record":
            var_t = LAYER if rt.elem is not None else STRING
        elif rt.kind == "dyn":
            var_t = DYN
        else:
            self._add(
                f"{name}() ranges over a list or a map, but '{self._src(target)}' is {article(rt)}: it fails on "
                "every record",
                off,
            )
            var_t = DYN
        inner = {**scope, args[0].args[0]: var_t}
        types = [self.infer(x, inner) for x in args[1:]]
        preds = args[1:] if name != "map" else args[1:-1]
        for x, t in zip(args[1:], types):
            if x in preds and t.kind not in ("bool", "dyn"):
                self._add(
                    f"the predicate of {name}() must be a bool, but '{self._src(x)}' is {article(t)}: it fails on "
                    "every record",
                    x.start,
                )
        if name in ("all", "exists", "exists_one"):
            return BOOL
        if name == "filter":
            return list_of(var_t) if rt.kind != "list" else rt
        return list_of(types[-1])


def _compare_example(src: str, t: T) -> str:
    """A comparison that turns ``src`` (of type ``t``) into a bool, for messages."""
    if t.kind in NUMERIC:
        return f"{src} > 0"
    if t.kind == "string":
        return f"{src} == '...'"
    if t.kind in ("list", "map", "record"):
        return f"size({src}) > 0"
    return "duration_us > 20.0"


def _unquote(s: str) -> str:
    return s[1:-1] if len(s) >= 2 and s[0] in "'\"" else s


def _plural(t: T) -> str:
    return {"int": "ints", "uint": "uints", "double": "doubles", "string": "strings", "bool": "bools"}.get(
        t.kind, article(t)
    )


def _comparable(a: T, b: T) -> bool:
    """Whether ``a == b`` can ever be true (CEL: numbers compare across int/uint/double)."""
    if "dyn" in (a.kind, b.kind) or "null" in (a.kind, b.kind):
        return True
    if a.kind in NUMERIC and b.kind in NUMERIC:
        return True
    kinds = {a.kind, b.kind}
    if kinds <= {"map", "record"}:
        return True
    if a.kind != b.kind:
        return False
    if a.kind == "list" and a.elem is not None and b.elem is not None:
        return _comparable(a.elem, b.elem)
    return True


def _orderable(a: T, b: T) -> bool:
    if "dyn" in (a.kind, b.kind):
        return True
    if a.kind in NUMERIC and b.kind in NUMERIC:
        return True
    return a.kind == b.kind and a.kind in ("string", "bytes", "bool", "duration", "timestamp")


def _fix(at: T, bt: T, a: Node, b: Node, src) -> str:
    """A fix for a comparison of ``a`` (of type ``at``) with ``b``."""
    lit, other, ot = (b, a, at) if b.op == "lit" else (a, b, bt) if a.op == "lit" else (None, None, None)
    if lit is not None and ot is not None:
        if ot.kind == "string":
            value = src(lit).strip("'\"")
            return f"'{src(other)}' is a string: compare it with a string, e.g. '{value}'"
        if ot.kind in NUMERIC:
            value = src(lit).strip("'\"")
            return f"'{src(other)}' is {article(ot)}: compare it with a number, e.g. {value if _is_num(value) else 0}"
        return f"'{src(other)}' is {article(ot)}: compare it with {article(ot)}"
    return "convert one side (int(), double(), string()) or compare fields of the same type"


def _is_num(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _conv_fix(at: T, bt: T, a: Node, b: Node, op: str, src) -> str:
    """A fix for ``a op b`` with two different numeric types: convert the int side to double."""
    target = "double" if "double" in (at.kind, bt.kind) else "int"
    if b.op == "lit" and bt.kind != target:
        lit = src(b)
        return f"write `{src(a)} {op} {_as(lit, target)}`"
    if a.op == "lit" and at.kind != target:
        return f"write `{_as(src(a), target)} {op} {src(b)}`"
    if at.kind != target:
        return f"write `{target}({src(a)}) {op} {src(b)}`"
    return f"write `{src(a)} {op} {target}({src(b)})`"


def _as(lit: str, target: str) -> str:
    text = lit.rstrip("uU")
    if target == "double":
        return text + ".0" if text.lstrip("-").isdigit() else f"double({lit})"
    return f"int({lit})"
