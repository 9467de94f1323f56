"""``obshub alerts``: the alerts that are firing and that fired recently, read back from the alerts topic
(``obshub.alerts.v1``, one record per state change, see obshub/rules/lifecycle.py ``change_record``).

Only the time range asked for is read (``--since``, default 24 h): each partition is entered at the
offset of its first record at or after that time (Kafka's offsets-for-times), never at its oldest
message. Per alert (fingerprint) the latest change wins: ``firing`` means still firing when the read
started; ``resolved`` ended within the range. Filters: training job, host, rule; ``--firing`` keeps the
firing ones only. Exit status: 0, or 1 when Kafka cannot be read (with the reason).
"""

from __future__ import annotations

import json
import time

import click

from obshub.core import schema
from obshub.core.clitypes import Bootstrap, Finite, NonEmpty

EPILOG = """\b
Examples:
  obshub alerts                              # firing and recent (24 h) alerts, newest first
  obshub alerts --firing                     # only what fires now
  obshub alerts --job llm-70b --since 2h     # one training job, the last two hours
  obshub alerts --host node17 --rule tcp_retransmits_on_straggler
  obshub alerts --since 2026-12-01T00:00:00Z --until 2026-12-01T06:00:00Z --json   # a window, for scripts
"""


def latest_alerts(
    values,
    *,
    job: str | None = None,
    host: str | None = None,
    rule: str | None = None,
    firing_only: bool = False,
    skipped: list[str] | None = None,
    since_ns: int | None = None,
    until_ns: int | None = None,
) -> list[dict]:
    """The latest firing/resolved change of each alert among ``values`` (JSON change records as bytes,
    or confluent_kafka Messages), filtered by the ``job``/``host`` labels and the ``rule``; sorted firing
    first, then newest first. Records that are not change records (``rules.intake.decode_change``) are
    skipped; with ``skipped``, each is appended there as ``topic[partition]@offset: field: problem``.
    ``since_ns``/``until_ns`` (epoch ns, inclusive) keep only changes whose ``updated_at_ns`` is in range."""
    from obshub.rules.intake import decode_change

    latest: dict[str, dict] = {}
    for v in values:
        msg = v if callable(getattr(v, "value", None)) else None
        try:
            rec = decode_change(msg.value() if msg is not None else v)
        except schema.SchemaError as exc:
            if skipped is not None:
                where = f"{msg.topic()}[{msg.partition()}]@{msg.offset()}: " if msg is not None else ""
                skipped.append(f"{where}{exc}")
            continue
        if rec["status"] not in ("firing", "resolved"):
            continue
        # a seek by time lands on the first message at or after ``since``, but a partition's timestamps
        # are not ordered, so a change from before the range can follow it: the record's own time decides
        updated = int(rec.get("updated_at_ns", 0))
        if (since_ns is not None and updated < since_ns) or (until_ns is not None and updated > until_ns):
            continue
        labels = rec.get("labels") or {}
        if (
            (job and labels.get("job") != job)
            or (host and labels.get("host") != host)
            or (rule and rec.get("rule") != rule)
        ):
            continue
        fp = rec.get("fingerprint", "")
        if fp not in latest or int(rec.get("updated_at_ns", 0)) >= int(latest[fp].get("updated_at_ns", 0)):
            latest[fp] = rec
    out = [r for r in latest.values() if not firing_only or r["status"] == "firing"]
    return sorted(out, key=lambda r: (r["status"] != "firing", -int(r.get("updated_at_ns", 0))))


