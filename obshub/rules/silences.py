"""Silences: mute notifications of alerts whose labels match, between a start and an end, with an author
and a comment (Alertmanager's silences). Stored in ``<state>/rules/silences.json``; the CLI writes it
(``obshub silence add|list|expire``) and ``obshub rules serve`` re-reads it when it changes.

Matchers: ``name=value``, ``name!=value``, ``name=~regex``, ``name!~regex`` (regexes anchored, as in
Alertmanager, and in RE2 syntax run by the linear-time engine of rule conditions' ``matches()``, Rust
``regex`` through ``cel``: no look-around or backreferences, and no pattern can make a match take
exponential time, which Python's backtracking ``re`` did: ``host=~node-(0|0?0)*1`` took 30 s on one
alert whose host was ``node-`` and 22 zeros, with the engine's notifications stalled meanwhile). A silence mutes an alert when every matcher matches and start <= now < end. Silenced
alerts still change state and are published to ``obshub.alerts.v1``; only notifications are muted.
An alert without a label reads it as ``''``, so a silence whose every matcher matches ``''``
(``host=~.*``, ``host!=node2``, ``rank=``) would mute every alert without that label, which is every
alert of any other kind: refused when it is made (:func:`check_not_everything`), as Alertmanager refuses it.
A matcher on a label no alert carries (``hostname=x``: the label is ``host``) mutes nothing: refused too
(:func:`check_labels`, with the labels the rules give their alerts), unless forced.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import time
import uuid
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

from obshub.rules.errors import SilenceError

log = logging.getLogger(__name__)

_MATCHER = re.compile(r"^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*$")


@lru_cache(maxsize=1)
def _regex_program():
    """The CEL program ``v.matches(p)``: the regex engine of rule conditions (Rust ``regex``, RE2 syntax,
    linear time in the value's length), imported at first use (``silence list`` needs none)."""
    import cel

    return cel.compile("v.matches(p)")


@lru_cache(maxsize=8192)
def regex_fullmatch(pattern: str, value: str) -> bool:
    """True when ``pattern`` (RE2 syntax) matches the whole of ``value``, as Alertmanager's matchers do
    (``^(?:pattern)$``). Raises SilenceError naming the pattern and the regex parser's reason (``unclosed
    group``, ``look-around ... is not supported``) when it is no regex this engine runs. One call compiles
    the pattern (~0.1 ms); answers are cached by (pattern, value), since alerts repeat their label values."""
    check_regex(pattern)
    try:
        return bool(_regex_program().execute({"v": value, "p": f"^(?:{pattern})$"}))
    except (ValueError, RuntimeError, TypeError) as exc:
        raise SilenceError(f"bad regex {pattern!r}: {_reason(exc)}", _REGEX_HINT) from None


@lru_cache(maxsize=1024)
def check_regex(pattern: str) -> None:
    """Raise SilenceError naming ``pattern`` and the parser's reason when it is no RE2 regex on its own: it
    is checked alone before it is anchored (``^(?:...)$``), so that ``node-0)|(x``, which the anchors
    would balance into ``^(?:node-0)|(x)$`` (matching any value starting with ``node-0``), is refused as
    Alertmanager and Python refuse it (walk23)."""
    try:
        _regex_program().execute({"v": "", "p": pattern})
    except (ValueError, RuntimeError, TypeError) as exc:
        raise SilenceError(f"bad regex {pattern!r}: {_reason(exc)}", _REGEX_HINT) from None


_REGEX_HINT = "fix the regular expression (RE2 syntax, as in Alertmanager: no look-around or backreferences)"


def _reason(exc: BaseException) -> str:
    """The regex parser's own line out of the CEL call's error (``unclosed group``)."""
    text = str(exc)
    why = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("error:")]
    reason = why[0].removeprefix("error:").strip() if why else (text.splitlines() or [repr(exc)])[0]
    return reason.split(". Check function arguments")[0]


