"""The bounded Jinja2 environment of annotation templates: what one render of one annotation may cost.

A rule's annotations are rendered on every alert change, inside the engine's evaluation, so one crafted
template must not stall ``rules serve`` or take gigabytes. Jinja's sandbox keeps templates away from
Python internals but not from work: ``("x"*60000)|replace("x", "x"*60000)`` makes 3.6 GB in one call,
``"x"|center(10**9)`` a gigabyte, a ``~`` doubling in a loop grows exponentially, a macro's loop called in a
loop or a ``recursive`` loop multiplies iterations (tmpl24's walk). The bound is in four layers:

1. **Output**: the text of one render is at most :data:`MAX_ANNOTATION_BYTES` (UTF-8); a longer one is cut
   there and ends with :data:`CUT_MARK` (rendering stops at the cut).
2. **Every intermediate value**: the result of every filter, call, method and operator (``+ * ** % ~``)
   is at most :data:`MAX_TEMPLATE_TEXT` characters or items (one that exceeds it is refused), and a
   container's text (what ``str()`` of it makes, nested containers and their shared items counted every
   time they appear) is at most :data:`MAX_TEMPLATE_TREE` wherever a value becomes text (``{{ }}``, ``~``,
   ``join``, ``%``/``format``, filters that take text). The operations that can make more than they are given
   from small inputs are checked *before* they run, on what they would make: the width/fill/count arguments
   of ``center``/``ljust``/``rjust``/``zfill``/``indent``/``expandtabs``/``to_bytes``/``batch``/``slice``/
   ``lipsum``/``range``, the products of ``replace``/``join``/``translate``/``sum``/``wordwrap``/``*``/
   ``**``, and the widths of printf (``%``, ``format``) and ``str.format`` fields.
3. **Work**: one render takes at most :data:`MAX_RENDER_STEPS` steps (a loop iteration, including those of
   macros and ``recursive`` loops, an item of a lazily made sequence, a filter, call, operator or output)
   and reads or makes at most :data:`MAX_RENDER_WORK` characters or items; a counter on the render's
   context, checked at every step, no signal or thread.
4. **CPU**: a backstop on the render's thread CPU time (:data:`MAX_RENDER_CPU_S`), read at most every 16
   steps and after every step that did at least 16,384 units of work.

Past a bound a render raises ``jinja2.exceptions.SecurityError`` naming the bound (the engine shows it as
the annotation, naming the rule, and counts ``template_errors``); :func:`static_problems` finds at load what
is visible in the template's text (a constant ``center(10**9)``, ``range(10**6)``, ``"x" * 10**9``).
"""

from __future__ import annotations

import functools
import re
import time
import types
from collections.abc import Iterator
from functools import update_wrapper
from typing import Any

import jinja2
import jinja2.exceptions
import jinja2.nodes as nodes
from jinja2.filters import make_attrgetter
from jinja2.runtime import Context, LoopContext, markup_join
from jinja2.sandbox import SandboxedEnvironment, SandboxedEscapeFormatter, SandboxedFormatter
from jinja2.utils import Namespace, _PassArg, generate_lorem_ipsum, pass_context
from jinja2.visitor import NodeTransformer
from markupsafe import Markup

SecurityError = jinja2.exceptions.SecurityError

MAX_TEMPLATE_TEXT = 65_536
"""Characters (or items) of any string, list, tuple, dict or bytes a template makes (by ``*``, ``+``, ``~``, a
filter, a call or a method): an annotation is a line of text, and ``"x" * 10**9`` in one took a gigabyte and
stalled ``rules serve`` (newuser23)."""
MAX_TEMPLATE_TREE = 1_048_576
"""Characters a value may become as text (``str()`` of a list holds its items' texts, a list holding one big
string 100 times holds it 100 times): the record's own lists fit (a summary is under the broker's 1 MB)."""
MAX_ANNOTATION_BYTES = 65_536
"""UTF-8 bytes of one rendered annotation; a longer render is cut there, ending with :data:`CUT_MARK`."""
CUT_MARK = " [cut at 64 KiB]"
"""The end of an annotation cut at :data:`MAX_ANNOTATION_BYTES`."""
MAX_TEMPLATE_POW_BITS = 4_096
"""Bits of an integer a template's ``**`` or ``*`` may make (``10**400000`` takes seconds to print)."""
MAX_TEMPLATE_RANGE = 10_000
"""Items of a template's ``range()`` (Jinja's sandbox allows 100,000)."""
MAX_LOOP_DEPTH = 1
"""``{% for %}`` loops nested in one annotation: one loop over a record's list (``blame``, ``hang.hosts``)
is what the builtin pack needs; two nested ones over ranges or a wide job's lists multiply into minutes of
rendering per alert change, with the engine's evaluation waiting."""
MAX_RENDER_STEPS = 100_000
"""Steps of one render: loop iterations (macros' and ``recursive`` loops' too), items of lazily made
sequences, filters, calls, operators and ``{{ }}`` outputs. The builtin pack's renders take 5-60."""
MAX_RENDER_WORK = 4_194_304
"""Characters or items one render's filters, calls, operators and outputs read and make, in all."""
MAX_RENDER_CPU_S = 0.5
"""Thread CPU seconds of one render (a backstop: the step and work bounds end every known attack first)."""

