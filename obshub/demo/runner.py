"""Run one demo scenario end to end, or the matrix of every fault kind.

Steps of ``run_demo`` (each shown live by :class:`obshub.demo.view.DemoView`):

1. check that every part exists (``parts.require``): the demo fakes none;
2. take the cluster lock, clean up after a crashed run, create H hosts (``cluster.Cluster``);
3. start the local Kafka broker (``obshub.stack.up``; stopped again at the end only if this run started
   it), the webhook receiver (Slack/PagerDuty/Alertmanager payloads -> ``webhook.jsonl``), an
   ``obshub.alerts.v1`` reader positioned at the topic's end, the stream worker and the rule engine;
4. per host an ``obshub agent`` in the root namespace watching the host's v2 cgroup; wait until each has
   attached its probes (it registers as component ``agent-node-0N``);
5. per host one rank of ``ddp_train`` under ``obshub run`` inside the host's namespace; wait for the
   first step on every host (t_warm);
6. at t_warm + ``fault_at_s`` inject the fault (t0 = CLOCK_REALTIME at injection), sample its evidence
   every 2 s, show alerts as they arrive;
7. after ``duration_s`` (or when the ranks finish ``steps``) remove the fault, wait ``settle_s`` for late
   alerts, stop everything, remove the cluster, and judge (``verdict.judge``).

Everything started is stopped on return, on an exception and on Ctrl-C/SIGTERM (an ExitStack).
The report (``--json``) is ``{"scenario": {...}, "verdict": {...}, "evidence": {...}, "alerts": [...],
"steps": {...}, "webhook": {...}, "logs": str}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from obshub import stack
from obshub.core import kafka, registry, schema
from obshub.core.settings import Settings
from obshub.demo import parts
from obshub.demo.cluster import Cluster
from obshub.demo.errors import DemoError, PartMissingError
from obshub.demo.faults import (
    CPU_SHAPES,
    KINDS,
    PARAMS,
    STALL_LAYERS,
    Stall,
    check_choice,
    layer_of,
    make_fault,
)
from obshub.demo.verdict import AlertSeen, check_resolved, judge, judge_stalls
from obshub.demo.view import DemoView
from obshub.demo.webhook import WebhookReceiver

STEP_LINE = re.compile(r"^step (\d+) rank (\d+) time_ms ([\d.]+)")


@dataclass
class DemoOptions:
    """One scenario. Times in seconds. ``steps`` None: ranks train until ``duration_s`` after warm-up.
    ``fault_params`` override the fault's sizes (see ``obshub.demo.faults``). ``sequence``: instead of
    one fault, episodes ``[(kind, host index), ...]`` (kind ``stall:LAYER``: a sporadic stall of that layer,
    net, cpu, process or mem, with the ``stall`` params) on one training: each injected for ``fault_for_s``,
    then removed, then ``gap_s`` (and until no alert of the job fires) before the next; ``exit`` only
    last (the rank is gone). Each episode is judged on the alerts from its injection to the next one."""

    hosts: int = 4
    fault: str = "net-loss"
    fault_host: int = 1
    fault_at_s: float = 15.0
    duration_s: float = 45.0
    steps: int | None = None
    settle_s: float = 8.0
    hidden: int | None = None
    step_sleep_ms: float = 50.0
    fault_params: dict = field(default_factory=dict)
    sequence: list[tuple[str, int]] = field(default_factory=list)
    fault_for_s: float = 12.0
    gap_s: float = 12.0
    keep_stack: bool = False
    ready_timeout_s: float = 300.0
    lock_wait_s: float = 0.0
    ranks_per_host: int = 1
    fault_rank: int | None = None  # local rank of the faulty host the cpu / hang fault hits alone
    workload: str = "ddp"  # the training every rank runs: a key of parts.WORKLOADS (ddp, lightning, accum)

    def plan(self) -> list[tuple[str, int, float, float]]:
        """The episodes as ``(kind, host index, inject at s, remove at s)`` after warm-up (later episodes
        may start later: see ``sequence``)."""
        if not self.sequence:
            return [(self.fault, self.fault_host, self.fault_at_s, self.duration_s)]
        out, t = [], self.fault_at_s
        for kind, host in self.sequence:
            out.append((kind, host, t, t + self.fault_for_s))
            t += self.fault_for_s + self.gap_s
        return out

    def check(self) -> None:
        """Raise DemoError for inconsistent options."""
        for i, (kind, host) in enumerate(self.sequence):
            base, _, sub = kind.partition(":")
            if base == "stall" and sub and sub not in STALL_LAYERS:
                raise DemoError(f"--sequence: unknown stall layer in {kind!r}", f"use stall:{'|'.join(STALL_LAYERS)}")
            if base != "stall" and (kind not in KINDS or kind == "none"):
                raise DemoError(
                    f"--sequence: unknown fault {kind!r}", f"use {', '.join(k for k in KINDS if k != 'none')}"
                )
            if not 0 <= host < self.hosts:
                raise DemoError(f"--sequence: host {host} of {kind} is outside 0..{self.hosts - 1}")
            if kind == "exit" and i != len(self.sequence) - 1:
                raise DemoError("--sequence: exit must be the last episode", "the killed rank does not come back")
        if self.fault not in KINDS:
            raise DemoError(f"unknown fault {self.fault!r}", f"use one of {', '.join(KINDS)}")
        check_params(self.fault_params, [k for k, _h in self.sequence] if self.sequence else [self.fault])
        if self.workload not in parts.WORKLOADS:
            raise DemoError(f"--workload {self.workload!r}: unknown", f"use one of {', '.join(parts.WORKLOADS)}")
        if not 1 <= self.ranks_per_host <= 8:
            raise DemoError(f"--ranks-per-host {self.ranks_per_host}: expected 1..8")
        if self.hosts < 1:
            raise DemoError(f"--hosts {self.hosts}: expected 1..16")
        if self.hosts == 1:
            # a one-node job: its ranks are each other's peers, so only a fault on one of them can be named
            if self.ranks_per_host < 2:
                raise DemoError(
                    "--hosts 1 with one rank: a straggler needs peers",
                    "use --hosts 2 or more, or --ranks-per-host 2..8 with --fault-rank",
                )
            kinds = [k for k, _h in self.sequence] if self.sequence else [self.fault]
            if any(k != "none" for k in kinds) and self.fault_rank is None:
                raise DemoError(
                    f"--hosts 1 with {', '.join(kinds)} and no --fault-rank: a fault of the whole node slows every "
                    "rank alike, nothing to compare it with",
                    "name the rank it hits: --fault cpu|hang (or stall with layer=cpu|process) --fault-rank N",
                )
        if self.fault_rank is not None:
            if not 0 <= self.fault_rank < self.ranks_per_host:
                raise DemoError(
                    f"--fault-rank {self.fault_rank} is outside 0..{self.ranks_per_host - 1}",
                    "it is the local rank on the faulty host"
                    + (
                        "; a host runs 1 rank unless --ranks-per-host 2..8 says more"
                        if self.ranks_per_host == 1
                        else ""
                    ),
                )
            kinds = [k for k, _h in self.sequence] if self.sequence else [self.fault]
            one_rank = ("cpu", "hang", "stall:cpu", "stall:process")
            if any(
                k not in one_rank and not (k == "stall" and self.fault_params.get("layer") in ("cpu", "process"))
                for k in kinds
            ):
                raise DemoError(
                    f"--fault-rank with {', '.join(kinds)}: only a cpu or hang fault hits one rank (or a cpu / process stall)",
                    "use --fault cpu, --fault hang, --fault stall --param layer=cpu|process, or such a --sequence",
                )
        if not 0 <= self.fault_host < self.hosts:
            raise DemoError(
                f"--fault-host {self.fault_host} is outside 0..{self.hosts - 1}", "hosts are numbered from 0"
            )
        if self.fault != "none" and self.fault_at_s >= self.duration_s and self.steps is None:
            raise DemoError(
                f"--fault-at {self.fault_at_s} s is not before the end ({self.duration_s} s)",
                "raise --duration or lower --fault-at",
            )
        kinds = [k for k, _h in self.sequence] if self.sequence else [self.fault]
        need = min_fault_steps()
        if self.steps is not None and self.steps < need and any(k != "none" for k in kinds):
            # --steps 3 --fault cpu ran the whole set-up and could only fail: the worker judges a step
            # against the job's own baseline once that holds baseline_min_n closed steps, so the fault's
            # first step that can be named is the one after them
            raise DemoError(
                f"--steps {self.steps} with {', '.join(kinds)}: the fault could never be named: the worker compares a "
                f"step with the job's baseline only once that holds {need - 1} steps (Thresholds.baseline_min_n, "
                f"docs/ANALYSIS.md), so a fault is seen from step {need} on, and it starts only --fault-at "
                f"{self.fault_at_s:g} s after the first step",
                f"give --steps {need} or more, enough to train past --fault-at (a step lasts at least --step-sleep-ms, "
                f"{self.step_sleep_ms:g} ms), or leave --steps out (the run lasts --duration)",
            )
        if any(k.partition(":")[0] == "stall" for k in kinds):
            # a stall is never cut short and its thread waits period_s between stalls: one longer than the
            # fault's time held the demo's end until it was over (stall_ms=600000: 10 minutes), and a period
            # past time_t (period_s=1e308) killed the stall thread with an OverflowError after the first
            window_s = self.fault_for_s if self.sequence else self.duration_s - self.fault_at_s
            stall_ms = float(self.fault_params.get("stall_ms", 800))
            if stall_ms / 1e3 >= window_s:
                raise DemoError(
                    f"--param stall_ms={stall_ms:g}: one stall would outlast the {window_s:g} s the fault is injected "
                    f"({'--fault-for' if self.sequence else '--duration minus --fault-at'}), and a stall is never cut short",
                    "shorten the stall or give the run more time (--duration, or --fault-for with --sequence)",
                )
            if float(self.fault_params.get("period_s", 18)) > 86_400:
                raise DemoError(
                    f"--param period_s={self.fault_params['period_s']:g}: at most 86400 (a day)",
                    "a period longer than the run gives one stall, at the start",
                )
        check_qdiscs(kinds, self.fault_params)


def needed_qdiscs(kinds: list[str], params: dict) -> list[tuple[str, str]]:
    """The tc qdiscs the faults of a run need (``kinds``: the ``--fault`` or every ``--sequence`` kind,
    ``stall:LAYER`` for a stall of that layer), as ``(qdisc, what needs it)``: ``tbf`` for ``net-slow`` and
    a net stall's ``rate_kbit``, ``netem`` for a net stall's ``delay_ms`` (``obshub.demo.faults``)."""
    out: list[tuple[str, str]] = []
    for kind in kinds:
        base, _, sub = kind.partition(":")
        if base == "net-slow":
            out.append(("tbf", "--fault net-slow (a tc tbf rate limit)"))
        elif base == "stall" and (sub or str(params.get("layer", "net"))) == "net":
            if params.get("delay_ms"):
                out.append(("netem", "--param delay_ms (an RTT spike with tc netem delay)"))
            elif params.get("rate_kbit"):
                out.append(("tbf", "--param rate_kbit (an RTT spike with tc tbf)"))
    return list(dict.fromkeys(out))


def check_qdiscs(kinds: list[str], params: dict) -> None:
    """Raise DemoError (a usage error: exit 2, before anything is set up) when a fault of the run needs a
    qdisc this kernel lacks, tried in a throwaway network namespace (:func:`obshub.core.qdisc.qdisc_missing`;
    walk24: ``--param delay_ms`` built the cluster and trained ~53 s before the fault said "no netem qdisc").
    A kernel that cannot be asked (not root) is let through: the fault's ``prepare`` still checks."""
    from obshub.core.qdisc import qdisc_missing

    for qdisc, what in needed_qdiscs(kinds, params):
        missing = qdisc_missing(qdisc)
        if not missing:
            continue
        if qdisc == "netem":
            raise DemoError(
                f"{what}: this kernel has no netem qdisc (sch_netem; tc said: {missing.rstrip('.')})",
                "use --param rate_kbit=N instead: an RTT spike with tc tbf (segments queue at that rate); "
                "`obshub doctor` lists the qdiscs this kernel takes",
            )
        raise DemoError(
            f"{what}: this kernel has no {qdisc} qdisc (sch_{qdisc}; tc said: {missing.rstrip('.')})",
            f"load it (modprobe sch_{qdisc}) or use another fault; `obshub doctor` lists the qdiscs this kernel takes",
        )


