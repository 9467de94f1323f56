"""Scale projection: from the per-event and per-step costs measured by the other benchmarks, the event
rate, Kafka bandwidth, agent CPU and number of stream workers that 1,024 GPUs (128 nodes x 8) and 16,384
GPUs (2,048 nodes x 8) need, with the arithmetic printed; then a check: synthetic batches of 128 hosts
replayed at a real step rate through real stream workers, with the backlog sampled all along.

Inputs (read from bench/results/*.json of the latest runs; a value not measured yet falls back to the
stated default and is marked so):

- ``E``   events per GPU per step: the agent's event count in bench/training_overhead.py (configuration C,
          every probe attached) / (steps x ranks); default 64 (bench/loadgen.py's shape);
- ``B``   bytes per event on the wire: msgpack batches of bench/loadgen.py, and after lz4 (the agent's
          default compression), measured here;
- ``W``   events/s one Faust worker carries: bench/stream_throughput.py (1 worker);
- ``C``   agent CPU seconds per million events: bench/agent_throughput.py;
- ``T``   step time: two cases, the toy workload's measured step (bench/training_overhead.py, plain) and
          1 s (large-model data-parallel steps take seconds).

Formulas: events/s = G x E / T; Kafka bytes/s = events/s x B; messages/s = N x 5 (one batch per agent per
200 ms, the batcher's age bound); workers = ceil(events/s / W); agent cores per node = 8 x E / T x C / 1e6.

Replay check: 128 hosts, ``REPLAY_EVENTS`` events per host-step, one batch per host per step published at
the step's time (``REPLAY_STEP_S`` apart) for ``REPLAY_STEPS`` steps into as many workers as the
projection asks for (ceil(events/s / W), at most ``MAX_REPLAY_WORKERS`` on this 2-core box). The backlog
(events published - events ingested, and the worker's own consumer-lag gauge) is sampled every 0.5 s;
*bounded* = the backlog at the end of each step never exceeds ``BOUND_STEPS`` steps' worth and every step
is summarised.

    python -m bench.scale               # projection + 128-host replay (REPLAY_STEPS steps)
    python -m bench.scale --quick       # projection + a short replay
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from rich.table import Table

from bench import common, loadgen
from bench.broker import free_port, private_stack
from bench.stream_throughput import worker_counters
from obshub.core import schema
from tests.support import testkit

GPUS_PER_NODE = 8
CLUSTERS = (1_024, 16_384)
DEFAULTS = {"E": 64.0, "W": 20_000.0, "C": 5.0, "T_toy": 0.05}
BATCHES_PER_S = 5  # one batch per agent per 200 ms (obshub/producer/batcher.py max_age_ms)
REPLAY_HOSTS, REPLAY_EVENTS, REPLAY_STEP_S, REPLAY_STEPS = 128, 64, 1.0, 30
QUICK_REPLAY_STEPS = 8
BOUND_STEPS = 3
MAX_REPLAY_WORKERS = 2  # 2 cores: more workers would only share them


def _load(name: str) -> dict:
    try:
        return json.loads((common.results_dir() / f"{name}.json").read_text())
    except (OSError, ValueError):
        return {}


def measured_inputs() -> dict:
    """E, W, C, T_toy from the latest results, each with where it came from."""
    out = {k: (v, "default (not measured yet)") for k, v in DEFAULTS.items()}
    to = _load("training_overhead")
    c_runs = (to.get("samples") or {}).get("C + agent (every probe)") or []
    per = [r["events_per_rank_step"] for r in c_runs if r.get("events_per_rank_step") is not None]
    if per:
        out["E"] = (
            statistics.median(per),
            f"training_overhead: agent events per rank per step after warm-up, "
            f"every probe attached, median of {len(per)} runs",
        )
    plain = [r["median_ms"] for r in (to.get("samples") or {}).get("A plain") or []]
    if plain:
        med = statistics.median(plain) / 1000
        out["T_toy"] = (med, "training_overhead: median plain step time")
    st = _load("stream_throughput")
    one = (st.get("samples") or {}).get("faust, 1 worker")
    if one:
        out["W"] = (sorted(one)[len(one) // 2], "stream_throughput: 1 Faust worker, median")
    ru = _load("rules_throughput").get("rates") or {}
    wide = [
        (k.split(":")[0], v)
        for k, v in ru.items()
        if k.startswith("step summaries of") and k.endswith("records/s") and v
    ]
    if wide:  # label "step summaries of N hosts"
        out["R"] = (1 / wide[0][1], f"rules_throughput: the builtin pack on one step summary {wide[0][0][15:]}")
    at = _load("agent_throughput")
    if at.get("cpu_s_per_M"):
        out["C"] = (at["cpu_s_per_M"], "agent_throughput: at the largest lossless rate")
    return out


def wire_bytes() -> tuple[float, float]:
    """(msgpack bytes per event, lz4-compressed bytes per event) of agent-shaped batches."""
    load = loadgen.build(8, 30)
    raw = load.bytes
    try:
        import cramjam

        comp = sum(len(cramjam.lz4.compress(v)) for _k, v in load.messages)
    except Exception:  # cramjam is aiokafka's codec; without it only the uncompressed size is known
        comp = raw
    return raw / load.events, comp / load.events


def projection(inputs: dict, b_raw: float, b_lz4: float) -> list[dict]:
    """One row per (cluster size, step time) with the formulas' results."""
    e, w, c = inputs["E"][0], inputs["W"][0], inputs["C"][0]
    rows = []
    for gpus in CLUSTERS:
        nodes = gpus // GPUS_PER_NODE
        for label, t in ((f"toy step {inputs['T_toy'][0] * 1000:.0f} ms", inputs["T_toy"][0]), ("1 s step", 1.0)):
            ev = gpus * e / t
            rows.append(
                {
                    "gpus": gpus,
                    "nodes": nodes,
                    "step": label,
                    "T_s": t,
                    "events_per_s": ev,
                    "mb_per_s_raw": ev * b_raw / 1e6,
                    "mb_per_s_lz4": ev * b_lz4 / 1e6,
                    "messages_per_s": nodes * BATCHES_PER_S,
                    "workers": math.ceil(ev / w),
                    "agent_cores_per_node": GPUS_PER_NODE * e / t * c / 1e6,
                    "events_per_node_s": GPUS_PER_NODE * e / t,
                }
            )
    return rows


