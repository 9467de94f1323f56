"""Strict YAML reading for rule files: positions, duplicate keys, YAML 1.1 surprises, JSON Schema.

Steps: parse with ruamel.yaml's round-trip loader (keeps line/column of every node; YAML 1.2, so the
surprises below are *not* silently converted, we flag them) -> walk every scalar for YAML 1.1 surprises
-> validate against ``obshub/rules/schema.json`` (jsonschema, Draft 2020-12) -> map every schema error's path
back to ``file:line:col``.

YAML 1.1 surprises rejected (PyYAML and many tools still read 1.1, so the same file would mean
different things to different readers):

* unquoted ``y/n/yes/no/on/off`` (any case): booleans in 1.1, strings in 1.2 -> quote them or use
  true/false;
* integers with leading zeros (``0755``, ``010``): octal in 1.1, decimal in 1.2 -> remove the zeros or
  quote;
* sexagesimal numbers (``1:30``): 90 in 1.1, a string in 1.2 -> quote.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import stat
from collections.abc import Collection, Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.scalarint import ScalarInt
from ruamel.yaml.scalarstring import ScalarString

from obshub.rules.durations import DURATION_PATTERN
from obshub.rules.errors import Problem

SCHEMA_PATH = Path(__file__).with_name("schema.json")
_BOOL11 = re.compile(r"^(y|n|yes|no|on|off)$", re.IGNORECASE)
_SEXAGESIMAL = re.compile(r"^[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?$")


@lru_cache(maxsize=1)
def file_schema() -> dict:
    """The JSON Schema of rule files (``obshub/rules/schema.json``)."""
    return json.loads(SCHEMA_PATH.read_text())


def _yaml() -> YAML:
    y = YAML(typ="rt")
    y.preserve_quotes = True  # quoted scalars load as ScalarString: "was it quoted?" stays answerable
    y.allow_duplicate_keys = False
    return y


#: flow collections (``[`` / ``{``) nested deeper than this are refused before parsing: ruamel.yaml's scanner
#: re-checks every open flow level at each token (``stale_possible_simple_keys``), so thousands of levels
#: take seconds (5,000: 5.5 s) only to end in a RecursionError; a rule file needs a handful.
MAX_FLOW_DEPTH = 64
_FLOW_CHARS = re.compile(r"""[\[\]{}'"#\n]""")


def flow_too_deep(text: str, limit: int = MAX_FLOW_DEPTH) -> tuple[int, int] | None:
    """``(line, column)`` (1-based) of the first ``[`` or ``{`` opened deeper than ``limit`` flow levels in
    YAML ``text``, or None. Brackets inside quoted scalars and comments do not count; a quote counts as one
    only where a YAML quoted scalar can start (after a space, ``[{,:`` or at a line's start), so an
    apostrophe inside a plain scalar (``it's``) is text. Linear in ``len(text)``; files with at most
    ``limit`` brackets in all return at once."""
    if text.count("[") + text.count("{") <= limit:
        return None
    depth, line, line_start, quote, i = 0, 1, 0, "", 0
    n = len(text)
    while i < n:
        m = _FLOW_CHARS.search(text, i)
        if m is None:
            return None
        i = m.start()
        ch = text[i]
        before = text[i - 1] if i > line_start else "\n"
        if ch == "\n":
            line, line_start = line + 1, i + 1
            if quote == "#":
                quote = ""
        elif quote == "#":
            pass
        elif quote:
            if ch == quote:
                if quote == "'" and text.startswith("''", i):
                    i += 1  # '' inside a single-quoted scalar is one quote
                elif quote == '"' and _escaped(text, i):
                    pass
                else:
                    quote = ""
        elif ch == "#":
            if before in " \t\n":
                quote = "#"
        elif ch in "'\"":
            if before in " \t\n[{,:":
                quote = ch
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return line, i - line_start + 1
        else:
            depth = max(0, depth - 1)
        i += 1
    return None


def _escaped(text: str, i: int) -> bool:
    """True when the character at ``i`` follows an odd number of backslashes."""
    k = i
    while k > 0 and text[k - 1] == "\\":
        k -= 1
    return (i - k) % 2 == 1


_TAB_TOKEN = "found character '\\t' that cannot start any token"


def _load_tolerating_tabs(text: str) -> Any:
    """ruamel.yaml's scanner rejects a tab between a value and its comment (``key: 1\t# why``), which
    YAML 1.2 allows (tabs are separation white space there). Where the scanner stops on such a tab, and
    only there (never inside a scalar), the tabs before the ``#`` become spaces, one for one, so every
    line:col stays the same; then it parses again."""
    for _ in range(1000):
        try:
            return _yaml().load(text)
        except MarkedYAMLError as exc:
            mark = exc.problem_mark
            if mark is None or _TAB_TOKEN not in str(exc.problem or "") or not 0 <= mark.index < len(text):
                raise
            end = mark.index
            while end < len(text) and text[end] in " \t":
                end += 1
            if end >= len(text) or text[end] != "#" or text[mark.index] != "\t":
                raise
            text = text[: mark.index] + text[mark.index : end].replace("\t", " ") + text[end:]
    return _yaml().load(text)


#: nodes a document may hold once its aliases are expanded. An alias (``*name``) repeats its anchor's value
#: wherever it stands, so aliases of aliases multiply (nine lists of nine aliases, nine levels deep: 387
#: million strings from 400 bytes, YAML's "billion laughs"), and every reader of the document (the YAML 1.1
#: walk, the schema, a message quoting a value) walks each copy: minutes of CPU and gigabytes. A rule file
#: holds a few hundred nodes (the builtin pack's largest file: 465).
MAX_EXPANDED_NODES = 200_000


def expanded_too_big(doc: Any, limit: int = MAX_EXPANDED_NODES) -> tuple[list, int] | None:
    """``(path, nodes)`` when ``doc`` holds more than ``limit`` nodes (mapping keys, values and list items,
    counted once per place they appear) with its aliases expanded: ``path`` leads from the root to the
    smallest value that still holds more than ``limit``, ``nodes`` is the whole document's count. None
    otherwise. Linear in the nodes written: each mapping or list is measured once, however many aliases
    repeat it (a value that contains itself counts once)."""
    sizes: dict[int, int] = {}

    def size(node: Any) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        known = sizes.get(id(node))
        if known is not None:
            return known
        sizes[id(node)] = 1  # an anchor inside its own value: counted once, not forever
        items = [x for kv in node.items() for x in kv] if isinstance(node, dict) else list(node)
        n = 1 + sum(size(x) for x in items)
        sizes[id(node)] = n
        return n

    total = size(doc)
    if total <= limit:
        return None
    path: list = []
    node = doc
    while True:
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        step = next(((k, v) for k, v in children if size(v) > limit), None)
        if step is None:
            return path, total
        path.append(step[0])
        node = step[1]


def load_yaml(text: str, file: str) -> tuple[Any, list[Problem]]:
    """Parse ``text`` (named ``file`` in messages). Returns ``(document, problems)``; the document is
    None when the YAML itself is broken (syntax error, duplicate key, flow collections nested deeper than
    ``MAX_FLOW_DEPTH``, more than ``MAX_EXPANDED_NODES`` nodes once aliases are expanded), with one problem
    at the mark."""
    deep = flow_too_deep(text)
    if deep is not None:
        what = f"YAML: nested too deeply (more than {MAX_FLOW_DEPTH} levels of [ or {{; a rule file needs a few)"
        return None, [Problem(file, deep[0], deep[1], what)]
    try:
        doc = _load_tolerating_tabs(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = (exc.problem or str(exc)).strip()
        context = str(getattr(exc, "context", None) or "")
        if exc.context_mark is not None and "end of stream" in what and "quoted scalar" in context:
            # a quote never closed: the scanner stops at the end of the file; the quote is what to fix
            mark = exc.context_mark
            what = "a quoted string starts here and is never closed (its closing quote is missing)"
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        if "duplicate key" in what:
            what += " (each key may appear once in a mapping)"
        elif "'\\t' that cannot start any token" in what:  # ruamel's words for a tab it refuses
            what = "a tab character: YAML indents with spaces only, and a value holding a tab must be quoted"
        elif what == "but found another document":
            what = "a second YAML document starts here (`---`): the file holds one; put the other in a file of its own"
        return None, [Problem(file, line, col, f"YAML: {what}")]
    except YAMLError as exc:
        pos, char = getattr(exc, "position", None), getattr(exc, "character", None)
        if isinstance(pos, int) and isinstance(char, int) and 0 <= pos <= len(text):
            # ReaderError: a character YAML does not allow (NUL, other control characters), at its place
            line = text.count("\n", 0, pos) + 1
            col = pos - text.rfind("\n", 0, pos)
            what = f"YAML: character U+{char:04X} is not allowed in YAML (a binary file, or one not saved as text?)"
            return None, [Problem(file, line, col, what)]
        return None, [Problem(file, 0, 0, f"YAML: {exc}")]
    except RecursionError:
        return None, [Problem(file, 1, 1, "YAML: nested too deeply (a rule file needs a few levels, not thousands)")]
    try:
        big = expanded_too_big(doc)
    except RecursionError:
        return None, [Problem(file, 1, 1, "YAML: nested too deeply (a rule file needs a few levels, not thousands)")]
    if big is not None:
        path, nodes = big
        line, col = position(doc, path) if path else (1, 1)
        where = "/".join(map(str, path)) or "the document"
        what = (
            f"YAML: {where} holds more than {MAX_EXPANDED_NODES:,} values (the file: {nodes:,}, each alias *name "
            "counted as the copy of its anchor's value it makes; aliases of aliases multiply): a rule file needs "
            "a few hundred; alias fewer levels or split the file"
        )
        return None, [Problem(file, line, col, what)]
    return doc, []


def _pos_of_value(node: Any, key: Any) -> tuple[int, int]:
    try:
        if isinstance(node, CommentedMap):
            line, col = node.lc.value(key)
        elif isinstance(node, CommentedSeq):
            line, col = node.lc.item(key)
        else:
            return 0, 0
        return line + 1, col + 1
    except (KeyError, IndexError, TypeError, AttributeError):
        return 0, 0


def _pos_of_key(node: Any, key: Any) -> tuple[int, int]:
    try:
        line, col = node.lc.key(key)
        return line + 1, col + 1
    except (KeyError, TypeError, AttributeError):
        return _pos_of_value(node, key)


def position(doc: Any, path: list, *, key: bool = False) -> tuple[int, int]:
    """1-based (line, col) of the node at ``path`` (keys and indexes from the root); with ``key`` the
    position of the last mapping key itself. (0, 0) when unknown."""
    node, pos = doc, (1, 1)
    for i, step in enumerate(path):
        last = i == len(path) - 1
        if last and key and isinstance(node, CommentedMap):
            return _pos_of_key(node, step)
        p = _pos_of_value(node, step)
        pos = p if p != (0, 0) else pos
        try:
            node = node[step]
        except (KeyError, IndexError, TypeError):
            break
    return pos


def _surprise(value: Any) -> str | None:
    if isinstance(value, bool) or isinstance(value, ScalarString):
        return None
    if isinstance(value, ScalarInt):
        width = getattr(value, "_width", None)
        digits = str(abs(int(value)))
        if width and width > len(digits) and not getattr(value, "_underscore", None):
            return (
                f"number with a leading zero ({'0' * (width - len(digits))}{digits}) is octal in YAML 1.1 "
                f"and decimal in YAML 1.2; write {digits} or quote it"
            )
        return None
    if type(value) is str:
        if _BOOL11.match(value):
            return (
                f"unquoted '{value}' is a boolean in YAML 1.1 (PyYAML and many tools) but a string in "
                f"YAML 1.2; quote it ('{value}') for a string, or write true/false for a boolean"
            )
        if _SEXAGESIMAL.match(value):
            return f"unquoted '{value}' is a base-60 number in YAML 1.1; quote it"
    return None


# keys that are names of record fields (``baseline: {n: 50}`` in a test input): a YAML 1.1 reader would
# read a bare ``n`` as a boolean, but every reader of these files (ruamel, YAML 1.2) reads a string
FIELD_KEYS = frozenset({"n"})


def yaml11_surprises(doc: Any, file: str) -> list[Problem]:
    """Every YAML 1.1 surprise in ``doc`` (keys and values), with its position; keys in ``FIELD_KEYS``
    (field names of the records, such as ``baseline.n``) are not surprises."""
    out: list[Problem] = []

    def walk(node: Any) -> None:
        if isinstance(node, CommentedMap):
            for k, v in node.items():
                msg = None if k in FIELD_KEYS else _surprise(k)
                if msg:
                    out.append(Problem(file, *_pos_of_key(node, k), f"key {msg}"))
                msg = _surprise(v)
                if msg:
                    out.append(Problem(file, *_pos_of_value(node, k), msg))
                walk(v)
        elif isinstance(node, CommentedSeq):
            for i, v in enumerate(node):
                msg = _surprise(v)
                if msg:
                    out.append(Problem(file, *_pos_of_value(node, i), msg))
                walk(v)

    walk(doc)
    return out


#: JSON Schema's type names as a YAML file calls them (``yaml_type``)
_SCHEMA_TYPES = {"object": "mapping", "array": "list"}


def _schema_message(err: jsonschema.ValidationError) -> tuple[str, bool]:
    """A readable message for one schema error; the flag says 'point at the key, not the value'."""
    where = "/".join(str(p) for p in err.absolute_path) or "top level"
    if err.validator == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed)) if isinstance(err.instance, dict) else []
        return (
            f"unknown field '{_cut(str(extra[0])) if extra else '?'}' in {where} (allowed: {', '.join(allowed)})",
            True,
        )
    if err.validator == "required":
        return f"{where}: {err.message}", False
    if err.validator == "type":
        want = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
        want_text = " or ".join(_SCHEMA_TYPES.get(str(w), str(w)) for w in want)  # the YAML words, not JSON's
        got = "null (an empty value)" if err.instance is None else f"{yaml_type(err.instance)} {brief(err.instance)}"
        return f"{where}: expected {want_text}, got {got}", err.instance is None  # an empty value: at its key
    if err.validator == "enum":
        return f"{where}: {brief(err.instance)} is not one of {', '.join(map(str, err.validator_value))}", False
    if err.validator == "pattern" and err.validator_value == DURATION_PATTERN:
        return (
            f"{where}: {brief(err.instance)} is not a duration: write a whole number and a unit (ms, s, m, h, d) "
            "without spaces, e.g. 10s, 5m, 1h30m",
            False,
        )
    if err.validator == "anyOf" and "last steps" in str(err.schema.get("description", "")):
        if not isinstance(err.instance, str):
            got = f"{yaml_type(err.instance)} {brief(err.instance)}"
            return f"{where}: expected string, got {got}: write a duration (e.g. 30s, 5m) or steps (10 steps)", False
        return (
            f"{where}: {brief(err.instance)} is neither a duration (e.g. 30s, 5m) nor a number of the "
            "job's last steps (e.g. 10 steps)",
            False,
        )
    if err.validator == "pattern":
        return f"{where}: {brief(err.instance)} does not match {err.validator_value}", False
    if err.validator == "maxLength" and isinstance(err.instance, str):
        return f"{where}: {brief(err.instance)} is longer than the {err.validator_value} characters it may have", False
    if err.validator == "const":
        return f"{where}: must be {err.validator_value!r}, got {brief(err.instance)}", False
    return f"{where}: {_cut(err.message)}", False  # jsonschema's own words quote the value whole


