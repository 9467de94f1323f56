"""``obshub streams worker`` (run one stream worker) and ``obshub tail steps`` (watch step summaries)."""

from __future__ import annotations

import json
import os
import sys
import time

import click

from obshub.core import kafka, registry, schema
from obshub.core.clitypes import Finite, KafkaName, NonEmpty, stop_timeout_option
from obshub.core.log import NullLogger
from obshub.core.settings import STREAMS, load_settings
from obshub.core.tables import WholeLineConsole
from obshub.streams.errors import StreamsError, TopicMissingError

WORKER_EPILOG = """\b
Examples:
  obshub streams worker                          # one worker on the local broker, 10 s step window
  obshub streams worker --window-s 3 --index 2   # a second worker (shares partitions via the group)
  obshub streams worker --metrics-port 9464      # Prometheus metrics on :9464/metrics
  obshub streams worker --partitions 32          # a new app's join over 32 partitions (up to 32 workers)
  obshub streams worker --app-id test-a --input-topic ev-a --output-topic steps-a   # isolated app
"""

TAIL_EPILOG = """\b
Examples:
  obshub tail steps                      # new step summaries as they arrive, one line each
  obshub tail steps --from-beginning     # everything kept on the topic, then follow
  obshub tail steps --job llama --json   # one job, raw JSON (one object per line, for jq)
  obshub tail steps --count 10 --from-beginning   # print 10 summaries and exit
"""


