"""``obshub topics create|check``: every topic obshub uses, on an existing Kafka cluster, as the one table of
:func:`obshub.core.topics.layout` says (partitions, replication factor, ``min.insync.replicas``, retention,
cleanup policy), the stream worker's repartition, changelog and leader topics and the scaled-out rule
engine's state topic included.

Bootstrap and security come from the one Kafka connection of the settings (``OBSHUB_BOOTSTRAP``,
``OBSHUB_KAFKA_SECURITY_PROTOCOL``, ...), like every other command, and so does the reachability check
(:func:`obshub.core.reach.require_broker`: one message after 10 s when the cluster does not answer).
``check`` prints one line per difference (topic, setting, want, have) and exits 1 when there is any; a missing
topic of the stream worker or the rule engine, which they create at their first start, is listed as not
created yet and is not a failure. ``create`` makes the missing topics (idempotent: a second run creates
nothing) and then checks. A replication factor larger than the cluster's broker count
is an error naming both numbers, before anything is created.

Which stream worker and rule engine: ``--app-id``, ``--streams-partitions`` and ``--rules-group-prefix``
when given; else those of the worker and engine running from this ``$OBSHUB_HOME`` (their component
records, the ones ``obshub status`` lists: a demo stack's worker is ``obshub-demo-streams`` and its
engine ``obshub-rules-demo-<run>``); else the defaults. The first line says which, and from where.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import click

from obshub.core import kafka
from obshub.core.clitypes import KafkaName
from obshub.core.errors import ObshubError
from obshub.core.log import NullLogger
from obshub.core.settings import RULES, STREAMS, load_settings
from obshub.core.topics import TopicLayout, layout

#: the settings ``check`` compares, in the order it reports them
CHECKED = ("exists", "partitions", "replication.factor", "min.insync.replicas", "retention.ms", "cleanup.policy")


#: owners (``TopicLayout.owner``) whose topics their component creates at its first start when missing
OWN_TOPICS = {"streams": "the stream worker", "rules": "the rule engine"}


def failing(diffs: list[Difference]) -> list[Difference]:
    """The differences that fail ``check``: all but the :attr:`Difference.pending` ones."""
    return [d for d in diffs if not d.pending]


class TopicsError(ObshubError):
    """The cluster cannot hold the topics as the table says (too few brokers), or does not answer."""


@dataclass(frozen=True)
class Difference:
    """One way a topic on the cluster differs from its row of the table: ``setting`` is one of
    :data:`CHECKED`; ``want`` and ``have`` are the values as text (``have`` is ``-`` for a missing topic).
    ``pending``: a missing topic of the stream worker or the rule engine (their own topics: repartition,
    changelogs, leader, state), which they create at their first start; not a failure of ``check``."""

    topic: str
    setting: str
    want: str
    have: str
    pending: bool = False


def wanted(
    settings: Any,
    app_id: str = STREAMS.app_id,
    streams_partitions: int = STREAMS.partitions,
    rules_group_prefix: str | None = RULES.group_prefix,
) -> tuple[TopicLayout, ...]:
    """The table for one deployment: obshub's topics, the stream worker ``app_id``'s own topics
    (``streams_partitions`` = its ``--partitions``) and the rule engine's state topic
    ``<rules_group_prefix>-state`` (every engine keeps its state there, one partition per steps partition;
    None leaves it out)."""
    from obshub.core.topics import partitions, topic_specs
    from obshub.streams.topics import internal_topics

    by_name = {t.name: partitions(t) for t in topic_specs(settings)}
    from obshub.core import schema

    internal = internal_topics(app_id, streams_partitions, by_name[schema.TOPIC_EVENTS])
    state = (f"{rules_group_prefix}-state", by_name[schema.TOPIC_STEPS]) if rules_group_prefix else None
    return layout(settings, internal, state)


def _admin(settings: Any):
    from confluent_kafka.admin import AdminClient

    return AdminClient(
        kafka.admin_config(kafka.connection(settings), {"socket.timeout.ms": 10000, "logger": NullLogger()})
    )


def _metadata(admin, bootstrap: str):
    from confluent_kafka import KafkaException

    try:
        return admin.list_topics(timeout=15)
    except KafkaException as exc:
        raise TopicsError(
            f"the Kafka cluster at {bootstrap} did not answer a metadata request: {exc}",
            "check OBSHUB_BOOTSTRAP and the Kafka security settings (`obshub status` shows what it reaches)",
        ) from exc


def _reach(settings: Any) -> None:
    """The one reachability path of every command (:func:`obshub.core.reach.require_broker`): return once
    the cluster answers, else raise BrokerUnreachable after its 10 s naming the address and the reason (at
    once when the bootstrap is this machine's loopback and its port refuses connections)."""
    from obshub.core.reach import require_broker

    require_broker(settings.bootstrap_servers, refused_fails=True)


def _require_brokers(rows: tuple[TopicLayout, ...], md, bootstrap: str) -> None:
    brokers = len(md.brokers)
    rf = max((r.replication_factor for r in rows), default=1)
    if rf > brokers:
        raise TopicsError(
            f"replication factor {rf} is larger than the {brokers} broker(s) of the cluster at {bootstrap}",
            "set OBSHUB_KAFKA_REPLICATION_FACTOR (Helm: kafka.replicationFactor) to at most the broker count",
        )


def differences(
    settings: Any, rows: tuple[TopicLayout, ...], admin=None, created: list[str] | None = None
) -> list[Difference]:
    """Compare the cluster of ``settings`` with ``rows``: one :class:`Difference` per setting that is not as
    the table says (a missing topic is one ``exists`` difference). Replication factor is the smallest
    replica count of the topic's partitions. ``created``: topics just created, waited for in the metadata
    this compares (:func:`_wait_listed`: each metadata request may be answered by another broker, whose
    cache may not list them yet). Raises TopicsError when the cluster does not answer."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource

    admin = admin or _admin(settings)
    md = _wait_listed(admin, list(created or ()), settings.bootstrap_servers) if created else None
    md = md or _metadata(admin, settings.bootstrap_servers)
    out: list[Difference] = []
    present = [r for r in rows if r.name in md.topics and md.topics[r.name].error is None]
    for r in rows:
        if r not in present:
            out.append(Difference(r.name, "exists", "yes", "no", pending=r.owner in OWN_TOPICS))
    configs: dict[str, dict[str, str]] = {}
    if present:
        futs = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, r.name) for r in present])
        for res, fut in futs.items():
            try:
                configs[res.name] = {k: v.value for k, v in fut.result(timeout=15).items()}
            except (KafkaException, TimeoutError) as exc:
                raise TopicsError(
                    f"failed to read the configs of topic {res.name} on {settings.bootstrap_servers}: {exc}",
                    "the principal needs DescribeConfigs on obshub's topics",
                ) from exc
    for r in present:
        parts = md.topics[r.name].partitions
        have: dict[str, str] = {
            "partitions": str(len(parts)),
            "replication.factor": str(min((len(p.replicas) for p in parts.values()), default=0)),
            **configs.get(r.name, {}),
        }
        want = {"partitions": str(r.partitions), "replication.factor": str(r.replication_factor), **r.config()}
        for key in CHECKED[1:]:
            if key in want and have.get(key) != want[key]:
                out.append(Difference(r.name, key, want[key], have.get(key, "-")))
    return out


def create(settings: Any, rows: tuple[TopicLayout, ...], admin=None) -> list[str]:
    """Create every topic of ``rows`` the cluster lacks, with the row's partitions, replication factor and
    configs; return the names created (none on a second run). Raises TopicsError when the replication
    factor exceeds the broker count (nothing is created then) or a create fails."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic

    admin = admin or _admin(settings)
    md = _metadata(admin, settings.bootstrap_servers)
    _require_brokers(rows, md, settings.bootstrap_servers)
    new = [
        NewTopic(r.name, num_partitions=r.partitions, replication_factor=r.replication_factor, config=r.config())
        for r in rows
        if r.name not in md.topics
    ]
    created = []
    for name, fut in (admin.create_topics(new, operation_timeout=30) if new else {}).items():
        try:
            fut.result()
            created.append(name)
        except KafkaException as exc:
            if "already exists" not in str(exc).lower():  # a concurrent create is fine
                raise TopicsError(
                    f"failed to create topic {name} on {settings.bootstrap_servers}: {exc}",
                    "the principal needs Create on the cluster or on obshub's topics",
                ) from exc
    _wait_listed(admin, created, settings.bootstrap_servers)
    return created


def _wait_listed(admin, names: list[str], bootstrap: str, timeout_s: float = 30.0):
    """Wait until the cluster's metadata lists every topic of ``names`` with all its partitions led (a
    created topic reaches the brokers' metadata caches a moment after the create call returns); returns
    that metadata (None for no names)."""
    import time

    deadline = time.monotonic() + timeout_s
    while names:
        md = _metadata(admin, bootstrap)
        # every name in this one answer (another broker may answer the next request)
        missing = [
            n
            for n in names
            if n not in md.topics
            or md.topics[n].error is not None
            or any(p.leader < 0 for p in md.topics[n].partitions.values())
        ]
        if not missing:
            return md
        if time.monotonic() > deadline:
            raise TopicsError(f"topics {', '.join(missing)} were created but not listed within {timeout_s:.0f} s", "")
        time.sleep(0.2)
    return None


_OPTIONS = [
    click.option(
        "--app-id",
        type=KafkaName(),
        default=STREAMS.app_id,
        show_default=True,
        help="the stream workers' --app-id [default: the running worker's, else obshub-streams]",
    ),
    click.option(
        "--streams-partitions",
        type=click.IntRange(1, 1024),
        default=None,
        help="the stream workers' --partitions (their repartition topic and fold tables; default "
        f"$OBSHUB_STREAMS_PARTITIONS or {STREAMS.partitions})",
    ),
    click.option(
        "--rules-group-prefix",
        "--rules-scale-out",  # its name before every engine kept its state in a topic
        "rules_prefix",
        type=KafkaName(),
        default=RULES.group_prefix,
        show_default=True,
        metavar="GROUP_PREFIX",
        help="the rule engines' `rules serve --group-prefix`: their state topic GROUP_PREFIX-state is one of the "
        "topics [default: the running engine's, else this]",
    ),
]


@dataclass(frozen=True)
class Deployment:
    """The stream worker and rule engine whose own topics ``check`` / ``create`` cover: ``app_id``,
    ``partitions`` (None: ``$OBSHUB_STREAMS_PARTITIONS``), ``rules_prefix``, and ``said``: one line on
    which these are and where they come from."""

    app_id: str
    partitions: int | None
    rules_prefix: str
    said: str


def deployment(
    settings: Any, app_id: str | None, streams_partitions: int | None, rules_prefix: str | None
) -> Deployment:
    """The deployment to check: each value given (not None) as given; else the one of the stream worker /
    rule engine running from ``settings.home`` (their component records: ``app_id`` and ``partitions``,
    ``group_prefix``), the first by record name when several differ (``said`` names the others); else
    the default (``STREAMS.app_id``, ``RULES.group_prefix``). ``obshub topics check`` on a running demo
    stack checked the default app id's topics, not the demo worker's (``obshub-demo-streams``)."""
    from obshub.core import registry

    running = [c for c in registry.components(settings) if c.get("running")]
    workers = [c for c in running if str(c.get("name", "")).startswith("streams") and isinstance(c.get("app_id"), str)]
    engines = [
        c for c in running if str(c.get("name", "")).startswith("rules") and isinstance(c.get("group_prefix"), str)
    ]
    parts, others = [], []
    if app_id is None:
        ids = list(dict.fromkeys(c["app_id"] for c in workers))
        if ids:
            app_id = ids[0]
            w = next(c for c in workers if c["app_id"] == app_id)
            if streams_partitions is None and isinstance(w.get("partitions"), int):
                streams_partitions = w["partitions"]
            parts.append(f"--app-id {app_id} (the running stream worker {w['name']}'s)")
            others += [f"--app-id {i}" for i in ids[1:]]
        else:
            app_id = STREAMS.app_id
            parts.append(f"--app-id {app_id} (the default: no stream worker runs from {settings.home})")
    else:
        parts.append(f"--app-id {app_id}")
    if rules_prefix is None:
        prefixes = list(dict.fromkeys(c["group_prefix"] for c in engines))
        if prefixes:
            rules_prefix = prefixes[0]
            parts.append(f"--rules-group-prefix {rules_prefix} (the running rule engine's)")
            others += [f"--rules-group-prefix {p}" for p in prefixes[1:]]
        else:
            rules_prefix = RULES.group_prefix
            parts.append(f"--rules-group-prefix {rules_prefix} (the default)")
    else:
        parts.append(f"--rules-group-prefix {rules_prefix}")
    said = "topics of " + ", ".join(parts)
    if others:
        said += "; also running here: " + ", ".join(others) + " (give the option to check those)"
    return Deployment(app_id, streams_partitions, rules_prefix, said)


def _given(name: str, value: Any) -> Any:
    """``value`` when the option ``name`` was given (command line or environment), else None."""
    ctx = click.get_current_context()
    src = ctx.get_parameter_source(name)
    return value if src not in (None, click.core.ParameterSource.DEFAULT) else None


def _opts(f):
    for o in reversed(_OPTIONS):
        f = o(f)
    return f


def _report(rows: tuple[TopicLayout, ...], diffs: list[Difference]) -> None:
    from rich.table import Table

    from obshub.core.tables import WholeLineConsole, print_table

    console = WholeLineConsole(highlight=False)
    bad = failing(diffs)
    if bad:
        t = Table("topic", "setting", "want", "have", title=f"{len(bad)} difference(s)")
        for d in bad:
            t.add_row(d.topic, d.setting, d.want, d.have)
        print_table(console, t)
    pending = [d for d in diffs if d.pending]
    if pending:
        owner = {r.name: r.owner for r in rows}
        t = Table("topic", "made by", title=f"{len(pending)} topic(s) not created yet (not a failure)")
        for d in pending:
            t.add_row(d.topic, f"{OWN_TOPICS[owner[d.topic]]} at its first start")
        print_table(console, t)
        console.print(
            "`obshub topics create` makes them now (a cluster's deployment does: their settings are then the "
            "table's from the start)"
        )


@click.group(
    "topics",
    epilog="""\b
Examples:
  obshub topics check                       # one line per difference; exit 1 when there is any
  obshub topics create                      # make what is missing, then check
  OBSHUB_BOOTSTRAP=kafka-0:9092 OBSHUB_KAFKA_REPLICATION_FACTOR=3 obshub topics create
  obshub topics create --rules-group-prefix prod   # engines run as `rules serve --group-prefix prod`
""",
)
def topics_group():
    """Every topic obshub uses on the cluster's Kafka (the worker's own topics included): create, check."""


@topics_group.command(
    "check",
    epilog="""\b
Examples:
  obshub topics check                       # one line per difference; exit 1 when there is any
  obshub topics check --json | jq .         # the differences for scripts
  obshub topics check --rules-group-prefix prod    # ... and their state topic prod-state checked too
""",
)
@_opts
@click.option("--json", "as_json", is_flag=True, help="print the differences as JSON lines")
def check_command(app_id, streams_partitions, rules_prefix, as_json):
    """Compare the cluster's topics with the table; exit 1 when any setting differs or a topic is missing.

    A missing topic of the stream worker or the rule engine (repartition, changelogs, leader, state: they
    create it at their first start) is listed as not created yet and does not fail the check."""
    s = load_settings()
    d = deployment(s, _given("app_id", app_id), streams_partitions, _given("rules_prefix", rules_prefix))
    click.echo(f"checking the {d.said}", err=True)
    _reach(s)
    rows = wanted(s, d.app_id, d.partitions or s.streams_partitions, d.rules_prefix)
    diffs = differences(s, rows)
    _print(rows, diffs, as_json)
    sys.exit(1 if failing(diffs) else 0)


@topics_group.command(
    "create",
    epilog="""\b
Examples:
  obshub topics create                      # make what is missing (never changes existing topics), then check
  OBSHUB_BOOTSTRAP=kafka-0:9092 OBSHUB_KAFKA_REPLICATION_FACTOR=3 obshub topics create
""",
)
@_opts
@click.option("--json", "as_json", is_flag=True, help="print the differences left as JSON lines")
def create_command(app_id, streams_partitions, rules_prefix, as_json):
    """Create the missing topics (idempotent), then check; exit 1 when differences remain (partition counts
    and replication factors of existing topics are never changed)."""
    s = load_settings()
    d = deployment(s, _given("app_id", app_id), streams_partitions, _given("rules_prefix", rules_prefix))
    click.echo(f"creating the {d.said}", err=True)
    _reach(s)
    rows = wanted(s, d.app_id, d.partitions or s.streams_partitions, d.rules_prefix)
    admin = _admin(s)
    made = create(s, rows, admin)
    click.echo(f"created {len(made)} topic(s){': ' + ', '.join(made) if made else ''}", err=True)
    diffs = differences(s, rows, admin, created=made)
    _print(rows, diffs, as_json)
    sys.exit(1 if failing(diffs) else 0)


def _print(rows, diffs, as_json: bool) -> None:
    import json

    if as_json:
        for d in diffs:
            click.echo(json.dumps(d.__dict__))
    elif diffs:
        _report(rows, diffs)
    if not as_json:
        pending = len(diffs) - len(failing(diffs))
        later = f", {pending} of the stream worker / rule engine not created yet" if pending else ""
        click.echo(f"{len(rows)} topic(s) checked, {len(diffs) - pending} difference(s){later}", err=True)
