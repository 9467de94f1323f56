"""Errors of the rule engine, all under :class:`obshub.core.errors.ObshubError`.

A rule file that does not validate raises :class:`RuleValidationError` carrying every
:class:`Problem` found (not only the first), each printed as ``file:line:col: rule "id": what``
(the format of Prometheus' ``promtool check rules``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from obshub.core.errors import ObshubError

#: a run of this many characters without a blank in a problem's message is a value quoted whole (a 50 kB
#: name or expression where a short one was expected): it is shown cut (``_shorten``); paths and lists of
#: allowed names stay whole
_LONG_WORD = re.compile(r"\S{201,}")


def _shorten(text: str) -> str:
    """``text`` with each run of more than 200 characters without a blank cut to its first 100 and its
    length (``xxxx... (50,000 characters)``)."""
    return _LONG_WORD.sub(lambda m: f"{m.group()[:100]}... ({len(m.group()):,} characters)", text)


@dataclass(frozen=True)
class Problem:
    """One validation problem. ``line``/``col`` are 1-based (0 when unknown); ``rule`` is the rule,
    macro or list the problem is in, if any."""

    file: str
    line: int
    col: int
    message: str
    rule: str | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.col}" if self.line else self.file  # 0: a whole-file problem
        rule = self.rule if self.rule is None or len(self.rule) <= 80 else f"{self.rule[:80]}..."  # a 50 kB id
        if rule:  # an invalid id holding a newline or a tab ("a\nb") stays on the problem's one line
            rule = "".join(c if c.isprintable() else repr(c)[1:-1] for c in rule)
        what = f'rule "{rule}": ' if rule else ""
        return f"{where}: {what}{_shorten(self.message)}"


class RulesError(ObshubError):
    """Base of the rule engine's errors."""


class RuleValidationError(RulesError):
    """One or more rule files are invalid. ``problems`` lists every problem, in file order."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        text = "\n".join(str(p) for p in self.problems)
        super().__init__(
            f"{len(self.problems)} problem(s) in rule files:\n{text}",
            "fix the places named above; `obshub rules check FILE` re-checks them",
        )


class RuleTestError(RulesError):
    """A rule unit-test file is malformed (not: a test that fails; that is a result)."""


class SinkConfigError(RulesError):
    """The alerting config (sinks, route, secrets) is invalid or a secret cannot be read."""


class SilenceError(RulesError):
    """A silence is malformed (bad matcher, end before start) or unknown."""
