"""``obshub setup``: the host steps that need obshub itself (run by ``make setup`` after the venv exists):
the kernel header tree for bcc, tracefs and the Kafka broker jars: what the demo and a node need. The Go
programs only the deployment tests run (Prometheus, Alertmanager, helm) are built by ``make test``
(tests/support/gobuild.py), never here. Each step says what it did; a second run that has nothing to do is
quick."""

from __future__ import annotations

import click

from obshub import stack
from obshub.core.settings import load_settings
from obshub.producer import kheaders


@click.command(
    "setup",
    epilog="""\b
Examples:
  obshub setup              # header tree + tracefs + Kafka jars (make setup runs it)
  obshub setup --no-kafka   # an agent-only node: no broker jars
""",
)
@click.option("--no-kafka", is_flag=True, help="skip installing the Kafka broker jars")
def setup_command(no_kafka):
    """Prepare this host: kernel header tree for bcc (built in the cache, no system folder edited),
    tracefs mounted, Apache Kafka jars cached (first run: a minute). The Go tools of the deployment tests
    are built by ``make test``, not here."""
    settings = load_settings()
    say = lambda m: click.echo(f"setup: {m}")  # noqa: E731
    tree = kheaders.find_header_tree(settings)
    say(f"kernel headers: {tree.source}: {tree.detail}")
    _mnt, what = kheaders.ensure_tracefs()
    say(what)
    if not no_kafka:
        libs = stack.install_kafka(settings, progress=say)
        say(f"Apache Kafka {settings.kafka_version} jars cached in {libs}")
