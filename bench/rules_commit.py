"""The rule engine's commit path, end to end: ``obshub rules serve`` against a private broker
(``bench.broker.private_stack``), each engine configuration of ``MODES`` measured side by side on the same
inputs (the modes alternate round by round):

- **throughput**: ``--steps`` step summaries of ``--jobs`` jobs (keyed by job, as the stream workers
  write them) produced while the engine runs; the time from the first produced summary until the engine's
  consumer group has committed every one of them (evaluation, alert changes and the commit path together).
  Reported as summaries/s.
- **recovery after SIGKILL**: a rule that fires on the third summary of a job that lost batches. Steps 1
  and 2 of every job are evaluated and committed, step 3 is produced and the engine is SIGKILLed as soon
  as its first alert change is on the broker (read_uncommitted: evaluated, maybe not committed). A fresh
  engine of the same group is started at once; *recovery* is the time from its start until its group
  has committed every step summary (the dead member's session timeout, 6 s, included).
- **duplicates after the crash**: firing changes of the rule on ``obshub.alerts.v1`` as the notify loops
  read it (read_committed), minus one per job: what a crash between an evaluation and its commit
  repeats.

    python -m bench.rules_commit                    # 20,000 summaries, 3 crash rounds per mode
    python -m bench.rules_commit --quick            # 2,000 summaries, 1 round

The two loops of before issue #29 (docs/ARCHITECTURE.md "One rule-engine loop"), from a checkout of
ad0dc0e: ``--mode "snapshot file=" --mode "transactions=--scale-out"``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from bench import common
from bench.broker import REPO, obshub_cmd, private_stack, stop_group
from obshub.core import schema

# engine configurations: name -> extra arguments of `obshub rules serve`
MODES: dict[str, list[str]] = {"one engine": []}

RULES = """\
version: 1
rules:
  - id: bench_lost_three
    description: batches lost in 3 steps of a job (benchmark rule)
    severity: error
    signal: steps
    condition: job.startsWith('{tag}-') && quality.lost_batches > 0
    group_by: {{job: job}}
    window: 10m
    threshold: {{aggregate: count, at_least: 3}}
  - id: bench_every_step
    description: a cheap rule on every summary (benchmark rule)
    severity: info
    signal: steps
    condition: step < 0
    group_by: {{job: job}}
    window: 1m
"""


def _summary(job: str, step: int, lost: int) -> bytes:
    return json.dumps(
        {
            "v": 1,
            "job": job,
            "step": step,
            "closed_by": "complete",
            "closed_at_ns": time.time_ns(),
            "hosts": ["h0", "h1"],
            "expected_hosts": ["h0", "h1"],
            "missing_hosts": [],
            "quality": {"lost_batches": lost},
        }
    ).encode()


def _ends(bootstrap: str) -> list[TopicPartition]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ends-{uuid.uuid4().hex}"})
    try:
        md = c.list_topics(schema.TOPIC_STEPS, timeout=10)
        out = []
        for p in md.topics[schema.TOPIC_STEPS].partitions:
            out.append(
                TopicPartition(
                    schema.TOPIC_STEPS, p, c.get_watermark_offsets(TopicPartition(schema.TOPIC_STEPS, p), timeout=10)[1]
                )
            )
        return out
    finally:
        c.close()


def _wait_committed(
    bootstrap: str, group: str, base: dict[int, int], timeout_s: float, proc: subprocess.Popen
) -> float:
    """Block until ``group`` has committed up to the current end of every steps partition written since
    ``base`` (partition -> end offset then); returns the monotonic time it was seen (polled every 50 ms)."""
    ends = {tp.partition: tp.offset for tp in _ends(bootstrap) if tp.offset > base.get(tp.partition, 0)}
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                got = c.committed([TopicPartition(schema.TOPIC_STEPS, p) for p in ends], timeout=10)
            except KafkaException:  # the group coordinator slow to answer on a loaded machine: ask again
                continue
            if all(tp.offset >= ends[tp.partition] for tp in got):
                return time.monotonic()
            if proc.poll() is not None:
                raise RuntimeError(f"rules serve exited with {proc.returncode}")
            time.sleep(0.05)
    finally:
        c.close()
    raise RuntimeError(f"group {group} did not commit the steps topic within {timeout_s:.0f} s")


def _changes(bootstrap: str, tag: str, isolation: str) -> list[dict]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"chg-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    c.subscribe([schema.TOPIC_ALERTS])
    out, quiet = [], time.monotonic()
    try:
        while time.monotonic() - quiet < 2.0:
            m = c.poll(0.2)
            if m is None or m.error():
                continue
            quiet = time.monotonic()
            rec = json.loads(m.value())
            if rec.get("labels", {}).get("job", "").startswith(f"{tag}-") and rec["rule"] == "bench_lost_three":
                out.append(rec)
    finally:
        c.close()
    return out


def _watch_changes(bootstrap: str) -> Consumer:
    """A consumer of the alert changes from their current end, read_uncommitted (what is on the broker,
    committed or not), assigned at once (no group join to wait for)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"first-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_uncommitted",
        }
    )
    md = c.list_topics(schema.TOPIC_ALERTS, timeout=10)
    parts = [TopicPartition(schema.TOPIC_ALERTS, p) for p in md.topics[schema.TOPIC_ALERTS].partitions]
    c.assign([TopicPartition(tp.topic, tp.partition, c.get_watermark_offsets(tp, timeout=10)[1]) for tp in parts])
    return c


