"""Accuracy and time to detection: every fault kind on every host of a 4-host ``obshub demo`` cluster
(network namespaces, cgroups, a real gloo training per host, a real agent per host, the real stream
worker and rule engine with the builtin rules), in several rounds, plus clean training.

One demo run per host H (set-up, with BPF compilation for 4 agents, takes minutes on a loaded 2-core
machine, so the rounds share a run): ``obshub demo --hosts 4 --sequence net-slow@H,cpu@H,net-loss@H,
mem@H,hang@H`` repeated ``rounds`` times, then ``exit@H`` (last: the rank is gone, so ``exit`` gets one
episode per host). After ``CLEAN_S`` of clean training each fault is injected for ``FAULT_FOR_S``,
removed, and the next one follows ``GAP_S`` later once no alert of the job fires; no two kinds of one
layer follow each other, so a late alert of one counts as wrong in the next. Each episode is
judged by the demo's verdict (docs/DEMO.md): the first alert naming the right host AND layer gives the
time to detection (injection, CLOCK_REALTIME, to the alert record's Kafka timestamp); any other alert in
the episode is wrong; ``hang`` must also resolve once the rank is thawed. The first ``CLEAN_S`` of every
run are the clean runs: every alert there is a false alarm (alerts per hour of clean training).

Targets: every fault named with the right host and layer, no wrong alert, no alert on the clean runs,
median time to detection <= 3 s and worst <= 5 s for every kind. Needs root, like the demo.

    python -m bench ttd                 # 4 runs: 2 rounds of 5 kinds + exit per host, 4 x 150 s clean (~40 min)
    python -m bench ttd --rounds 3      # 3 rounds
    python -m bench ttd --quick         # one run: cpu and hang on node-01 after 30 s clean
    python -m bench.ttd --rounds 1 --fault-hosts 1,3 --clean-s 300   # 2 runs, every kind on node-01
                                        # and node-03, 10 min clean (~22 min)
    python -m bench.ttd --fault-hosts 0 --json h0.json   # the campaign in chunks of one host each ...
    python -m bench.ttd --combine h0.json h1.json h2.json h3.json     # ... printed as one campaign
    python -m bench.ttd --fault-hosts 2 --rounds 1 --keep runs/      # keep logs and step summaries
    python -m bench.ttd --stall                  # sporadic stalls (issue #30): one run per host (node-01,
                                        # node-03): 60 s clean, then 38 s of each layer (net, cpu, process,
                                        # mem), an 800 ms stall every 12 s; every stall must be named,
                                        # median <= 2 s, worst <= 5 s (~15 min)
    python -m bench.ttd --stall cpu,process --fault-hosts 2   # some layers on one host
    python -m bench.ttd --stall mem --fault-hosts 1 --stall-param full=1   # memory stalls that fill the
                                        # rank's cgroup (they stall it; a rank may die of EFAULT: docs/DEMO.md)
    python -m bench.ttd --stall net --fault-hosts 0 --stall-param loss_pct=40 --stall-param stall_ms=2000
                                        # 2 s loss bursts (delay_ms=300: RTT spikes) instead of blackouts
    python -m bench.ttd --stall cpu,process --fault-hosts 1 --ranks-per-host 2 --fault-rank 1
                                        # 2 ranks per host, the stalls on node-01's local rank 1 alone
    python -m bench.ttd --make-demo     # make demo (persistent net-loss) and a clean run, rules as shipped
    python -m bench.ttd --make-demo --workload lightning   # the same under a PyTorch Lightning Trainer
    python -m bench.ttd --stall net --fault-hosts 1 --workload accum   # gradient accumulation (4 micro-batches)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from rich.table import Table

from bench import common
from bench.broker import obshub_cmd, private_stack

ROUNDS = 2
HOSTS = 4
KINDS = ("net-slow", "cpu", "net-loss", "mem", "hang", "exit")  # no two kinds of one layer in a row
QUICK = (("cpu", "hang"), (1,), 30.0)  # --quick: kinds, hosts, clean seconds (one round)
CLEAN_S = 150.0  # clean training before the first fault of every run
FAULT_FOR_S, GAP_S, SETTLE_S = 10.0, 8.0, 6.0
TARGET_MEDIAN_S, TARGET_WORST_S = 3.0, 5.0
RUN_TIMEOUT_S = 900


def wait_for_demo_lock(timeout_s: float = 900.0) -> float:
    """Wait while another ``obshub demo`` holds the machine-wide cluster lock (it refuses to share the
    namespaces); returns the seconds waited. Raises RuntimeError after ``timeout_s``."""
    import fcntl

    from obshub.demo.cluster import STATE_DIR

    lock = STATE_DIR / "lock"
    t0 = time.monotonic()
    said = False

    def busy() -> bool:
        if not lock.exists():
            return False
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        try:  # a --matrix run releases the lock between its scenarios: its pid stays in the file
            pid = int(lock.read_text().strip() or 0)
            return pid > 0 and b"demo" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return False

    while busy():
        if not said:
            common.console.print("[yellow]  another obshub demo is using the cluster; waiting for it[/yellow]")
            said = True
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"another obshub demo held {lock} for {timeout_s:.0f} s")
        time.sleep(2)
    return time.monotonic() - t0


def run_sequence(
    kinds: tuple[str, ...],
    host: int,
    clean_s: float,
    out: Path,
    log: Path,
    fault_for_s: float = FAULT_FOR_S,
    params: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
) -> dict:
    """One ``obshub demo --sequence`` run of ``kinds`` on host index ``host`` after ``clean_s`` of clean
    training, each fault ``fault_for_s`` long, ``params`` (``KEY=VALUE``) given as ``--param``; returns its
    report; ``extra``: more ``obshub demo`` options (``--ranks-per-host 2 --fault-rank 1``). Raises
    RuntimeError when it writes no report."""
    seq = ",".join(f"{k}@{host}" for k in kinds)
    duration = clean_s + len(kinds) * (fault_for_s + GAP_S + 10) + 5
    cmd = obshub_cmd(
        "demo",
        "--hosts",
        str(HOSTS),
        "--sequence",
        seq,
        "--fault-at",
        str(clean_s),
        "--fault-for",
        str(fault_for_s),
        "--gap",
        str(GAP_S),
        "--duration",
        str(duration),
        "--settle",
        str(SETTLE_S),
        "--json",
        str(out),
        "--lock-wait",
        "600",
        *(x for kv in params for x in ("--param", kv)),
        *extra,
    )
    with log.open("w") as f:
        proc = subprocess.run(
            cmd, stdout=f, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S, env={**os.environ, "COLUMNS": "120"}
        )
    if not out.exists():
        raise RuntimeError(
            f"obshub demo --sequence {seq} exited with {proc.returncode} and wrote no report:\n"
            f"{log.read_text(errors='replace')[-3000:]}"
        )
    return json.loads(out.read_text())


def keep_run(report: dict, log: Path, dest: Path, steps: bool = True) -> Path:
    """Copy what explains a run's verdicts into ``dest`` (created; an existing one is replaced): the demo's
    output (``demo.log``), its report (``report.json``), its run folder (every agent's, the stream
    worker's and the rule engine's log, the webhook records) and the job's step summaries as the worker
    sent them (``steps.jsonl``, ``obshub tail steps --json`` from the run's broker, which the temporary
    home removes afterwards; not with ``steps`` False). Returns ``dest``."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    shutil.copy(log, dest / "demo.log")
    (dest / "report.json").write_text(json.dumps(report, indent=2, default=str))
    run_dir = Path(report.get("logs") or "")
    if run_dir.is_dir():
        shutil.copytree(run_dir, dest / "run")
    if not steps:
        return dest
    job = report["scenario"]["job"]
    with (dest / "steps.jsonl").open("w") as f:
        subprocess.run(
            obshub_cmd("tail", "steps", "--from-beginning", "--json", "--job", job, "--timeout-s", "15"),
            stdout=f,
            stderr=subprocess.DEVNULL,
            timeout=120,
            check=False,
        )
    return dest