_CPU_EVERY = 16  # steps between reads of the thread's CPU time
_CPU_WORK = 16_384  # a step with at least this much work reads it too
_SIZED = (str, bytes, bytearray, list, tuple, dict, set, frozenset)
_SCALARS = (str, int, float, type(None))


class RenderBudget:
    """What one render has spent: steps, work (characters or items read and made), and the thread CPU time
    at its start. :meth:`charge` raises ``SecurityError`` past a bound."""

    __slots__ = ("steps", "work", "cpu0", "next_check", "texts")

    def __init__(self) -> None:
        self.steps = 0
        self.work = 0
        self.cpu0 = -1.0  # read at the first CPU check: a render of fewer steps does not read the clock
        self.next_check = _CPU_EVERY
        self.texts: dict[int, tuple[Any, int]] = {}  # id -> (container, text size): kept alive, ids stay unique

    def charge(self, what: str, work: int = 0) -> None:
        """Count one step of ``what`` (a short name for the error) that read or made ``work`` units."""
        self.steps += 1
        self.work += work
        if self.steps > MAX_RENDER_STEPS:
            raise SecurityError(
                f"{what}: the render took more than {MAX_RENDER_STEPS:,} steps (loop iterations, calls, filters, "
                "operators)"
            )
        if self.work > MAX_RENDER_WORK:
            raise SecurityError(
                f"{what}: the render read or made more than {MAX_RENDER_WORK:,} characters or items in all"
            )
        if self.steps >= self.next_check or work >= _CPU_WORK:
            self.next_check = self.steps + _CPU_EVERY
            now = time.thread_time()
            if self.cpu0 < 0:
                self.cpu0 = now
            elif now - self.cpu0 > MAX_RENDER_CPU_S:
                raise SecurityError(f"{what}: the render took more than {MAX_RENDER_CPU_S} s of CPU")

    def made(self, what: str, work: int) -> None:
        """Count ``work`` units more for the step of ``what`` just charged."""
        self.work += work
        if self.work > MAX_RENDER_WORK:
            raise SecurityError(
                f"{what}: the render read or made more than {MAX_RENDER_WORK:,} characters or items in all"
            )


def _budget(context: Any) -> RenderBudget:
    """The budget of the render ``context`` belongs to, made at its first use (macros, loops and calls of the
    render share the context)."""
    budget = getattr(context, "budget", None)
    if budget is None:
        budget = RenderBudget()
        try:
            context.budget = budget
        except AttributeError:  # not a BoundedContext: a budget per call, the sizes still checked
            pass
    return budget


class BoundedContext(Context):
    """A render's context, carrying its :class:`RenderBudget` (made at its first use)."""

    budget: RenderBudget | None = None


def size(value: Any) -> int:
    """Characters or items of ``value`` (0 for a value that has no length, or a lazy one)."""
    return len(value) if isinstance(value, _SIZED) else 0


def _too_big(what: str, n: int, bound: int = MAX_TEMPLATE_TEXT, unit: str = "characters or items") -> SecurityError:
    return SecurityError(f"{what} would make {n:,} {unit} (at most {bound:,})")


def text_size(value: Any, budget: RenderBudget | None = None, limit: int = MAX_TEMPLATE_TREE) -> int:
    """An upper bound of ``len(str(value))`` (within a few characters per item), counting nested containers'
    items as ``str()`` does: every time they appear. Stops past ``limit`` (returns more than ``limit``).
    Iterative (a list nested 100,000 deep costs no recursion); a container's size is remembered in
    ``budget`` for the rest of the render."""
    if isinstance(value, (str, bytes, bytearray)):
        return len(value)
    if not isinstance(value, (list, tuple, dict, set, frozenset, Namespace)):
        return value.bit_length() // 3 + 2 if isinstance(value, int) else 24
    memo = budget.texts if budget is not None else {}
    hit = memo.get(id(value))
    if hit is not None and hit[0] is value:
        return hit[1]
    total = 0
    stack: list[Any] = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v) + 4  # quotes and ", " around an item
        elif isinstance(v, (bytes, bytearray)):
            total += len(v) * 4 + 6
        elif isinstance(v, Namespace):
            stack.append(dict(v._Namespace__attrs))  # type: ignore[attr-defined]  # its repr is its attributes'
        elif isinstance(v, (dict, list, tuple, set, frozenset)):
            got = memo.get(id(v))
            if got is not None and got[0] is v:  # a container met before in this render: its size is known
                total += got[1]
            elif isinstance(v, dict):
                total += 2 + 2 * len(v)
                stack.extend(v.keys())
                stack.extend(v.values())
            else:
                total += 2 + len(v)
                stack.extend(v)
        elif isinstance(v, int) and not isinstance(v, bool):
            total += v.bit_length() // 3 + 2
        else:
            total += 24  # a float, bool, None, undefined: short
        if total > limit:
            return total
    if budget is not None:
        memo[id(value)] = (value, total)
    return total