def nearest_missing_required(key: object, allowed: Iterable[str], missing: Collection[str]) -> str | None:
    """The required field that the unknown key ``key`` misspells, or None: its nearest allowed name
    (``difflib``, cutoff 0.6) when that field is in ``missing`` (required and absent from the same
    mapping), as ``severty:`` for ``severity``. ``allowed``: every field name of the mapping. Such a pair is
    one problem, said at the key's own line with the fix, not also as "required" at the mapping. Shared by
    the rule files (jsonschema errors) and the alerting config (pydantic errors)."""
    near = difflib.get_close_matches(str(key), sorted(allowed), n=1, cutoff=0.6)
    return near[0] if near and near[0] in missing else None


def _misspelt_required(errors: list[jsonschema.ValidationError]) -> set[tuple[tuple, str]]:
    """``(path, name)`` of each required field that is missing from its mapping because an unknown key of
    the same mapping misspells it (:func:`nearest_missing_required`)."""
    out = set()
    for err in errors:
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            allowed = err.schema.get("properties", {})
            missing = set(err.schema.get("required", [])) - set(err.instance)
            for extra in set(err.instance) - set(allowed):
                name = nearest_missing_required(extra, allowed, missing)
                if name is not None:
                    out.add((tuple(err.absolute_path), name))
    return out