def clean_alerts(report: dict) -> tuple[float, list[str]]:
    """(seconds of clean training, alerts fired in it) of a run: from its first training step (the demo's
    warm-up end, estimated as the first step line's time) to the first injection."""
    eps = report.get("episodes") or [{"t0_ns": report["verdict"].get("t0_ns")}]
    t0 = eps[0]["t0_ns"]
    fired = [f"{a['rule']}@{a['host']}/{a['layer']}" for a in report["alerts"] if t0 is None or a["received_ns"] < t0]
    return float(report["scenario"]["fault_at_s"]), fired


def per_hour(clean: dict) -> float:
    """Alerts per hour of clean training, from ``{"seconds", "alerts"}``."""
    return len(clean["alerts"]) / clean["seconds"] * 3600 if clean["seconds"] else 0.0


def report(
    episodes: list[dict],
    clean: dict,
    n_runs: int,
    rounds: int,
    hosts: tuple[int, ...] | list[int],
    kinds: tuple[str, ...] | list[str],
    clean_s: float,
) -> tuple[dict, bool]:
    """Print the per-kind table (accuracy, wrong alerts, median and worst time to detection in s), the
    clean-run alert rate and the target verdicts of ``episodes`` (each the demo's verdict plus ``kind``
    and ``host``) and ``clean`` (``{"seconds", "alerts"}`` over ``n_runs`` runs). Returns ``(per_kind,
    every target met)``; ``per_kind[kind]``: ``episodes``, ``named``, ``wrong``, ``ttd_s``, ``median_s``,
    ``worst_s`` (None when an episode was not named), ``passed``, ``reasons``."""
    t = Table(
        title=f"accuracy and time to detection, {rounds} round(s) of each kind (exit: 1) on each of "
        f"{len(hosts)} host(s) ({', '.join(f'node-{h:02d}' for h in hosts)}), {HOSTS}-host cluster, "
        f"{clean_s:.0f} s clean per run",
        caption=common.describe_machine(),
    )
    for col in (
        "fault",
        "episodes",
        "right host+layer",
        "wrong alerts",
        "median TTD (s)",
        "worst TTD (s)",
        "passed",
        "failures",
    ):
        t.add_column(col)
    per_kind = {}
    for kind in kinds:
        rows = [e for e in episodes if e["kind"] == kind]
        ttds = [e["ttd_s"] for e in rows if e.get("ttd_s") is not None]
        med = statistics.median(ttds) if ttds else None
        worst = max(ttds) if len(ttds) == len(rows) and ttds else None
        wrong = sum(e["wrong_count"] for e in rows)
        reasons = sorted({f"{e['host']}: {e['reason'][:80]}" for e in rows if not e["ok"]})
        per_kind[kind] = {
            "episodes": len(rows),
            "named": len(ttds),
            "wrong": wrong,
            "ttd_s": ttds,
            "median_s": med,
            "worst_s": worst,
            "passed": sum(1 for e in rows if e["ok"]),
            "reasons": reasons,
        }
        t.add_row(
            kind,
            str(len(rows)),
            f"{len(ttds)}/{len(rows)}",
            str(wrong),
            f"{med:.2f}" if med is not None else "-",
            f"{worst:.2f}" if worst is not None else ("-" if not ttds else f">{max(ttds):.2f} (missed)"),
            f"{per_kind[kind]['passed']}/{len(rows)}",
            "; ".join(reasons)[:200],
        )
    common.console.print(t)
    common.console.print(
        f"clean training: {clean['seconds'] / 60:.1f} min over {n_runs} runs, "
        f"{len(clean['alerts'])} alert(s) ({per_hour(clean):.1f} per hour)"
        + (": " + ", ".join(clean["alerts"]) if clean["alerts"] else "")
    )
    all_named = all(v["named"] == v["episodes"] for v in per_kind.values())
    no_wrong = all(v["wrong"] == 0 for v in per_kind.values())
    fast = all(v["median_s"] is not None and v["median_s"] <= TARGET_MEDIAN_S for v in per_kind.values())
    worst_ok = all(v["worst_s"] is not None and v["worst_s"] <= TARGET_WORST_S for v in per_kind.values())
    common.verdict(
        "every fault named with the right host and layer",
        all_named,
        ", ".join(f"{k} {v['named']}/{v['episodes']}" for k, v in per_kind.items()),
    )
    common.verdict("no wrong alert", no_wrong, ", ".join(f"{k} {v['wrong']}" for k, v in per_kind.items()))
    common.verdict(
        "no alert on clean training", not clean["alerts"], f"{len(clean['alerts'])} in {clean['seconds'] / 60:.1f} min"
    )
    common.verdict(
        f"median time to detection <= {TARGET_MEDIAN_S:.0f} s for every kind",
        fast,
        ", ".join(f"{k} {v['median_s']:.2f} s" if v["median_s"] is not None else f"{k} -" for k, v in per_kind.items()),
    )
    common.verdict(
        f"worst time to detection <= {TARGET_WORST_S:.0f} s for every kind",
        worst_ok,
        ", ".join(
            f"{k} {v['worst_s']:.2f} s" if v["worst_s"] is not None else f"{k} missed" for k, v in per_kind.items()
        ),
    )
    return per_kind, all_named and no_wrong and fast and worst_ok and not clean["alerts"]


