"""Training overhead, side by side: the step time of a real 2-rank ``torch.distributed`` (gloo, CPU)
training (``obshub.workloads.ddp_train``) in four configurations, run interleaved A B C D, A B C D, ...:

A. ``plain``: the two ranks as plain Python processes;
B. ``obshub run``: the same under ``obshub run`` (in-process instrumentation, USDT probes not attached);
C. ``obshub run + agent``: B while ``obshub agent --registered`` runs with every probe that attaches on
   this machine (its probe table is saved with the results), shipping to a private Kafka broker;
D. ``torch.profiler``: the same loop under ``torch.profiler.profile(activities=[CPU])``
   (bench/profiled_train.py).

Rank r is pinned to CPU r (as a launcher binds ranks on a real node); the agent and the broker are not
pinned. One sample = the median step time (ms) over both ranks' steps after ``WARMUP`` steps, read from
the workload's ``step N rank R time_ms T`` lines. The table gives each configuration's median over the rounds,
the spread, and the ratio to plain. Target: C within 1 % of A.

    python -m bench.training_overhead                  # ROUNDS rounds of STEPS steps
    python -m bench.training_overhead --quick          # 1 round of 15 steps (smoke run)
    python -m bench.training_overhead --breakdown pytorch --breakdown pytorch,sched,network
                                                       # + E1, E2: the agent with only these probes
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench import common
from bench.broker import bpf_unavailable, cpu_seconds, free_port, obshub_cmd, private_stack, stop_group
from obshub import stack

ROUNDS = 3             # interleaved rounds (each runs A, B, C, D once)
STEPS = 120            # training steps per run
WARMUP = 8             # first steps of each rank left out (allocator, gloo connections, DDP buckets)
QUICK_ROUNDS, QUICK_STEPS, QUICK_WARMUP = 1, 15, 3
TARGET_RATIO = 1.01    # obshub run + agent within 1 % of plain
STEP_LINE = re.compile(r"^step (\d+) rank (\d+) time_ms ([\d.]+)", re.M)
WORKLOAD = ["-m", "obshub.workloads.ddp_train"]
PROFILED = ["-m", "bench.profiled_train"]


def run_ranks(prefix: list[str], module: list[str], steps: int, warmup: int, on_warm=None) -> dict:
    """Start 2 ranks of ``prefix + [python] + module + --steps N`` with the torch.distributed environment,
    rank r pinned to CPU r, wait for both. ``on_warm()`` is called once, when rank 0 prints step ``warmup`` (the steady state
    begins). Returns ``{"median_ms", "steps": [(rank, step, ms)], "wall_s"}``. Raises RuntimeError with
    the output tail when a rank fails or prints no step line."""
    port = free_port()
    procs = []
    cpus = sorted(os.sched_getaffinity(0))   # one rank per CPU, as a launcher binds ranks on a real node
    t0 = time.monotonic()
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        cpu = cpus[rank % len(cpus)]
        procs.append(subprocess.Popen([*prefix, sys.executable, *module, "--steps", str(steps)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True, preexec_fn=lambda c=cpu: os.sched_setaffinity(0, {c})))
    outs: list[list[str]] = [[], []]
    errs: list[str] = ["", ""]

    def read(i: int) -> None:
        for line in procs[i].stdout:
            outs[i].append(line)
            if i == 0 and on_warm is not None and line.startswith(f"step {warmup} "):
                on_warm()
        errs[i] = procs[i].stderr.read()

    readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in (0, 1)]
    for r in readers:
        r.start()
    try:
        for p, r in zip(procs, readers):
            p.wait(timeout=600)
            r.join(30)
    finally:
        for p in procs:
            stop_group(p, 5)
    wall = time.monotonic() - t0
    times = []
    for p, out, err in zip(procs, outs, errs):
        if p.returncode != 0:
            raise RuntimeError(f"a rank of {' '.join(prefix + module)} exited with {p.returncode}:\n{err[-2000:]}")
        times += [(int(r), int(s), float(ms)) for s, r, ms in STEP_LINE.findall("".join(out)) if int(s) >= warmup]
    if not times:
        raise RuntimeError(f"no step lines after warm-up from {' '.join(prefix + module)}")
    ms = sorted(t[2] for t in times)
    return {"median_ms": statistics.median(ms), "p10_ms": ms[len(ms) // 10], "steps": times, "wall_s": wall}


def _cpu_snapshot(agent_pid: int, broker_pid: int | None) -> tuple[float, float, float]:
    """(monotonic s, agent CPU s, broker CPU s) now."""
    try:
        b = cpu_seconds(broker_pid) if broker_pid else 0.0
    except OSError:
        b = 0.0
    return time.monotonic(), cpu_seconds(agent_pid), b


class AgentRun:
    """``obshub agent --registered`` in its own session for one configuration-C sample: started, waited
    on until it printed its probe table (all probes compiled and attached), stopped after the run."""

    def __init__(self, job: str, probes: str | None = None):
        self.port = free_port()
        self.proc = subprocess.Popen(obshub_cmd("agent", "--job", job, "--registered", "--host", "bench-node",
                                                "--metrics-port", str(self.port),
                                                *(["--probes", probes] if probes else [])),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.table: list[str] = []
        started = False
        for line in self.proc.stdout:
            if line.startswith("probe "):
                started = True
            elif started:
                if not line.strip() or line.startswith("obshub agent:"):
                    break
                self.table.append(line.rstrip())
                if line.startswith("sysfs_pcie") or len(self.table) >= 64:
                    break
        if not started:
            raise RuntimeError("obshub agent exited before printing its probe table (needs root and bcc)")
        time.sleep(0.5)  # the rest of the table and the first loop turn

    def kinds(self) -> dict[str, int]:
        """Events read so far per kind (the agent's ``obshub_agent_events_total{kind}``)."""
        out: dict[str, int] = {}
        try:
            text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text
        except httpx.HTTPError:
            return out
        for fam in text_string_to_metric_families(text):
            if fam.name == "obshub_agent_events":
                for smp in fam.samples:
                    if smp.name.endswith("_total"):
                        out[smp.labels.get("kind", "?")] = int(smp.value)
        return out

    def stop(self) -> str:
        """Stop the agent; returns its last output line (``stopped: N batches, M events, ...``)."""
        self.last_kinds = self.kinds()
        stop_group(self.proc, 30)
        rest = self.proc.stdout.read().strip().splitlines()
        return rest[-1] if rest else ""


def run(quick: bool = False, rounds: int | None = None, breakdown: tuple[str, ...] = ()) -> dict:
    """Run the benchmark, print the table and the verdict, save the JSON. Returns the results dict.
    ``breakdown``: probe selections (``obshub agent --probes`` values, e.g. ``"pytorch"``); each adds a
    configuration E<i> with the agent attaching only those probes, to see which probes cost what."""
    rounds = rounds or (QUICK_ROUNDS if quick else ROUNDS)
    steps, warmup = (QUICK_STEPS, QUICK_WARMUP) if quick else (STEPS, WARMUP)
    common.console.rule("[bold]1. training overhead[/bold]: 2-rank gloo DDP, step time in 4 configurations")
    runs: dict[str, list[dict]] = {}
    infos: dict[str, dict] = {}   # configuration -> what its agent runs reported
    p10: dict[str, common.Series] = {}   # configuration -> per-run 10th percentile of the step times
    with private_stack(common.console.print) as settings:
        broker = stack.broker_pid(settings)

        def sample(name: str, prefix: list[str], module: list[str], with_agent: bool = False,
                   probes: str | None = None):
            def fn() -> float:
                agent = AgentRun("bench-overhead", probes) if with_agent else None
                agent_info = infos.setdefault(name, {"probe_table": [], "stopped": []})
                warm: dict = {}
                cpu_warm: list = []

                def on_warm() -> None:
                    cpu_warm.extend(_cpu_snapshot(agent.proc.pid, broker))
                    warm.update(agent.kinds())

                try:
                    res = run_ranks(prefix, module, steps, warmup, on_warm=on_warm if agent else None)
                finally:
                    if agent is not None:
                        cpu_end = _cpu_snapshot(agent.proc.pid, broker)
                        if cpu_warm:
                            dt = cpu_end[0] - cpu_warm[0]
                            agent_info.setdefault("agent_core_share", []).append((cpu_end[1] - cpu_warm[1]) / dt)
                            agent_info.setdefault("broker_core_share", []).append((cpu_end[2] - cpu_warm[2]) / dt)
                        agent_info["stopped"].append(agent.stop())
                        agent_info["probe_table"] = agent.table
                        agent_info.setdefault("kinds", []).append(agent.last_kinds)
                        agent_info.setdefault("kinds_at_warm", []).append(warm)
                        steady = {k: v - warm.get(k, 0) for k, v in agent.last_kinds.items()}
                        rank_steps = steady.get("STEP_END") or (steps - warmup) * 2   # steps the delta covers
                        agent_info.setdefault("steady_events_per_rank_step", []).append(
                            sum(steady.values()) / rank_steps if warm else None)
                        agent_info.setdefault("steady_kinds", []).append(steady if warm else {})
                runs.setdefault(name, []).append({k: v for k, v in res.items() if k != "steps"})
                p10.setdefault(name, common.Series(name)).samples.append(res["p10_ms"])
                return res["median_ms"]
            return fn

        run_prefix = obshub_cmd("run", "--job", "bench-overhead", "--")
        configs = {
            "A plain": sample("A plain", [], WORKLOAD),
            "B obshub run": sample("B obshub run", run_prefix, WORKLOAD),
            "C obshub run + agent": sample("C obshub run + agent", run_prefix, WORKLOAD, with_agent=True),
            "D torch.profiler (CPU)": sample("D torch.profiler (CPU)", [], PROFILED),
        }
        e_names = [f"E{i + 1} obshub run + agent, --probes {sel}" for i, sel in enumerate(breakdown)]
        for e_name, sel in zip(e_names, breakdown):
            configs[e_name] = sample(e_name, run_prefix, WORKLOAD, with_agent=True, probes=sel)
        no_bpf = bpf_unavailable()
        if no_bpf:
            common.console.print(f"[yellow]configurations with the agent left out: {no_bpf}[/yellow]")
            configs.pop("C obshub run + agent")
            for e_name in e_names:
                configs.pop(e_name, None)
        series = common.interleave(configs, rounds)
    common.console.print(common.table(f"step time, 2 ranks, {steps} steps per run ({warmup} warm-up left out), "
                                      f"{rounds} interleaved rounds", series, "ms", baseline="A plain", fmt="{:.2f}"))
    common.console.print(common.table("the same runs, 10th percentile of each run's step times (the least disturbed "
                                      "steps: less sensitive to other load than the median)", p10, "ms",
                                      baseline="A plain", fmt="{:.2f}"))
    agent_info = infos.get("C obshub run + agent", {"probe_table": [], "stopped": []})
    attached = [ln.split()[0] for ln in agent_info["probe_table"] if " attached" in ln]
    common.console.print(f"agent: {len(attached)} probes attached ({', '.join(attached)}); "
                         f"{'; '.join(s for s in agent_info['stopped'] if s)}")
    if agent_info.get("kinds"):
        k = agent_info["kinds"][-1]
        common.console.print("agent events by kind (last C run, start-up included): "
                             + ", ".join(f"{n} {v:,}" for n, v in sorted(k.items(), key=lambda x: -x[1])))
        st = agent_info["steady_kinds"][-1]
        per = [x for x in agent_info["steady_events_per_rank_step"] if x is not None]
        if per:
            kinds = ", ".join(f"{n} {v:,}" for n, v in sorted(st.items(), key=lambda x: -x[1]) if v)
            common.console.print(f"steady state (after rank 0's step {warmup}; per rank-step = per STEP_END): "
                                 f"{statistics.median(per):,.1f} events per rank per step; {kinds}")
    base = series["A plain"].median
    for cname, info in infos.items():
        shares = info.get("agent_core_share") or []
        if shares:
            common.console.print(f"during the steady-state steps of {cname.split()[0]} the agent used "
                                 f"{statistics.median(shares) * 100:.1f} % of one core and the broker "
                                 f"{statistics.median(info['broker_core_share']) * 100:.1f} % (medians over the runs): "
                                 f"CPU the 2 ranks lose on this 2-core machine")
    c_name = "C obshub run + agent" if "C obshub run + agent" in series else "B obshub run"
    ratio = series[c_name].median / base
    common.verdict(f"{c_name[2:]} within 1 % of plain", ratio <= TARGET_RATIO,
                   f"ratio {ratio:.4f} ({(ratio - 1) * 100:+.2f} %); torch.profiler "
                   f"{(series['D torch.profiler (CPU)'].median / base - 1) * 100:+.2f} %; 2 cores shared by 2 ranks, "
                   f"the agent, the broker and other work: run-to-run spread ±{series['A plain'].mad / base * 100:.1f} %")
    result = {"rounds": rounds, "steps": steps, "warmup": warmup, "rev": common.git_rev(),
              "samples_ms": {k: v.samples for k, v in series.items()},
              "ratios": {k: v.median / base for k, v in series.items()}, "runs": runs,
              "p10_ms": {k: v.samples for k, v in p10.items()},
              "p10_ratios": {k: v.median / p10["A plain"].median for k, v in p10.items()},
              "agent": agent_info, "agent_breakdown": {k: v for k, v in infos.items() if k[0] == "E"},
              "target_ratio": TARGET_RATIO,
              "target_met": ratio <= TARGET_RATIO}
    name = "training_overhead_breakdown" if breakdown else "training_overhead"
    common.console.print(f"raw results: {common.save(name, result)}")
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m bench.training_overhead [--quick] [--rounds N]``."""
    p = argparse.ArgumentParser(prog="python -m bench.training_overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: 1 round of 15 steps")
    p.add_argument("--rounds", type=int, default=None, help=f"interleaved rounds (default {ROUNDS})")
    p.add_argument("--breakdown", action="append", default=[], metavar="PROBES",
                   help="add a configuration: obshub run + agent with only these probes (names or layers, "
                        "comma-separated, as obshub agent --probes); repeatable")
    a = p.parse_args(argv)
    run(a.quick, a.rounds, tuple(a.breakdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