def print_projection(inputs: dict, b_raw: float, b_lz4: float, rows: list[dict]) -> None:
    con = common.console
    e, w, c = inputs["E"][0], inputs["W"][0], inputs["C"][0]
    con.print("[bold]inputs[/bold]")
    con.print(f"  E = {e:,.1f} events per GPU per step   ({inputs['E'][1]})")
    con.print(
        f"  B = {b_raw:.1f} bytes per event msgpack, {b_lz4:.1f} after lz4   (agent-shaped batches, measured here)"
    )
    con.print(f"  W = {w:,.0f} events/s per stream worker   ({inputs['W'][1]})")
    con.print(f"  C = {c:.2f} agent CPU s per million events   ({inputs['C'][1]})")
    con.print(f"  T = {inputs['T_toy'][0] * 1000:.0f} ms ({inputs['T_toy'][1]}) and 1 s")
    if "R" in inputs:
        con.print(
            f"  R = {inputs['R'][0]:.2f} s of rule-engine CPU per step summary   ({inputs['R'][1]}): one summary "
            f"per job per step, so a job of that width with 1 s steps needs {inputs['R'][0]:.1f} engine cores"
        )
    con.print("[bold]arithmetic[/bold]")
    for r in rows:
        con.print(
            f"  {r['gpus']:,} GPUs ({r['nodes']:,} nodes), {r['step']}: events/s = {r['gpus']:,} x {e:,.1f} / "
            f"{r['T_s']:.3f} = {r['events_per_s']:,.0f}; Kafka = {r['events_per_s']:,.0f} x {b_lz4:.1f} B = "
            f"{r['mb_per_s_lz4']:,.1f} MB/s lz4 ({r['mb_per_s_raw']:,.1f} MB/s raw), {r['messages_per_s']:,} msg/s; "
            f"workers = ceil({r['events_per_s']:,.0f} / {w:,.0f}) = {r['workers']:,}; agent = 8 x {e:,.1f} / "
            f"{r['T_s']:.3f} x {c:.2f} / 1e6 = {r['agent_cores_per_node']:.3f} cores per node"
        )
    t = Table(title="scale projection", caption=common.describe_machine())
    for col in (
        "GPUs",
        "nodes",
        "step",
        "events/s",
        "Kafka MB/s (lz4)",
        "Kafka MB/s (raw)",
        "messages/s",
        "stream workers",
        "agent cores/node",
    ):
        t.add_column(col)
    for r in rows:
        t.add_row(
            f"{r['gpus']:,}",
            f"{r['nodes']:,}",
            r["step"],
            f"{r['events_per_s']:,.0f}",
            f"{r['mb_per_s_lz4']:,.1f}",
            f"{r['mb_per_s_raw']:,.1f}",
            f"{r['messages_per_s']:,}",
            f"{r['workers']:,}",
            f"{r['agent_cores_per_node']:.3f}",
        )
    con.print(t)


