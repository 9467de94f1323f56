"""``obshub rules check|test|serve`` and ``obshub silence add|list|expire``."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import click

from obshub.core.clitypes import KafkaName, stop_timeout_option
from obshub.core.settings import RULES, load_settings
from obshub.rules.durations import parse_duration_ns
from obshub.rules.errors import RuleTestError, RuleValidationError
from obshub.rules.lifecycle import rfc3339

RULES_EPILOG = """\b
Examples:
  obshub rules check builtin                        # validate the builtin pack (exit 0 = valid)
  obshub rules check builtin my_rules.yaml          # yours with it: every problem as file:line:col
  obshub rules test my_rules_test.yaml              # run rule unit tests (rule_files: may name builtin)
  obshub rules test builtin                         # the builtin pack's own unit tests
  obshub rules serve                                # builtin pack, console sink, local Kafka
  obshub rules serve -r builtin -r team.yaml -c alerting.yaml   # the builtin pack, your rules and sinks
  obshub rules serve --metrics-port 9108            # also Prometheus metrics on :9108 (every interface)
  obshub rules serve --log-file ~/obshub-rules.log &   # in the background, logs to a file
  obshub rules serve --group-prefix prod   # run N of these: the engines of one prefix share the jobs
  kill -HUP $(jq .pid $OBSHUB_HOME/run/rules.json)  # reload rule files now (a second engine: rules-2.json)
The name `builtin` is the builtin pack installed with obshub (a file or folder of that name wins).
"""

SILENCE_EPILOG = """\b
Examples:
  obshub silence add -m host=node2 -d 2h -a alice -c "node2 in maintenance, OPS-123"   # mute node2
  obshub silence add -m alertname=~'.*straggler' -m job=llm -d 30m -a bob -c "known"   # regex matcher
  obshub silence add -m team=ml -r team.yaml -d 1h -a carol -c "ours"   # a label of your own rules
  obshub silence list                                # active and pending silences
  obshub silence list --all                          # including expired ones
  obshub silence expire 3f2a9c1d0b7e                 # end a silence now