#: ``--param`` keys of a stall that only a stall of one layer reads (the others read no such key); a
#: stall key not listed here is read by a stall of every layer
STALL_KEY_LAYER = {
    "loss_pct": "net",
    "delay_ms": "net",
    "rate_kbit": "net",
    "procs": "cpu",
    "shape": "cpu",
    "quota_us": "cpu",
    "room_mb": "mem",
    "full": "mem",
}
#: ``--param`` keys that count things (processes, MiB, µs, percent as nftables reads it): whole numbers
WHOLE_PARAMS = ("percent", "procs", "room_mb", "hog_anon_mb", "file_mb", "quota_us", "full")


def _readers(key: str, kinds: list[str], params: dict) -> list[str]:
    """The faults among ``kinds`` (``stall:LAYER``: a stall of that layer) that read ``--param key``."""
    out = []
    for kind in kinds:
        base, _, sub = kind.partition(":")
        if key not in PARAMS.get(base, ()):
            continue
        if base == "stall":
            if key == "layer" and sub:  # stall:LAYER names its layer; --param layer is not read
                continue
            layer = sub or str(params.get("layer", "net"))
            if STALL_KEY_LAYER.get(key, layer) != layer:
                continue
        out.append(kind)
    return out


BASELINE_WAIT_S = 60.0
"""How long past ``--fault-at`` the demo waits for the stream worker's baseline of the job
(``BaselineWatch``) before it injects the fault anyway, saying so."""