@dataclass(frozen=True)
class Matcher:
    """One label matcher; ``op`` is one of ``=``, ``!=``, ``=~``, ``!~``."""

    name: str
    op: str
    value: str

    @classmethod
    def parse(cls, text: str) -> "Matcher":
        """``'host=node2'`` -> Matcher. Raises SilenceError on a malformed matcher or regex."""
        m = _MATCHER.match(text)
        if not m:
            raise SilenceError(
                f"matcher {text!r} is not NAME=VALUE, NAME!=VALUE, NAME=~REGEX or NAME!~REGEX",
                "example: --matcher host=node2 --matcher alertname=~'.*straggler'",
            )
        name, op, value = m.groups()
        value = value.strip("\"'")
        if op in ("=~", "!~"):
            try:
                check_regex(value)
                _regex_program().execute({"v": "", "p": f"^(?:{value})$"})
            except SilenceError as exc:
                raise SilenceError(f"matcher {text!r}: {exc.args[0]}", _REGEX_HINT) from None
            except (ValueError, RuntimeError, TypeError) as exc:
                raise SilenceError(f"matcher {text!r}: bad regex: {_reason(exc)}", _REGEX_HINT) from None
        return cls(name, op, value)

    def matches(self, labels: dict[str, str]) -> bool:
        v = labels.get(self.name, "")
        if self.op == "=":
            return v == self.value
        if self.op == "!=":
            return v != self.value
        hit = regex_fullmatch(self.value, v)
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        return f"{self.name}{self.op}{self.value}"


def check_not_everything(matchers: list[Matcher]) -> None:
    """Raise SilenceError when every matcher of a silence matches the empty string: an alert without the
    label reads it as ``''``, so such a silence mutes every alert that lacks those labels (``host=~.*`` mutes
    the job-wide alerts too, ``host!=node2`` every alert without a host), and with a name no alert has
    (``hostname!=x``) every alert there is. Alertmanager refuses the same silences."""
    if matchers and all(m.matches({}) for m in matchers):
        one = len(matchers) == 1
        shown = " ".join(str(m) for m in matchers)
        raise SilenceError(
            f"matcher{'' if one else 's'} {shown!r} also match{'es' if one else ''} an alert without "
            f"{'that label' if one else 'these labels'} (an absent label reads as ''): the silence would mute "
            "every alert of another kind too",
            "add a matcher that needs a value, e.g. -m host=node2 or -m job=llama-7b "
            "(-m host=~.+ mutes every alert that has a host)",
        )


def alert_labels(ruleset) -> set[str]:
    """The label names the alerts of ``ruleset`` (a ``model.RuleSet``) can carry: ``alertname`` and
    ``severity`` of every alert, each rule's ``group_by`` names and its fixed ``labels``."""
    names = {"alertname", "severity"}
    for rule in ruleset.rules.values():
        names |= set(rule.group_by) | set(rule.labels)
    return names


def check_labels(matchers: list[Matcher], known: set[str]) -> None:
    """Raise SilenceError when a matcher that needs a value names a label outside ``known``
    (:func:`alert_labels`): ``hostname=node2`` matches no alert (they carry ``host``), so the silence would
    mute nothing, silently. A matcher that matches the absent label (``hostname!=x``) is
    :func:`check_not_everything`'s."""
    unknown = sorted({m.name for m in matchers if m.name not in known and not m.matches({})})
    if unknown:
        raise SilenceError(
            f"no alert carries the label{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}: "
            f"the silence would mute nothing (alerts carry {', '.join(sorted(known))}; docs/RULES.md "
            "'Builtin pack and runbooks')",
            "use one of those labels, or give your own rule files with -r (their labels count too), or "
            "--any-label to keep it",
        )


#: the longest matcher value a silence takes (characters): label values are host names, rule ids, job
#: names; a 100,000-character one matched nothing and ``silence list`` printed it whole
MAX_VALUE_CHARS = 1024