@click.group("streams", epilog=WORKER_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
def streams_group():
    """The Faust stream application: per-step join across nodes, straggler and layer blame."""


def _wait_for_broker(bootstrap: str, stop) -> None:
    """A service waits for its broker: one message once it could not be reached for 10 s, then quiet
    retries until it answers. ``stop`` (a threading.Event, set by the worker's StopWatch at SIGINT/SIGTERM)
    ends the wait: exit 0, no traceback."""
    from obshub.core.reach import CONNECT_TIMEOUT_S, HINT, BrokerUnreachable, require_broker

    said, since = False, time.monotonic()
    while not stop.is_set():
        try:
            if not require_broker(bootstrap, timeout_s=1.0, stop=stop):
                continue  # stopped
        except BrokerUnreachable as exc:
            if not said and time.monotonic() - since >= CONNECT_TIMEOUT_S:
                msg = str(exc).replace(" within 1 s", f" for {CONNECT_TIMEOUT_S:.0f} s")
                click.echo(
                    f"obshub streams worker: {msg}; retrying quietly until it answers (Ctrl-C to stop). hint: {HINT}",
                    err=True,
                )
                said = True
            continue
        if said:
            click.echo(f"obshub streams worker: reached the Kafka broker at {bootstrap}", err=True)
        return
    raise click.exceptions.Exit(0)


def _faust_stop(worker):
    """``to(signum)`` for a :class:`obshub.core.stopping.SignalRelay`: hand the signal to the Faust
    worker's event loop as if the loop had caught it (mode's ``_on_sigterm`` / ``_on_sigint``, the graceful
    stop Faust does on its own signal handlers, which never run now that both signals are blocked in every
    thread; a second call is ignored there, one shutdown)."""
    import signal

    def to(signum: int) -> None:
        handler = worker._on_sigint if signum == signal.SIGINT else worker._on_sigterm
        worker.loop.call_soon_threadsafe(handler)

    return to


def _topic_partitions(bootstrap: str, topic: str, app_id: str) -> tuple[int, int | None]:
    """Partition counts of the input ``topic`` and of the app's ``<app_id>-steps`` topic (None when the app
    is new); raises TopicMissingError / StreamsError with a hint."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(
        kafka.admin_config(
            kafka.KafkaConnection(bootstrap=bootstrap), {"socket.timeout.ms": 5000, "logger": NullLogger()}
        )
    )
    try:
        md = admin.list_topics(timeout=10)
    except KafkaException as exc:
        raise StreamsError(
            f"Failed to reach the Kafka broker at {bootstrap}: {exc}",
            "start it with `obshub up`, or set OBSHUB_BOOTSTRAP",
        ) from exc
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        raise TopicMissingError(
            f"input topic {topic!r} does not exist on {bootstrap}",
            "create it with `obshub up` (the project's topics) or pass --input-topic",
        )
    own = md.topics.get(f"{app_id}-steps")
    return len(t.partitions), (len(own.partitions) if own is not None and own.error is None else None)


def _free_index(settings) -> int:
    running = {c["name"] for c in registry.components(settings) if c["running"]}
    n = 1
    while f"streams-{n}" in running:
        n += 1
    return n


@streams_group.command("worker", epilog=WORKER_EPILOG)
@click.option(
    "--app-id",
    default=STREAMS.app_id,
    show_default=True,
    type=KafkaName(),
    help="Faust app id = consumer group and prefix of internal/changelog topics",
)
@click.option("--input-topic", default=schema.TOPIC_EVENTS, show_default=True, help="agent batches")
@click.option("--output-topic", default=schema.TOPIC_STEPS, show_default=True, help="step summaries (JSON)")
@click.option("--dlq-topic", default=schema.TOPIC_DLQ, show_default=True, help="undecodable messages")
@click.option(
    "--partitions",
    default=None,
    type=click.IntRange(1, 1024),
    help="partitions of the (job, step) repartition topic and the tables, fixed per app id "
    "[default: the app's existing count, else OBSHUB_STREAMS_PARTITIONS, else 8]; sizing "
    "in docs/STREAMS.md",
)
@click.option(
    "--window-s",
    default=STREAMS.window_s,
    show_default=True,
    type=Finite(0.2, 3600),
    help="a step closes at most this many seconds after its first data arrived",
)
@click.option(
    "--job-retention-s",
    default=STREAMS.job_retention_s,
    show_default=True,
    type=Finite(1, None),
    help="drop a job's state (tables, changelogs, memory) this many seconds after its last data; keep it "
    "above the longest step and the hang hold (docs/STREAMS.md 'Retention')",
)
@click.option(
    "--read-idle-every-s",
    default=STREAMS.read_idle_every_s,
    show_default=True,
    type=Finite(0.5, 3600),
    help="an idle worker (no new input, no open step) writes its 'read' report this often; the retention "
    "sweep's read check waits for it (docs/STREAMS.md)",
)
@click.option(
    "--metrics-port",
    default=STREAMS.metrics_port,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="serve Prometheus metrics on this port (0 = off)",
)
@click.option(
    "--metrics-addr",
    envvar="OBSHUB_METRICS_ADDR",
    default="0.0.0.0",
    show_default=True,
    help="address the metrics port binds (127.0.0.1: this machine only) [env OBSHUB_METRICS_ADDR]",
)
@click.option(
    "--index",
    type=click.IntRange(1, 9999),
    default=None,
    help="worker number n (component streams-<n>); default: the first free one",
)
@stop_timeout_option(60.0, "a second signal forces it at once")
@click.option(
    "--log-level", default="warning", show_default=True, type=click.Choice(["debug", "info", "warning", "error"])
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    envvar="OBSHUB_LOG_FORMAT",
    default="text",
    show_default=True,
    help="json: one JSON object per line (time, level, logger, message)",
)
def worker_command(
    app_id,
    input_topic,
    output_topic,
    dlq_topic,
    partitions,
    window_s,
    job_retention_s,
    read_idle_every_s,
    metrics_port,
    metrics_addr,
    index,
    stop_timeout,
    log_level,
    log_format,
):
    """Run one stream worker until SIGTERM/SIGINT (exit 0). Start several (any host) to share the partitions.

    State (Faust table data dir) lives under $OBSHUB_HOME/state/<app-id>; tables are recovered from
    their changelog topics at start, so a restarted worker resumes where the group stopped; it reads no
    input until then, and says on stderr when it starts reading (`obshub status`: "recovering its tables"
    before). A stop that
    does not finish within --stop-timeout seconds, or a second signal, forces the exit (exit 1, every
    thread's stack on stderr): the signals have a thread of their own (obshub/core/stopping.py), so a
    main thread blocked in a Kafka client call cannot make the worker deaf to them.
    """
    import logging

    # croniter (Faust's crontab timers) asks ``platform.architecture()`` when imported, which runs
    # ``file -b <python>``: a child started after the signals are blocked inherits the blocked mask and
    # ignores SIGTERM and SIGINT (``execve`` keeps it). Imported here, before they are blocked; it starts
    # no thread (numpy's, imported with the app below, does, so that import stays after the block).
    import faust.utils.cron  # noqa: F401

    from obshub.core import stopping

    # before any thread starts (librdkafka's, asyncio's executor, the metrics server's): every thread
    # inherits the blocked mask and the stop-watch thread sees the signal whatever the main thread does
    stopping.block_stop_signals()
    relay, names = stopping.SignalRelay(), []
    settings = load_settings()

    def forget() -> None:  # the component's record (`obshub status`), when a forced exit skips the finally
        for n in names:
            registry.unregister_component(settings, n)

    stopping.StopWatch(
        relay,
        forget,
        stop_timeout,
        name="streams worker",
        logger=logging.getLogger("obshub.streams"),
        unfinished="what was not committed is read and joined again by the next start",
    ).start()

    import faust

    from obshub.streams.app import WorkerConfig, build_app, tune_gc
    from obshub.streams.metrics import WorkerMetrics
    from obshub.streams.topics import ensure_internal_topics

    _wait_for_broker(settings.bootstrap_servers, relay.stop)
    n_in, existing = _topic_partitions(settings.bootstrap_servers, input_topic, app_id)
    # an existing app keeps the count it was created with unless --partitions says otherwise (then the
    # mismatch is an error below); a new app takes OBSHUB_STREAMS_PARTITIONS
    partitions = partitions or existing or settings.streams_partitions
    cfg = WorkerConfig(
        app_id=app_id,
        bootstrap=settings.bootstrap_servers,
        input_topic=input_topic,
        output_topic=output_topic,
        dlq_topic=dlq_topic,
        partitions=partitions,
        window_s=window_s,
        job_retention_s=job_retention_s,
        read_idle_every_s=read_idle_every_s,
        state_dir=settings.state_dir,
        metrics_port=metrics_port,
    )
    ensure_internal_topics(cfg.bootstrap, cfg.app_id, cfg.partitions, n_in, retention_s=job_retention_s)
    metrics = WorkerMetrics(job_idle_s=job_retention_s)
    try:
        metrics.serve(metrics_port, metrics_addr)
    except OSError as exc:
        raise StreamsError(
            f"Failed to serve metrics on {metrics_addr}:{metrics_port}: {exc}",
            "choose a free port with --metrics-port (0 turns metrics off) or another --metrics-addr",
        ) from exc
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    name = f"streams-{index or _free_index(settings)}"
    record = dict(
        app_id=app_id,
        partitions=partitions,
        input=input_topic,
        output=output_topic,
        metrics_port=metrics_port,
        ready=False,  # recovering its tables: `obshub status` says so, `obshub demo` waits
    )

    def mark_ready(took_s: float) -> None:
        registry.update_component(settings, name, ready=True, ready_s=round(took_s, 3))
        if log_format != "json":  # whatever --log-level: a long recovery says nothing else until it reads
            click.echo(f"{name}: reading {input_topic} (tables recovered, {took_s:.1f} s after start)", err=True)

    app = build_app(cfg, n_in, metrics, on_ready=mark_ready)
    if relay.stop.is_set():  # a signal during the start-up steps: nothing runs yet
        raise click.exceptions.Exit(0)
    registry.register_component(settings, name, os.getpid(), **record)
    names.append(name)
    try:
        logging_config = None
        if log_format == "json":
            from obshub.core import log as jsonlog

            logging_config = jsonlog.dict_config(log_level, name)
        worker = faust.Worker(app, loglevel=log_level.upper(), quiet=True, logging_config=logging_config)
        # Faust's terminal spinner sets the root logger to DEBUG at levels >= WARNING so that it can spin
        # on every record: every debug call of aiokafka and Faust then builds a record (a third of the
        # worker's CPU on the stream benchmark). No spinner: the root logger keeps the chosen level.
        worker.spinner = None
        relay.attach(_faust_stop(worker))
        tune_gc()
        worker.execute_from_commandline()
    finally:
        registry.unregister_component(settings, name)


def _who(x: dict) -> str:
    """A host named in a summary, with its global rank when the summary gives one (``node-01 rank 3``)."""
    r = x.get("rank")
    return f"{x['host']} rank {r}" if isinstance(r, int) else str(x["host"])


def _line(s: dict) -> str:
    ms = lambda ns: f"{ns / 1e6:.1f} ms"  # noqa: E731
    life = s.get("life") or 0
    parts = [
        f"{s['job']} step {s['step']}" + (f" (life {life})" if life else ""),
        f"{s['closed_by']:8}",
        f"{len(s['hosts'])}/{len(s['expected_hosts']) or len(s['hosts'])} hosts",
        f"max {ms(s['step_time_max_ns'])}",
    ]
    if s["missing_hosts"]:
        parts.append(f"[red]missing {','.join(s['missing_hosts'])}[/red]")
    if s.get("hang"):
        h = s["hang"]
        parts.append(
            f"[red]HANG: {','.join(_who(x) for x in h['hosts'])} never arrived at {h['op']} "
            f"pg={h['pg']} seq={h['coll_seq']}; {len(h['waiting'])} waiting {h['waited_ns'] / 1e9:.1f} s[/red]"
        )
    if s["closed_by"] == "running":
        parts.append(
            "[yellow]RUNNING LONG: slow connections on "
            + ", ".join(f"{h} ({v['network']})" for h, v in s["evidence"]["hosts"].items())
            + "[/yellow]"
        )
    st = s["straggler"]
    if st:
        parts.append(f"[yellow]straggler {_who(st)}[/yellow] score {st['score']:.2f} +{ms(st['excess_ns'])}")
        if s["blame"]:
            b = s["blame"][0]
            what = f"+{ms(b['excess_ns'])}" if b["excess_ns"] else f"{b['count']} events"
            parts.append(f"blame {b['layer']} {what}")
    elif s["closed_by"] not in ("hang", "running"):  # an interim record of an open step is not a clean step
        parts.append("[green]clean[/green]")
    if s["stall"]:
        parts.append(f"[red]STALL x{s['stall_ratio']:.2f}[/red]")
    q = s["quality"]
    bad = {k: v for k, v in q.items() if v}
    if bad:
        parts.append("quality " + " ".join(f"{k}={v}" for k, v in bad.items()))
    return "  ".join(parts)


@click.group("tail", epilog=TAIL_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
def tail_command():
    """Follow obshub's output topics as they are written."""


@tail_command.command("steps", epilog=TAIL_EPILOG)
@click.option("--topic", default=schema.TOPIC_STEPS, show_default=True)
@click.option("--job", type=NonEmpty("a job name"), default=None, help="only this job")
@click.option("--from-beginning", is_flag=True, help="start at the oldest kept summary")
@click.option("--count", type=click.IntRange(min=0), default=0, help="exit after this many summaries (0 = follow)")
@click.option("--json", "as_json", is_flag=True, help="raw JSON, one summary per line")
@click.option("--timeout-s", type=Finite(min=0), default=0.0, help="exit after this many seconds (0 = never)")
@click.option(
    "--hold-s",
    type=Finite(min=0, max=60),
    default=0.5,
    show_default=True,
    help="hold each summary this long and print what arrived together in step order (0: as they arrive)",
)
def tail_steps(topic, job, from_beginning, count, as_json, timeout_s, hold_s):
    """Print step summaries as they arrive, deduplicated by (job, life, step): the first one of a key wins (the
    interim records of a step still open, closed_by 'hang' or 'running', are shown once per kind and do not
    count). Steps close in several partitions, so they arrive a little out of order: what arrived within
    --hold-s of each other is printed in (job, life, step) order (a backlog read with --from-beginning comes
    out in order).

    Exits 1 with one message when the broker cannot be reached within 10 s (or --timeout-s, if shorter),
    at once when it is this machine's loopback and its port refuses connections (no local broker runs),
    at start; a broker that goes away later is reported once and waited for. --timeout-s counts from the
    start, the wait for the broker included; when it ends the wait before --count summaries arrived, the
    exit code is 1 (a script can tell). Ctrl-C ends it (exit 0)."""
    import logging
    import signal
    import threading
    import uuid

    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaException, TopicPartition

    from obshub.core.reach import CONNECT_TIMEOUT_S, BrokerWatch, require_broker

    started = time.monotonic()
    settings = load_settings()
    console = WholeLineConsole(highlight=False)
    err = WholeLineConsole(stderr=True, highlight=False)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    wait_s = min(CONNECT_TIMEOUT_S, timeout_s) if timeout_s else CONNECT_TIMEOUT_S
    # a refused local port (no local broker runs) fails at once; a remote broker gets wait_s (walk24)
    if not require_broker(settings.bootstrap_servers, wait_s, stop=stop, refused_fails=True):
        return
    say = logging.getLogger("obshub.tail")
    if not say.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("obshub tail: %(message)s"))
        say.addHandler(handler)
        say.propagate = False
    watch = BrokerWatch(settings.bootstrap_servers, say, "tail")
    c = Consumer(
        kafka.consumer_config(
            kafka.connection(settings),
            f"obshub-tail-{uuid.uuid4().hex[:8]}",
            {
                "auto.offset.reset": "earliest" if from_beginning else "latest",
                "enable.auto.commit": False,
                **watch.client_conf(),
            },
        )
    )
    # every partition assigned by hand: a reader that joins no consumer group leaves none behind
    # (a subscribed group with no members would linger in `obshub status` until the broker expires it)
    try:
        md = c.list_topics(topic, timeout=wait_s).topics.get(topic)
    except KafkaException as exc:
        c.close()
        raise StreamsError(
            f"cannot read the partitions of topic {topic}: {exc}", "is the broker up? `obshub status`"
        ) from None
    if md is None or md.error is not None or not md.partitions:
        c.close()
        why = md.error.str() if md is not None and md.error is not None else "no partitions"
        raise StreamsError(
            f"topic {topic} cannot be read: {why}", "create the topics with `obshub up` (local) or check the name"
        )
    parts = md.partitions
    start = OFFSET_BEGINNING if from_beginning else OFFSET_END
    c.assign([TopicPartition(topic, p, start) for p in sorted(parts)])
    watch.up()
    seen: set[tuple[str, int, int, str]] = set()
    held: list[tuple[float, tuple[str, int, int, str], str]] = []  # (arrived, key, text) not yet printed
    n, deadline = 0, started + timeout_s if timeout_s else None

    def release(everything: bool) -> bool:
        """Print the held summaries that waited --hold-s (all of them when ``everything``) in key order;
        True once --count is reached."""
        nonlocal n, held
        now = time.monotonic()
        due = held if everything else [h for h in held if now - h[0] >= hold_s]
        if not due:
            return False
        held = [] if everything else [h for h in held if now - h[0] < hold_s]
        for _, _, text in sorted(due, key=lambda h: h[1]):
            if as_json:
                sys.stdout.write(text + "\n")
                sys.stdout.flush()
            else:
                console.print(text, soft_wrap=True)
            n += 1
            if count and n >= count:
                return True
        return False

    done = False
    try:
        while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            msg = c.poll(min(0.2, hold_s) if held else 0.2)
            if msg is None or msg.error():
                if held and release(False):
                    done = True
                    break
                continue
            watch.up()
            try:
                s = schema.decode_step_summary(msg.value())
                by = s.get("closed_by")
                k = (s["job"], int(s.get("life") or 0), int(s["step"]), by if by in ("hang", "running") else "")
            except (schema.SchemaError, KeyError) as exc:
                why = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
                err.print(
                    f"skipped unreadable summary at {msg.topic()}[{msg.partition()}]@{msg.offset()}: {why}",
                    markup=False,
                    style="red",
                )
                continue
            if k in seen or (job and s["job"] != job):
                continue
            seen.add(k)
            try:
                text = json.dumps(s, sort_keys=True) if as_json else _line(s)
            except (ValueError, KeyError, TypeError, OverflowError, AttributeError) as exc:
                where = f"{msg.topic()}[{msg.partition()}]@{msg.offset()}"
                console.print(f"unreadable summary at {where}: {type(exc).__name__}: {exc}", markup=False, style="red")
                continue
            held.append((time.monotonic(), k, text))
            if release(hold_s == 0):
                done = True
                break
        if not done and held:
            release(True)
    finally:
        c.close()
    if count and n < count and not stop.is_set():
        err.print(f"only {n} of {count} summaries within --timeout-s {timeout_s:g}", markup=False, style="red")
        sys.exit(1)
