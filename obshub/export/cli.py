"""``obshub trace export``: write a job's steps as a Perfetto / chrome://tracing timeline."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

from obshub.core import schema
from obshub.core.clitypes import Bootstrap, Finite, KafkaName, NonEmpty
from obshub.export.errors import ExportError

EPILOG = """\b
Examples:
  obshub trace export --job dlrm --steps 10 -o dlrm.json          # one step of job "dlrm"
  obshub trace export --job dlrm --steps 100-120 -o slow.json     # a range of steps
  obshub trace export --job dlrm --steps 10 -o - | gzip > t.json.gz  # to stdout, compressed
  obshub trace export --job dlrm --steps 5000-5010 --since 2h -o t.json  # read only the last 2 hours
  obshub trace export --job dlrm --steps 1-20 --life 1 -o t.json  # steps 1-20 after the first restart
  # then open the file in https://ui.perfetto.dev (Open trace file) or chrome://tracing
"""


def parse_steps(value: str) -> tuple[int, int]:
    """``"10"`` -> (10, 10), ``"10-20"`` -> (10, 20), steps 0 to ``schema.I64_MAX``. Raises click.BadParameter
    otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", value)
    if not m:
        raise click.BadParameter(f"{value!r} is not a step or a range A-B (e.g. 10 or 10-20)")
    a = int(m.group(1))
    b = int(m.group(2)) if m.group(2) else a
    if b < a:
        raise click.BadParameter(f"step range {value!r} ends before it starts")
    if b > schema.I64_MAX:  # no summary holds such a step: the topics were read for nothing
        raise click.BadParameter(f"step {b} is beyond the largest step a summary holds ({schema.I64_MAX})")
    return a, b


@click.group("trace", epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
def trace_group():
    """Timelines of what obshub saw (events on Kafka, live or replayed)."""


@trace_group.command("export", epilog=EPILOG)
@click.option(
    "--job", required=True, type=NonEmpty("a job name"), help="job name (as the agents or `obshub replay` published it)"
)
@click.option(
    "--steps",
    "steps",
    required=True,
    callback=lambda _ctx, _param, value: parse_steps(value),
    help="step or inclusive range A-B",
)
@click.option("-o", "--output", required=True, help="output JSON file, or - for stdout")
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
    help="give up reading a topic after this many seconds (> 0)",
)
@click.option(
    "--events-topic", type=KafkaName(max_len=249), default=schema.TOPIC_EVENTS, show_default=True, help="agent batches"
)
@click.option(
    "--steps-topic", type=KafkaName(max_len=249), default=schema.TOPIC_STEPS, show_default=True, help="step summaries"
)
@click.option("--since", default=None, help="read only messages from this time on: 2h (ago) or 2026-12-01T02:00:00Z")
@click.option("--until", default=None, help="read only messages up to this time (same forms as --since)")
@click.option(
    "--life",
    type=click.IntRange(min=0),
    default=None,
    help="only this life of a restarted job (0: its first run; `obshub tail steps` shows the life) "
    "[default: every life found; a note says when several share the steps]",
)
def export_command(job, steps, output, bootstrap, timeout_s, events_topic, steps_topic, since, until, life):
    """Write job JOB's steps as Chrome-trace JSON for ui.perfetto.dev: a process per host, a track
    per layer, flow arrows joining each collective across hosts, the straggler and blamed layer marked
    (from the step summaries on obshub.steps.v1)."""
    from obshub.core.settings import load_settings
    from obshub.export.perfetto import build_trace
    from obshub.export.source import parse_when, read_job

    rng = steps  # (first, last), parsed by the option's callback
    bounds = {}
    for name, value in (("since", since), ("until", until)):
        if value is not None:
            try:
                bounds[f"{name}_ns"] = parse_when(value)
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint=f"'--{name}'") from None
    if len(bounds) == 2 and bounds["until_ns"] < bounds["since_ns"]:
        raise click.BadParameter(f"{until!r} is before --since {since!r}", param_hint="'--until'")
    if output != "-" and (not output.strip() or Path(output).is_dir()):  # "" and "." would fail at the end
        raise click.BadParameter(
            f"{output!r} is not a file name: give a JSON file, or - for stdout", param_hint="'-o' / '--output'"
        )
    if output != "-" and not Path(output).resolve().parent.is_dir():  # before minutes of reading topics
        raise ExportError(
            f"cannot write {output}: its folder {Path(output).resolve().parent} does not exist",
            hint="choose a writable path for -o (its folder must exist), or -o - for stdout",
        )
    settings = load_settings(bootstrap=bootstrap)
    data = read_job(
        settings.bootstrap_servers,
        job,
        rng,
        timeout_s=timeout_s,
        events_topic=events_topic,
        steps_topic=steps_topic,
        life=life,
        **bounds,
    )
    if life is None and len(data.lives) > 1:
        data.notes.insert(
            0,
            f"steps {rng[0]}-{rng[1]} of job {job!r} ran in lives {', '.join(map(str, sorted(data.lives)))} "
            "(the job restarted): their events are drawn together; pass --life N for one",
        )
    if life is not None and life not in data.lives:
        raise ExportError(
            f"no step summary of life {life} of job {job!r} in steps {rng[0]}-{rng[1]}"
            + (f" (lives found: {', '.join(map(str, sorted(data.lives)))})" if data.lives else ""),
            hint="`obshub tail steps` shows each step's life",
        )
    if not data.hosts:
        raise ExportError(
            f"no events of job {job!r} in steps {rng[0]}-{rng[1]} on {settings.bootstrap_servers} "
            f"({data.batches} batches read)",
            hint="check the job name and steps (`obshub replay ... --json` prints both)",
        )
    trace = build_trace(data.hosts, data.summaries, job=job, steps=rng)
    text = json.dumps(trace, separators=(",", ":"))
    if output == "-":
        click.echo(text)
    else:
        try:
            Path(output).write_text(text)
        except OSError as exc:
            raise ExportError(
                f"cannot write {output}: {exc.strerror or exc}",
                hint="choose a writable path for -o (its folder must exist), or -o - for stdout",
            ) from None
        n = sum(len(h.events) for h in data.hosts)
        o = trace["otherData"]
        found = (min(e.step for h in data.hosts for e in h.events), max(e.step for h in data.hosts for e in h.events))
        asked = "" if found == tuple(rng) else f" (of {rng[0]}-{rng[1]} asked)"
        click.echo(
            f"wrote {output}: {len(data.hosts)} hosts, {n} events, steps {found[0]}-{found[1]}{asked}, "
            f"straggler marked in steps {o['straggler_steps'] or 'none'}"
            + (f" (no summary for steps {o['steps_without_summary']})" if o["steps_without_summary"] else ""),
            err=True,
        )
    for n in data.notes:
        click.echo(f"note: {n}", err=True)
