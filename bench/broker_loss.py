"""What a broker fault costs the stream worker on a real three-broker KRaft cluster (replication factor 3,
``min.insync.replicas`` 2; ``obshub.stack.LocalCluster``, heaps of 256 MB): the stall of step summaries
while partition leaders change, side by side with the same job on the undisturbed cluster.

One synthetic job per phase (4 hosts, a step every 0.25 s) goes through one ``obshub streams worker``; the
latency of a step is the time from the publication of its last batch to its summary on the steps topic
(read by a consumer beside it, which also counts steps not summarised and steps summarised twice). The
fault comes at a third of the phase's steps:

- ``baseline``: no fault;
- ``clean shutdown``: SIGTERM of a broker that leads input partitions (a controlled shutdown moves its
  leaders before it exits);
- ``preferred election``: that broker back, its leaders moved back to it (preferred leader election);
- ``broker SIGKILL``: a broker that leads input partitions (not the controller) killed: its leaders move
  only once the controller fences it (``broker.session.timeout.ms``, 6 s here; Kafka's default is 9 s);
- ``controller SIGKILL``: the active KRaft controller (also a broker) killed.

The stall of a phase is its largest step latency minus the baseline's median latency. The worker's
"Timer commit is overlapping (runtime=...)" lines of the phase give how long its offset commit hung.

    python -m bench.broker_loss              # one round (about 3 minutes)
    python -m bench.broker_loss --rounds 3   # phases repeated, medians over rounds
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from bench import common
from bench.broker import REPO, obshub_cmd, stop_group
from obshub.core import schema
from obshub.core.log import NullLogger
from obshub.core.settings import load_settings
from obshub.stack import LocalCluster

STEP_S = 0.25  # s between steps of the synthetic job
PHASES = ("baseline", "clean shutdown", "preferred election", "broker SIGKILL", "controller SIGKILL")


class _Arrivals:
    """A consumer thread on the steps topic: monotonic arrival time per (job, step) (the first), and how
    many summaries of each arrived (``n``: more than 1 is a step summarised twice)."""

    def __init__(self, bootstrap: str):
        from confluent_kafka import Consumer

        self.at: dict[tuple[str, int], float] = {}
        self.n: dict[tuple[str, int], int] = {}
        self.stop = threading.Event()
        self.c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-broker-loss-{os.getpid()}",
                "auto.offset.reset": "latest",
                "enable.auto.commit": False,
                "logger": NullLogger(),
            }
        )
        self.c.subscribe([schema.TOPIC_STEPS])
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self) -> None:
        import json

        while not self.stop.is_set():
            m = self.c.poll(0.05)
            if m is None or m.error():
                continue
            s = json.loads(m.value())
            self.at.setdefault((s["job"], s["step"]), time.monotonic())
            self.n[(s["job"], s["step"])] = self.n.get((s["job"], s["step"]), 0) + 1
        self.c.close()


def _publish_phase(prod, job: str, steps: int, fault) -> dict[int, float]:
    """Publish one synthetic job, one step every STEP_S; call ``fault()`` at a third of the steps.
    Returns step -> monotonic time its last batch was acknowledged."""
    from obshub.streams import synthetic

    scn = synthetic.Scenario(job=job, hosts=4, steps=steps, straggler=1, seed=3)
    batches = synthetic.generate(scn)
    by_step: dict[int, list] = {}
    for key, b in batches:
        by_step.setdefault(b.events[0].step, []).append((key, b))
    sent: dict[int, float] = {}
    for step in sorted(by_step):
        for key, b in by_step[step]:
            prod.produce(schema.TOPIC_EVENTS, key=key, value=schema.encode_batch(b))
        prod.flush(60)
        if step >= 0:
            sent[step] = time.monotonic()
            if step == steps // 3 and fault is not None:
                fault()
        time.sleep(STEP_S)
    return sent


def _leader_of_events(cluster: LocalCluster, not_node: int) -> int:
    """A node (not ``not_node``) that leads some partition of the events topic."""
    leaders = set(cluster.leaders(schema.TOPIC_EVENTS).values())
    return next(
        (n for n in sorted(leaders) if n != not_node and n > 0), next(n for n in cluster.procs if n != not_node)
    )


def run(quick: bool = False, rounds: int | None = None) -> dict:
    """Measure every phase ``rounds`` times (default 1), print the tables, save the JSON."""
    from confluent_kafka import ElectionType, Producer
    from confluent_kafka.admin import AdminClient

    from obshub.topics_cli import create, wanted

    rounds = rounds or 1
    steps = 16 if quick else 32
    root = Path(tempfile.mkdtemp(prefix="obshub-bench-cluster-"))
    cluster = LocalCluster(load_settings(home=root / "home"), root, n=3, heap_mb=256)
    saved = {k: os.environ.get(k) for k in ("OBSHUB_BOOTSTRAP", "OBSHUB_KAFKA_REPLICATION_FACTOR", "OBSHUB_HOME")}
    worker = None
    lat: dict[str, common.Series] = {p: common.Series(p) for p in PHASES}
    commit: dict[str, list[float]] = {p: [] for p in PHASES}
    lost: dict[str, int] = {p: 0 for p in PHASES}
    twice: dict[str, int] = {p: 0 for p in PHASES}
    try:
        t0 = time.monotonic()
        cluster.start_all(timeout_s=180)
        common.console.print(f"[dim]  3 brokers on {cluster.bootstrap} ({time.monotonic() - t0:.0f} s to start)[/dim]")
        os.environ.update(
            OBSHUB_BOOTSTRAP=cluster.bootstrap, OBSHUB_KAFKA_REPLICATION_FACTOR="3", OBSHUB_HOME=str(root / "home")
        )
        settings = load_settings(home=root / "home", bootstrap=cluster.bootstrap)
        create(settings, wanted(settings, "bench-bl", 2))
        wlog = root / "worker.log"
        out = open(wlog, "ab")
        worker = subprocess.Popen(
            obshub_cmd("streams", "worker", "--app-id", "bench-bl", "--partitions", "2", "--window-s", "3")
            + ["--index", "1", "--log-level", "info"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=REPO,
        )
        out.close()
        deadline = time.monotonic() + 120
        while "Worker ready" not in wlog.read_text(errors="replace"):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start:\n{wlog.read_text(errors='replace')[-2000:]}")
            time.sleep(0.3)
        arrivals = _Arrivals(cluster.bootstrap)
        prod = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 2})
        _publish_phase(prod, "warm-up", 8, None)  # the consumer's assignment, the worker's first steps
        time.sleep(5)
        state: dict[str, int] = {}

        def clean():
            state["b"] = _leader_of_events(cluster, cluster.controller())
            cluster.stop_node(state["b"])

        def back_and_elect():
            admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
            admin.elect_leaders(ElectionType.PREFERRED, None).result(timeout=30)

        def kill():
            state["k"] = _leader_of_events(cluster, cluster.controller())
            cluster.kill(state["k"])

        def kill_controller():
            state["c"] = cluster.controller()
            cluster.kill(state["c"])

        faults = {
            "baseline": None,
            "clean shutdown": clean,
            "preferred election": back_and_elect,
            "broker SIGKILL": kill,
            "controller SIGKILL": kill_controller,
        }
        after = {
            "clean shutdown": lambda: cluster.start(state["b"]),
            "broker SIGKILL": lambda: cluster.start(state["k"]),
            "controller SIGKILL": lambda: cluster.start(state["c"]),
        }
        for r in range(rounds):
            for phase, fault in faults.items():
                common.console.print(f"[dim]  round {r + 1}/{rounds}: {phase}[/dim]")
                job = f"bl-{r}-{phase.replace(' ', '-')}"
                log_from = wlog.stat().st_size
                sent = _publish_phase(prod, job, steps, fault)
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and sum((job, s) in arrivals.at for s in sent) < len(sent):
                    time.sleep(0.2)
                got = [arrivals.at[(job, s)] - t for s, t in sent.items() if (job, s) in arrivals.at]
                lost[phase] += len(sent) - len(got)
                lat[phase].samples.append(max(got) if got else float("nan"))
                with open(wlog, "rb") as f:
                    f.seek(log_from)
                    text = f.read().decode(errors="replace")
                runs = [
                    float(x)
                    for x in re.findall(r"Timer commit is overlapping \(interval=[\d.]+ runtime=([\d.]+)", text)
                ]
                commit[phase].append(max(runs, default=0.0))
                if phase in after:
                    after[phase]()
                    time.sleep(3)
                twice[phase] += sum(arrivals.n.get((job, s), 0) > 1 for s in sent)  # late repeats: counted here
                if phase == "baseline":
                    base_all = sorted(arrivals.at[(job, s)] - t for s, t in sent.items() if (job, s) in arrivals.at)
                    lat.setdefault("baseline median", common.Series("baseline median")).samples.append(
                        base_all[len(base_all) // 2]
                    )
        arrivals.stop.set()
    finally:
        if worker is not None:
            stop_group(worker)
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    base = lat.pop("baseline median").median
    common.console.print(
        common.table(
            f"largest step latency per phase (publish of the last batch -> summary), {steps} steps at "
            f"{STEP_S} s, 4 hosts; baseline median latency {base:.3f} s",
            lat,
            "s",
            baseline="baseline",
        )
    )
    from rich.table import Table

    t = Table(title="stall and commit hang per phase (medians over rounds)", caption=common.describe_machine())
    cols = ("phase", "stall: max latency - baseline median (s)", "longest commit (s)", "steps not summarised")
    for col in (*cols, "steps summarised twice"):
        t.add_column(col)
    for p in PHASES:
        cm = sorted(commit[p])[len(commit[p]) // 2] if commit[p] else 0.0
        t.add_row(p, f"{lat[p].median - base:.3f}", f"{cm:.3f}", str(lost[p]), str(twice[p]))
    common.console.print(t)
    result = {
        "baseline_median_s": base,
        "max_latency_s": {p: lat[p].samples for p in PHASES},
        "commit_runtime_s": commit,
        "not_summarised": lost,
        "summarised_twice": twice,
        "steps": steps,
        "rev": common.git_rev(),
    }
    common.console.print(f"raw results: {common.save('broker_loss', result)}")
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m bench.broker_loss [--quick] [--rounds N]``."""
    p = argparse.ArgumentParser(
        prog="python -m bench.broker_loss", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="16 steps per phase instead of 32")
    p.add_argument("--rounds", type=common.positive_int, default=None, help="repeat every phase N times (default 1)")
    a = p.parse_args(argv)
    run(quick=a.quick, rounds=a.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
