"""The ``obshub`` command line (click). Subcommands of other stages are loaded lazily from their own
packages (see ``LAZY_COMMANDS``) so ``obshub --help`` stays fast and each stage owns its CLI."""

from __future__ import annotations

import errno
import importlib
import json
import os
import sys
import time

# Output that goes to a pipe or a file (logs, CI, `| less`) is not cut at rich's default 80 columns: probe
# names, paths and timestamps stay whole. A terminal keeps its own width; COLUMNS set by the user wins.
# Tables go through obshub.core.tables.print_table: off a terminal, as wide as their cells (past 200 too);
# plain lines through its WholeLineConsole: off a terminal, never wrapped (past 200 too).
if "COLUMNS" not in os.environ and not sys.stdout.isatty():
    os.environ["COLUMNS"] = "200"

try:
    import click
    from pydantic import ValidationError
    from rich.markup import escape
    from rich.table import Table
except ModuleNotFoundError as _exc:  # an install with only the instrumentation (no extra)
    sys.exit(
        f"obshub: the command line needs the Python package {_exc.name!r}, which this install lacks: "
        "pip install 'obshub[all]' (or the extra of one role: obshub[agent], obshub[streams], obshub[rules])"
    )

from obshub import __version__, stack
from obshub.core.errors import ObshubError
from obshub.core.settings import DEFAULT_KAFKA_PORT, load_settings
from obshub.core.tables import WholeLineConsole, print_table

# name -> "module:attribute" of a click command or group, imported only when used.
LAZY_COMMANDS: dict[str, str] = {
    "doctor": "obshub.doctor:doctor_command",
    "alerts": "obshub.alerts:alerts_command",
    "setup": "obshub.hostsetup:setup_command",
    "streams": "obshub.streams.cli:streams_group",
    "tail": "obshub.streams.cli:tail_command",
    "demo": "obshub.demo.cli:demo_command",
    "rules": "obshub.rules.cli:rules_group",
    "silence": "obshub.rules.cli:silence_group",
    "replay": "obshub.replay.cli:replay_command",
    "trace": "obshub.export.cli:trace_group",
    "agent": "obshub.producer.cli:agent_command",
    "probes": "obshub.producer.cli:probes_command",
    "deep-dive": "obshub.producer.cli:deep_dive_command",
    "run": "obshub.instrument.cli:run_command",
    "topics": "obshub.topics_cli:topics_group",
}

console = WholeLineConsole(highlight=False)
err_console = WholeLineConsole(stderr=True, highlight=False, emoji=False)


class LazyGroup(click.Group):
    """A click group whose subcommands listed in ``LAZY_COMMANDS`` are imported on first use."""

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def get_command(self, ctx, name):
        if name in LAZY_COMMANDS:
            mod, attr = LAZY_COMMANDS[name].split(":")
            try:
                return getattr(importlib.import_module(mod), attr)
            except ModuleNotFoundError as exc:
                if exc.name and exc.name.split(".")[0] in ("obshub", "producer", "streams", "rules"):
                    raise
                role = {
                    "agent": "agent",
                    "probes": "agent",
                    "streams": "streams",
                    "tail": "streams",
                    "rules": "rules",
                    "silence": "rules",
                    "alerts": "rules",
                }.get(name, "all")
                raise click.UsageError(
                    f"`obshub {name}` needs the Python package {exc.name!r}, which this install "
                    f"lacks: pip install 'obshub[{role}]'"
                ) from None
        return super().get_command(ctx, name)

    def format_commands(self, ctx, formatter):
        """The Commands section of ``obshub --help``: as click's, but a subcommand whose module cannot be
        imported here (a missing extra, the USDT extension not built) is listed with why, instead of
        ``--help`` failing as a whole (exit 1) on it; running that subcommand still gives the full error."""
        rows = []
        for name in self.list_commands(ctx):
            try:
                cmd = self.get_command(ctx, name)
            except (ObshubError, click.UsageError):
                rows.append((name, f"(not usable in this install: `obshub {name}` says why)"))
                continue
            if cmd is not None and not cmd.hidden:
                rows.append(
                    (name, cmd.get_short_help_str(formatter.width - 6 - max(map(len, self.list_commands(ctx)))))
                )
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


EPILOG = """\b
Examples:
  obshub up                      # install (once) and start the local Kafka broker, create topics
  obshub status                  # broker health, topics, consumer groups with lag, components
  obshub status --json           # the same for scripts
  obshub doctor                  # what this kernel offers and which probes will work
  obshub down                    # stop everything obshub started
"""