def _outcome(clean_s, episodes: list, runs: list, per_kind: dict, clean: dict, target_met: dict) -> dict:
    """The part of the raw results a run and a combination of runs share (``clean_s``: per run, s)."""
    return {
        "clean_s_per_run": clean_s,
        "episodes": episodes,
        "runs": runs,
        "per_kind": per_kind,
        "clean": {**clean, "per_hour": per_hour(clean)},
        "target_median_s": TARGET_MEDIAN_S,
        "target_worst_s": TARGET_WORST_S,
        "target_met": target_met,
    }


def combine(paths: list[Path]) -> dict:
    """Pool the results of several runs of this benchmark (``--json`` chunks, e.g. one fault host each)
    into one campaign: their episodes, runs and clean training are concatenated, and the table and
    verdicts are printed as for one run. The chunks must have the same rounds and kinds. Returns the
    pooled results (also saved as ``ttd-combined.json``). Raises ValueError for chunks that do not fit
    together, a missing file or one that is not this benchmark's results."""
    chunks = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"--combine {path}: cannot read it as JSON ({exc})") from exc
        if not isinstance(data, dict) or not {"episodes", "runs", "clean", "rounds", "kinds"} <= set(data):
            raise ValueError(f"--combine {path}: not the results of python -m bench.ttd")
        chunks.append(data)
    if not chunks:
        raise ValueError("--combine needs at least one results file")
    rounds, kinds = chunks[0]["rounds"], list(chunks[0]["kinds"])
    for path, data in zip(paths, chunks):
        if data["rounds"] != rounds or list(data["kinds"]) != kinds:
            raise ValueError(
                f"--combine {path}: {data['rounds']} round(s) of {', '.join(data['kinds'])}, the first file "
                f"{rounds} round(s) of {', '.join(kinds)}"
            )
    hosts = sorted({h for data in chunks for h in data.get("fault_hosts", [])})
    clean_s = sorted({float(data.get("clean_s_per_run") or 0) for data in chunks})
    episodes = [e for data in chunks for e in data["episodes"]]
    runs = [r for data in chunks for r in data["runs"]]
    clean = {
        "seconds": sum(float(data["clean"]["seconds"]) for data in chunks),
        "alerts": [a for data in chunks for a in data["clean"]["alerts"]],
    }
    common.console.rule(
        f"[bold]5. accuracy and time to detection[/bold], {len(chunks)} result file(s) combined: "
        + ", ".join(f"{Path(p).name} ({data.get('rev', '?')})" for p, data in zip(paths, chunks))
    )
    for run_ in runs:  # each run's line, as the chunk printed it
        name = f"node-{run_['host']:02d}"
        eps = [e for e in episodes if e["host"] == name]
        common.console.print(
            f"[dim]  {name}: {run_.get('wall_s', '?')} s; "
            + ", ".join(
                f"{e['kind']} {'pass' if e['ok'] else 'FAIL'}"
                + (f" {e['ttd_s']:.2f} s" if e.get("ttd_s") is not None else "")
                for e in eps
            )
            + (f"; clean: {len(run_['clean_alerts'])} alert(s)" if run_["clean_alerts"] else "; clean: no alert")
            + "[/dim]"
        )
    per_run_s = clean["seconds"] / len(runs) if runs else 0.0  # the chunks' own clean_s when they agree
    per_kind, target_met = report(episodes, clean, len(runs), rounds, hosts, kinds, per_run_s)
    result = {
        "combined": [str(p) for p in paths],
        "revs": [data.get("rev") for data in chunks],
        "rounds": rounds,
        "hosts": HOSTS,
        "fault_hosts": hosts,
        "kinds": kinds,
        **_outcome(clean_s, episodes, runs, per_kind, clean, target_met),
    }
    common.console.print(f"raw results: {common.save('ttd-combined', result)}")
    return result


