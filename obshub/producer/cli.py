"""The node agent's command line: ``obshub agent`` (run the agent) and ``obshub probes`` (the probe table
of this machine). The library modules (obshub/producer/agent.py, obshub/producer/loader.py) hold no click code."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import click
from rich.table import Table

from obshub.core.clitypes import Bootstrap, Finite, HostName, NonEmpty, stop_timeout_option
from obshub.core.kafka import SaslMechanism, SecurityProtocol
from obshub.core.schema import Layer
from obshub.core.settings import (
    BATCH_MAX_AGE_MS,
    BATCH_MAX_BYTES,
    BATCH_STEP_MIN_AGE_MS,
    SPOOL_MAX_BYTES,
    SPOOL_SEGMENT_BYTES,
    Settings,
)
from obshub.core.tables import WholeLineConsole, print_table
from obshub.producer import kheaders
from obshub.producer import probes as cat
from obshub.producer.agent import Agent
from obshub.producer.probes import ProbeOptions, ProbeStatus, Target

# ---------------------------------------------------------------------------------------------------------
# `obshub agent`
# ---------------------------------------------------------------------------------------------------------

_EPILOG = """\b
Examples:
  obshub agent --job bert --registered                      # watch whatever `obshub run` registers
  obshub agent --registered --only-job bert                 # a shared box: serve job bert only
  obshub agent --job bert --host node3 --cgroup /sys/fs/cgroup/job.slice/rank3.scope
                                                            # one agent per cgroup, as if node3
  obshub agent --job bert --pid 4242 --pid 4243 --metrics-port 9464
                                                            # two pids; metrics on :9464/metrics
  obshub agent --job bert --registered --threshold rdma_latency_ns=30000 --probes sched,network
                                                            # a probe subset, a 30 µs RDMA threshold
  obshub agent --source synthetic --rate 50000 --duration 30
                                                            # no BPF: 50k synthetic events/s for 30 s
  obshub agent --registered --bootstrap kafka1:9093 --security-protocol SASL_SSL \\
      --sasl-mechanism SCRAM-SHA-512 --sasl-username agent --ssl-ca-location /etc/ssl/kafka-ca.pem
                                                            # a secured cluster; password from
                                                            # $OBSHUB_KAFKA_SASL_PASSWORD