def min_fault_steps() -> int:
    """The fewest ``--steps`` with which a fault can be named: the worker's lateness evidence, the running
    check and the stall flag need a baseline of ``Thresholds.baseline_min_n`` closed steps of the job
    (obshub/streams/analysis), and the rules' warm-ups (``warmup_steps``, ``stall_min_n``) ask the same
    10; the first step that can show the fault is the one after them."""
    from obshub.streams.analysis.thresholds import Thresholds

    return Thresholds().baseline_min_n + 1


def check_params(params: dict, kinds: list[str]) -> None:
    """Check ``--param KEY=VALUE`` (``params``) against the faults of the run (``kinds``: the ``--fault``,
    or every ``--sequence`` kind, ``stall:LAYER`` for a stall of that layer) before anything is set up.

    Raises DemoError naming the parameter when no fault of the run reads it (a key of another fault kind
    or stall layer would be ignored), when a number is not finite and positive, not whole where it counts
    something (``WHOLE_PARAMS``), a percent above 100, ``full`` other than 1, a stall not shorter than
    its period (``stall_ms`` < ``period_s`` x 1000), or when the stall of a layer would refuse it (its
    shapes, ``Stall``)."""
    import math

    for key, value in params.items():
        if not _readers(key, kinds, params):
            readers = [k for k, keys in PARAMS.items() if key in keys]
            if not readers:
                raise DemoError(
                    f"--param {key}: no fault reads it",
                    "known: " + ", ".join(f"{k} ({kind})" for kind, keys in PARAMS.items() for k in keys),
                )
            where = " or ".join(
                f"stall (layer={STALL_KEY_LAYER[key]})" if k == "stall" and key in STALL_KEY_LAYER else k
                for k in readers
            )
            raise DemoError(
                f"--param {key}: read by {where} only, not by this run's {', '.join(kinds)} (it would be ignored)",
                "drop it, or choose the fault that reads it (obshub demo --help lists each fault's params)",
            )
        if key == "layer":  # words: a stall's layer, a cpu stall's shape
            check_choice(key, value, STALL_LAYERS, "stall layer")
            continue
        if key == "shape":
            check_choice(key, value, CPU_SHAPES, "cpu stall shape")
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
            raise DemoError(f"--param {key}={value}: expected a positive number")
        if key in WHOLE_PARAMS and value != int(value):
            raise DemoError(f"--param {key}={value}: expected a whole number")
    if params.get("percent", 0) > 100:
        raise DemoError(f"--param percent={params['percent']}: at most 100")
    if params.get("full", 1) != 1:
        raise DemoError(f"--param full={params['full']}: the only value is 1 (fill the cgroup); leave it out otherwise")
    stall_ms, period_s = params.get("stall_ms", 800), params.get("period_s", 18)
    if any(k.partition(":")[0] == "stall" for k in kinds) and stall_ms >= period_s * 1000:
        raise DemoError(
            f"--param stall_ms={stall_ms:g} is not shorter than period_s={period_s:g} ({period_s * 1000:g} ms): "
            "the stalls would run back to back, one persistent fault",
            "a sporadic stall is shorter than its period, e.g. --param stall_ms=800 --param period_s=18",
        )
    for kind in kinds:
        base, _, sub = kind.partition(":")
        if base == "stall":  # what the stall itself refuses (its shapes), now rather than after set-up
            Stall(None, None, {**params, **({"layer": sub} if sub else {})})  # type: ignore[arg-type]