def _required_name(err: jsonschema.ValidationError) -> str | None:
    """The field a ``required`` error says is missing (jsonschema reports one error per field)."""
    names = err.validator_value if isinstance(err.validator_value, list) else []
    inst = err.instance if isinstance(err.instance, dict) else {}
    return next((n for n in names if n not in inst and repr(n) in err.message), None)


def schema_problems(doc: Any, file: str) -> list[Problem]:
    """Every JSON Schema violation of ``doc`` with its position, sorted by position. A misspelt required
    field is one problem, at the misspelt key (``unknown field 'severty' ...: did you mean 'severity'?
    (required)``), not that and a second "'severity' is a required property" at the mapping."""
    validator = jsonschema.Draft202012Validator(file_schema())
    errors = list(validator.iter_errors(doc))
    misspelt = _misspelt_required(errors)
    out = []
    for err in errors:
        path = list(err.absolute_path)
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            # every unknown key of the mapping, each at its own line, with the nearest allowed name
            allowed = sorted(err.schema.get("properties", {}))
            where = "/".join(str(p) for p in path) or "top level"
            for extra in sorted(set(err.instance) - set(allowed), key=str):
                near = difflib.get_close_matches(str(extra), allowed, n=1, cutoff=0.6)
                hint = f": did you mean '{near[0]}'?" if near else f" (allowed: {', '.join(allowed)})"
                if near and (tuple(path), near[0]) in misspelt:
                    hint += " (a required field)"
                line, col = position(doc, path + [extra], key=True)
                what = f"unknown field '{_cut(str(extra))}' in {where}{hint}"
                out.append(Problem(file, line, col, what, _rule_name(doc, path)))
            continue
        if err.validator == "required" and (tuple(path), _required_name(err)) in misspelt:
            continue  # said once, at the misspelt key (above)
        msg, at_key = _schema_message(err)
        line, col = position(doc, path, key=at_key)
        rule = _rule_name(doc, path)
        out.append(Problem(file, line, col, msg, rule))
    return sorted(out, key=lambda p: (p.line, p.col))


