"""One rule of the ``steps`` signal as a rule file's text, for tests that check what the loader says about
one field (its line: ``group_by`` on line 8, ``labels`` on 9, ``annotations`` on 10)."""

from __future__ import annotations


def one_rule(group_by: str = "{host: straggler.host}", labels: str = "{}", summary: str = "x") -> str:
    """The text of a rule file with one rule ``a`` (warning, ``step > 1``); ``group_by`` and ``labels`` are
    YAML flow maps as written, ``summary`` the annotation's template (quoted here)."""
    return (
        "version: 1\n"
        "rules:\n"
        "  - id: a\n"
        "    description: d\n"
        "    severity: warning\n"
        "    signal: steps\n"
        "    condition: step > 1\n"
        f"    group_by: {group_by}\n"
        f"    labels: {labels}\n"
        f"    annotations: {{summary: {summary!r}}}\n"
    )