class _TopicReader:
    """Reads ``topic`` from its end (positions taken at construction) in a thread, handing each JSON
    object record to :meth:`_record` with its Kafka message timestamp (ns; the time of reading when the
    record has none). Raises DemoError when the topic's end offsets cannot be read within 30 s."""

    topic = ""

    def __init__(self, settings: Settings, job: str):
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        self.job = job
        self._stop = threading.Event()
        self._c = Consumer(
            kafka.consumer_config(
                kafka.connection(settings),
                f"demo-{job}",
                {"enable.auto.commit": False, "auto.offset.reset": "earliest", "log_level": 0},
            )
        )
        deadline = time.monotonic() + 30
        while True:  # right after `up` created the topic its partitions may have no leader yet
            try:
                md = self._c.list_topics(self.topic, timeout=10)
                tps = [
                    TopicPartition(
                        self.topic,
                        p,
                        self._c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1],
                    )
                    for p in md.topics[self.topic].partitions
                ]
                break
            except KafkaException as exc:
                if time.monotonic() > deadline:
                    self._c.close()
                    raise DemoError(
                        f"Failed to read the end offsets of {self.topic}: {exc}",
                        f"check the broker at {settings.bootstrap_servers} (obshub status)",
                    ) from exc
                time.sleep(0.5)
        self._c.assign(tps)
        self._thread = threading.Thread(target=self._run, name=self.topic, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            m = self._c.poll(0.2)
            if m is None or m.error():
                continue
            try:
                rec = json.loads(m.value())
            except ValueError:
                continue
            if isinstance(rec, dict):
                _ts_type, ts_ms = m.timestamp()
                self._record(rec, ts_ms * 1_000_000 if ts_ms > 0 else time.time_ns())

    def _record(self, rec: dict, received_ns: int) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._c.close()


class BaselineWatch(_TopicReader):
    """Reads ``obshub.steps.v1`` from its end and notes when the stream worker first closed a step of
    ``job`` with a baseline of at least ``need`` steps (``baseline.n``; ``ready``, set once). The worker
    names a fault only against the job's baseline; at the start of a run it may still be behind the
    training (2 hosts x 2 ranks, lead24: steps 0-80, the first 10 s, were all closed at once 10-17 s into
    training, each with an empty baseline, so a fault injected at +15 s became part of the baseline and
    was named late or never), so the demo injects no fault before this is set."""

    topic = schema.TOPIC_STEPS

    def __init__(self, settings: Settings, job: str, need: int):
        super().__init__(settings, job)
        self.need = need
        self.ready = threading.Event()

    def _record(self, rec: dict, received_ns: int) -> None:
        if self.ready.is_set() or rec.get("job") != self.job or rec.get("closed_by") in ("running", "hang"):
            return
        bl = rec.get("baseline")
        if isinstance(bl, dict) and isinstance(bl.get("n"), int) and bl["n"] >= self.need:
            self.ready.set()


class AlertReader(_TopicReader):
    """Reads ``obshub.alerts.v1`` from its end (positions taken at construction) in a thread and keeps
    the firing records of ``job`` as :class:`AlertSeen` (``received_ns`` = the Kafka message timestamp,
    i.e. when the rule engine published the change)."""

    topic = schema.TOPIC_ALERTS

    def __init__(self, settings: Settings, job: str, on_alert=None):
        super().__init__(settings, job)
        self.on_alert = on_alert
        self.alerts: list[AlertSeen] = []
        self.records: list[dict] = []

    def _record(self, rec: dict, received_ns: int) -> None:
        labels = rec.get("labels") or {}
        if labels.get("job", self.job) != self.job:
            return
        rec["received_ns"] = received_ns
        self.records.append(rec)
        if rec.get("status") == "firing":
            a = AlertSeen.from_record(rec, received_ns)
            self.alerts.append(a)
            if self.on_alert:
                self.on_alert(a)


class Rank:
    """One training rank: its process and the steps it printed (``steps``: list of (step, ms, t_ns))."""

    def __init__(self, host, proc: subprocess.Popen, view: DemoView, rank: int | None = None, per_host: int = 1):
        self.host, self.proc, self.view = host, proc, view
        self.rank = host.index if rank is None else rank
        # the name the view and the report use: the host, or host/r<global rank> with several per host
        self.name = host.name if per_host == 1 else f"{host.name}/r{self.rank}"
        self.steps: list[tuple[int, float, int]] = []
        self._thread = threading.Thread(target=self._read, name=f"rank-{self.rank}", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            m = STEP_LINE.match(raw.decode(errors="replace"))
            if m:
                step, ms = int(m.group(1)), float(m.group(3))
                self.steps.append((step, ms, time.time_ns()))
                self.view.step(self.name, step, ms)


def _wait(cond, timeout_s: float, what: str, check=None) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if check:
            check()
        if time.monotonic() > deadline:
            raise DemoError(
                f"timed out after {timeout_s:.0f} s waiting for {what}", "see the logs of the run (path printed above)"
            )
        time.sleep(0.2)


def _stop_together(procs: list[subprocess.Popen], grace_s: float = 5.0) -> list[subprocess.Popen]:
    """SIGTERM the process groups of ``procs`` at once, then SIGKILL whatever is left after ``grace_s``
    (one deadline for all): the exit stack's own per-process stop then finds them gone. Returns those
    SIGKILLed (their last lines and their own clean-up lost)."""
    killed: list[subprocess.Popen] = []
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        alive = [p for p in procs if p.poll() is None]
        if sig == signal.SIGKILL:
            killed = alive
        for p in alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)
        deadline = time.monotonic() + wait_s
        for p in alive:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.0, deadline - time.monotonic()))
    return killed