def check_text(value: Any, what: str, budget: RenderBudget | None) -> None:
    """Refuse ``value`` where it becomes text if its text would pass :data:`MAX_TEMPLATE_TREE`."""
    if isinstance(value, (list, tuple, dict, set, frozenset, Namespace)):
        n = text_size(value, budget)
        if n > MAX_TEMPLATE_TREE:
            raise SecurityError(f"{what}: a value of more than {MAX_TEMPLATE_TREE:,} characters as text")


def check_result(what: str, result: Any, inputs: tuple = ()) -> None:
    """Refuse a made ``result`` longer than :data:`MAX_TEMPLATE_TEXT` (one of ``inputs`` passed through is
    not made: a record's own list may be longer)."""
    n = size(result)
    if n > MAX_TEMPLATE_TEXT and not any(result is x for x in inputs):
        raise SecurityError(f"{what} made {n:,} characters or items (at most {MAX_TEMPLATE_TEXT:,})")


def _int_arg(what: str, n: Any, bound: int = MAX_TEMPLATE_TEXT) -> None:
    if isinstance(n, int) and n > bound:
        raise _too_big(what, n, bound)


# -- what amplifying operations would make, checked before they run ---------------------------------------

_PRINTF = re.compile(r"%(?:\(([^)]*)\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d*))?[hlL]?(.)", re.S)
_SPEC = re.compile(r"(?:.?[<>=^])?[-+ ]?z?#?0?(\d*)[,_]?(?:\.(\d*))?[a-zA-Z%]?", re.S)


def _num(digits: str | None) -> int:
    if not digits:
        return 0
    return int(digits) if len(digits) <= 9 else MAX_TEMPLATE_TREE + 1


def _field_size(v: Any, conv: str, budget: RenderBudget | None) -> int:
    if conv in "sra":
        check_text(v, f"'%{conv}'", budget)
        return text_size(v, budget) * (4 if conv in "ra" else 1)
    if isinstance(v, int):
        return v.bit_length() // 3 + 24
    return 340  # a float in %f: at most 309 digits and a point


@functools.lru_cache(maxsize=512)
def _printf_fields(fmt: str) -> tuple[tuple[str | None, str | None, str | None, str], ...]:
    """The conversions of a printf format: (key, width, precision, type) each, ``%%`` left out (cached: a
    template's formats are few and constant)."""
    return tuple(m.groups() for m in _PRINTF.finditer(fmt) if m.group(4) != "%")


def printf_size(fmt: str, args: Any, budget: RenderBudget | None = None) -> int:
    """An upper bound of ``len(fmt % args)``; raises ``SecurityError`` past :data:`MAX_TEMPLATE_TEXT`."""
    fields = (
        _printf_fields(fmt)
        if len(fmt) <= 256
        else tuple(m.groups() for m in _PRINTF.finditer(fmt) if m.group(4) != "%")
    )
    if len(fields) == 1 and not isinstance(args, (tuple, dict)):  # '%.1f' % value: the common case
        key, width, prec, conv = fields[0]
        if width != "*" and prec != "*" and key is None:
            total = len(fmt) + max(_num(width), _num(prec) + _field_size(args, conv, budget))
            if total > MAX_TEMPLATE_TEXT:
                raise _too_big("'%' formatting", total)
            return total
    seq = list(args) if isinstance(args, tuple) else [args]
    total, i = len(fmt), 0

    def take() -> Any:
        nonlocal i
        i += 1
        return seq[i - 1] if i - 1 < len(seq) else None

    for key, width, prec, conv in fields:
        w = (abs(v) if isinstance(v := take(), int) else 0) if width == "*" else _num(width)
        p = (abs(v) if isinstance(v := take(), int) else 0) if prec == "*" else _num(prec)
        if key is not None:
            v = args.get(key) if isinstance(args, dict) else None
        else:
            v = take()
        total += max(w, p + _field_size(v, conv, budget))
        if total > MAX_TEMPLATE_TEXT:
            raise _too_big("'%' formatting", total)
    return total


def spec_size(spec: str) -> int:
    """Characters a ``str.format`` field of format spec ``spec`` pads or extends to (width + precision)."""
    m = _SPEC.fullmatch(spec)
    return _num(m.group(1)) + _num(m.group(2)) if m else 0


class _Formatter(SandboxedFormatter):
    """``str.format``/``format_map`` of templates: Jinja's sandboxed formatter, with each field's width and
    precision and the made text checked before each field is made."""

    def __init__(self, env: jinja2.Environment, **kwargs: Any) -> None:
        super().__init__(env, **kwargs)
        self._made = 0

    def format_field(self, value: Any, format_spec: str) -> Any:
        check_text(value, "str.format", None)
        would = self._made + spec_size(format_spec) + (len(value) if isinstance(value, str) else 0)
        if would > MAX_TEMPLATE_TEXT:
            raise _too_big("str.format", would)
        out = super().format_field(value, format_spec)
        self._made += len(out)
        if self._made > MAX_TEMPLATE_TEXT:
            raise _too_big("str.format", self._made)
        return out