def replay(settings, tmp: Path, steps: int, workers: int = 1) -> dict:
    """Publish 128 hosts' batches step by step at REPLAY_STEP_S into ``workers`` workers of one app;
    sample the backlog."""
    load = loadgen.build(REPLAY_HOSTS, steps, events_per_step=REPLAY_EVENTS, steps_per_batch=1)
    hosts = REPLAY_HOSTS
    # rounds of one message per host: the registrations, then one per step (loadgen's send order)
    rounds = [load.messages[i : i + hosts] for i in range(0, len(load.messages), hosts)]
    rounds = [rounds[0] + rounds[1]] + rounds[2:]
    tag = f"scale-{uuid.uuid4().hex[:6]}"
    topics = testkit.make_topics(settings, f"bench-{tag}", partitions=4)
    ports = [free_port() for _ in range(workers)]
    procs = [
        testkit.Worker(
            topics,
            f"bench-{tag}-app",
            i + 1,
            tmp / f"scale-worker{i}.log",
            window_s=5.0,
            partitions=4,
            metrics_port=ports[i],
        )
        for i in range(workers)
    ]
    samples, at_step_end = [], []
    try:
        for w in procs:
            w.wait_ready(120)
        time.sleep(1.0 if workers == 1 else 3.0)
        prod = testkit.producer(settings)
        counts = [sum(len(schema.decode_batch(v).events) for _k, v in batch) for batch in rounds]
        published_events, t0 = 0, time.monotonic()
        for s, batch in enumerate(rounds):
            for key, value in batch:
                prod.produce(topics.events, key=key, value=value)
            published_events += counts[s]
            prod.poll(0)
            prod.flush(10)
            deadline = t0 + (s + 1) * REPLAY_STEP_S
            while True:
                c = worker_counters(ports)
                samples.append(
                    {
                        "t": time.monotonic() - t0,
                        "published": published_events,
                        "ingested": c["events"],
                        "summaries": c["summaries"],
                        "backlog": published_events - c["events"],
                        "lag_gauge": sum(_lag_gauge(p) for p in ports),
                    }
                )
                if time.monotonic() >= deadline - 0.05:
                    break
                time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
            at_step_end.append(samples[-1]["backlog"])
        t_end = time.monotonic()
        while worker_counters(ports)["summaries"] < steps and time.monotonic() - t_end < 20:
            time.sleep(0.2)
        drain_s = time.monotonic() - t_end
        final = worker_counters(ports)
    finally:
        for w in procs:
            w.stop()
    ev_per_step = load.events / steps
    bound = BOUND_STEPS * ev_per_step
    return {
        "hosts": REPLAY_HOSTS,
        "steps": steps,
        "workers": workers,
        "step_s": REPLAY_STEP_S,
        "events": load.events,
        "events_per_s": load.events / (steps * REPLAY_STEP_S),
        "events_per_step": ev_per_step,
        "max_backlog_events": max(at_step_end),
        "backlog_at_step_end": at_step_end,
        "bound_events": bound,
        "summaries": final["summaries"],
        "drain_s": drain_s,
        "bounded": max(at_step_end) <= bound and final["summaries"] >= steps,
        "samples": samples,
    }