def _alive(proc: subprocess.Popen, name: str, log: Path) -> None:
    if proc.poll() is not None:
        tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
        raise DemoError(
            f"{name} exited with code {proc.returncode} before the demo was done:\n{tail}", f"full log: {log}"
        )


def _start_logged(es: contextlib.ExitStack, cluster: Cluster, host, argv, log: Path, **kw) -> subprocess.Popen:
    f = open(log, "ab")
    proc = cluster.spawn(host, argv, stdout=kw.pop("stdout", f), stderr=f, **kw)
    es.callback(f.close)
    es.callback(Cluster.stop, proc)
    return proc


def _remove_run_state(settings: Settings, run_id: str, job: str, say) -> None:
    removed = parts.remove_run_state(settings, run_id, job, say)
    if removed:
        say("removed this run's consumer groups and topics from the broker: " + ", ".join(removed))


def describe(opts: DemoOptions) -> str:
    """The scenario in words, for the run's first line: hosts and ranks, then the fault, or with
    ``sequence`` each episode's fault and host in order (``--fault``/``--fault-host`` do not apply then)."""
    rank = f" (local rank {opts.fault_rank})" if opts.fault_rank is not None else ""
    out = f"{opts.hosts} hosts x {opts.ranks_per_host} rank{'' if opts.ranks_per_host == 1 else 's'} per host, "
    if opts.workload != "ddp":
        out += f"workload {opts.workload}, "
    if opts.sequence:
        eps = ", then ".join(f"{kind} on node-{host:02d}" for kind, host in opts.sequence)
        return out + (
            f"sequence {eps}{rank}, from +{opts.fault_at_s:.0f} s"
            + (
                f", each {opts.fault_for_s:g} s, {opts.gap_s:g} s apart"
                if len(opts.sequence) > 1
                else f" for {opts.fault_for_s:g} s"
            )
        )
    if opts.fault == "none":
        return out + "fault none"
    return out + f"fault {opts.fault} on node-{opts.fault_host:02d} at +{opts.fault_at_s:.0f} s{rank}"