class _EscapeFormatter(_Formatter, SandboxedEscapeFormatter):
    pass


def _replace_size(s: Any, old: Any, new: Any, count: Any = -1) -> int:
    n = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    return len(s) + n * max(len(new) - len(old), 0)


def _join_texts(items: list, sep: Any, what: str, budget: RenderBudget) -> list[str]:
    """``str()`` of each of ``items``, refusing before the join what ``sep.join`` would make past the bound."""
    texts, total = [], max(len(items) - 1, 0) * len(sep)
    for it in items:
        check_text(it, what, budget)
        t = it if isinstance(it, str) else str(it)
        total += len(t)
        if total > MAX_TEMPLATE_TEXT:
            raise _too_big(what, total)
        texts.append(t)
    budget.charge(what, total)
    return texts


def _method_check(obj: Any, args: tuple, kwargs: dict, budget: RenderBudget) -> Any:
    """Before a call of a builtin method of a string, bytes or integer: refuse what it would make past
    :data:`MAX_TEMPLATE_TEXT`. Returns the arguments to call with (``join``'s iterable as a list)."""
    owner = getattr(obj, "__self__", None)
    name = getattr(obj, "__name__", "")
    if isinstance(owner, (str, bytes, bytearray)):
        what = f"{type(owner).__name__}.{name}"
        a = list(args)
        if name in ("center", "ljust", "rjust", "zfill") and a:
            _int_arg(what, a[0])
        elif name == "expandtabs":
            tab = a[0] if a else kwargs.get("tabsize", 8)
            if isinstance(tab, int) and len(owner) + owner.count("\t" if isinstance(owner, str) else b"\t") * tab > (
                MAX_TEMPLATE_TEXT
            ):
                raise _too_big(what, len(owner) * max(tab, 1))
        elif name == "replace" and len(a) >= 2 and isinstance(a[0], type(owner)) and isinstance(a[1], type(owner)):
            n = _replace_size(owner, a[0], a[1], a[2] if len(a) > 2 else kwargs.get("count", -1))
            if n > MAX_TEMPLATE_TEXT:
                raise _too_big(what, n)
        elif name == "join" and a:
            items = list(_Counted(a[0], budget, what)) if not isinstance(a[0], (list, tuple)) else a[0]
            if isinstance(owner, str):
                a[0] = _join_texts(list(items), owner, what, budget)
            else:
                n = sum(size(x) for x in items) + max(len(items) - 1, 0) * len(owner)
                if n > MAX_TEMPLATE_TEXT:
                    raise _too_big(what, n)
                a[0] = items
        elif name == "translate" and a and isinstance(a[0], dict):
            most = max((size(v) for v in a[0].values()), default=1)
            if len(owner) * max(most, 1) > MAX_TEMPLATE_TEXT:
                raise _too_big(what, len(owner) * most)
        return tuple(a)
    if isinstance(owner, int) and name == "to_bytes":
        _int_arg("int.to_bytes", args[0] if args else kwargs.get("length", 1))
    return args


def check_binop(operator: str, left: Any, right: Any, budget: RenderBudget | None = None) -> None:
    """Before ``left <operator> right`` (``*``, ``**``, ``+``, ``%``): refuse a string, bytes, list or tuple
    past :data:`MAX_TEMPLATE_TEXT`, an integer past :data:`MAX_TEMPLATE_POW_BITS` bits, a printf past the
    text bound."""
    seqs = (str, bytes, list, tuple)
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, seqs) and isinstance(n, int) and len(seq) * max(n, 0) > MAX_TEMPLATE_TEXT:
                raise _too_big("'*'", len(seq) * n)
        if isinstance(left, int) and isinstance(right, int):
            bits = left.bit_length() + right.bit_length()
            if bits > MAX_TEMPLATE_POW_BITS:
                raise _too_big("'*'", bits, MAX_TEMPLATE_POW_BITS, "bits of an integer")
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
        bits = max(left.bit_length(), 1) * right
        if abs(left) > 1 and bits > MAX_TEMPLATE_POW_BITS:
            raise SecurityError(f"'**' would make an integer of ~{bits:,} bits (at most {MAX_TEMPLATE_POW_BITS:,})")
    elif operator == "+" and isinstance(left, seqs) and isinstance(right, seqs):
        if len(left) + len(right) > MAX_TEMPLATE_TEXT:
            raise _too_big("'+'", len(left) + len(right))
    elif operator == "%" and isinstance(left, str):
        printf_size(left, right, budget)


# -- filters ------------------------------------------------------------------------------------------------


def _arg(args: tuple, kwargs: dict, i: int, key: str, default: Any = None) -> Any:
    return args[i] if len(args) > i else kwargs.get(key, default)


def _check_center(what: str, value: Any, args: tuple, kwargs: dict, budget: RenderBudget) -> Any:
    _int_arg(what, _arg(args, kwargs, 0, "width", 80))
    return value