@click.group(cls=LazyGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="obshub")
def cli():
    """obshub: which host, which layer, which step, why.

    An eBPF agent per node, Kafka, a Faust per-step join across nodes and a YAML rule engine that
    names the straggler of a distributed training job and the layer that made it slow.
    State lives in $OBSHUB_HOME; the broker listens on 127.0.0.1:$OBSHUB_KAFKA_PORT (default 19092).
    """


def _say(msg: str) -> None:
    err_console.print(f"[dim]obshub:[/dim] {msg}")


@cli.command(
    epilog="""\b
Examples:
  obshub up                          # broker on 127.0.0.1:19092, state in $OBSHUB_HOME
  obshub up --port 29092             # another port (no stack of this $OBSHUB_HOME may run)
  OBSHUB_HOME=/tmp/two obshub up --port 29092   # a second stack beside the first: its own state folder
  OBSHUB_KAFKA_VERSION=4.0.1 obshub up   # another Kafka 4.x version from Maven Central
"""
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help=f"broker port (default $OBSHUB_KAFKA_PORT or {DEFAULT_KAFKA_PORT})",
)
def up(port):
    """Install (once, cached) and start the local Apache Kafka broker (KRaft) and create the topics."""
    s = load_settings(kafka_port=port)
    res = stack.up(s, progress=_say)
    if res["already"]:
        console.print(f"already up: Kafka on {res['bootstrap']} (pid {res['pid']}); log {res['log']}")
    else:
        console.print(f"up: Kafka on {res['bootstrap']} (pid {res['pid']}); log {res['log']}")


@cli.command(
    epilog="""\b
Examples:
  obshub down                        # stop workers, rule engine, agents, then the broker
  OBSHUB_HOME=/tmp/other obshub down # the stack of another state folder
"""
)
def down():
    """Stop every component obshub started, then the broker. State stays in $OBSHUB_HOME."""
    s = load_settings()
    stopped = stack.down(s, progress=_say)
    console.print("stopped: " + ", ".join(stopped) if stopped else "nothing was running")


@cli.command(
    epilog="""\b
Examples:
  obshub status                      # tables: broker, topics, consumer groups with lag, components
  obshub status --json | jq .groups  # consumer lag for scripts
"""
)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of tables")
def status(as_json):
    """Broker health, topics with partitions, consumer groups with lag, running components.

    Exit code 0 when the broker answers, 1 otherwise."""
    s = load_settings()
    st = stack.status(s)
    if as_json:
        click.echo(json.dumps(st, indent=2, default=str))
        sys.exit(0 if st["broker"]["up"] else 1)
    b = st["broker"]
    if b["up"]:
        console.print(f"[green]broker up[/green] at {st['bootstrap']} (pid {b['pid'] or 'external'})")
    else:
        console.print(f"[red]broker down[/red] at {st['bootstrap']}: {b['error']}")
    console.print(f"state {st['home']}; logs in {st['logs']} (broker log {b['log']})")
    sec = st.get("security") or {}
    if sec.get("protocol") not in (None, "PLAINTEXT"):
        who = f", SASL {sec['sasl_mechanism']} as {sec['sasl_username']}" if sec.get("sasl_mechanism") else ""
        tls = f", CA {sec['ssl_ca_location']}" if sec.get("ssl_ca_location") else ""
        cert = f", client certificate {sec['ssl_certificate_location']}" if sec.get("ssl_certificate_location") else ""
        console.print(escape(f"Kafka security: {sec['protocol']}{who}{tls}{cert}"))
    if st["topics"]:
        t = Table("topic", "partitions", "messages", title="topics")
        for row in st["topics"]:
            t.add_row(row["name"], str(row["partitions"]), str(row["messages"]))
        print_table(console, t)
    if st["groups"]:
        t = Table("consumer group", "state", "lag (messages)", title="consumer groups")
        for g in st["groups"]:
            t.add_row(g["group"], g["state"], str(g["lag"]))
        print_table(console, t)
    if st["components"]:
        t = Table("component", "pid", "running", "log", title="components")
        for c in st["components"]:
            t.add_row(c["name"], str(c["pid"]), component_state(c, b["up"]), c.get("log", ""))
        print_table(console, t)
    else:  # an empty table's frame said nothing a new user could read
        console.print("components: none registered in this state folder (`obshub up` starts the broker)")
    sys.exit(0 if b["up"] else 1)