@click.command("alerts", epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--since", default="24h", show_default=True, help="from this time: 2h (ago) or 2026-12-01T02:00:00Z")
@click.option("--until", default=None, help="up to this time (same forms as --since) [default: now]")
@click.option("--job", type=NonEmpty("a job name"), help="only alerts of this training job (label job)")
@click.option("--host", type=NonEmpty("a host name"), help="only alerts of this host (label host)")
@click.option("--rule", type=NonEmpty("a rule id"), help="only alerts of this rule id (label alertname)")
@click.option("--firing", "firing_only", is_flag=True, help="only alerts still firing")
@click.option("--json", "as_json", is_flag=True, help="one JSON array of the latest change records")
@click.option(
    "--bootstrap",
    type=Bootstrap(),
    help="Kafka bootstrap servers (default: the obshub broker)",
)
@click.option(
    "--timeout-s",
    type=Finite(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="give up reading after this many seconds (> 0)",
)
def alerts_command(since, until, job, host, rule, firing_only, as_json, bootstrap, timeout_s):
    """List the alerts firing now and those that fired recently, by job, host and rule."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from obshub.core.settings import load_settings
    from obshub.core.tables import print_table
    from obshub.export.source import parse_when, snapshot

    bounds = {}
    for name, value in (("since", since), ("until", until)):
        if value is not None:
            try:
                bounds[f"{name}_ns"] = parse_when(value)
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint=f"'--{name}'") from None
    if "until_ns" in bounds and bounds["until_ns"] < bounds["since_ns"]:
        raise click.BadParameter(
            f"{until} is before --since {since}: the range would be empty (2h means two hours ago, so "
            "--since 5h --until 2h reads from five to two hours ago)",
            param_hint="'--until'",
        )
    settings = load_settings(bootstrap=bootstrap)
    skipped: list[str] = []
    rows = latest_alerts(
        snapshot(settings.bootstrap_servers, schema.TOPIC_ALERTS, timeout_s, **bounds),
        job=job,
        host=host,
        rule=rule,
        firing_only=firing_only,
        skipped=skipped,
        since_ns=bounds.get("since_ns"),
        until_ns=bounds.get("until_ns"),
    )
    for text in skipped[:20]:
        click.echo(f"skipped unreadable alert change at {text}", err=True)
    if len(skipped) > 20:
        click.echo(f"... and {len(skipped) - 20} more unreadable alert changes", err=True)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(
            f"no {'firing ' if firing_only else ''}alerts since {since}"
            + (f" for job {job}" if job else "")
            + (f" on host {host}" if host else "")
        )
        return
    console = Console(highlight=False)
    title = f"alerts since {since} ({sum(r['status'] == 'firing' for r in rows)} firing)"
    cells = [_cells(r, time.time_ns()) for r in rows]
    if not console.is_terminal:  # piped or to a file: a short line per alert, its summary whole below it
        click.echo("\n".join(piped_lines(title, cells)))
        return
    t = Table(*COLUMNS, "summary", title=title)
    for c in cells:
        status = "[red]firing[/red]" if c[0] == "firing" else "[green]resolved[/green]"
        t.add_row(status, *(Text(x) for x in c[1:]))  # user text: never markup
    print_table(console, t)


#: the columns of `obshub alerts` before the summary
COLUMNS = ("status", "since", "rule", "job", "host", "layer", "severity")


def _cells(r: dict, now_ns: int) -> list[str]:
    """One alert's cells: :data:`COLUMNS`, then the summary (texts; ``since`` in minutes before ``now_ns``)."""
    lab = r.get("labels") or {}
    at = r.get("ends_at_ns") if r["status"] == "resolved" else r.get("starts_at_ns")
    ago = f"{(now_ns - int(at)) / 60e9:.0f} min ago" if at else ""
    return [
        str(r["status"]),
        ago,
        *(
            str(x)
            for x in (
                r.get("rule", ""),
                lab.get("job", ""),
                lab.get("host", ""),
                lab.get("layer", ""),
                r.get("severity", ""),
                (r.get("annotations") or {}).get("summary", ""),
            )
        ),
    ]


def piped_lines(title: str, cells: list[list[str]]) -> list[str]:
    """The alerts off a terminal (``obshub alerts | less``, ``> alerts.txt``): the title, a header and one
    line per alert of the short :data:`COLUMNS`, aligned, then its summary whole on the next line, indented
    by 4. The table laid every row out as wide as the longest summary plus its frame (over 300 columns
    for one stall alert), unreadable in a pager; cutting or wrapping the summary would lose words for
    ``grep``. A value's own line breaks become blanks: one line each."""
    cells = [[" ".join(x.split()) for x in c] for c in cells]  # a value's own line breaks become blanks
    widths = [max(len(h), *(len(c[k]) for c in cells)) for k, h in enumerate(COLUMNS)]

    def line(values) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(values, widths)).rstrip()

    out = [title, line(COLUMNS)]
    for c in cells:
        out.append(line(c[: len(COLUMNS)]))
        if c[len(COLUMNS)]:
            out.append("    " + c[len(COLUMNS)])
    return out