def _check_indent(what: str, value: Any, args: tuple, kwargs: dict, budget: RenderBudget) -> Any:
    width = _arg(args, kwargs, 0, "width", 4)
    _int_arg(what, width)
    ind = len(width) if isinstance(width, str) else max(width, 0) if isinstance(width, int) else 4
    s = value if isinstance(value, str) else ""
    if len(s) + (s.count("\n") + 1) * ind > MAX_TEMPLATE_TEXT:
        raise _too_big(what, len(s) + (s.count("\n") + 1) * ind)
    return value


def _check_replace(what: str, value: Any, args: tuple, kwargs: dict, budget: RenderBudget) -> Any:
    text = value if isinstance(value, str) else str(value)  # Jinja's replace works on str() of a list too
    old, new = str(_arg(args, kwargs, 0, "old", "")), str(_arg(args, kwargs, 1, "new", ""))
    count = _arg(args, kwargs, 2, "count")
    n = _replace_size(text, old, new, -1 if count is None else count)
    if n > MAX_TEMPLATE_TEXT:
        raise _too_big(what, n)
    return value


def _check_wordwrap(what: str, value: Any, args: tuple, kwargs: dict, budget: RenderBudget) -> Any:
    wrap = _arg(args, kwargs, 2, "wrapstring")
    if isinstance(value, str) and isinstance(wrap, str):
        n = len(value) + (len(value) + 1) * len(wrap)  # a line per character at worst
        if n > MAX_TEMPLATE_TEXT:
            raise _too_big(what, n)
    return value


def _check_format(what: str, value: Any, args: tuple, kwargs: dict, budget: RenderBudget) -> Any:
    fmt = value if isinstance(value, str) else str(value)  # Jinja's format: str() of the value % the arguments
    printf_size(fmt, dict(kwargs) if kwargs else tuple(args), budget)
    return value


def _check_count_arg(what: str, value: Any, args: tuple, kwargs: dict, budget: RenderBudget) -> Any:
    _int_arg(what, _arg(args, kwargs, 0, "linecount" if what.endswith("batch") else "slices", 0))
    return value


def _check_sum(what: str, value: Any, args: tuple, kwargs: dict, budget: RenderBudget) -> Any:
    start = _arg(args, kwargs, 1, "start", 0)
    if isinstance(start, (list, tuple, str)):
        value = list(_Counted(value, budget, what))
        n = size(start) + sum(size(x) for x in value)
        if n > MAX_TEMPLATE_TEXT:
            raise _too_big(what, n)
    return value


_FILTER_CHECKS = {
    "center": _check_center,
    "indent": _check_indent,
    "replace": _check_replace,
    "wordwrap": _check_wordwrap,
    "format": _check_format,
    "batch": _check_count_arg,
    "slice": _check_count_arg,
    "sum": _check_sum,
}
"""The filters that can make more than they are given from small inputs, and the check of what they would
make, before they run (``join``'s is :func:`_join_filter` itself). Every other filter's result is checked after
(:func:`check_result`): it is at most a few times its input."""


@pass_context
def _join_filter(context: Any, value: Any, d: str = "", attribute: Any = None) -> str:
    """``join`` of templates: Jinja's ``join`` with the made text checked item by item before it is made."""
    budget = _budget(context)
    items = list(_Counted(value, budget, "filter join"))
    if attribute is not None:
        get = make_attrgetter(context.environment, attribute)
        items = [get(x) for x in items]
    if context.eval_ctx.autoescape:
        for it in items:
            check_text(it, "filter join", budget)
        if sum(size(str(x)) for x in items) > MAX_TEMPLATE_TEXT:
            raise _too_big("filter join", sum(len(str(x)) for x in items))
        return jinja2.filters.sync_do_join(context.eval_ctx, items, d)
    return str(d).join(_join_texts(items, str(d), "filter join", budget))