def _rule_name(doc: Any, path: list) -> str | None:
    if len(path) >= 2 and path[0] in ("rules", "overrides") and isinstance(path[1], int):
        try:
            item = doc[path[0]][path[1]]
            return str(item.get("id") or item.get("rule") or "") or None
        except (KeyError, IndexError, TypeError, AttributeError):
            return None
    return None


_YAML_TYPES = (
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (dict, "mapping"),
    (list, "list"),
)


def yaml_type(v: Any) -> str:
    """The YAML type of a parsed value, as a message names it (not ruamel's class names)."""
    if v is None:
        return "null"
    return next((name for t, name in _YAML_TYPES if isinstance(v, t)), type(v).__name__)


#: characters of a value an error message quotes: a 50 kB string or a list of 300 items where a duration
#: was expected was printed whole (81 kB of message for two problems); the field and file:line:col say where
MAX_SHOWN_CHARS = 80


def _cut(text: str, limit: int = MAX_SHOWN_CHARS * 3) -> str:
    """``text`` itself, or its first ``limit`` characters and how long it is."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def brief(value: Any, limit: int = MAX_SHOWN_CHARS) -> str:
    """``value`` (parsed YAML) as an error message quotes it: its Python repr (``'5 m'``, ``[1, 2]``), cut
    to ``limit`` characters with its size (``'xxxx...' (50,000 characters)``, ``[...] (300 items)``)."""
    text = repr(plain_value(value))
    if len(text) <= limit:
        return text
    if isinstance(value, str):
        size = f"{len(value):,} characters"
    elif isinstance(value, (list, dict)):
        size = f"{len(value):,} item{'s' if len(value) != 1 else ''}"
    else:
        size = f"{len(text):,} characters"
    return f"{text[:limit]}... ({size})"


def plain_value(node: Any) -> Any:
    """ruamel containers/scalars -> plain python (dict with str keys / list / str / int / float / bool)."""
    if isinstance(node, dict):
        return {str(k): plain_value(v) for k, v in node.items()}
    if isinstance(node, list):
        return [plain_value(v) for v in node]
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    return str(node)


#: bytes a YAML file (rules, rule tests, alerting config) may have: the parser reads about 200 kB a second
#: into 100 bytes of memory per byte (a 3 MB list: 16 s, 340 MB), and the rule engine re-reads a changed
#: file on every hot reload. The builtin pack's largest file is 17 kB.
MAX_FILE_BYTES = 4 * 1024 * 1024


def read_text(path: Path) -> tuple[str | None, list[Problem]]:
    """The text of a YAML file (rules, tests) as UTF-8. Returns (text, []) or (None, [the Problem]): the
    file cannot be read (line 0), is not a regular file (a FIFO, a character device such as ``/dev/zero``,
    a socket: line 0, refused at once, before a byte is read, since such a file can block forever or
    never end), is larger than ``MAX_FILE_BYTES`` (line 1: by its size before it is read, and by what was
    read, at most ``MAX_FILE_BYTES`` + 1 bytes, for a file that grows or whose size ``stat`` does not
    give, such as one in /proc), or its first byte that is not UTF-8 at line:col."""
    file = str(path)

    def too_big(size: str) -> tuple[None, list[Problem]]:
        what = (
            f"the file is {size} bytes, more than the {MAX_FILE_BYTES:,} a YAML file of obshub may have "
            "(a rule file needs a few kB): split it into several files, or check that this is the file meant"
        )
        return None, [Problem(file, 1, 1, what)]

    try:
        # O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a writer (no effect
        # on a regular file); the file's kind is then checked on what was opened, not on a second lookup
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                what = _file_kind(st.st_mode)
                return None, [
                    Problem(file, 0, 0, f"cannot read: not a regular file ({what}); give the path of a YAML file")
                ]
            if st.st_size > MAX_FILE_BYTES:
                return too_big(f"{st.st_size:,}")
            raw = fh.read(MAX_FILE_BYTES + 1)
            if len(raw) > MAX_FILE_BYTES:
                return too_big(f"more than {MAX_FILE_BYTES:,}")
    except OSError as exc:
        return None, [Problem(file, 0, 0, f"cannot read: {exc.strerror or exc}")]
    try:
        return raw.decode("utf-8"), []
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        return None, [Problem(file, line, col, f"not UTF-8: byte 0x{raw[exc.start]:02x} (save the file as UTF-8)")]


def _file_kind(mode: int) -> str:
    """What a ``stat`` mode that is not a regular file's names, for an error."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO, a named pipe"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return f"file mode {stat.S_IFMT(mode):o}"


def read_rule_file(path: Path) -> tuple[Any, list[Problem]]:
    """Read and structurally validate one rule file. Returns (document or None, problems)."""
    file = str(path)
    text, problems = read_text(path)
    if text is None:
        return None, problems
    doc, problems = load_yaml(text, file)
    if doc is None:
        return None, problems
    if not isinstance(doc, CommentedMap):
        return None, [Problem(file, 1, 1, "a rule file is a mapping with `version: 1` at the top")]
    if "rule_files" in doc or "tests" in doc:
        key = "rule_files" if "rule_files" in doc else "tests"
        line, col = position(doc, [key], key=True)
        return None, [
            Problem(
                file, line, col, f"this is a rule test file (it has `{key}:`): run it with `obshub rules test {file}`"
            )
        ]
    surprises = yaml11_surprises(doc, file)
    seen = {(p.line, p.col) for p in surprises}
    problems = surprises + [p for p in schema_problems(doc, file) if (p.line, p.col) not in seen]
    return doc, sorted(problems, key=lambda p: (p.line, p.col))