"""


@click.group("rules", epilog=RULES_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
def rules_group():
    """Validate, test and run alerting rules (YAML + CEL). See docs/RULES.md."""


@rules_group.command("check", epilog=RULES_EPILOG)
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
def check_command(files):
    """Validate rule FILES (or directories) together, in the order given. Prints every problem as
    file:line:col; exit code 0 only when all are valid. A file without rules, macros, lists, overrides
    or inhibit rules (empty, only comments, only `version:`) is a problem ("no rules"), unless it says
    `rules: []`."""
    from obshub.rules.loader import load_ruleset

    try:
        rs = load_ruleset(list(files))
    except RuleValidationError as exc:
        for p in exc.problems:
            click.echo(str(p), err=True)
        click.echo(f"FAILED: {len(exc.problems)} problem(s)", err=True)
        sys.exit(1)
    for f in rs.empty:  # valid: it says so
        click.echo(f"note: {f}: no rules (`rules: []`, as written)", err=True)
    for u in rs.unread:  # valid, but rules the user may think are checked (and served) are not
        click.echo(f"note: {u}", err=True)
    click.echo(f"OK: {len(rs.rules)} rule(s) in {len(rs.files)} file(s)")


@rules_group.command("test", epilog=RULES_EPILOG)
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
def test_command(files):
    """Run rule unit-test FILES (a directory: the *_test.yaml / *_test.yml files in it and its
    subdirectories, in path order; the name `builtin`: the builtin pack's own tests). Prints PASS/FAIL per
    test, expected vs got for failures, every problem of a malformed test file as file:line:col; exit code 0
    only when every test passes, 1 also when a directory holds no test file or the files hold no test (a
    test run that ran nothing must not pass in CI)."""
    from obshub.rules.loader import BUILTIN_NAME, resolve_builtin
    from obshub.rules.testing import run_test_file

    failed = passed = 0
    broken = False
    paths = []
    for f in files:
        f = resolve_builtin(f) if str(f) == BUILTIN_NAME else f  # as `rules check builtin`: a path of that name wins
        if not f.is_dir():
            paths.append(f)
            continue
        found = sorted(p for p in f.rglob("*") if p.is_file() and p.name.endswith(("_test.yaml", "_test.yml")))
        if not found:
            click.echo(f"ERROR {f}: no *_test.yaml or *_test.yml file in it or below it", err=True)
            broken = True
        paths += found
    for f in paths:
        try:
            results = run_test_file(f)
        except (RuleTestError, RuleValidationError) as exc:
            click.echo(f"ERROR {f}:\n{exc}", err=True)
            broken = True
            continue
        for r in results:
            if r.ok:
                passed += 1
                click.echo(f"PASS {f}: {r.name}")
            else:
                failed += 1
                click.echo(f"FAIL {f}: {r.name}")
                for text in r.failures:
                    click.echo("  " + text.replace("\n", "\n  "))
    if not passed and not failed and not broken:
        click.echo("ERROR: no test ran: the test files hold no tests (`tests:` is empty)", err=True)
        broken = True
    click.echo(f"{passed} passed, {failed} failed" + (", some files could not run" if broken else ""))
    sys.exit(1 if failed or broken else 0)


@rules_group.command("serve", epilog=RULES_EPILOG)
@click.option(
    "-r",
    "--rules",
    "rule_paths",
    multiple=True,
    type=click.Path(path_type=Path),
    help="rule file or directory (repeatable; default: the builtin pack)",
)
@click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    default=None,
    help="alerting config: sinks, route, delivery (default: console sink only)",
)
@click.option(
    "--group-prefix",
    type=KafkaName(),
    default=RULES.group_prefix,
    show_default=True,
    help="Kafka consumer group prefix (and of the state topic PREFIX-state)",
)
@click.option("--from-beginning", is_flag=True, help="a new consumer group reads inputs from the earliest offset")
@click.option(
    "--scale-out",
    is_flag=True,
    hidden=True,
    help="accepted for compatibility: every engine scales out (engines of one --group-prefix share the jobs)",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="serve Prometheus metrics on PORT (0: any free port, logged)",
)
@click.option(
    "--metrics-addr",
    envvar="OBSHUB_METRICS_ADDR",
    default="0.0.0.0",
    show_default=True,
    help="address the metrics port binds (127.0.0.1: this machine only) [env OBSHUB_METRICS_ADDR]",
)
@click.option(
    "--resolve-on-exit",
    is_flag=True,
    help="resolve every firing alert when stopping (an engine that stops for good: a demo, a CI stack; "
    "by default alerts survive a restart in the engine's state)",
)
@stop_timeout_option(60.0, "a second signal forces it at once")
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@click.option(
    "--log-file",
    type=click.Path(path_type=Path),
    default=None,
    help="append logs to this file instead of stderr (e.g. $OBSHUB_HOME/logs/rules.log)",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    envvar="OBSHUB_LOG_FORMAT",
    default="text",
    show_default=True,
    help="json: one JSON object per line (time, level, logger, message)",
)
def serve_command(
    rule_paths,
    config_path,
    group_prefix,
    from_beginning,
    scale_out,
    metrics_port,
    metrics_addr,
    resolve_on_exit,
    stop_timeout,
    log_level,
    log_file,
    log_format,
):
    """Consume step summaries and events, run the rules, publish alert changes to obshub.alerts.v1 and
    deliver them to the sinks. Reloads rule files on change or SIGHUP. Stops on SIGTERM/SIGINT (exit 0),
    or is forced to after --stop-timeout seconds or a second signal (exit 1)."""
    from obshub.core import registry, stopping
    from obshub.rules.service import RuleService
    from obshub.rules.sinks.config import load_config

    # before any thread starts (librdkafka's, the dispatcher's): every thread inherits the blocked mask and
    # the stop-watch thread sees the signal even while the main thread is blocked in a Kafka client call
    stopping.block_stop_signals()

    if log_file:
        log_file.parent.mkdir(parents=True, exist_ok=True)
    from obshub.core import log as jsonlog

    jsonlog.setup(
        log_level,
        log_format,
        "rules",
        "%(asctime)s %(levelname)s %(name)s: %(message)s",
        str(log_file) if log_file else None,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # httpx logs request URLs: they can hold secrets
    settings = load_settings()
    svc = RuleService(
        settings,
        list(rule_paths),
        load_config(config_path),
        group_prefix=group_prefix,
        from_beginning=from_beginning,
        log_path=str(log_file) if log_file else "stderr",
        scale_out=scale_out,
        resolve_on_exit=resolve_on_exit,
    )
    started = (
        f"rules: {len(svc.ruleset.rules)} rule(s), sinks: "
        f"{', '.join(s.name for s in svc.dispatcher.sinks) or 'none (alerts only on the alerts topic: `obshub alerts`)'}; "
        f"Kafka {settings.bootstrap_servers}"
    )
    if log_format == "json":
        logging.getLogger("obshub.rules.service").info(started)
    else:
        click.echo(started, err=True)

    def forget() -> None:  # the component's record (`obshub status`), when a forced exit skips serve's own
        if getattr(svc, "component", None):
            registry.unregister_component(settings, svc.component)

    svc_log = logging.getLogger("obshub.rules.service")
    stopping.StopWatch(lambda _signum: svc.stop.set(), forget, stop_timeout, name="rules serve", logger=svc_log).start()
    svc.serve(metrics_port, metrics_addr)


def _store():
    from obshub.rules.service import state_dir
    from obshub.rules.silences import SilenceStore

    return SilenceStore(state_dir(load_settings()) / "silences.json")


@click.group("silence", epilog=SILENCE_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
def silence_group():
    """Mute alert notifications by label matchers for a time (alerts still change state)."""


@silence_group.command("add", epilog=SILENCE_EPILOG)
@click.option(
    "-m",
    "--matcher",
    "matchers",
    multiple=True,
    required=True,
    help="NAME=VALUE, NAME!=VALUE, NAME=~REGEX or NAME!~REGEX (repeatable; all must match)",
)
@click.option("-d", "--duration", default="1h", show_default=True, help="how long, e.g. 30m, 2h")
@click.option("--start-in", default="0s", show_default=True, help="start later, e.g. 10m")
@click.option("-a", "--author", required=True, help="who silences")
@click.option("-c", "--comment", required=True, help="why (ticket, maintenance)")
@click.option(
    "-r",
    "--rules",
    "rule_paths",
    multiple=True,
    type=click.Path(path_type=Path),
    help="your rule files or directories: their alerts' labels a matcher may name too, besides those of the "
    "builtin pack and the opt-in packs (repeatable)",
)
@click.option(
    "--any-label",
    is_flag=True,
    help="keep a matcher on a label no alert of the rules carries, or alertname= an id none of them has "
    "(it mutes nothing until such a rule runs)",
)
@click.option("--json", "as_json", is_flag=True)
def silence_add(matchers, duration, start_in, author, comment, rule_paths, any_label, as_json):
    """Create a silence; prints its id. A matcher on a label no alert carries (`hostname=node2`: the
    label is `host`) is refused, naming the labels alerts carry (--any-label keeps it); so are a value that
    starts with `=` or `~` (`host==node2`), `severity=` no severity, `alertname=` no rule id (both mute
    nothing) and a value over 1,024 characters."""
    from obshub.rules.loader import BUILTIN_NAME, PACKS_DIR, load_ruleset
    from obshub.rules.silences import (
        Matcher,
        SilenceError,
        alert_labels,
        check_labels,
        check_not_everything,
        check_values,
    )

    try:  # a malformed matcher, matchers that mute every alert or nothing, is a usage error (exit 2)
        parsed = [Matcher.parse(text) for text in matchers]
        check_not_everything(parsed)
        ruleset = None
        if not any_label:
            paths = [BUILTIN_NAME, *sorted(p.stem for p in PACKS_DIR.glob("*.yaml")), *rule_paths]
            ruleset = load_ruleset(paths)
            check_labels(parsed, alert_labels(ruleset))
        check_values(parsed, set(ruleset.rules) if ruleset is not None else None)
    except SilenceError as exc:
        raise click.BadParameter(
            f"{exc}; {exc.hint}" if exc.hint else str(exc), param_hint="'-m' / '--matcher'"
        ) from None
    for name, text in (("'-a' / '--author'", author), ("'-c' / '--comment'", comment)):
        if not text.strip():  # a usage error (exit 2) like the others, not the store's failure (exit 1)
            raise click.BadParameter(
                "a silence needs an author and a comment (why it is muted), not an empty one",
                param_hint=name,
            )
    values = {}
    for name, hint, text in (("start_in", "'--start-in'", start_in), ("duration", "'-d' / '--duration'", duration)):
        try:
            values[name] = parse_duration_ns(text)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=hint) from None
    if values["duration"] <= 0:  # a silence that ends as it starts: a usage error, not a failure (exit 2)
        raise click.BadParameter(
            f"{duration!r}: a silence lasts a positive time, e.g. 30m", param_hint="'-d' / '--duration'"
        )
    max_ns = 10 * 366 * 24 * 3600 * 10**9
    if values["start_in"] > max_ns:
        raise click.BadParameter("a silence may start at most 10 years from now", param_hint="'--start-in'")
    if values["start_in"] + values["duration"] > max_ns:
        raise click.BadParameter(
            "a silence may end at most 10 years from now (--start-in plus --duration)", param_hint="'-d' / '--duration'"
        )
    start = time.time_ns() + values["start_in"]
    end = start + values["duration"]
    s = _store().add(list(matchers), start, end, author, comment)
    click.echo(json.dumps(s.__dict__) if as_json else f"silence {s.id} until {rfc3339(s.ends_at_ns)}")


@silence_group.command("list", epilog=SILENCE_EPILOG)
@click.option("--all", "show_all", is_flag=True, help="include expired silences")
@click.option("--json", "as_json", is_flag=True)
def silence_list(show_all, as_json):
    """List silences (active and pending; --all for expired too)."""
    from obshub.rules.silences import shown_matcher

    now = time.time_ns()
    items = [s for s in _store().list() if show_all or s.ends_at_ns > now]
    if as_json:
        click.echo(json.dumps([s.__dict__ for s in items]))
        return
    for s in items:
        state = "active" if s.active(now) else ("pending" if s.starts_at_ns > now else "expired")
        click.echo(
            f"{s.id}  {state:8} {rfc3339(s.starts_at_ns)} .. {rfc3339(s.ends_at_ns)}  "
            f"{' '.join(shown_matcher(m) for m in s.matchers)}  by {s.author}: {s.comment}"
        )
    if not items:
        click.echo("no silences")


@silence_group.command("expire", epilog=SILENCE_EPILOG)
@click.argument("silence_id")
def silence_expire(silence_id):
    """End the silence SILENCE_ID now."""
    s = _store().expire(silence_id)
    click.echo(f"silence {s.id} expired at {rfc3339(s.ends_at_ns)}")