def _guard_filter(name: str, func: Any) -> Any:
    """``func`` (a filter) with the bounds around it: a step charged for it and for what it reads and makes,
    its input and arguments checked before (:func:`_pre_filter`), its result after (:func:`check_result`), and a
    lazy result counted item by item."""
    pass_arg = getattr(func, "jinja_pass_arg", None)
    kind = getattr(pass_arg, "name", None)

    what = f"filter {name}"
    check = _FILTER_CHECKS.get(name)

    @pass_context
    def guarded(context: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        budget = _budget(context)
        budget.charge(what, size(value))
        if not isinstance(value, _SCALARS):
            check_text(value, what, budget)
        if check is not None:
            value = check(what, value, args, kwargs, budget)
        if kind == "context":
            out = func(context, value, *args, **kwargs)
        elif kind == "eval_context":
            out = func(context.eval_ctx, value, *args, **kwargs)
        elif kind == "environment":
            out = func(context.environment, value, *args, **kwargs)
        else:
            out = func(value, *args, **kwargs)
        return _after(what, out, (value, *args), budget)

    update_wrapper(guarded, func)
    guarded.jinja_pass_arg = _PassArg.context  # type: ignore[attr-defined]  # update_wrapper copied func's
    return guarded


def _after(what: str, out: Any, inputs: tuple, budget: RenderBudget) -> Any:
    """What a filter or call returned, checked (:func:`check_result`) and counted; a lazy one counted item by
    item."""
    if type(out) is str:  # the common case
        if len(out) > MAX_TEMPLATE_TEXT:
            check_result(what, out, inputs)
        budget.made(what, len(out))
        return out
    if isinstance(out, _SCALARS):
        if isinstance(out, str):
            check_result(what, out, inputs)
            budget.made(what, len(out))
        return out
    if isinstance(out, (types.GeneratorType, Iterator)) and not isinstance(out, _Counted):
        return _Counted(out, budget, what)
    check_result(what, out, inputs)
    budget.made(what, _check_tree(out, what, budget) if isinstance(out, _TREES) else size(out))
    return out


_TREES = (list, tuple, dict, set, frozenset)


def _check_tree(value: Any, what: str, budget: RenderBudget) -> int:
    """Refuse a container made by the template whose text (nested items as often as they appear) would pass
    :data:`MAX_TEMPLATE_TREE`: comparing two of them (``==``, ``in``, ``sort``), which no hook sees, or
    printing one costs that much. Returns its text size (the work of checking it: the walk stops past the
    bound)."""
    n = text_size(value, budget)
    if n > MAX_TEMPLATE_TREE:
        raise SecurityError(f"{what} made a value of more than {MAX_TEMPLATE_TREE:,} characters as text")
    return n


@pass_context
def _bounded_literal(context: Any, value: Any) -> Any:
    """A list, tuple or dict literal with a variable item (the parse rewrite): checked by
    :func:`_check_tree`."""
    budget = context.budget or _budget(context)
    budget.charge("literal", _check_tree(value, "a literal", budget))
    return value


class _Counted:
    """An iterable whose every item is a step of the render's budget (loops, lazy filter results, ``loop()``
    of a recursive loop); ``len()`` where the source has one."""

    __slots__ = ("_src", "_it", "_budget", "_what")

    def __init__(self, src: Any, budget: RenderBudget, what: str = "loop") -> None:
        self._src, self._it, self._budget, self._what = src, iter(src), budget, what

    def __iter__(self) -> _Counted:
        return self

    def __bool__(self) -> bool:
        return True  # as a generator is: no len() asked

    def __next__(self) -> Any:
        item = next(self._it)
        self._budget.charge(self._what)
        return item

    def __len__(self) -> int:
        if isinstance(self._src, _Counted) or not hasattr(self._src, "__len__"):
            raise TypeError("a lazy sequence has no len()")
        return len(self._src)


@pass_context
def _counted_iter(context: Any, iterable: Any) -> _Counted:
    """What a ``{% for %}`` loop iterates: ``iterable``, each item a step (the loader's AST rewrite)."""
    return iterable if isinstance(iterable, _Counted) else _Counted(iterable, _budget(context), "loop")


@pass_context
def _bounded_concat(context: Any, parts: tuple) -> str:
    """``a ~ b ~ ...`` of templates: refused past :data:`MAX_TEMPLATE_TEXT` before it is made."""
    budget = _budget(context)
    texts, total = [], 0
    for p in parts:
        check_text(p, "'~'", budget)
        t = p if isinstance(p, str) else str(p)
        total += len(t)
        if total > MAX_TEMPLATE_TEXT:
            raise _too_big("'~'", total)
        texts.append(t)
    budget.charge("'~'", total)
    if context.eval_ctx.autoescape:
        return markup_join(parts)
    return "".join(texts)


@pass_context
def _finalize(context: Any, value: Any) -> Any:
    """Every ``{{ }}`` output: a step, its text's length charged, a container's text checked first."""
    budget = context.budget or _budget(context)
    if type(value) is str:  # the common case, inline: a step and its length
        budget.steps += 1
        budget.work += len(value)
        if budget.work > MAX_RENDER_WORK or budget.steps >= budget.next_check:
            budget.charge("output")
        return value
    if isinstance(value, _SCALARS):
        budget.charge("output", len(value) if isinstance(value, str) else 1)
        return value
    check_text(value, "output", budget)
    budget.charge("output", text_size(value, budget))
    return value


LOOP_FILTER, CONCAT_FILTER, LITERAL_FILTER = "_loop", "_concat", "_literal"
"""The filters the parse rewrite puts around a loop's iterable and a ``~`` (a filter is called directly, without
the sandbox's call: the cheapest hook Jinja compiles)."""


class _Rewrite(NodeTransformer):
    """A ``{% for %}`` iterates through :func:`_counted_iter`; ``a ~ b`` is :func:`_bounded_concat` of
    ``(a, b)``."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, LOOP_FILTER, [], [], None, None, lineno=node.iter.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        parts = nodes.Tuple(node.nodes, "load", lineno=node.lineno)
        return nodes.Filter(parts, CONCAT_FILTER, [], [], None, None, lineno=node.lineno)

    def _literal(self, node: nodes.Expr, items: list) -> nodes.Node:
        self.generic_visit(node)
        if all(isinstance(x, nodes.Const) for x in items):
            return node  # constant: its size is the text's
        return nodes.Filter(node, LITERAL_FILTER, [], [], None, None, lineno=node.lineno)

    def visit_List(self, node: nodes.List) -> nodes.Node:
        return self._literal(node, node.items)

    def visit_Tuple(self, node: nodes.Tuple) -> nodes.Node:
        if node.ctx != "load":  # an assignment's targets: {% for a, b in ... %}
            return node
        return self._literal(node, node.items)

    def visit_Dict(self, node: nodes.Dict) -> nodes.Node:
        return self._literal(node, [x for pair in node.items for x in (pair.key, pair.value)])


class BoundedTemplate(jinja2.Template):
    """A template whose :meth:`render` stops at :data:`MAX_ANNOTATION_BYTES` and cuts the text there."""

    def render(self, *args: Any, **kwargs: Any) -> str:
        """The text of the template on ``dict(*args, **kwargs)``, at most :data:`MAX_ANNOTATION_BYTES` UTF-8
        bytes (a longer one cut, ending with :data:`CUT_MARK`). Raises what the template raises: past a
        bound ``jinja2.exceptions.SecurityError``."""
        ctx = self.new_context(dict(*args, **kwargs))
        try:
            return cut_output(self.root_render_func(ctx))
        except Exception:
            self.environment.handle_exception()


def cut_output(pieces: Any) -> str:
    """Join the pieces of a render (a generator), stopping once they pass :data:`MAX_ANNOTATION_BYTES`: the
    text cut to that many UTF-8 bytes, ending with :data:`CUT_MARK`."""
    parts: list[str] = []
    add, n, cut = parts.append, 0, False
    for piece in pieces:
        add(piece)
        n += len(piece)
        if n > MAX_ANNOTATION_BYTES:
            cut = True
            pieces.close()
            break
    out = "".join(parts)
    if n * 4 <= MAX_ANNOTATION_BYTES and not cut:
        return out
    raw = out.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_ANNOTATION_BYTES:
        return out
    keep = MAX_ANNOTATION_BYTES - len(CUT_MARK.encode())
    return raw[:keep].decode("utf-8", "ignore") + CUT_MARK


class BoundedSandbox(SandboxedEnvironment):
    """Jinja2's sandbox with the cost of one render bounded (this module's doc): filters wrapped by
    :func:`_guard_filter`, calls and methods by :meth:`call`, operators by :meth:`call_binop`, loops and ``~``
    rewritten at parse, outputs by :func:`_finalize`, the text cut by :class:`BoundedTemplate`; loops nested
    at most :data:`MAX_LOOP_DEPTH` deep are the loader's check. Past a bound a render raises
    ``jinja2.exceptions.SecurityError``."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})
    template_class = BoundedTemplate
    context_class = BoundedContext

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(finalize=_finalize, **kwargs)

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        return _Rewrite().visit(tree)

    def call_binop(self, context, operator: str, left, right):  # noqa: ANN001 - Jinja's signature
        budget = _budget(context)
        budget.charge(f"'{operator}'", size(left) + size(right))
        check_binop(operator, left, right, budget)
        out = super().call_binop(context, operator, left, right)
        check_result(f"'{operator}'", out, (left, right))
        if isinstance(out, (list, tuple)) and out is not left and out is not right:
            budget.made(f"'{operator}'", _check_tree(out, f"'{operator}'", budget))
        return out

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: ANN001, N805 - Jinja's signature
        budget = _budget(__context)
        budget.charge("call", sum(size(a) for a in args))
        if isinstance(__obj, LoopContext) and args:  # loop(...) of a recursive loop: its items are steps
            args = (_Counted(args[0], budget, "recursive loop"), *args[1:])
        else:
            args = _method_check(__obj, args, kwargs, budget)
        out = super().call(__context, __obj, *args, **kwargs)
        return _after(f"call of {getattr(__obj, '__name__', type(__obj).__name__)}", out, args, budget)

    def wrap_str_format(self, value: Any) -> Any:
        """``str.format``/``format_map`` through :class:`_Formatter` (Jinja's, with each field bounded)."""
        if not isinstance(value, (types.MethodType, types.BuiltinMethodType)) or value.__name__ not in (
            "format",
            "format_map",
        ):
            return None
        f_self = value.__self__
        if not isinstance(f_self, str):
            return None
        str_type = type(f_self)
        is_format_map = value.__name__ == "format_map"
        if isinstance(f_self, Markup):
            formatter: _Formatter = _EscapeFormatter(self, escape=f_self.escape)
        else:
            formatter = _Formatter(self)

        def wrapper(*args: Any, **kwargs: Any) -> str:
            formatter._made = 0
            if is_format_map:
                if kwargs:
                    raise TypeError("format_map() takes no keyword arguments")
                if len(args) != 1:
                    raise TypeError(f"format_map() takes exactly one argument ({len(args)} given)")
                kwargs, args = args[0], ()
            return str_type(formatter.vformat(f_self, args, kwargs))

        return update_wrapper(wrapper, value)


