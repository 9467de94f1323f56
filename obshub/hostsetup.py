"""``obshub setup``: the host steps that need obshub itself (run by ``make setup`` after the venv exists):
the kernel header tree for bcc, tracefs, the Kafka broker jars, and the Go programs the deployment tests
run (Prometheus, Alertmanager, helm: built once with ``go install``, cached, see obshub/gotools.py). Each
step says what it did; a second run that has nothing to do is quick."""

from __future__ import annotations

import click

from obshub import gotools, stack
from obshub.core.settings import load_settings
from obshub.producer import kheaders


@click.command(
    "setup",
    epilog="""\b
Examples:
  obshub setup              # header tree + tracefs + Kafka jars (make setup runs it)
  obshub setup --no-kafka   # an agent-only node: no broker jars
  obshub setup --no-go-tools   # skip Prometheus, Alertmanager and helm (only the deployment tests use them)
""",
)
@click.option("--no-kafka", is_flag=True, help="skip installing the Kafka broker jars")
@click.option("--no-go-tools", is_flag=True, help="skip building Prometheus, Alertmanager and helm")
def setup_command(no_kafka, no_go_tools):
    """Prepare this host: kernel header tree for bcc (built in the cache, no system folder edited),
    tracefs mounted, Apache Kafka jars cached, Prometheus/Alertmanager/helm built from their Go modules
    and cached (first run: several minutes)."""
    settings = load_settings()
    say = lambda m: click.echo(f"setup: {m}")  # noqa: E731
    tree = kheaders.find_header_tree(settings)
    say(f"kernel headers: {tree.source}: {tree.detail}")
    _mnt, what = kheaders.ensure_tracefs()
    say(what)
    if not no_kafka:
        libs = stack.install_kafka(settings, progress=say)
        say(f"Apache Kafka {settings.kafka_version} jars cached in {libs}")
    if not no_go_tools:
        for name in gotools.TOOLS:
            path = gotools.ensure(settings.cache, name, progress=say)
            say(f"{name} {gotools.TOOLS[name].version}: {path}")