def run(
    quick: bool = False,
    rounds: int | None = None,
    fault_hosts: tuple[int, ...] | None = None,
    clean_s: float | None = None,
    json_path: Path | None = None,
    keep: Path | None = None,
    workload: str = "ddp",
) -> dict:
    """Run the campaign, print per kind accuracy and time to detection and the clean-run alert rate,
    save the JSON. Returns the results dict. ``fault_hosts``: the host indices that get the faults (one
    demo run each; default every host); ``clean_s``: clean training per run (default ``CLEAN_S``);
    ``json_path``: also write the results there (a chunk for ``combine``); ``keep``: a folder that gets
    every run's evidence (``keep_run``). Raises ValueError for a host index outside the cluster."""
    rounds = 1 if quick else (rounds or ROUNDS)
    kinds, hosts, default_clean_s = QUICK if quick else (KINDS, tuple(range(HOSTS)), CLEAN_S)
    hosts = fault_hosts or hosts
    clean_s = clean_s or default_clean_s
    if any(not 0 <= h < HOSTS for h in hosts):
        raise ValueError(f"--fault-hosts {hosts}: host indices are 0..{HOSTS - 1}")
    common.console.rule(
        f"[bold]5. accuracy and time to detection[/bold]: {len(kinds)} fault kinds x "
        f"{len(hosts)} host(s) x {rounds} round(s), {HOSTS}-host demo cluster"
    )
    if os.geteuid() != 0:
        common.console.print("[yellow]skipped: the demo needs root (network namespaces, cgroups, BPF)[/yellow]")
        return {"skipped": "not root"}
    episodes: list[dict] = []
    clean = {"seconds": 0.0, "alerts": []}
    runs: list[dict] = []
    t_start = time.monotonic()
    with (
        private_stack(common.console.print) as _settings,
        tempfile.TemporaryDirectory(prefix="obshub-bench-ttd-") as tmp,
    ):
        seq = tuple(k for k in kinds if k != "exit") * rounds + (("exit",) if "exit" in kinds else ())
        for r in (0,):  # one run per host holds every round (set-up costs minutes)
            for h in hosts:
                wait_for_demo_lock()
                t0 = time.monotonic()
                rep = run_sequence(
                    seq, h, clean_s, Path(tmp) / f"h{h}.json", Path(tmp) / f"h{h}.log", extra=workload_args(workload)
                )
                if keep is not None:
                    kept = keep_run(rep, Path(tmp) / f"h{h}.log", keep / f"node-{h:02d}")
                    common.console.print(f"[dim]  node-{h:02d}: evidence kept in {kept}[/dim]")
                secs, fired = clean_alerts(rep)
                clean["seconds"] += secs
                clean["alerts"] += fired
                eps = rep.get("episodes") or []
                for ep in eps:
                    episodes.append({"round": r, "kind": ep["kind"], "host": ep["host"], **ep["verdict"]})
                runs.append(
                    {
                        "round": r,
                        "host": h,
                        "job": rep["scenario"]["job"],
                        "clean_alerts": fired,
                        "wall_s": round(time.monotonic() - t0),
                    }
                )
                common.console.print(
                    f"[dim]  node-{h:02d}: {time.monotonic() - t0:.0f} s; "
                    + ", ".join(
                        f"{ep['kind']} {'pass' if ep['verdict']['ok'] else 'FAIL'}"
                        + (f" {ep['verdict']['ttd_s']:.2f} s" if ep["verdict"].get("ttd_s") is not None else "")
                        for ep in eps
                    )
                    + (f"; clean: {len(fired)} alert(s)" if fired else "; clean: no alert")
                    + "[/dim]"
                )
    per_kind, target_met = report(episodes, clean, len(runs), rounds, hosts, kinds, clean_s)
    result = {
        "rounds": rounds,
        "hosts": HOSTS,
        "fault_hosts": list(hosts),
        "kinds": list(kinds),
        "fault_for_s": FAULT_FOR_S,
        "gap_s": GAP_S,
        **_outcome(clean_s, episodes, runs, per_kind, clean, target_met),
        "wall_s": round(time.monotonic() - t_start),
        "rev": common.git_rev(),
    }
    common.console.print(f"raw results: {common.save('ttd', result)}")
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2, default=str))
        common.console.print(f"chunk results: {json_path}")
    return result


STALL_LAYERS = ("net", "cpu", "process", "mem")  # obshub demo --fault stall --param layer=...
STALL_MS, STALL_PERIOD_S, STALL_FOR_S = 800, 12.0, 38.0  # 4 stalls per layer: at 0, 12, 24, 36 s
STALL_CLEAN_S = 60.0
TARGET_STALL_MEDIAN_S = 2.0