def _bounded_range(*args: int) -> range:
    """``range()`` of templates, at most :data:`MAX_TEMPLATE_RANGE` items."""
    rng = range(*args)
    if len(rng) > MAX_TEMPLATE_RANGE:
        raise SecurityError(f"range of {len(rng):,} items (at most {MAX_TEMPLATE_RANGE:,})")
    return rng


def _bounded_lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002
    """``lipsum()`` of templates: at most 100 paragraphs of at most 1,000 words."""
    if n > 100 or max > 1_000:
        raise SecurityError(f"lipsum of {n:,} paragraphs of up to {max:,} words (at most 100 of 1,000)")
    return generate_lorem_ipsum(n, html, min, max)


def loop_depth(node) -> int:  # noqa: ANN001 - a jinja2.nodes.Node
    """How deep ``{% for %}`` loops nest in the parsed template ``node`` (0: no loop)."""
    inner = max((loop_depth(child) for child in node.iter_child_nodes()), default=0)
    return inner + 1 if isinstance(node, nodes.For) else inner


def template_env() -> BoundedSandbox:
    """The sandboxed Jinja2 environment of annotation templates (:class:`BoundedSandbox`), with unit
    filters: ``us`` (ns -> µs text), ``ms`` (ns -> ms text), ``s`` (ns -> s text)."""
    env = BoundedSandbox(undefined=jinja2.ChainableUndefined, autoescape=False)
    env.globals["range"] = _bounded_range
    env.globals["lipsum"] = _bounded_lipsum
    env.filters["us"] = lambda ns: f"{(ns or 0) / 1e3:.1f}"
    env.filters["ms"] = lambda ns: f"{(ns or 0) / 1e6:.1f}"
    env.filters["s"] = lambda ns: f"{(ns or 0) / 1e9:.2f}"
    env.filters["join"] = _join_filter
    env.filters = {name: _guard_filter(name, f) for name, f in env.filters.items()}
    env.filters[LOOP_FILTER] = _counted_iter
    env.filters[CONCAT_FILTER] = _bounded_concat
    env.filters[LITERAL_FILTER] = _bounded_literal
    return env