def _first_change(c: Consumer, tag: str, timeout_s: float) -> bool:
    """True as soon as ``c`` reads one alert change of ``tag``."""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.01)
            if m is not None and not m.error() and json.loads(m.value())["labels"].get("job", "").startswith(tag):
                return True
        return False
    finally:
        c.close()


def _start(rules: Path, prefix: str, extra: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        obshub_cmd("rules", "serve", "-r", str(rules), "--group-prefix", prefix, *extra),
        cwd=REPO,
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _ready(log: Path, proc: subprocess.Popen, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text()
        if "engine: assigned" in text or "engine: took over" in text:
            return
        if proc.poll() is not None:
            raise RuntimeError(f"rules serve exited: {text[-2000:]}")
        time.sleep(0.1)
    raise RuntimeError("the engine was not assigned its partitions")


def one_round(bootstrap: str, name: str, extra: list[str], steps: int, jobs: int, tmp: Path) -> dict:
    """Throughput, recovery and duplicates of one mode (module docstring); a fresh group and job names."""
    tag = f"b{uuid.uuid4().hex[:8]}"
    prefix = f"bench-{tag}"
    rules = tmp / f"{tag}.yaml"
    rules.write_text(RULES.format(tag=tag))
    log = tmp / f"{tag}.log"
    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "partitioner": "murmur2_random"})
    names = [f"{tag}-{j}" for j in range(jobs)]
    proc = _start(rules, prefix, extra, log)
    try:
        _ready(log, proc)
        base = {tp.partition: tp.offset for tp in _ends(bootstrap)}
        # throughput: clean summaries (no loss) of every job
        t0 = time.monotonic()
        for i in range(steps):
            job = names[i % jobs]
            prod.produce(schema.TOPIC_STEPS, key=job, value=_summary(job, 100 + i // jobs, 0))
            if i % 1000 == 999:
                prod.poll(0)
        prod.flush(30)
        t1 = _wait_committed(bootstrap, f"{prefix}-engine", base, 600, proc)
        rate = steps / (t1 - t0)
        # crash: steps 1, 2 committed, step 3 produced, SIGKILL at the first change on the broker
        for step in (1, 2):
            for job in names:
                prod.produce(schema.TOPIC_STEPS, key=job, value=_summary(job, step, 1))
        prod.flush(30)
        _wait_committed(bootstrap, f"{prefix}-engine", base, 120, proc)
        watch = _watch_changes(bootstrap)
        for job in names:
            prod.produce(schema.TOPIC_STEPS, key=job, value=_summary(job, 3, 1))
        prod.flush(30)
        if not _first_change(watch, tag, 60):
            raise RuntimeError("no alert change within 60 s of step 3")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        t2 = time.monotonic()
        proc = _start(rules, prefix, extra, log)
        t3 = _wait_committed(bootstrap, f"{prefix}-engine", base, 180, proc)
        time.sleep(1.0)
        firing = [c for c in _changes(bootstrap, tag, "read_committed") if c["status"] == "firing"]
        per_job = {j: sum(1 for c in firing if c["labels"]["job"] == j) for j in names}
        return {
            "mode": name,
            "summaries_per_s": rate,
            "recovery_s": t3 - t2,
            "jobs": jobs,
            "jobs_fired": sum(1 for n in per_job.values() if n),
            "duplicates": sum(max(0, n - 1) for n in per_job.values()),
        }
    finally:
        stop_group(proc)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20_000, help="summaries of the throughput phase")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--rounds", type=common.positive_int, default=3, help="crash rounds per mode (modes alternate)")
    ap.add_argument("--quick", action="store_true", help="2,000 summaries, 1 round")
    ap.add_argument("--mode", action="append", default=None, help="NAME=ARGS (extra `rules serve` args), repeatable")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.rounds = 2_000, 1
    modes = dict(MODES)
    if args.mode:
        modes = {m.split("=", 1)[0]: m.split("=", 1)[1].split() if "=" in m else [] for m in args.mode}
    print(common.describe_machine())
    rows: dict[str, list[dict]] = {m: [] for m in modes}
    with private_stack() as settings, tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            for name, extra in modes.items():
                res = one_round(settings.bootstrap_servers, name, extra, args.steps, args.jobs, Path(d))
                print(f"  round {r + 1} {name}: {res}")
                rows[name].append(res)
    print(f"\n{'mode':<24} {'summaries/s':>12} {'recovery s':>11} {'duplicates':>11} {'jobs fired':>11}")
    for name, rs in rows.items():
        print(
            f"{name:<24} {statistics.median(x['summaries_per_s'] for x in rs):>12,.0f} "
            f"{statistics.median(x['recovery_s'] for x in rs):>11.1f} "
            f"{sum(x['duplicates'] for x in rs):>5} / {sum(x['jobs'] for x in rs):<5} "
            f"{sum(x['jobs_fired'] for x in rs):>5} / {sum(x['jobs'] for x in rs):<5}"
        )
    common.save("rules_commit", {"rows": rows, "args": vars(args)})


if __name__ == "__main__":
    main()