def stall_table(episodes: list[dict], clean: dict, hosts, layers, stall_ms: int, period_s: float) -> tuple[dict, bool]:
    """Print the per-layer table of the sporadic-stall campaign (stalls, named with the right host and
    layer, wrong alerts, median and worst time to detection from each stall's start, in s) and the target
    verdicts; ``episodes``: the demo's per-episode verdicts (``judge_stalls``) plus ``kind`` and ``host``.
    Returns ``(per_layer, every target met)``."""
    t = Table(
        title=f"sporadic stalls: one {stall_ms:g} ms stall every {period_s:g} s, on "
        f"{', '.join(f'node-{h:02d}' for h in hosts)} of a {HOSTS}-host cluster",
        caption=common.describe_machine(),
    )
    for col in (
        "layer",
        "episodes",
        "stalls",
        "named (host+layer)",
        "wrong alerts",
        "median TTD (s)",
        "worst TTD (s)",
        "first rule",
    ):
        t.add_column(col)
    per = {}
    for layer in layers:
        rows = [e for e in episodes if e["kind"] == f"stall:{layer}"]
        stalls = [st for e in rows for st in e.get("stalls", [])]
        ttds = sorted(st["ttd_s"] for st in stalls if st["ttd_s"] is not None)
        rules = sorted({st["rule"] for st in stalls if st["rule"]})
        per[layer] = {
            "episodes": len(rows),
            "stalls": len(stalls),
            "named": len(ttds),
            "wrong": sum(e["wrong_count"] for e in rows),
            "median_s": statistics.median(ttds) if ttds else None,
            "worst_s": ttds[-1] if ttds and len(ttds) == len(stalls) else None,
            "rules": rules,
            "reasons": sorted({f"{e['host']}: {e['reason'][:100]}" for e in rows if not e["ok"]}),
        }
        v = per[layer]
        t.add_row(
            layer,
            str(len(rows)),
            str(len(stalls)),
            f"{len(ttds)}/{len(stalls)}",
            str(v["wrong"]),
            f"{v['median_s']:.2f}" if v["median_s"] is not None else "-",
            f"{v['worst_s']:.2f}" if v["worst_s"] is not None else ("-" if not ttds else f">{ttds[-1]:.2f} (missed)"),
            ", ".join(rules),
        )
    common.console.print(t)
    for layer, v in per.items():
        for r in v["reasons"]:
            common.console.print(f"  stall:{layer} {r}")
    common.console.print(
        f"clean training: {clean['seconds'] / 60:.1f} min, {len(clean['alerts'])} alert(s)"
        + (": " + ", ".join(clean["alerts"]) if clean["alerts"] else "")
    )
    named = all(v["stalls"] and v["named"] == v["stalls"] for v in per.values())
    no_wrong = all(v["wrong"] == 0 for v in per.values())
    fast = all(v["median_s"] is not None and v["median_s"] <= TARGET_STALL_MEDIAN_S for v in per.values())
    worst = all(v["worst_s"] is not None and v["worst_s"] <= TARGET_WORST_S for v in per.values())
    common.verdict(
        "every stall named with the right host and layer",
        named,
        ", ".join(f"{k} {v['named']}/{v['stalls']}" for k, v in per.items()),
    )
    common.verdict("no wrong alert", no_wrong, ", ".join(f"{k} {v['wrong']}" for k, v in per.items()))
    common.verdict("no alert on clean training", not clean["alerts"], f"{len(clean['alerts'])}")
    common.verdict(
        f"median time to detection <= {TARGET_STALL_MEDIAN_S:.0f} s for every layer",
        fast,
        ", ".join(f"{k} {v['median_s']:.2f} s" if v["median_s"] is not None else f"{k} -" for k, v in per.items()),
    )
    common.verdict(
        f"worst time to detection <= {TARGET_WORST_S:.0f} s for every layer",
        worst,
        ", ".join(f"{k} {v['worst_s']:.2f} s" if v["worst_s"] is not None else f"{k} missed" for k, v in per.items()),
    )
    return per, named and no_wrong and fast and worst and not clean["alerts"]


def stall_episodes(report: dict) -> list[dict]:
    """The episodes of a demo report: its ``episodes``, or for a sequence of one fault (which the demo
    reports as a single run, with a top-level ``verdict``) that run as the one episode ``{kind, host,
    evidence, verdict}``; [] without either."""
    if report.get("episodes"):
        return report["episodes"]
    seq = (report.get("scenario") or {}).get("sequence") or []
    verdict = report.get("verdict")
    if len(seq) != 1 or not isinstance(verdict, dict):
        return []
    return [{"kind": seq[0][0], "host": verdict.get("host"), "evidence": report.get("evidence"), "verdict": verdict}]


def _fmt(v) -> str:
    """A ``--param`` value as the demo's command line takes it: a number in its shortest form, a word as is."""
    return f"{v:g}" if isinstance(v, (int, float)) else str(v)