def check_values(matchers: list[Matcher], rule_ids: set[str] | None = None) -> None:
    """Raise SilenceError naming the matcher and the fix when an equality matcher (``=``, ``!=``) can mute
    nothing: a value that starts with ``=`` or ``~`` (``host==node2`` is ``host`` equal to ``=node2``:
    did you mean ``host=node2``?), ``severity=`` a word that is none of the engine's severities
    (``model.SEVERITIES``), ``alertname=`` a rule id outside ``rule_ids`` (the rules' ids, None: not
    checked; the message names the closest ids, difflib), or any value longer than ``MAX_VALUE_CHARS``.
    Regex matchers keep their own checks (``Matcher.parse``)."""
    import difflib

    from obshub.rules.model import SEVERITIES

    for m in matchers:
        shown = str(m) if len(str(m)) <= 80 else f"{str(m)[:60]}... ({len(m.value)} characters)"
        if len(m.value) > MAX_VALUE_CHARS:
            raise SilenceError(
                f"matcher {shown!r}: the value is {len(m.value)} characters, at most {MAX_VALUE_CHARS}",
                "label values are host names, rule ids, job names: give the value itself (or a regex, =~)",
            )
        if m.op not in ("=", "!="):
            continue
        if m.value[:1] in ("=", "~"):
            fix = f"{m.name}{m.op}{m.value[1:]}" if m.value[0] == "=" else f"{m.name}{m.op[:-1]}~{m.value[1:]}"
            raise SilenceError(
                f"matcher {shown!r} compares {m.name} with {m.value!r}, a value starting with {m.value[0]!r} "
                "that no label has",
                f"did you mean {fix}?",
            )
        if m.name == "severity" and m.op == "=" and m.value not in SEVERITIES:
            raise SilenceError(
                f"matcher {shown!r}: {m.value!r} is not a severity, so it mutes nothing",
                f"alerts' severities are {', '.join(SEVERITIES)}",
            )
        if m.name == "alertname" and m.op == "=" and rule_ids is not None and m.value not in rule_ids:
            close = difflib.get_close_matches(m.value, sorted(rule_ids), n=3, cutoff=0.6)
            raise SilenceError(
                f"matcher {shown!r}: no rule has the id {m.value!r} (alertname is the rule id), so it mutes nothing",
                (f"did you mean {' or '.join(f'alertname={c}' for c in close)}? " if close else "")
                + "`obshub rules check builtin` lists the builtin ids; give your own rule files with -r "
                "(--any-label keeps it)",
            )


def shown_matcher(text: str, limit: int = 120) -> str:
    """``text`` (a stored matcher) for a listing: cut to ``limit`` characters, saying how long it is (a
    hand-edited or older silence may hold a value of any length)."""
    return text if len(text) <= limit else f"{text[: limit - 20]}... ({len(text)} characters)"


@lru_cache(maxsize=4096)
def _parse_matcher(text: str) -> Matcher:
    """``Matcher.parse(text)``, cached (a Matcher is immutable)."""
    return Matcher.parse(text)


@dataclass
class Silence:
    """A silence. Times are CLOCK_REALTIME ns."""

    id: str
    matchers: list[str]
    starts_at_ns: int
    ends_at_ns: int
    author: str
    comment: str
    created_at_ns: int = field(default_factory=time.time_ns)

    def parsed(self) -> list[Matcher]:
        """The matchers, parsed (cached per text: a silence is checked against every alert). Raises
        SilenceError on a malformed one."""
        return [_parse_matcher(m) for m in self.matchers]

    def active(self, now_ns: int) -> bool:
        return self.starts_at_ns <= now_ns < self.ends_at_ns

    def mutes(self, labels: dict[str, str], now_ns: int) -> bool:
        """True when active at ``now_ns`` and every matcher matches ``labels``."""
        return self.active(now_ns) and all(m.matches(labels) for m in self.parsed())