def run_demo(opts: DemoOptions, settings: Settings, view: DemoView, out_dir: Path | None = None) -> dict:
    """Run one scenario (see the module docstring); returns the report. Raises PartMissingError before
    starting anything when a part is missing, DemoError/ClusterError/FaultError when a step fails."""
    opts.check()
    parts.require(opts.workload)
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:4]
    job = f"demo-{run_id}"
    out_dir = out_dir or settings.home / "demo" / run_id
    out_dir.mkdir(parents=True, exist_ok=True)
    view.say(f"run {run_id}: {describe(opts)}; logs in {out_dir}")
    with contextlib.ExitStack() as es:
        cluster = es.enter_context(Cluster(opts.hosts, progress=view.say, lock_wait_s=opts.lock_wait_s))
        was_up = stack.broker_pid(settings) is not None
        if not was_up and not opts.keep_stack:  # before `up`: a Ctrl-C while it creates the topics stops it too
            es.callback(stack.down, settings, view.say)
        stack.up(settings, progress=view.say)
        # runs after the parts stopped (callbacks run last-in first-out) and before the broker stops
        es.callback(_remove_run_state, settings, run_id, job, view.say)
        receiver = WebhookReceiver(out_dir / "webhook.jsonl").start()
        es.callback(receiver.stop)
        view.say(f"webhook receiver on 127.0.0.1:{receiver.port} -> {receiver.path}")
        expected = (
            (cluster.hosts[opts.fault_host].name, layer_of(opts.fault, opts.fault_params))
            if opts.fault != "none"
            else None
        )

        def on_alert(a: AlertSeen) -> None:
            v = judge(t0["kind"], *(expected or (None, None)), t0["ns"], [a], t0.get("rank"))
            view.alert(a, "correct" if v.correct_count else "wrong: " + (v.wrong[0]["why"] if v.wrong else "?"))

        t0: dict = {"ns": None, "kind": opts.fault}  # the current episode (for the live view)
        reader = AlertReader(settings, job, on_alert).start()
        es.callback(reader.stop)
        baseline = BaselineWatch(settings, job, min_fault_steps() - 1).start()  # from the end: before training
        es.callback(baseline.stop)
        watched: list[tuple[subprocess.Popen, str, Path]] = []  # must live until the end
        # the agents' and parts' records (`obshub status`) go once they are stopped (runs after each one's
        # own stop, registered below): one SIGKILLed after its grace never removed its own
        spawned: list[subprocess.Popen] = []
        es.callback(lambda: registry.forget_exited(settings, [p.pid for p in spawned]))
        aux = cluster.aux_cgroups("pipeline")
        penv = {**os.environ, **parts.alerting_config(receiver, out_dir / "alerting.yaml")}
        # sporadic stalls are named by the builtin pack's stall rules (on by default since issue #30).
        # Every part starts at once and the agents compile their probes meanwhile: the parts need only
        # the broker, and the ranks start after all of them are ready (a third of a demo's run time when
        # each waited for the one before).
        started_parts = []
        for part in parts.pipeline(job, run_id, out_dir / "alerting.yaml"):
            log = out_dir / f"{part.name}.log"
            proc = _start_logged(es, cluster, 0, part.argv, log, netns=False, cgroups=aux, env=penv)
            spawned.append(proc)
            started_parts.append((part, proc, log))

        agents = {}
        agent_cg = cluster.aux_cgroups("agents")
        for h in cluster.hosts:
            log = out_dir / f"agent-{h.name}.log"
            agents[h.name] = (
                _start_logged(
                    es, cluster, h, parts.agent_argv(job, h, h.cgroup("unified")), log, netns=False, cgroups=agent_cg
                ),
                log,
            )
            spawned.append(agents[h.name][0])
            view.say(f"agent {h.name} starting (pid {agents[h.name][0].pid}), compiling probes")

        def agents_alive() -> None:
            for n, (p, alog) in agents.items():
                _alive(p, f"agent {n}", alog)

        for part, proc, log in started_parts:
            _wait(
                lambda part=part, proc=proc: parts.ready(settings, part, proc.pid),
                opts.ready_timeout_s,
                f"the {part.name} part",
                check=lambda part=part, proc=proc, log=log: (_alive(proc, part.name, log), agents_alive()),
            )
            took = parts.registered(settings, part, proc.pid).get("ready_s")
            recovered = (
                f", its tables recovered in {took:.1f} s" if isinstance(took, (int, float)) and took >= 1 else ""
            )
            view.say(f"{part.name} ready (pid {proc.pid}){recovered}")
            watched.append((proc, part.name, log))

        def agents_ready() -> bool:
            regs = {c["name"]: c for c in registry.components(settings) if c.get("running")}
            return all(regs.get(f"agent-{n}", {}).get("pid") == p.pid for n, (p, _) in agents.items())

        _wait(
            agents_ready,
            opts.ready_timeout_s,
            "the agents to attach their probes",
            check=agents_alive,
        )
        view.say("agents attached")
        watched += [(p, f"agent {n}", log) for n, (p, log) in agents.items()]

        steps = opts.steps or 1_000_000
        ranks = []
        per = opts.ranks_per_host
        world = opts.hosts * per
        for h in cluster.hosts:
            for lr in range(per):  # global rank h * per + lr: the rank layout torchrun gives per node
                rank = h.index * per + lr
                log = out_dir / f"rank-{rank}.log"
                env = parts.training_env(dict(os.environ), h, world, cluster.hosts[0].address)
                env.update({"RANK": str(rank), "LOCAL_RANK": str(lr), "LOCAL_WORLD_SIZE": str(per)})
                proc = _start_logged(
                    es,
                    cluster,
                    h,
                    parts.training_argv(job, h, steps, opts.hidden, opts.step_sleep_ms, opts.workload),
                    log,
                    env=env,
                    stdout=subprocess.PIPE,
                )
                ranks.append(Rank(h, proc, view, rank, per))
        view.say(
            f"training: {world} ranks of {parts.WORKLOADS[opts.workload][0].rsplit('.', 1)[-1]} (gloo, {per} per host) over 10.77.0.0/24, job {job}"
        )
        stopped_parts: list[bool] = []

        def stop_parts() -> None:
            """Stop the parts in order, once: the rule engine first (the ranks are stopped one by one
            otherwise, and a rank gone while its peers wait in a collective is what the hang check names,
            an exit, so it would page the sinks), then the ranks together, then the agents (a SIGTERM
            flushes what each holds, its ranks' exit reports included), then the worker once it has read
            and committed its input (at most 15 s), then the rest at once (each alone waited up to its
            grace in turn). A worker stopped before it read the exits left them to the next demo's worker
            (its group is shared), which found the job's last step open in its changelog and paged
            rank_hang for the ended job (newuser18). Also on Ctrl-C (an exit stack callback): the stack
            stopped the ranks one by one, last started first, with the engine still running, and
            rank_hang fired for node-03 to every sink (cancel19)."""
            if stopped_parts:
                return
            stopped_parts.append(True)
            for proc, name, _log in watched:
                if name == "rules":
                    Cluster.stop(proc)
            _stop_together([r.proc for r in ranks])
            agents = [(proc, name) for proc, name, _log in watched if name.startswith("agent ")]
            killed = _stop_together([proc for proc, _name in agents])
            if killed:
                view.say(
                    "killed after the 5 s grace (their last lines lost): "
                    + ", ".join(name for proc, name in agents if proc in killed)
                )
            _wait_drained(settings, parts.STREAMS_APP_ID, 15.0)
            _stop_together([proc for proc, _name, _log in watched])

        es.callback(stop_parts)

        killed = False  # an exit fault killed a rank: the others may fail with it

        def check_ranks():
            for proc, name, log in watched:
                _alive(proc, name, log)
            if killed:
                return  # the fault killed a rank: the others may fail with it
            for r in ranks:
                if r.proc.poll() not in (None, 0):
                    _alive(r.proc, f"rank {r.rank}", out_dir / f"rank-{r.rank}.log")

        _wait(lambda: all(r.steps for r in ranks), opts.ready_timeout_s, "the first training step", check=check_ranks)
        t_warm = time.monotonic()
        view.say("every rank finished its first step")

        episodes = opts.plan()
        done: list[dict] = []  # per episode: kind, host, t0_ns, removed_ns, evidence
        evidence: dict = {}
        for i, (kind, host_i, start_s, stop_s) in enumerate(episodes):
            base, _, sub = kind.partition(":")  # stall:LAYER in a --sequence: a stall of that layer
            one = ranks[host_i * per + opts.fault_rank] if opts.fault_rank is not None else None  # a one-rank fault
            pid = one.proc.pid if one else None
            fault = make_fault(base, cluster, host_i, {**opts.fault_params, **({"layer": sub} if sub else {})}, pid=pid)
            fault.prepare()
            es.callback(fault.remove)
            expected = (cluster.hosts[host_i].name, fault.layer) if kind != "none" else None
            ep = {
                "kind": kind,
                "host": expected[0] if expected else None,
                "layer": fault.layer,
                "rank": one.rank if one and kind != "none" else None,  # global rank: its alerts must name it
                "t0_ns": None,
                "removed_ns": None,
                "evidence": {},
            }
            if i > 0:  # start each later episode with no alert of the job firing (at most 30 s more)
                _wait_quiet(reader, 30.0, check_ranks)
                start_s = max(start_s, time.monotonic() - t_warm)
                stop_s = start_s + opts.fault_for_s
            t0.update(ns=None, kind=kind, rank=ep["rank"])
            next_sample = 0.0
            waited, planned = False, stop_s - start_s  # the fault's planned time (s)
            while time.monotonic() < t_warm + stop_s and any(r.proc.poll() is None for r in ranks):
                check_ranks()
                now = time.monotonic()
                due = ep["t0_ns"] is None and kind != "none" and now >= t_warm + start_s
                if due and not baseline.ready.is_set() and now < t_warm + start_s + BASELINE_WAIT_S:
                    # the worker has no baseline of the job yet: a fault now would be part of it (BaselineWatch)
                    if not waited:
                        view.say(
                            f"waiting for the stream worker's baseline of the job ({baseline.need} closed steps) "
                            "before the fault"
                        )
                        waited = True
                    stop_s = now - t_warm + planned + 1.0  # the fault keeps its planned time
                    time.sleep(0.2)
                    continue
                if due and not baseline.ready.is_set():
                    view.say(
                        f"no baseline of the job from the stream worker after {BASELINE_WAIT_S:.0f} s more: the fault now"
                    )
                if due:
                    if waited:
                        stop_s = now - t_warm + planned
                    fault.inject()
                    t0["ns"] = ep["t0_ns"] = time.time_ns()
                    killed = killed or kind == "exit"
                    view.fault(f"{fault.describe()} injected (layer {fault.layer})")
                if ep["t0_ns"] is not None and now >= next_sample:
                    ep["evidence"] = evidence = fault.evidence()
                    view.set_evidence(evidence)
                    next_sample = now + 2.0
                time.sleep(0.2)
            if ep["t0_ns"] is not None:
                ep["evidence"] = evidence = fault.evidence()
                view.set_evidence(evidence)
            fault.remove()
            ep["removed_ns"] = time.time_ns()
            if base == "stall":
                ep["stall_starts_ns"] = list(fault.starts_ns)
                ep["evidence"] = evidence = fault.evidence()
            if len(episodes) > 1:
                view.say(f"{kind} on {ep['host']} removed")
            done.append(ep)
        view.say(f"training window over; waiting {opts.settle_s:.0f} s for late alerts")
        time.sleep(opts.settle_s)
        end_ns = time.time_ns()  # alerts after this are listed in the report, not judged
        view.say("stopping every part and removing the cluster")
        engine_stop_ns = time.time_ns()  # the engine resolves what still fires as it stops (--resolve-on-exit)
        stop_parts()  # the rule engine first, then the ranks together (see stop_parts)
    bounds = [ep["t0_ns"] or end_ns for ep in done[1:]] + [end_ns]
    for ep, until in zip(done, bounds):
        mine = [a for a in reader.alerts if a.received_ns < until]
        if ep is not done[0]:
            mine = [a for a in mine if a.received_ns >= (ep["t0_ns"] or 0)]
        if ep["kind"].partition(":")[0] == "stall":
            v = judge_stalls(ep["host"], ep["layer"], ep.get("stall_starts_ns") or [], mine, until, ep.get("rank"))
        else:
            v = judge(ep["kind"], ep["host"], ep["layer"], ep["t0_ns"], mine, ep.get("rank"))
        if ep["kind"] == "hang":
            # resolved by the engine's rules, not by its exit (--resolve-on-exit: those end after it was stopped)
            natural = [r for r in reader.records if (r.get("ends_at_ns") or 0) < engine_stop_ns]
            check_resolved(v, natural, ep["removed_ns"])
        ep["verdict"] = v.to_dict()
    verdict = done[0]["verdict"]
    expected = (done[0]["host"], done[0]["layer"]) if done[0]["kind"] != "none" else None
    report = {
        "scenario": {
            **asdict(opts),
            "job": job,
            "run_id": run_id,
            "fault_host_name": expected[0] if expected else None,
            "fault_rank_global": done[0]["rank"],  # the first episode's (with --sequence, --fault-host is unused)
        },
        "verdict": verdict,
        "evidence": done[0]["evidence"],
        "alerts": [asdict(a) for a in reader.alerts if a.received_ns < end_ns],
        "alerts_after_end": [asdict(a) for a in reader.alerts if a.received_ns >= end_ns],
        "alert_records": reader.records,
        "steps": {r.name: {"count": len(r.steps), "median_ms": _median([s[1] for s in r.steps])} for r in ranks},
        "webhook": _webhook_summary(receiver),
        "logs": str(out_dir),
    }
    if len(done) > 1:
        report["episodes"] = done
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
    return report


