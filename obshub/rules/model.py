"""The compiled, validated form of rule files: what the engine runs. Built by ``rules.loader``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from obshub.rules.expr import Compiled

SEVERITIES = ("critical", "error", "warning", "info")
SEVERITY_RANK = {s: i for i, s in enumerate(reversed(SEVERITIES))}  # info 0 .. critical 3


@dataclass
class Correlation:
    """A second signal joined on keys: a hit of the rule needs a match of ``condition`` on ``signal``
    whose ``other_keys`` equal the rule record's ``this_keys``, within ``within_ns`` of each other;
    ``order`` is ``any``, ``this_first`` or ``other_first``."""

    signal: str
    kinds: frozenset[str]
    condition: Compiled
    this_keys: dict[str, Compiled]
    other_keys: dict[str, Compiled]
    within_ns: int
    order: str = "any"


@dataclass
class Rule:
    """One compiled rule. Durations in ns. ``aggregate`` over the hits of a group within ``window_ns``
    must reach ``at_least`` (count: number of hits; sum/max/min/avg/cusum: of the ``of`` expression; cusum:
    Page's one-sided CUSUM of the values in time order, ``engine.cusum``)."""

    id: str
    description: str
    severity: str
    signal: str
    kinds: frozenset[str]
    condition: Compiled
    group_by: dict[str, Compiled]
    window_ns: int
    aggregate: str
    of: Compiled | None
    at_least: float
    for_ns: int
    keep_firing_for_ns: int
    labels: dict[str, str]
    annotations: dict[str, Any]  # name -> jinja2 Template
    annotation_sources: dict[str, str]
    foreach: Compiled | None = None
    correlate: Correlation | None = None
    runbook: str = ""
    routes: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    enabled: bool = True
    file: str = ""
    line: int = 0
    # where each name of `routes` was written, (file, line, col): the rule's own `routes:` or an override's
    # `append`/`replace` in another file (a route to no sink is reported there)
    routes_at: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    # a window of the job's last `window_steps` steps instead of `window_ns` (0: a time window); a hit is
    # placed at its record's step, and `count` counts steps with a match (several in one step count once)
    window_steps: int = 0
    # steps rules: False (default) skips interim records (closed_by 'hang' or 'running'), True reads them
    interim: bool = False
    # steps rules: records whose baseline holds fewer than this many steps are skipped (warm-up)
    warmup_steps: int = 0
    # notify again on a new match while firing: at most `renotify_limit` times per firing (0: never),
    # at least `renotify_after_ns` after the previous notification
    renotify_limit: int = 0
    renotify_after_ns: int = 0

    def reads(self, signal: str, kind: str | None = None) -> bool:
        """True when records of ``signal`` (and event ``kind``) may concern this rule (either side)."""
        if self.signal == signal and (signal != "events" or not self.kinds or kind in self.kinds):
            return True
        c = self.correlate
        return bool(c and c.signal == signal and (signal != "events" or not c.kinds or kind in c.kinds))


@dataclass
class InhibitRule:
    """While an alert matching ``source`` (label -> value) fires, alerts matching ``target`` with the same
    values of the ``equal`` labels are not notified (Alertmanager's inhibit_rules)."""

    source: dict[str, str]
    target: dict[str, str]
    equal: list[str]


@dataclass
class RuleSet:
    """Every enabled rule of a set of files, by id, plus inhibition rules; ``files`` in load order;
    ``empty``: the files that say they hold no rules (`rules: []` and nothing else: noted); ``unread``:
    what a folder given as a rule path holds that looks like rules but is not read (``loader.unread_paths``:
    noted, as its rules would never fire)."""

    rules: dict[str, Rule]
    inhibit: list[InhibitRule]
    files: list[str]
    empty: list[str] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)