class SilenceStore:
    """The silences file, with an exclusive lock around each read-modify-write."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._mtime = -1.0
        self._cache: list[Silence] = []
        self._bad: set[str] = set()  # ids of silences already logged as not applied

    def _read(self) -> list[Silence]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            raise SilenceError(f"cannot read silences from {self.path}: {exc}", "fix or remove the file") from None
        items = data.get("silences", []) if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise SilenceError(
                f"cannot read silences from {self.path}: not a silences file (a JSON object with a 'silences' list)",
                "fix or remove the file",
            )
        return [self._silence(i, d) for i, d in enumerate(items)]

    def _silence(self, i: int, d: object) -> Silence:
        """Silence number ``i`` of the file from its JSON ``d``. Raises SilenceError naming it and the field."""
        where = f"cannot read silences from {self.path}: silence {i}"
        try:
            s = Silence(**d)  # type: ignore[arg-type]  # checked just below; a non-mapping is a TypeError
        except TypeError as exc:
            raise SilenceError(f"{where}: {exc}", "fix or remove the file") from None
        for name, want in (("id", str), ("matchers", list), ("author", str), ("comment", str)):
            if not isinstance(getattr(s, name), want):
                raise SilenceError(f"{where}: '{name}' is not a {want.__name__}", "fix or remove the file")
        for name in ("starts_at_ns", "ends_at_ns", "created_at_ns"):
            if type(getattr(s, name)) is not int:
                raise SilenceError(f"{where}: '{name}' is not an integer (ns)", "fix or remove the file")
        if not all(isinstance(m, str) for m in s.matchers):
            raise SilenceError(f"{where}: 'matchers' holds something that is not a string", "fix or remove the file")
        return s

    def _write(self, items: list[Silence]) -> None:
        """Replace the file by ``items`` (a temporary file renamed over it). Raises SilenceError naming the
        file when it cannot be written (a full or read-only disk: the write's OSError names no file, and
        `silence add` ended in a traceback); the file keeps its previous silences and the partly written
        temporary file is removed."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps({"v": 1, "silences": [asdict(s) for s in items]}, indent=1))
            os.replace(tmp, self.path)
        except OSError as exc:
            if tmp.is_file():
                tmp.unlink(missing_ok=True)
            raise SilenceError(
                f"cannot write silences to {self.path}: {exc.strerror or exc}",
                "free space on its disk or make it writable (its folder is under $OBSHUB_HOME); nothing was changed",
            ) from None

    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path.with_suffix(".lock"), "w")
        fcntl.flock(f, fcntl.LOCK_EX)
        return f

    def add(self, matchers: list[str], starts_at_ns: int, ends_at_ns: int, author: str, comment: str) -> Silence:
        """Create a silence; returns it. Raises SilenceError (no matcher, bad matcher, matchers that all
        match an absent label (:func:`check_not_everything`), end <= start, empty author or comment)."""
        if not matchers:
            raise SilenceError("a silence needs at least one matcher", "example: --matcher host=node2")
        check_not_everything([Matcher.parse(m) for m in matchers])
        if ends_at_ns <= starts_at_ns:
            raise SilenceError("the silence ends before it starts", "give a positive --duration")
        if not author.strip() or not comment.strip():
            raise SilenceError(
                "a silence needs an author and a comment (why it is muted)",
                "--author you@example.com --comment 'node2 in maintenance, TICKET-123'",
            )
        s = Silence(uuid.uuid4().hex[:12], list(matchers), starts_at_ns, ends_at_ns, author, comment)
        with self._locked():
            items = self._read()
            items.append(s)
            self._write(items)
        return s

    def expire(self, silence_id: str, now_ns: int | None = None) -> Silence:
        """End a silence now. Raises SilenceError for an unknown id."""
        now_ns = now_ns or time.time_ns()
        with self._locked():
            items = self._read()
            for s in items:
                if s.id == silence_id:
                    s.ends_at_ns = min(s.ends_at_ns, now_ns)
                    self._write(items)
                    return s
        raise SilenceError(f"no silence with id {silence_id!r}", "`obshub silence list --all` shows the ids")

    def list(self) -> list[Silence]:
        """Every silence, oldest first."""
        return self._read()

    def current(self) -> list[Silence]:
        """Silences, re-read only when the file changed (cheap to call every tick)."""
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            self._cache, self._mtime = [], -1.0
            return []
        if mtime != self._mtime:
            self._cache, self._mtime = self._read(), mtime
            self._bad.clear()
        return self._cache

    def muted_by(self, labels: dict[str, str], now_ns: int) -> list[str]:
        """Ids of the silences muting ``labels`` now. A silence whose matchers this version refuses (a
        regex with look-around, which f174a23's Python ``re`` accepted) mutes nothing and is logged once per
        file read, naming its id and why; the others apply (it used to raise, and the notifier then applied
        no silence at all: walk23)."""
        out = []
        for s in self.current():
            try:
                if s.mutes(labels, now_ns):
                    out.append(s.id)
            except SilenceError as exc:
                if s.id not in self._bad:
                    self._bad.add(s.id)
                    log.error("silence %s is not applied: %s (expire it: obshub silence expire %s)", s.id, exc, s.id)
        return out