\b
Exit codes: 0 everything delivered; 1 an error (message and hint on stderr), among them a setting the
agent checks when it builds its configuration (--batch-*, --spool-*, --duration, --flush-timeout, --host,
--delivery-timeout-ms, the Kafka security settings; the message names the option); 2 a command line that
cannot be parsed (an unknown option, a value of the wrong type or out of the range shown in --help, an
unknown or negative --threshold, an option of the other --source); 3 batches left undelivered in the
spool ($OBSHUB_HOME/spool/<host>), replayed by the next start with the same --host.
"""


def _key_values(option: str, items: tuple[str, ...], *, as_int: bool) -> dict:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint=option)
        if as_int:
            try:
                out[name] = int(value, 0)
            except ValueError:
                raise click.BadParameter(f"{item!r}: {value!r} is not an integer", param_hint=option) from None
            if out[name] < 0:
                raise click.BadParameter(f"{item!r}: a threshold is 0 or more", param_hint=option)
        else:
            out[name] = value
    return out


def _bpf_source(
    settings: Settings,
    cgroup,
    pids,
    registered: bool,
    probes: str | None,
    thresholds: dict[str, int],
    debug_ebpf: bool,
    attach_deep_dive: bool = False,
):
    """Build the BPF EventSource (obshub/producer/loader.py) for the processes to watch."""
    from obshub.producer.errors import SourceError, TargetError

    if not (cgroup or pids or registered):
        raise TargetError(
            "say which processes to watch: --cgroup PATH, --pid PID (repeatable) and/or --registered",
            "e.g. obshub agent --registered (what `obshub run` starts), or --source synthetic",
        )
    try:
        from obshub.producer.loader import BpfEventSource
        from obshub.producer.probes import ProbeOptions, Target
    except ImportError as exc:
        raise SourceError(
            f"the BPF event source is not available in this build ({exc})",
            "use --source synthetic, or install bcc (python3-bpfcc) and run `make setup`",
        ) from None
    target = Target(cgroup=Path(cgroup) if cgroup else None, pids=set(pids) if pids else None, registered=registered)
    names = tuple(p.strip() for p in (probes or "").split(",") if p.strip())
    extra = {"deep_dive": ()} if attach_deep_dive else {}
    options = ProbeOptions(probes=names, thresholds=dict(thresholds), debug_ebpf=debug_ebpf, **extra)
    return BpfEventSource(settings, target, options)


def _some_probes(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """Click callback of ``--probes``: a given list must name at least one probe (``--probes ,`` or ``""``
    selected every probe, as if the option were left out), and only probe or layer names the loader knows
    (``loader.selected_probes``: ``--probes nope`` exited 1 after reading the libraries, an ObshubError,
    where a bad option value is a usage error). Raises click.BadParameter (exit 2) naming the valid names."""
    if value is None:
        return value
    names = [p.strip() for p in value.split(",") if p.strip()]
    if not names:
        raise click.BadParameter(
            f"{value!r} names no probe: give comma-separated probe or layer names (`obshub probes` lists them), "
            "or leave the option out for all of them"
        )
    layers = sorted({p.layer.value for p in cat.PROBES})
    unknown = [n for n in names if n not in cat.PROBES_BY_NAME and n not in {layer.value for layer in Layer}]
    if unknown:
        raise click.BadParameter(
            f"unknown probe or layer name(s) {', '.join(map(repr, unknown))}: give layer names ({', '.join(layers)}) "
            f"or probe names ({', '.join(cat.PROBES_BY_NAME)}), comma-separated"
        )
    return value


# the settings ``agent_config`` checks, by the option that sets them (its errors name the option)
_OPTION_OF = {
    "job": "--job",
    "only_jobs": "--only-job",
    "host": "--host",
    "host_id": "--host-id",
    "kafka.bootstrap": "--bootstrap",
    "kafka.delivery_timeout_ms": "--delivery-timeout-ms",
    "kafka.compression": "--compression",
    **{f"kafka.{k}": "--" + k.replace("_", "-") for k in ("security_protocol", "sasl_mechanism", "sasl_username")},
    **{f"kafka.{k}": "--" + k.replace("_", "-") for k in ("sasl_password", "ssl_ca_location", "ssl_key_password")},
    **{f"kafka.{k}": "--" + k.replace("_", "-") for k in ("ssl_certificate_location", "ssl_key_location")},
    "kafka.extra": "--kafka-option",
    "batch.max_bytes": "--batch-max-bytes",
    "batch.max_age_ms": "--batch-max-age-ms",
    "batch.step_min_age_ms": "--batch-step-min-age-ms",
    "spool.max_bytes": "--spool-max-bytes",
    "spool.segment_bytes": "--spool-segment-bytes",
    "spool": "--spool-segment-bytes / --spool-max-bytes",
    "metrics_port": "--metrics-port",
    "metrics_addr": "--metrics-addr",
    "duration_s": "--duration",
    "flush_timeout_s": "--flush-timeout",
}
# options of one source only: (option, parameter name, the source it belongs to)
_SOURCE_ONLY = (
    ("--cgroup", "cgroup", "bpf"),
    ("--pid", "pids", "bpf"),
    ("--registered", "registered", "bpf"),
    ("--probes", "probes", "bpf"),
    ("--rate", "rate", "synthetic"),
    ("--synthetic-events", "synthetic_events", "synthetic"),
)


def _check_source_options(source: str, thresholds: dict[str, int]) -> None:
    """Refuse an option given on the command line that the chosen ``--source`` does not use, and an
    unknown ``--threshold`` name (``click.UsageError``/``BadParameter``, exit 2)."""
    ctx = click.get_current_context()
    for option, param, owner in _SOURCE_ONLY:
        if owner != source and ctx.get_parameter_source(param) == click.core.ParameterSource.COMMANDLINE:
            raise click.UsageError(f"{option} applies to --source {owner} only; this agent runs --source {source}")
    for name in thresholds:
        if name not in cat.THRESHOLDS:
            raise click.BadParameter(
                f"unknown threshold {name!r} (known: {', '.join(cat.THRESHOLDS)})", param_hint="'--threshold'"
            )


def _finite(value: float, name: str) -> float:
    """Reject NaN (which every range check lets through) for a float option."""
    if value != value:
        raise click.BadParameter(f"{value} is not a number", param_hint=f"'{name}'")
    return value


@click.command("agent", epilog=_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--job",
    envvar="OBSHUB_JOB",
    type=NonEmpty("a job name"),
    default="default",
    show_default=True,
    help="job of the events of processes that never registered (a registered process names its own job)",
)
@click.option(
    "--host",
    envvar="OBSHUB_HOST",
    type=HostName(),
    default=None,
    help="host name: Kafka key and spool folder [default: this machine's host name]",
)
@click.option(
    "--host-id",
    envvar="OBSHUB_HOST_ID",
    type=click.IntRange(0, 0xFFFF),
    default=None,
    help="16-bit host id of the TraceKey [default: crc32(host) & 0xFFFF]",
)
@click.option(
    "--cgroup", type=click.Path(exists=True, file_okay=False), help="watch the processes of this cgroup (v2 path)"
)
@click.option("--pid", "pids", type=int, multiple=True, help="watch this process and its threads (repeatable)")
@click.option("--registered", is_flag=True, help="watch whatever process fires the `register` USDT probe (obshub run)")
@click.option(
    "--only-job",
    "only_jobs",
    type=NonEmpty("a job name"),
    multiple=True,
    help="serve only the processes registered for this job (repeatable) [default: every job on the node]; "
    "the events of other jobs' processes are dropped by the agent",
)
@click.option(
    "--source",
    type=click.Choice(["bpf", "synthetic"]),
    default="bpf",
    show_default=True,
    help="where events come from: the BPF probes, or a synthetic training-shaped stream",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True, max=1e9),
    default=10_000,
    callback=lambda _c, _p, v: _finite(v, "--rate"),
    show_default=True,
    help="synthetic source: events per second",
)
@click.option(
    "--synthetic-events",
    type=click.IntRange(min=1),
    default=None,
    help="synthetic source: stop after this many events (the agent then delivers them and exits)",
)
@click.option(
    "--probes", default=None, callback=_some_probes, help="comma-separated subset of probes to attach [default: all]"
)
@click.option(
    "--threshold",
    "thresholds",
    multiple=True,
    metavar="NAME=VALUE",
    help="probe threshold, e.g. rdma_latency_ns=20000 (repeatable; changeable at run time in BPF maps)",
)
@click.option(
    "--bootstrap",
    envvar="OBSHUB_BOOTSTRAP",
    type=Bootstrap(),
    default=None,
    help="Kafka bootstrap servers [default: the local broker of `obshub up`]",
)
@click.option(
    "--security-protocol",
    type=click.Choice([p.value for p in SecurityProtocol]),
    default=None,
    help="[default: $OBSHUB_KAFKA_SECURITY_PROTOCOL, else PLAINTEXT]",
)
@click.option(
    "--sasl-mechanism",
    type=click.Choice([m.value for m in SaslMechanism]),
    default=None,
    help="[default: $OBSHUB_KAFKA_SASL_MECHANISM]",
)
@click.option("--sasl-username", envvar=["OBSHUB_KAFKA_SASL_USERNAME", "OBSHUB_SASL_USERNAME"], default=None)
@click.option(
    "--sasl-password",
    envvar=["OBSHUB_KAFKA_SASL_PASSWORD", "OBSHUB_SASL_PASSWORD"],
    default=None,
    help="SASL password (prefer $OBSHUB_KAFKA_SASL_PASSWORD: command lines are visible to every user)",
)
@click.option(
    "--ssl-ca-location",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="[default: $OBSHUB_KAFKA_SSL_CA_LOCATION]",
)
@click.option(
    "--ssl-certificate-location",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="[default: $OBSHUB_KAFKA_SSL_CERTIFICATE_LOCATION]",
)
@click.option(
    "--ssl-key-location",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="[default: $OBSHUB_KAFKA_SSL_KEY_LOCATION]",
)
@click.option("--ssl-key-password", envvar=["OBSHUB_KAFKA_SSL_KEY_PASSWORD", "OBSHUB_SSL_KEY_PASSWORD"], default=None)
@click.option(
    "--compression", type=click.Choice(["none", "gzip", "snappy", "lz4", "zstd"]), default="lz4", show_default=True
)
@click.option(
    "--kafka-option",
    "kafka_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="any other librdkafka producer setting (repeatable), e.g. queue.buffering.max.messages=100",
)
@click.option(
    "--delivery-timeout-ms",
    type=int,
    default=10_000,
    show_default=True,
    help="a batch not acknowledged within this goes to the spool",
)
@click.option(
    "--batch-max-bytes", type=int, default=BATCH_MAX_BYTES, show_default=True, help="batch bound, bytes (1 KiB..1 MiB)"
)
@click.option("--batch-max-age-ms", type=int, default=BATCH_MAX_AGE_MS, show_default=True, help="batch bound (age), ms")
@click.option(
    "--batch-step-min-age-ms",
    type=int,
    default=BATCH_STEP_MIN_AGE_MS,
    show_default=True,
    help="a step end seals the batch; one after a step-aligned batch only once this old, ms",
)
@click.option("--spool-max-bytes", type=int, default=SPOOL_MAX_BYTES, show_default=True, help="spool bound, bytes")
@click.option("--spool-segment-bytes", type=int, default=SPOOL_SEGMENT_BYTES, show_default=True)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="serve Prometheus metrics on PORT at /metrics (0: any free port)",
)
@click.option(
    "--metrics-addr",
    envvar="OBSHUB_METRICS_ADDR",
    default="0.0.0.0",
    show_default=True,
    help="address the metrics port binds (127.0.0.1: this machine only) [env OBSHUB_METRICS_ADDR]",
)
@click.option("--duration", type=float, default=None, help="stop after this many seconds (scripted runs)")
@click.option(
    "--flush-timeout",
    type=float,
    default=15.0,
    show_default=True,
    help="on stop, seconds to try delivering what is left (less when Kafka takes nothing for 2 s)",
)
@stop_timeout_option(
    None,
    "a second signal stops waiting for Kafka (the rest goes to the spool), a third forces the exit at once",
    "--flush-timeout + 45",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    envvar="OBSHUB_LOG_FORMAT",
    default="text",
    show_default=True,
    help="json: one JSON object per line (time, level, logger, message)",
)
@click.option(
    "--attach-deep-dive",
    is_flag=True,
    help="attach the deep-dive probes (the per-launch CUDA uprobes, ~0.9 µs per kernel launch) at start "
    "like the others, instead of only on request (`obshub deep-dive`)",
)
@click.option("--ebpf", "debug_ebpf", is_flag=True, hidden=True, help="print the final BPF C and flags to stderr")
def agent_command(
    job,
    host,
    host_id,
    cgroup,
    pids,
    registered,
    only_jobs,
    source,
    rate,
    synthetic_events,
    probes,
    thresholds,
    bootstrap,
    security_protocol,
    sasl_mechanism,
    sasl_username,
    sasl_password,
    ssl_ca_location,
    ssl_certificate_location,
    ssl_key_location,
    ssl_key_password,
    compression,
    kafka_options,
    delivery_timeout_ms,
    batch_max_bytes,
    batch_max_age_ms,
    batch_step_min_age_ms,
    spool_max_bytes,
    spool_segment_bytes,
    metrics_port,
    metrics_addr,
    duration,
    flush_timeout,
    stop_timeout,
    log_format,
    attach_deep_dive,
    debug_ebpf,
):
    """Run the node agent: probes -> msgpack batches -> Kafka (spooled on disk while Kafka is away).

    Prints the probe table (attached, or skipped with the reason), then runs until SIGTERM/SIGINT or
    --duration. Several agents may run on one machine, each with its own --host and cgroup. A stop that
    does not end within --stop-timeout seconds, or a third signal, forces the exit (exit 1, every thread's
    stack on stderr): the signals have a thread of their own (obshub/core/stopping.py)."""
    import socket
    import zlib

    from obshub.core import log as jsonlog
    from obshub.core import registry, stopping
    from obshub.core.settings import AgentSettingsError, agent_config, load_settings

    # before any thread starts (librdkafka's, the BPF source's, the metrics server's): every thread
    # inherits the blocked mask and the stop-watch thread sees the signal whatever the main thread does
    stopping.block_stop_signals()
    relay = stopping.SignalRelay()

    jsonlog.setup(logging.WARNING, log_format, "agent", "obshub agent: %(name)s: %(message)s")
    say = None
    if log_format == "json":  # the agent's progress lines become INFO records of logger obshub.agent
        logging.getLogger("obshub.agent").setLevel(logging.INFO)
        say = logging.getLogger("obshub.agent").info
    logging.getLogger("producer.kafka").setLevel(logging.CRITICAL)  # outages are reported by the transport
    settings = load_settings()
    host = host or socket.gethostname().split(".")[0]
    if host_id is None:
        host_id = zlib.crc32(host.encode()) & 0xFFFF
    thr = _key_values("--threshold", thresholds, as_int=True)
    _check_source_options(source, thr)
    security = dict(
        security_protocol=security_protocol,
        sasl_mechanism=sasl_mechanism,
        sasl_username=sasl_username,
        sasl_password=sasl_password,
        ssl_ca_location=ssl_ca_location,
        ssl_certificate_location=ssl_certificate_location,
        ssl_key_location=ssl_key_location,
        ssl_key_password=ssl_key_password,
    )
    kafka = dict(
        bootstrap=bootstrap or settings.bootstrap_servers,
        compression=compression,
        delivery_timeout_ms=delivery_timeout_ms,
        extra=_key_values("--kafka-option", kafka_options, as_int=False),
        **{k: v for k, v in security.items() if v is not None},
    )  # the rest from OBSHUB_KAFKA_*
    try:
        cfg = agent_config(
            _OPTION_OF,
            job=job,
            host=host,
            host_id=host_id,
            kafka=kafka,
            batch=dict(max_bytes=batch_max_bytes, max_age_ms=batch_max_age_ms, step_min_age_ms=batch_step_min_age_ms),
            spool=dict(
                dir=settings.home / "spool" / host, max_bytes=spool_max_bytes, segment_bytes=spool_segment_bytes
            ),
            metrics_port=metrics_port,
            metrics_addr=metrics_addr,
            duration_s=duration,
            flush_timeout_s=flush_timeout,
            only_jobs=tuple(only_jobs),
        )
    except AgentSettingsError as exc:
        if exc.by_option:  # a bad option value: a usage error (exit 2) as every command's, naming the option
            raise click.UsageError(str(exc)) from None
        raise
    made: list = []  # the agent, once built

    def forget() -> None:  # its component record (`obshub status`), when a forced exit skips run()'s own
        for a in made:
            registry.unregister_component(settings, a.component)

    grace = stop_timeout or min(cfg.flush_timeout_s + 45, stopping.MAX_STOP_GRACE_S)
    stopping.StopWatch(
        relay,
        forget,
        grace,
        on_second=relay,
        name="agent",
        logger=logging.getLogger("obshub.agent"),
        unfinished="batches neither delivered nor in the spool are lost (the spool keeps its own)",
    ).start()
    if source == "synthetic":
        from obshub.producer.synthetic import SyntheticSource

        src = SyntheticSource(rate, total=synthetic_events, host_id=host_id, job=job)
        agent = Agent(cfg, src, settings=settings, thresholds=thr, say=say)
        if synthetic_events is not None:  # the last event stops the loop: flush, deliver, exit
            src.on_done = agent.stop
    else:  # thresholds go in at build time, so a layer that did not load cannot fail the start
        src = _bpf_source(settings, cgroup, pids, registered, probes, thr, debug_ebpf, attach_deep_dive)
        agent = Agent(cfg, src, settings=settings, say=say)
    agent.signals_watched = True
    made.append(agent)
    relay.attach(agent._on_signal)
    sys.exit(agent.run())


# ---------------------------------------------------------------------------------------------------------
# `obshub deep-dive`: ask a host's agent to attach its deep-dive probes for some steps
# ---------------------------------------------------------------------------------------------------------
_DEEP_DIVE_EPILOG = """\b
Examples:
  obshub deep-dive --host node-078                  # 20 steps of per-launch CUDA data from node-078's ranks
  obshub deep-dive --host node-078 --steps 100 --max-s 60   # longer, but at most a minute
  OBSHUB_BOOTSTRAP=kafka-0:9092 obshub deep-dive --host node-078   # the cluster's Kafka