def run_stall(
    fault_hosts: tuple[int, ...] = (1, 3),
    layers: tuple[str, ...] = STALL_LAYERS,
    clean_s: float = STALL_CLEAN_S,
    json_path: Path | None = None,
    keep: Path | None = None,
    params: dict | None = None,
    ranks_per_host: int = 1,
    fault_rank: int | None = None,
    workload: str = "ddp",
) -> dict:
    """The sporadic-stall campaign: per fault host one ``obshub demo --sequence stall:net@H,stall:cpu@H,
    ...`` run (``STALL_FOR_S`` per layer, one ``STALL_MS`` stall every ``STALL_PERIOD_S``) after
    ``clean_s`` of clean training; every stall must be named (right host and layer) from its own start,
    median <= 2 s, worst <= 5 s, nothing wrong, nothing on the clean training. ``params``: the stall
    fault's ``--param`` values over those defaults (``stall_ms``, ``period_s``; ``loss_pct`` or
    ``delay_ms`` for a net loss burst or RTT spike instead of a blackout); ``ranks_per_host`` /
    ``fault_rank``: the demo's ``--ranks-per-host`` and ``--fault-rank`` (the stall hits that local rank
    of the host alone); ``workload``: the demo's ``--workload``. Returns the results."""
    params = {"stall_ms": STALL_MS, "period_s": STALL_PERIOD_S, **(params or {})}
    stall_ms, period_s = params["stall_ms"], float(params["period_s"])
    common.console.rule(
        f"[bold]5b. sporadic stalls[/bold]: {len(layers)} layers x {len(fault_hosts)} host(s), "
        f"{stall_ms:g} ms every {period_s:g} s"
        + "".join(f", {k}={_fmt(v)}" for k, v in params.items() if k not in ("stall_ms", "period_s"))
    )
    if os.geteuid() != 0:
        common.console.print("[yellow]skipped: the demo needs root (network namespaces, cgroups, BPF)[/yellow]")
        return {"skipped": "not root"}
    if any(not 0 <= h < HOSTS for h in fault_hosts):
        raise ValueError(f"--fault-hosts {fault_hosts}: host indices are 0..{HOSTS - 1}")
    episodes: list[dict] = []
    clean = {"seconds": 0.0, "alerts": []}
    t_start = time.monotonic()
    with (
        private_stack(common.console.print) as _settings,
        tempfile.TemporaryDirectory(prefix="obshub-bench-ttd-stall-") as tmp,
    ):
        for h in fault_hosts:
            wait_for_demo_lock()
            t0 = time.monotonic()
            log = Path(tmp) / f"h{h}.log"
            rep = run_sequence(
                tuple(f"stall:{layer}" for layer in layers),
                h,
                clean_s,
                Path(tmp) / f"h{h}.json",
                log,
                fault_for_s=STALL_FOR_S,
                params=tuple(f"{k}={_fmt(v)}" for k, v in params.items()),
                extra=("--ranks-per-host", str(ranks_per_host))
                + (("--fault-rank", str(fault_rank)) if fault_rank is not None else ())
                + workload_args(workload),
            )
            if keep is not None:
                common.console.print(
                    f"[dim]  node-{h:02d}: evidence kept in {keep_run(rep, log, keep / f'stall-node-{h:02d}')}[/dim]"
                )
            secs, fired = clean_alerts(rep)
            clean["seconds"] += secs
            clean["alerts"] += fired
            for ep in stall_episodes(rep):
                episodes.append(
                    {"kind": ep["kind"], "host": ep["host"], "evidence": ep.get("evidence"), **ep["verdict"]}
                )
            common.console.print(
                f"[dim]  node-{h:02d}: {time.monotonic() - t0:.0f} s; "
                + ", ".join(
                    f"{ep['kind']} {ep['verdict'].get('named', 0)}/{len(ep['verdict'].get('stalls', []))}"
                    for ep in stall_episodes(rep)
                )
                + "[/dim]"
            )
    per, met = stall_table(episodes, clean, fault_hosts, layers, stall_ms, period_s)
    result = {
        "stall": True,
        "fault_hosts": list(fault_hosts),
        "layers": list(layers),
        "stall_ms": stall_ms,
        "period_s": period_s,
        "params": params,
        "ranks_per_host": ranks_per_host,
        "fault_rank": fault_rank,
        "workload": workload,
        "per_layer_s": STALL_FOR_S,
        "episodes": episodes,
        "per_layer": per,
        "clean": clean,
        "target_met": met,
        "wall_s": round(time.monotonic() - t_start),
        "rev": common.git_rev(),
    }
    common.console.print(f"raw results: {common.save('ttd-stall', result)}")
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2, default=str))
    return result


def run_make_demo(keep: Path | None = None, fault_host: int = 1, workload: str = "ddp") -> dict:
    """``make demo`` (``obshub demo --hosts 4 --fault net-loss --fault-host 1``, a persistent fault) and the
    same run clean (``--fault none``), with the builtin pack as it ships (the stall rules on): prints each
    run's verdict and every alert; both must pass (the right host and layer, nothing wrong; nothing on the
    clean run). ``workload``: the demo's ``--workload``. ``keep``: copy each run's evidence to ``DIR/make-demo-{net-loss,none}``. Returns
    ``{fault: {"ok", "ttd_s", "alerts"}}``."""
    common.console.rule("[bold]make demo[/bold] (persistent net-loss) and a clean run, the builtin pack as shipped")
    if os.geteuid() != 0:
        common.console.print("[yellow]skipped: the demo needs root (network namespaces, cgroups, BPF)[/yellow]")
        return {"skipped": "not root"}
    out: dict = {}
    with private_stack(common.console.print), tempfile.TemporaryDirectory(prefix="obshub-bench-demo-") as tmp:
        for fault in ("net-loss", "none"):
            wait_for_demo_lock()
            rep_path, log = Path(tmp) / f"{fault}.json", Path(tmp) / f"{fault}.log"
            # a clean run names no fault host (the demo refuses --fault-host with --fault none)
            where = ("--fault-host", str(fault_host)) if fault != "none" else ()
            cmd = obshub_cmd(
                "demo", "--hosts", str(HOSTS), "--fault", fault, *where,
                "--json", str(rep_path), "--lock-wait", "600", *workload_args(workload),
            )  # fmt: skip
            with log.open("w") as f:
                subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S)
            if not rep_path.exists():
                raise RuntimeError(f"obshub demo --fault {fault} wrote no report:\n{log.read_text()[-3000:]}")
            rep = json.loads(rep_path.read_text())
            if keep is not None:
                keep_run(rep, log, keep / f"make-demo-{fault}")
            v = rep["verdict"]
            alerts = [f"{a['rule']}@{a['host'] or '-'}/{a['layer'] or '-'}" for a in rep["alerts"]]
            out[fault] = {"ok": bool(v.get("ok")), "ttd_s": v.get("ttd_s"), "alerts": alerts}
            common.console.print(
                f"  --fault {fault}: {'pass' if v.get('ok') else 'FAIL'}, ttd {v.get('ttd_s')} s; "
                f"alerts: {', '.join(alerts) or 'none'}"
            )
    return out