# -- what the loader sees in a template's text ----------------------------------------------------------------


class _Unknown(Exception):
    """A value not known before the render."""


_OPS = {nodes.Mul: "*", nodes.Pow: "**", nodes.Add: "+", nodes.Mod: "%"}
_STATIC_CALLS = {"range": _bounded_range, "lipsum": _bounded_lipsum}


def _static(node: nodes.Node) -> Any:
    """The value of ``node`` when the text alone gives it (constants, ``*``/``**``/``+``/``%`` of them, a
    constant ``range``), each operation checked as at render (``SecurityError``); else :class:`_Unknown`."""
    if isinstance(node, nodes.Const):
        return node.value
    if isinstance(node, nodes.Neg):
        v = _static(node.node)
        if isinstance(v, (int, float)):
            return -v
    elif isinstance(node, (nodes.List, nodes.Tuple)):
        items = [_static(x) for x in node.items]
        return items if isinstance(node, nodes.List) else tuple(items)
    elif type(node) in _OPS:
        op = _OPS[type(node)]
        left, right = _static(node.left), _static(node.right)  # type: ignore[attr-defined]
        check_binop(op, left, right)
        try:
            return {"*": lambda a, b: a * b, "**": lambda a, b: a**b, "+": lambda a, b: a + b}.get(
                op, lambda a, b: a % b
            )(left, right)
        except Exception as exc:  # noqa: BLE001 - a type error is the render's to show
            raise _Unknown from exc
    elif isinstance(node, nodes.Call) and isinstance(node.node, nodes.Name) and node.node.name in _STATIC_CALLS:
        args = [_static(a) for a in node.args]
        kwargs = {k.key: _static(k.value) for k in node.kwargs}
        if node.dyn_args is None and node.dyn_kwargs is None:
            try:
                return _STATIC_CALLS[node.node.name](*args, **kwargs)
            except SecurityError:
                raise
            except Exception as exc:  # noqa: BLE001
                raise _Unknown from exc
    raise _Unknown


def static_problems(tree: nodes.Template) -> list[str]:
    """What the parsed template ``tree`` would be refused at render for, seen in its text alone: constant
    arguments of ``range``/``lipsum``/``center``/``indent``/``batch``/``slice``/``format``/``replace``, and
    ``*``/``**``/``+``/``%`` of constants (``"x" * 10**9``). Each as ``"on its line N: <why>"``."""
    out: list[str] = []

    def note(node: nodes.Node, exc: SecurityError) -> None:
        msg = f"on its line {node.lineno}: {exc}"
        if msg not in out:
            out.append(msg)

    for node in tree.find_all((nodes.BinExpr, nodes.Call, nodes.Filter)):
        try:
            if isinstance(node, nodes.Filter) and node.node is not None:
                try:
                    value = _static(node.node)
                except _Unknown:
                    value = ""
                args = [_static(a) for a in node.args]
                kwargs = {k.key: _static(k.value) for k in node.kwargs}
                check = _FILTER_CHECKS.get(node.name)
                if check is not None:
                    check(f"filter {node.name}", value, tuple(args), kwargs, RenderBudget())
            elif not isinstance(node, nodes.Filter):
                _static(node)
        except _Unknown:
            continue
        except SecurityError as exc:
            note(node, exc)
    return out