def _wait_drained(settings: Settings, group: str, timeout_s: float) -> bool:
    """Wait until consumer group ``group`` committed what its topics held when the wait began, at most
    ``timeout_s``: twice, against the high watermarks taken at the start and again once those were reached
    (what the group wrote to its own topics while it read the first ones: the worker's step records of the
    agents' last batches). The marks are fixed: the worker's own broadcasts after them do not count
    (``parts.GroupLag.marks``). Reads every 0.25 s through one pair of clients built for the wait and
    closed at its end (``parts.GroupLag``). Returns True when drained, False when the time ran out or the
    broker did not answer (the stop goes on)."""
    deadline = time.monotonic() + timeout_s
    with parts.GroupLag(settings) as reader:
        for _phase in range(2):
            marks = reader.marks(group)
            if marks is None:
                return False
            while True:
                lag = reader.lag(group, marks)
                if lag is None:
                    return False
                if lag == 0:
                    break
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.25)
    return True


def _wait_quiet(reader: "AlertReader", timeout_s: float, check) -> None:
    """Wait until no alert of the reader's job is firing (by its state-change records), at most
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        check()
        state: dict[str, str] = {}
        for r in list(reader.records):
            state[r.get("fingerprint", "")] = r.get("status", "")
        if not any(st == "firing" for st in state.values()):
            return
        time.sleep(0.5)


def _median(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[len(s) // 2], 1)


def _webhook_summary(receiver: WebhookReceiver) -> dict:
    recs = receiver.records()
    by: dict[str, int] = {}
    for r in recs:
        by[r["service"]] = by.get(r["service"], 0) + 1
    return {
        "file": str(receiver.path),
        "requests": len(recs),
        "by_service": by,
        "invalid": [r for r in recs if not r["valid"]],
    }


def matrix_row(report: dict) -> dict:
    """One row of the matrix table from a report: fault, host, detected host, layer, TTD, wrong alerts."""
    v, s = report["verdict"], report["scenario"]
    fc = v.get("first_correct") or {}
    return {
        "fault": s["fault"],
        "host": s.get("fault_host_name") or "-",
        "detected_host": fc.get("host") or "-",
        "layer": fc.get("layer") or "-",
        "ttd_s": v.get("ttd_s"),
        "wrong_alerts": v.get("wrong_count", 0),
        "ok": v.get("ok", False),
        "reason": v.get("reason", ""),
    }


def matrix_scenarios(opts: DemoOptions, kinds=KINDS) -> list[DemoOptions]:
    """The scenarios of ``--matrix``: ``opts`` once per fault kind of ``kinds``, each with the ``--param``
    values its own kind reads (``percent`` goes to net-loss alone). Raises DemoError for a ``--param``
    that no kind of the matrix reads."""
    check_params(opts.fault_params, list(kinds))
    return [
        DemoOptions(
            **{
                **asdict(opts),
                "fault": kind,
                "keep_stack": True,
                "fault_params": {k: v for k, v in opts.fault_params.items() if _readers(k, [kind], opts.fault_params)},
            }
        )
        for kind in kinds
    ]


def run_matrix(opts: DemoOptions, settings: Settings, view: DemoView, kinds=KINDS) -> list[dict]:
    """Run ``opts`` once per fault kind (``none`` included) on ``opts.fault_host``. Returns the rows; a
    scenario that raises is recorded as a failed row with the error, and the matrix goes on."""
    rows = []
    was_up = stack.broker_pid(settings) is not None
    try:
        for o in matrix_scenarios(opts, kinds):
            kind = o.fault
            try:
                rows.append({**matrix_row(run_demo(o, settings, view)), "error": ""})
            except DemoError as exc:
                if isinstance(exc, PartMissingError):
                    raise
                rows.append(
                    {
                        "fault": kind,
                        "host": f"node-{opts.fault_host:02d}",
                        "detected_host": "-",
                        "layer": "-",
                        "ttd_s": None,
                        "wrong_alerts": 0,
                        "ok": False,
                        "reason": str(exc),
                        "error": str(exc),
                    }
                )
    finally:
        if not was_up and not opts.keep_stack:
            stack.down(settings, view.say)
    return rows