def workload_args(workload: str) -> tuple[str, ...]:
    """``obshub demo``'s options for ``workload`` (none for the default, ``ddp``)."""
    return () if workload == "ddp" else ("--workload", workload)


def check_stall_options(fault_hosts: tuple[int, ...], layers: tuple[str, ...], params: dict, a) -> None:
    """Check a ``--stall`` campaign's options as ``obshub demo`` would (``DemoOptions.check``: the stall
    params each layer reads, ``--fault-rank`` only with cpu / process stalls, the fault hosts) before the
    broker starts and a demo is waited for; ``params``: the stall ``--param`` values (``stall_ms``,
    ``period_s``, ...), ``a``: the parsed ``ranks_per_host`` and ``fault_rank``. Raises ValueError with the
    demo's message and hint (it was a traceback after minutes: the demo refused the run and wrote no report);
    a fault host outside the cluster and a ``--fault-rank`` with a net or mem stall in this bench's options
    (the demo's name ``--sequence`` and ``--fault stall --param layer=``, which this bench has not)."""
    from obshub.demo.errors import DemoError
    from obshub.demo.runner import DemoOptions

    outside = [h for h in fault_hosts if not 0 <= h < HOSTS]
    if outside:  # obshub demo names the --sequence it was given, which the user of this bench never wrote
        raise ValueError(
            f"obshub demo would refuse this campaign: --fault-hosts {','.join(map(str, fault_hosts))}: "
            f"host indices are 0..{HOSTS - 1}"
        )
    if a.fault_rank is not None and set(layers) - {"cpu", "process"}:  # the demo's hint names its own options
        raise ValueError(
            f"obshub demo would refuse this campaign: --fault-rank with --stall {','.join(layers)}: only a cpu or "
            "process stall hits one rank alone; "
            "use --stall cpu,process (or a part of it), or drop --fault-rank"
        )
    for h in fault_hosts:
        opts = DemoOptions(
            hosts=HOSTS,
            sequence=[(f"stall:{layer}", h) for layer in layers],
            fault_params=dict(params),
            ranks_per_host=a.ranks_per_host,
            fault_rank=a.fault_rank,
            workload=getattr(a, "workload", "ddp"),
            duration_s=STALL_CLEAN_S + len(layers) * (STALL_FOR_S + GAP_S + 10) + 5,
            fault_at_s=STALL_CLEAN_S,
        )
        try:
            opts.check()
        except DemoError as exc:
            msg = f"{exc}" + (f" ({exc.hint})" if exc.hint else "")
            raise ValueError(
                f"obshub demo would refuse this campaign: {msg.replace('--param ', '--stall-param ')}"
            ) from exc