"""


@click.command("deep-dive", epilog=_DEEP_DIVE_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--host",
    required=True,
    type=HostName(),
    help="the agent's --host (the host the straggler analysis or a rule names)",
)
@click.option("--steps", type=click.IntRange(1, 100_000), default=20, show_default=True, help="steps per rank")
@click.option(
    "--max-s", type=Finite(0, 86400, min_open=True), default=120.0, show_default=True, help="at most, seconds"
)
@click.option(
    "--bootstrap",
    envvar="OBSHUB_BOOTSTRAP",
    type=Bootstrap(),
    help="Kafka bootstrap servers (default: the local broker)",
)
def deep_dive_command(host, steps, max_s, bootstrap):
    """Ask the agent of HOST to attach its deep-dive probes (per-launch CUDA uprobes: launch counts,
    call times, slow launches per step) for STEPS steps of each rank, at most MAX_S seconds, and detach
    them after. The request goes through the control topic (obshub.control.v1); the agent logs the
    window it served."""
    from confluent_kafka import KafkaException

    from obshub.core.kafka import KafkaConnection
    from obshub.core.reach import HINT, BrokerUnreachable, tcp_reason, unreachable_message
    from obshub.core.settings import load_settings
    from obshub.producer.control import CONTROL_TOPIC, request_deep_dive

    conn = KafkaConnection(bootstrap=bootstrap or load_settings().bootstrap_servers)
    try:
        request_deep_dive(conn, host, steps, max_s, by="obshub deep-dive")
    except (ValueError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from None
    except KafkaException as exc:  # the control topic's metadata or creation (10 s): said once, as every command
        reason = tcp_reason(conn.bootstrap, 1.0)
        if reason is not None:
            raise BrokerUnreachable(unreachable_message(conn.bootstrap, reason, 10.0), HINT) from None
        raise click.ClickException(f"the Kafka cluster at {conn.bootstrap} did not take the request: {exc}") from None
    click.echo(f"deep dive asked of {host}: {steps} steps, at most {max_s:g} s (via {CONTROL_TOPIC})")


# ---------------------------------------------------------------------------------------------------------
# `obshub probes`: the probe table of this machine
# ---------------------------------------------------------------------------------------------------------
_PROBES_EPILOG = """\b
Examples:
  obshub probes                         # what this kernel and these libraries offer (nothing loaded)
  obshub probes --load                  # compile and attach everything for a moment: the real table
  obshub probes --load --probes sched   # only the scheduler probes
  obshub probes --json                  # the table for scripts
  obshub probes --thresholds            # thresholds, their defaults and units
