"""The parts of obshub the demo integrates, how each is started, and whether this checkout has them.

The demo never fakes a part: ``require()`` raises :class:`PartMissingError` naming every missing one
("agent not available: ...") before anything is started. Each part is started as its own ``obshub``
subcommand (``python -m obshub.cli <command> ...``), exactly as a user would run it:

=============  ==========================================================================================
part           command line
=============  ==========================================================================================
agent          ``obshub agent --job J --host node-0N --host-id N --cgroup /sys/fs/cgroup/unified/obshub-demo/hN``
training rank  ``obshub run --job J --host-id N -- python -m obshub.workloads.ddp_train --steps S``
               (``--workload lightning|accum``: ``lightning_train`` / ``accum_train`` instead)
               inside netns ``obshub-hN`` with RANK=N WORLD_SIZE=H MASTER_ADDR=10.77.0.10
stream worker  ``obshub streams worker --app-id obshub-demo-streams --window-s 5 --job-retention-s 360``
rule engine    ``obshub rules serve -c alerting.yaml`` (builtin rules; every sink type -> the local receiver)
=============  ==========================================================================================
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

from obshub.demo.cluster import Host
from obshub.demo.errors import PartMissingError

OBSHUB = [sys.executable, "-m", "obshub.cli"]
TRAIN_MODULE = "obshub.workloads.ddp_train"
#: ``obshub demo --workload NAME``: the training module each rank runs (same command line and step lines:
#: ``--steps``, ``--hidden``, ``--step-sleep-ms``; ``step N rank R time_ms T`` per optimizer step) and the
#: modules it needs besides torch. ``ddp``: a plain DDP loop; ``lightning``: PyTorch Lightning's Trainer
#: (DDP strategy, automatic optimisation, ``sync_dist`` logging); ``accum``: 4 micro-batches per optimizer
#: step, ``no_sync`` on the first 3.
WORKLOADS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ddp": (TRAIN_MODULE, ()),
    "lightning": ("obshub.workloads.lightning_train", ("lightning",)),
    "accum": ("obshub.workloads.accum_train", ()),
}
MASTER_PORT = 29500
# one stable Faust app id for every demo run: its consumer group resumes where the last run stopped,
# instead of a new group replaying the whole events topic; runs are told apart by their job name
STREAMS_APP_ID = "obshub-demo-streams"
#: the demo worker's ``--job-retention-s`` (s): every run is a new job that ends with the run, and a worker
#: reads back at its start every changelog write of about the last retention (Kafka never compacts the
#: active segment). With the default hour, 20 runs in an hour made the next worker read 46,000 records for
#: 8-27 s; 6 minutes hold a few runs' writes. It stays above the hang hold (``Thresholds.hang_hold_ns``,
#: 300 s), as docs/STREAMS.md "Retention" requires: a long hang keeps its job's state.
STREAMS_JOB_RETENTION_S = 360


@dataclass(frozen=True)
class Part:
    """A part: ``name`` shown to the user, the ``obshub`` subcommand that starts it (or None) and the
    ``modules`` that must import (the command's own module among them)."""

    name: str
    command: str | None
    modules: tuple[str, ...]


PARTS: tuple[Part, ...] = (
    Part("training workload", None, (TRAIN_MODULE,)),
    Part(
        "obshub run (USDT instrumentation)",
        "run",
        ("obshub.instrument.cli", "obshub.instrument.usdt", "obshub.instrument._usdt"),
    ),
    Part("agent", "agent", ("obshub.producer.cli", "obshub.producer.agent", "obshub.producer.loader")),
    Part("stream worker", "streams", ("obshub.streams.cli", "obshub.streams")),
    Part("rule engine", "rules", ("obshub.rules.cli", "obshub.rules.engine")),
)


def _importable(module: str) -> str:
    try:
        if importlib.util.find_spec(module) is None:
            return f"module {module} not found"
    except (ImportError, ValueError) as exc:
        return f"module {module}: {exc}"
    return ""


def missing(workload: str = "ddp") -> list[str]:
    """One line per missing part (empty when everything is there), e.g.
    ``"agent not available: module producer.loader not found"``; ``workload`` (a key of
    :data:`WORKLOADS`) is the training the ranks run. Raises KeyError for an unknown workload."""
    module, needs = WORKLOADS[workload]
    out = []
    for p in (Part("training workload", None, (module, *needs)), *PARTS[1:]):
        why = [w for w in (_importable(m) for m in p.modules) if w]
        if why:
            out.append(f"{p.name} not available: {'; '.join(why)}")
    return out


def require(workload: str = "ddp") -> None:
    """Raise PartMissingError listing every missing part (the training of ``workload`` among them);
    return when all are present."""
    gone = missing(workload)
    if gone:
        raise PartMissingError(
            "; ".join(gone),
            "the demo integrates the real agent, stream worker and rule engine and "
            "fakes none of them: install a complete checkout",
        )


def agent_argv(job: str, host: Host, cgroup: Path) -> list[str]:
    """The agent of ``host``: watches only the host's v2 cgroup, publishes as ``node-0N``."""
    return [*OBSHUB, "agent", "--job", job, "--host", host.name, "--host-id", str(host.index), "--cgroup", str(cgroup)]


def training_argv(
    job: str, host: Host, steps: int, hidden: int | None = None, step_sleep_ms: float = 0.0, workload: str = "ddp"
) -> list[str]:
    """One rank of the DDP training ``workload`` (a key of :data:`WORKLOADS`) under ``obshub run``
    (``step_sleep_ms``: simulated data loading per optimizer step). Raises KeyError for an unknown one."""
    argv = [
        *OBSHUB,
        "run",
        "--job",
        job,
        "--host-id",
        str(host.index),
        "--",
        sys.executable,
        "-m",
        WORKLOADS[workload][0],
        "--steps",
        str(steps),
    ]
    if hidden:
        argv += ["--hidden", str(hidden)]
    if step_sleep_ms:
        argv += ["--step-sleep-ms", str(step_sleep_ms)]
    return argv


def training_env(base: dict[str, str], host: Host, world: int, master: str) -> dict[str, str]:
    """The rank's environment: torch.distributed rendezvous on host 0 over the namespace's ``eth0``.

    ``MALLOC_MMAP_THRESHOLD_=131072`` fixes glibc's mmap threshold at 128 KiB (it otherwise grows to
    32 MiB after the first free), so tensor memory is returned to the kernel and faulted in again each
    step, as with large activations; every rank gets it, faulty or not."""
    env = dict(base)
    env.update(
        {
            "RANK": str(host.index),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": master,
            "MASTER_PORT": str(MASTER_PORT),
            "GLOO_SOCKET_IFNAME": host.ifname,
            "OMP_NUM_THREADS": "1",
            "MALLOC_MMAP_THRESHOLD_": "131072",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


ALERTING_YAML = """\
# written by `obshub demo`: every sink type, all pointed at the demo's local receiver
version: 1
route: {{group_by: [alertname, job, host], group_wait: 0s, group_interval: 5s, repeat_interval: 4h}}
delivery: {{max_attempts: 3, max_elapsed: 30s, timeout: 5s}}
sinks:
  - {{name: slack, type: slack, url_env: OBSHUB_DEMO_SLACK_URL}}
  - {{name: pagerduty, type: pagerduty, url: "{pagerduty}", routing_key_env: OBSHUB_DEMO_PD_KEY}}
  - {{name: alertmanager, type: alertmanager, url: "{alertmanager}"}}
  - {{name: webhook, type: webhook, url_env: OBSHUB_DEMO_WEBHOOK_URL}}
"""


def alerting_config(receiver, path: Path) -> dict[str, str]:
    """Write the rule engine's alerting config (Slack, PagerDuty, Alertmanager and webhook sinks, all to
    the local ``receiver``) to ``path``; returns the environment variables its secrets come from."""
    base = f"http://127.0.0.1:{receiver.port}"
    path.write_text(ALERTING_YAML.format(pagerduty=f"{base}/pagerduty", alertmanager=base))
    return {
        "OBSHUB_DEMO_SLACK_URL": f"{base}/slack",
        "OBSHUB_DEMO_PD_KEY": "demo-routing-key",
        "OBSHUB_DEMO_WEBHOOK_URL": f"{base}/webhook",
    }


@dataclass
class PipelinePart:
    """A long-running pipeline process: ``argv``, the stack ``component`` name it registers under once
    started, and the Kafka consumer ``groups`` that must be Stable before it counts as ready."""

    name: str
    argv: list[str]
    component: str
    groups: tuple[str, ...]


def pipeline(job: str, run_id: str, config: Path, packs: tuple[str, ...] = ()) -> list[PipelinePart]:
    """The stream worker and the rule engine, in start order; the engine loads the builtin pack plus the
    opt-in ``packs`` (names of obshub/rules/packs/*.yaml, e.g. ``stall``). Raises PartMissingError while a
    command is missing from this checkout."""
    require()
    rules_prefix = rules_group_prefix(run_id)
    rule_args = [a for name in ("builtin", *packs) for a in ("-r", name)] if packs else []
    return [
        PipelinePart(
            "streams",
            [
                *OBSHUB,
                "streams",
                "worker",
                "--app-id",
                STREAMS_APP_ID,
                "--window-s",
                "5",
                "--job-retention-s",
                str(STREAMS_JOB_RETENTION_S),
            ],
            "streams",
            (STREAMS_APP_ID,),
        ),
        PipelinePart(
            "rules",
            [
                *OBSHUB,
                "rules",
                "serve",
                *rule_args,
                "-c",
                str(config),
                "--group-prefix",
                rules_prefix,
                "--resolve-on-exit",
            ],
            "rules",
            (f"{rules_prefix}-engine",),
        ),
    ]


def rules_group_prefix(run_id: str) -> str:
    """The rule engine's ``--group-prefix`` of demo run ``run_id`` (its groups and state topic start so)."""
    return f"obshub-rules-demo-{run_id}"


def run_state(run_id: str, job: str) -> tuple[list[str], list[str]]:
    """What demo run ``run_id`` (job ``job``) leaves on the broker: (consumer groups, topics). The rule
    engine's ``<prefix>-engine`` and ``<prefix>-notify`` groups and its ``<prefix>-state`` topic, and the
    alert reader's ``demo-<job>`` group. The stream worker's app id is shared by every run (it resumes
    where the last run stopped) and is not listed."""
    prefix = rules_group_prefix(run_id)
    return [f"{prefix}-engine", f"{prefix}-notify", f"demo-{job}"], [f"{prefix}-state"]


def remove_run_state(settings, run_id: str, job: str, say=lambda _m: None) -> list[str]:
    """Delete what :func:`run_state` lists from the broker of ``settings`` once the run's parts stopped
    (a group with members cannot be deleted); returns the names removed. A group or topic that is not
    there is skipped; any other failure is said through ``say`` and never raised (the demo's verdict
    stands)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from obshub.core import kafka

    groups, topics = run_state(run_id, job)
    from obshub.rules.service_common import state_dir
    from obshub.rules.service_notify import dispatch_file

    try:  # the run's notify state (its firing alerts: never restored by another run)
        (state_dir(settings) / dispatch_file(rules_group_prefix(run_id))).unlink(missing_ok=True)
    except OSError as exc:
        say(f"could not remove this run's notify state: {exc}")
    admin = AdminClient(kafka.admin_config(kafka.connection(settings), {"socket.timeout.ms": 5000}, quiet=True))
    removed: list[str] = []
    try:
        present = {g.group_id for g in admin.list_consumer_groups(request_timeout=10).result().valid}
        mine = [g for g in groups if g in present]
        futs = dict(admin.delete_consumer_groups(mine, request_timeout=10)) if mine else {}
        md = admin.list_topics(timeout=10)
        mine = [t for t in topics if t in md.topics]
        futs.update(admin.delete_topics(mine, operation_timeout=20) if mine else {})
    except KafkaException as exc:  # the broker is gone: say what is left
        say(f"could not remove this run's state from the broker ({exc}); left: {', '.join(groups + topics)}")
        return removed
    for name, fut in futs.items():
        try:
            fut.result()
            removed.append(name)
        except KafkaException as exc:  # e.g. a group whose killed member has not timed out yet
            say(f"could not remove {name} from the broker: {exc}")
    return removed


def group_stable(settings, group: str) -> bool:
    """True when Kafka consumer group ``group`` is Stable with at least one member."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from obshub.core import kafka

    admin = AdminClient(kafka.admin_config(kafka.connection(settings), {"log_level": 0}))
    try:
        desc = admin.describe_consumer_groups([group], request_timeout=5)[group].result()
    except KafkaException:  # the broker did not answer, or no such group
        return False
    return getattr(desc.state, "name", str(desc.state)).upper() == "STABLE" and bool(desc.members)


class GroupLag:
    """Reads consumer groups' lag (:meth:`lag`) and partition ends (:meth:`marks`) through one AdminClient
    (the groups' committed offsets) and one Consumer (the topics' high watermarks), both built here and kept
    for every read: a wait that reads a lag every 0.25 s (the demo's stop, ``_wait_drained``) no longer
    builds two clients, with their threads and broker connections, per read. :meth:`close` (or the end of a
    ``with`` block) closes the consumer and drops the admin client (librdkafka destroys it with its last
    reference; it has no close). Building it needs no broker: the clients connect at their first request."""

    def __init__(self, settings) -> None:
        from confluent_kafka import Consumer
        from confluent_kafka.admin import AdminClient

        from obshub.core import kafka

        conn = kafka.connection(settings)
        self.admin: AdminClient | None = AdminClient(kafka.admin_config(conn, {"log_level": 0}))
        self.consumer: Consumer | None = Consumer(
            kafka.consumer_config(conn, "obshub-demo-lag", {"enable.auto.commit": False}, quiet=True)
        )

    def _committed(self, group: str) -> list:
        """The TopicPartitions (with committed offsets) of ``group``. Raises KafkaException when the broker
        does not answer (5 s), RuntimeError once closed."""
        from confluent_kafka import ConsumerGroupTopicPartitions

        if self.admin is None or self.consumer is None:
            raise RuntimeError("GroupLag is closed")
        req = [ConsumerGroupTopicPartitions(group)]
        return self.admin.list_consumer_group_offsets(req, request_timeout=5)[group].result().topic_partitions or []

    def _high(self, topic: str, partition: int) -> int:
        """The high watermark of one partition now (2 s for the broker to answer)."""
        from confluent_kafka import TopicPartition

        assert self.consumer is not None
        return self.consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=2, cached=False)[1]

    def lag(self, group: str, marks: dict[tuple[str, int], int] | None = None) -> int | None:
        """The messages consumer group ``group`` has not committed yet: per partition it committed, the high
        watermark minus the committed offset, summed (0 for a group that committed nothing). With ``marks``
        ({(topic, partition): offset}, from :meth:`marks`), the lag is counted up to those fixed offsets
        instead of the moving high watermarks (a partition not in ``marks`` counts 0). None when the broker
        does not answer (5 s for the offsets, 2 s per watermark). Raises RuntimeError once closed."""
        from confluent_kafka import KafkaException

        try:
            lag = 0
            for tp in self._committed(group):
                if tp.offset >= 0:
                    if marks is not None:
                        hi = marks.get((tp.topic, tp.partition), 0)
                    else:
                        hi = self._high(tp.topic, tp.partition)
                    lag += max(0, hi - tp.offset)
            return lag
        except KafkaException:  # the broker did not answer, or no such group
            return None

    def marks(self, group: str) -> dict[tuple[str, int], int] | None:
        """The high watermarks now of every partition consumer group ``group`` committed: {(topic,
        partition): offset}, for :meth:`lag`'s ``marks``. None when the broker does not answer.

        A fixed mark is what "the group read what was there" needs: the demo's stream worker writes to a
        topic it reads itself (``<app id>-steps``: its ``progress`` timer broadcasts a ``read`` record to
        every partition twice a second, obshub/streams/app.py), so the lag against the moving high
        watermarks is rarely 0 at the moment it is read (a clean demo waited out its whole 15 s, speed19)."""
        from confluent_kafka import KafkaException

        try:
            return {
                (tp.topic, tp.partition): self._high(tp.topic, tp.partition)
                for tp in self._committed(group)
                if tp.offset >= 0
            }
        except KafkaException:  # the broker did not answer, or no such group
            return None

    def close(self) -> None:
        """Close the consumer and drop the admin client; a second call does nothing."""
        consumer, self.consumer, self.admin = self.consumer, None, None
        if consumer is not None:
            consumer.close()

    def __enter__(self) -> "GroupLag":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def group_lag(settings, group: str, marks: dict[tuple[str, int], int] | None = None) -> int | None:
    """The messages consumer group ``group`` has not committed yet (:meth:`GroupLag.lag`, up to ``marks``
    when given), read once with clients built and closed for this call; None when the broker does not
    answer."""
    with GroupLag(settings) as reader:
        return reader.lag(group, marks)


def group_marks(settings, group: str) -> dict[tuple[str, int], int] | None:
    """The partition ends of group ``group`` now (:meth:`GroupLag.marks`), read once; None when the broker
    does not answer."""
    with GroupLag(settings) as reader:
        return reader.marks(group)


def ready(settings, part: PipelinePart, pid: int) -> bool:
    """Whether ``part`` (started with ``pid``) registered itself, says it is ready (a stream worker's record
    has ``ready`` false while it recovers its tables: its group is Stable well before it reads any input)
    and its consumer groups are Stable."""
    if registered(settings, part, pid).get("ready", True) is not True:
        return False
    return all(group_stable(settings, g) for g in part.groups)


def registered(settings, part: PipelinePart, pid: int) -> dict:
    """``part``'s registry record (started with ``pid``; ``obshub status``'s), ``{"ready": False}`` while it
    has none."""
    from obshub.core import registry

    for c in registry.components(settings):
        if c.get("running") and c.get("pid") == pid:
            if c["name"] == part.component or c["name"].startswith(part.component + "-"):
                return c
    return {"ready": False}