def component_state(c: dict, broker_up: bool) -> str:
    """The ``running`` cell of ``obshub status`` for registry record ``c``: for the broker (``kafka``) what
    is true of both the process and the port, e.g. a process that runs but does not answer. A record whose
    process is gone (it was killed before it could remove it) says so and when that process started
    (local time): a component that stops by itself removes its record."""
    exited = f"[red]no: exited{_since(c)}, its record left behind (`obshub down` clears it)[/red]"
    if c["name"] != "kafka":
        if c["running"] and c.get("ready") is False:  # a stream worker recovering its tables reads no input yet
            return "[yellow]yes, recovering its tables (reads no input yet)[/yellow]"
        return "yes" if c["running"] else exited
    if c["running"] and broker_up:
        return "yes"
    if c["running"]:
        return "[red]process yes, but it does not answer (starting, stuck or failing: read its log)[/red]"
    if broker_up:
        return "[red]no (stale record); another process answers on its port[/red]"
    return exited


def _since(c: dict) -> str:
    """`` (started 2026-12-06 21:24:22)`` from record ``c``'s ``started`` (Unix seconds), "" without one."""
    started = c.get("started")
    if not isinstance(started, (int, float)) or isinstance(started, bool):
        return ""
    return time.strftime(" (started %Y-%m-%d %H:%M:%S)", time.localtime(started))


def _os_error_hint(path: str) -> str:
    """What to check for a file obshub could not create, read or write: the variable that chose its
    folder when it is under ``$OBSHUB_HOME`` or ``$OBSHUB_CACHE``."""
    from pathlib import Path

    from obshub.core.settings import load_settings

    try:
        settings = load_settings()
    except ObshubError:
        return "check the path and its permissions"
    for var, root in (("OBSHUB_HOME", settings.home), ("OBSHUB_CACHE", settings.cache)):
        if Path(path) == root or root in Path(path).parents or Path(path) in root.parents:  # in it, or above it
            return f"{var} is {root}: make it a folder this user can write, or point {var} at one"
    return "check that the path exists and that this user may read or write it"


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``obshub`` console script: runs the CLI, turns ObshubError into
    ``error:``/``hint:`` lines and its exit code (1 unless it says otherwise)."""
    try:
        cli.main(args=argv, standalone_mode=False)
    except ObshubError as exc:
        # messages quote user input (paths, trace contents): never read them as rich markup
        err_console.print(f"[red]error:[/red] {escape(str(exc))}")
        if exc.hint:
            err_console.print(f"[yellow]hint:[/yellow] {escape(exc.hint)}")
        sys.exit(getattr(exc, "exit_code", 1))
    except ValidationError as exc:
        if exc.title != "KafkaConnection":
            raise
        # the security settings of every Kafka client (OBSHUB_KAFKA_*) are incomplete or name a missing file:
        # the messages name the variables; the values (a password) are never printed
        from obshub.core.kafka import ENV

        for e in exc.errors():
            field = str(e["loc"][0]) if e["loc"] else ""
            what = (f"{ENV[field]}: " if field in ENV else "") + e["msg"].removeprefix("Value error, ")
            err_console.print(f"[red]error:[/red] Kafka connection: {escape(what)}")
        err_console.print(
            "[yellow]hint:[/yellow] set the variables named above (deploy/README.md, 'Secured Kafka'), "
            "or unset OBSHUB_KAFKA_SECURITY_PROTOCOL for a PLAINTEXT broker"
        )
        sys.exit(1)
    except OSError as exc:
        if exc.filename is None and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            # a write to a full or read-only disk names no file (the open did, and worked)
            err_console.print(f"[red]error:[/red] {escape(exc.strerror or str(exc))}")
            err_console.print(
                "[yellow]hint:[/yellow] a disk this command writes to is full or read-only: the state folder "
                "($OBSHUB_HOME), the output file it was given, or where its output is redirected"
            )
            sys.exit(1)
        if exc.filename is None:  # not about a file the user can fix: a bug, shown as one
            raise
        # a folder or file this user cannot create or write (OBSHUB_HOME=/var/lib/obshub as a user, a
        # read-only or full disk): one error naming the file, not a traceback from the first mkdir or open
        err_console.print(f"[red]error:[/red] {escape(f'{exc.filename}: {exc.strerror or exc}')}")
        err_console.print(f"[yellow]hint:[/yellow] {escape(_os_error_hint(str(exc.filename)))}")
        sys.exit(1)
    except click.exceptions.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