def positive_seconds(text: str) -> float:
    """argparse type of ``--clean-s``: a finite number of seconds above 0 (0 was read as the default, a
    negative or nan one reached the demo). Raises argparse.ArgumentTypeError."""
    try:
        s = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(s) or s <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: seconds above 0")
    return s


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked before any run (exit 2 naming the option, argparse): options of one
    campaign only (``--stall-param``, ``--ranks-per-host``, ``--fault-rank`` with ``--stall``; ``--stall``,
    ``--quick``, ``--combine``, ``--make-demo`` one at a time), ``--keep`` created, and for ``--stall`` its
    layers, fault hosts and params parsed (``layers``, ``fault_host_list``, ``params``) and checked as
    ``obshub demo`` would (``check_stall_options``)."""
    p = argparse.ArgumentParser(
        prog="python -m bench.ttd", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="one run: cpu and hang on node-01 after 30 s clean")
    p.add_argument(
        "--rounds", type=common.positive_int, default=None, help=f"rounds over every host (default {ROUNDS})"
    )
    p.add_argument(
        "--fault-hosts",
        default=None,
        metavar="I,J",
        help=f"only these host indices get faults, one run each (default all {HOSTS})",
    )
    p.add_argument(
        "--clean-s", type=positive_seconds, default=None, help=f"clean training per run (default {CLEAN_S:.0f} s)"
    )
    p.add_argument(
        "--json", dest="json_path", type=Path, default=None, metavar="PATH", help="also write the results here"
    )
    p.add_argument(
        "--keep",
        type=Path,
        default=None,
        metavar="DIR",
        help="copy each run's demo output, logs, report and step summaries to DIR/node-HH (to explain a verdict)",
    )
    p.add_argument(
        "--combine",
        nargs="+",
        type=Path,
        default=None,
        metavar="PATH",
        help="run nothing: print the table and verdicts of several --json results as one campaign",
    )
    p.add_argument(
        "--stall",
        nargs="?",
        const=",".join(STALL_LAYERS),
        default=None,
        metavar="LAYERS",
        help="run the sporadic-stall campaign instead (layers net,cpu,process,mem; --fault-hosts default 1,3, "
        f"--clean-s default {STALL_CLEAN_S:.0f})",
    )
    p.add_argument(
        "--stall-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"with --stall: a stall fault --param (stall_ms, default {STALL_MS}; period_s, default "
        f"{STALL_PERIOD_S:g}; loss_pct: net loss bursts; delay_ms (netem) or rate_kbit (tbf): net RTT spikes; procs; room_mb; cpu shape=burst|outside|quota, quota_us)",
    )
    p.add_argument(
        "--ranks-per-host", type=int, default=1, help="with --stall: training ranks per host (obshub demo's)"
    )
    p.add_argument(
        "--fault-rank",
        type=int,
        default=None,
        help="with --stall: the local rank of the fault host the stall hits alone (obshub demo's --fault-rank)",
    )
    p.add_argument(
        "--workload",
        choices=("ddp", "lightning", "accum"),
        default="ddp",
        help="the training every rank runs (obshub demo's --workload): ddp, lightning (PyTorch Lightning) or accum "
        "(gradient accumulation); every campaign",
    )
    p.add_argument(
        "--make-demo",
        action="store_true",
        help="run `make demo` (persistent net-loss on node-01) and the same clean, the builtin pack as shipped",
    )
    a = p.parse_args(argv)
    if a.stall is not None and not a.stall.strip():  # `--stall "$LAYERS"` with none: it ran the fault campaign
        p.error(
            f"--stall {a.stall!r}: no layer named; name some (e.g. --stall cpu,process) or give --stall alone (all)"
        )
    modes = [f"--{m.replace('_', '-')}" for m in ("stall", "quick", "combine", "make_demo") if getattr(a, m)]
    if len(modes) > 1:
        p.error(f"{' and '.join(modes)}: one campaign at a time")
    if not a.stall:
        alone = [
            o
            for o, on in (
                ("--stall-param", a.stall_param),
                ("--fault-rank", a.fault_rank is not None),
                ("--ranks-per-host", a.ranks_per_host != 1),
            )
            if on
        ]
        if alone:
            p.error(f"{', '.join(alone)}: only with --stall (the fault campaign would ignore it)")
    if a.keep is not None:
        try:  # before minutes of runs, not after the first one (every campaign: stall, make demo too)
            a.keep.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            p.error(f"--keep {a.keep}: cannot create the folder ({exc.strerror})")
    hosts_err = f"--fault-hosts {a.fault_hosts!r}: comma-separated host indices, e.g. 1,3"
    try:
        a.fault_host_list = tuple(int(x) for x in a.fault_hosts.split(",")) if a.fault_hosts else None
    except ValueError:
        p.error(hosts_err)
    if a.stall:
        a.layers = tuple(x for x in a.stall.split(",") if x)
        if not a.layers or any(x not in STALL_LAYERS for x in a.layers):
            p.error(f"--stall {a.stall}: layers are {', '.join(STALL_LAYERS)}")
        a.params = {}
        for kv in a.stall_param:
            k, eq, v = kv.partition("=")
            if k == "shape" and eq:  # a cpu stall's shape (burst, outside, quota): a word
                a.params[k] = v
                continue
            if k == "layer":  # obshub demo's stall --param layer: here the campaign's layers are --stall's
                p.error(f"--stall-param {kv!r}: the layers are --stall's here (e.g. --stall {v or 'cpu'}), not a param")
            try:
                value = float(v) if eq else 0.0
            except ValueError:
                value = 0.0
            if value <= 0:
                p.error(f"--stall-param {kv!r}: KEY=VALUE with a positive number (shape=WORD)")
            a.params[k] = value
        if a.ranks_per_host < 1:
            p.error(f"--ranks-per-host {a.ranks_per_host}: at least 1 rank per host")
        if a.fault_rank is not None and not 0 <= a.fault_rank < a.ranks_per_host:
            p.error(
                f"--fault-rank {a.fault_rank} is outside 0..{a.ranks_per_host - 1}: the local rank of the fault host"
                + ("; give --ranks-per-host 2..8 for a rank-level fault" if a.ranks_per_host == 1 else "")
            )
        a.fault_host_list = a.fault_host_list or (1, 3)
        try:
            params = {"stall_ms": STALL_MS, "period_s": STALL_PERIOD_S, **a.params}
            check_stall_options(a.fault_host_list, a.layers, params, a)
        except ValueError as exc:
            p.error(str(exc))
    a.error = p.error
    return a


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m bench.ttd [--rounds N] [--fault-hosts I,J] [--clean-s S] [--quick]``
    (``parse_args``); runs the campaign it names. Returns 0 when every target was met (or ``--quick``, a
    smoke run), 1 when one was missed (``common.exit_code``); exits 2 on bad input (argparse). ``--make-demo``
    returns 0: its pass or FAIL lines are the demo's verdicts, not targets."""
    a = parse_args(argv)
    if a.make_demo:
        run_make_demo(a.keep, workload=a.workload)
        return 0
    try:
        if a.stall:
            run_stall(
                a.fault_host_list,
                a.layers,
                a.clean_s or STALL_CLEAN_S,
                a.json_path,
                a.keep,
                a.params,
                a.ranks_per_host,
                a.fault_rank,
                a.workload,
            )
        elif a.combine:
            combine(a.combine)
        else:
            run(a.quick, a.rounds, a.fault_host_list, a.clean_s, a.json_path, a.keep, a.workload)
    except ValueError as exc:
        a.error(str(exc))
    return common.exit_code(a.quick)


if __name__ == "__main__":
    raise SystemExit(main())