"""


@click.command("probes", epilog=_PROBES_EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--load", is_flag=True, help="compile and attach the probes (root), then detach")
@click.option(
    "--probes", "names", default=None, callback=_some_probes, help="comma-separated probe or layer names [default: all]"
)
@click.option(
    "--usdt-library",
    type=click.Path(dir_okay=False),
    default=None,
    help="library with the obshub USDT probes [default: obshub.instrument._usdt when built]",
)
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@click.option("--thresholds", "show_thresholds", is_flag=True, help="list the run-time thresholds")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    envvar="OBSHUB_LOG_FORMAT",
    default="text",
    show_default=True,
    help="json: one JSON object per line (time, level, logger, message)",
)
@click.option("--ebpf", "debug_ebpf", is_flag=True, hidden=True, help="print the final BPF C and flags")
def probes_command(load, names, usdt_library, as_json, show_thresholds, log_format, debug_ebpf):
    """The probe table: every probe obshub has, its layer and mechanism, and whether it attaches on
    this machine (or why not). Without --load only the kernel's tracefs and the libraries are
    inspected; with --load the programs are compiled and attached (needs CAP_BPF, CAP_PERFMON and,
    for uprobes on other users' processes, CAP_SYS_ADMIN)."""
    from obshub.core import log as jsonlog
    from obshub.core.settings import load_settings

    jsonlog.setup(logging.WARNING, log_format, "probes", "obshub probes: %(name)s: %(message)s")
    from obshub.producer.loader import BpfEventSource, plan, selected_probes

    console = WholeLineConsole(highlight=False)
    if show_thresholds:
        rows = [{"name": n, "default": d, "unit": u} for n, (_i, d, u) in cat.THRESHOLDS.items()]
        if as_json:
            click.echo(json.dumps(rows, indent=2))
        else:
            for r in rows:
                console.print(f"{r['name']:<18} {r['default']:>12}  {r['unit']}")
        return
    options = ProbeOptions(
        probes=tuple(n.strip() for n in (names or "").split(",") if n.strip()),
        usdt_library=Path(usdt_library) if usdt_library else None,
        debug_ebpf=debug_ebpf,
    )
    target = Target(pids={os.getpid()})
    if load or debug_ebpf:
        src = BpfEventSource(load_settings(), target, options)
        try:
            statuses = src.start()
        finally:
            src.close()
    else:
        pl = plan(options, target, kheaders.tracefs_mount())
        statuses = [
            ProbeStatus(
                p.name,
                p.layer.value,
                p.name not in pl.skipped,
                pl.skipped.get(p.name, "available (not loaded: use --load)"),
            )
            for p in selected_probes(options)
        ]
    if as_json:
        # `attached` only when the programs really were (--load); without it `available` says what would
        loaded = bool(load or debug_ebpf)
        rows = [{**s.__dict__, "attached": s.attached and loaded, "available": s.attached} for s in statuses]
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table("probe", "layer", "mechanism", "status", "reason")
    for s in statuses:
        p = cat.PROBES_BY_NAME[s.name]
        state = (
            "[green]attached[/green]"
            if s.attached and load
            else "[green]available[/green]"
            if s.attached
            else "[yellow]skipped[/yellow]"
        )
        table.add_row(s.name, s.layer, p.mechanism, state, "" if s.attached else s.reason)
    print_table(console, table)