def _lag_gauge(port: int) -> float:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return -1.0
    for fam in text_string_to_metric_families(text):
        if fam.name == "obshub_streams_consumer_lag_messages":
            return sum(s.value for s in fam.samples)
    return -1.0


def run(quick: bool = False, rounds: int | None = None) -> dict:
    """Print the projection, run the replay check, save the JSON. Returns the results dict. ``rounds``
    (``python -m bench --rounds``, every benchmark's) is not read: one replay."""
    common.console.rule("[bold]6. scale projection[/bold]: 1,024 and 16,384 GPUs, checked by a 128-host replay")
    inputs = measured_inputs()
    b_raw, b_lz4 = wire_bytes()
    rows = projection(inputs, b_raw, b_lz4)
    print_projection(inputs, b_raw, b_lz4, rows)
    steps = QUICK_REPLAY_STEPS if quick else REPLAY_STEPS
    need = math.ceil(REPLAY_HOSTS * REPLAY_EVENTS / REPLAY_STEP_S / inputs["W"][0])
    workers = max(1, min(MAX_REPLAY_WORKERS, need))
    common.console.print(
        f"replay: the projection asks for ceil({REPLAY_HOSTS} x {REPLAY_EVENTS} / {REPLAY_STEP_S:.0f} s / "
        f"{inputs['W'][0]:,.0f}) = {need} worker(s); running {workers} (at most "
        f"{MAX_REPLAY_WORKERS} on this machine)"
    )
    tmp = Path(tempfile.mkdtemp(prefix="obshub-bench-scale-"))
    try:
        with private_stack(common.console.print) as settings:
            rep = replay(settings, tmp, steps, workers)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ends = rep["backlog_at_step_end"]
    common.console.print(
        f"replay: {rep['hosts']} hosts x {rep['events_per_step'] / rep['hosts']:.0f} events per step, one "
        f"step every {rep['step_s']:.1f} s for {rep['steps']} steps = {rep['events_per_s']:,.0f} events/s "
        f"into {rep['workers']} worker(s); backlog at each step's end (events): "
        f"{', '.join(f'{int(x):,}' for x in ends[:12])}{' ...' if len(ends) > 12 else ''}; "
        f"max {rep['max_backlog_events']:,.0f} (bound {rep['bound_events']:,.0f} = {BOUND_STEPS} steps); "
        f"{rep['summaries']:.0f}/{rep['steps']} steps summarised, last {rep['drain_s']:.1f} s after the "
        f"last publish"
    )
    w = inputs["W"][0]
    common.verdict(
        f"128 hosts at a 1 s step through {rep['workers']} worker(s): consumer lag bounded",
        rep["bounded"],
        f"max backlog {rep['max_backlog_events']:,.0f} events; one worker saturates near "
        f"{w / (REPLAY_HOSTS * REPLAY_EVENTS):.2f} steps/s for 128 hosts x {REPLAY_EVENTS} events",
    )
    result = {
        "inputs": {k: {"value": v[0], "source": v[1]} for k, v in inputs.items()},
        "bytes_per_event": {"msgpack": b_raw, "lz4": b_lz4},
        "projection": rows,
        "replay": rep,
        "rev": common.git_rev(),
    }
    common.console.print(f"raw results: {common.save('scale', result)}")
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m bench.scale [--quick]``."""
    p = argparse.ArgumentParser(
        prog="python -m bench.scale", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help=f"short replay ({QUICK_REPLAY_STEPS} steps)")
    a = p.parse_args(argv)  # no --rounds: one replay (it was accepted and unused)
    run(a.quick)
    return common.exit_code(a.quick)


if __name__ == "__main__":
    raise SystemExit(main())
