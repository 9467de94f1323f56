"""Agent throughput: the largest event rate the agent carries from the BPF ring buffer to Kafka on one
core without loss, its CPU seconds per million events, and the loss at twice that rate.

Source: real BPF records. bench/firehose.c, pinned to the second CPU at niceness -10 (so that other work
on that CPU does not bound what it offers; the agent keeps the default priority), offers events at a controlled rate
in two ways: (1) one hit of the USDT probe ``obshub:step_begin`` per event (the probe ``obshub.instrument._usdt``
has, and the agent's own handler): the real per-event path, but each uprobe trap costs several µs on this
virtual machine, so one firehose core cannot offer more than ~250,000 events/s; (2) bursts: one call of
``fire_burst(first, n)`` per 64 events, where a uprobe handler the bench adds to the agent's BPF program
(bench/firehose_burst.c) emits n ``STEP_BEGIN`` records exactly as the USDT handler does (same ring
buffer, reservation, loss counter and wakeup policy). The agent (bench/agent_host.py:
``producer.agent.Agent`` with ``BpfEventSource``, only the ``pytorch_step`` probe, watching the firehose's
pid) is pinned to the first CPU and publishes to a private broker. The
BPF handlers run in the firehose's context, so the agent's CPU is only the user-space path: ring-buffer
drain and msgpack encoding (C, obshub/producer/_ring.c) -> batch -> librdkafka.

Two agents run side by side, one per ring-buffer size in ``RINGS`` (the default 64 MiB and 16 MiB), each
with its own firehose; every burst level is offered to one after the other (interleaved), so both see the
same machine. Ring size is what decides loss here: the agent needs a fraction of its core, but on a shared
machine its thread waits on the run queue for tens of milliseconds at a time, and the ring must hold what
arrives meanwhile (16 MiB: ~95 ms at 1,000,000 events/s; 64 MiB: ~380 ms).

Burst rates rise through ``LEVELS`` for ``LEVEL_S`` seconds each. A level is *lossless* when the kernel's
ring-buffer loss counter did not move and the agent read every event the firehose fired. Then the
largest lossless level is repeated ``rounds`` times; if any repeat loses events, the next lower lossless
level is tried. The accepted level's repeats give the result (median, spread), and 2x it is offered once.
Counters come from the agent's Prometheus endpoint; CPU from /proc/<pid>/stat. Targets: >= 1,000,000
events/s lossless on one core and <= 1 CPU second per million events.

    python -m bench.agent_throughput               # LEVELS, 3 confirmation rounds
    python -m bench.agent_throughput --quick       # two low levels, 1 round
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from rich.table import Table

from bench import common
from bench.broker import bpf_unavailable, cpu_seconds, free_port, private_stack, stop_group

HERE = Path(__file__).resolve().parent
LEVELS = (100_000, 250_000, 500_000, 750_000, 1_000_000, 1_250_000, 1_500_000, 2_000_000, 3_000_000)
QUICK_LEVELS = (20_000, 200_000)
USDT_LEVELS = (50_000, 100_000, 200_000, 300_000)  # one USDT hit per event (bounded by the trap cost)
BURST = 64
LEVEL_S = 3.0
QUICK_LEVEL_S = 1.0
ROUNDS = 3
TARGET = 1_000_000  # events/s lossless on one agent core
TARGET_CPU_PER_M = 1.0  # agent CPU seconds per million events
# the firehose runs at a raised priority so that other work on its CPU does not bound what it offers (the
# agent keeps the default priority, as it runs in production)
FIREHOSE_NICE = -10
# ring-buffer sizes run side by side (4 KiB pages): the agent's default and the earlier 16 MiB
RINGS = {"16 MiB ring": 4096, "64 MiB ring (default)": 16384}
DEFAULT_RING = "64 MiB ring (default)"


def build_firehose(out_dir: Path) -> Path:
    """Compile bench/firehose.c into ``out_dir/firehose``. Raises RuntimeError with gcc's message."""
    out = out_dir / "firehose"
    r = subprocess.run(["gcc", "-O2", "-o", str(out), str(HERE / "firehose.c")], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(
            f"Failed to build bench/firehose.c (needs gcc and sys/sdt.h from systemtap-sdt-dev):\n{r.stderr[-1500:]}"
        )
    return out


def _pin(cpu: int | None, nice: int = 0):
    """preexec_fn: pin to ``cpu`` (None: anywhere) and add ``nice`` to the niceness (ignored without the
    privilege)."""

    def run() -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        if nice:
            try:
                os.nice(nice)
            except OSError:
                pass

    return run


class Counters:
    """Reads the agent's counters: events read (kind STEP_BEGIN), in-kernel ring-buffer loss, batches sealed
    and delivered, and the process's CPU seconds."""

    def __init__(self, port: int, pid: int):
        self.url, self.pid = f"http://127.0.0.1:{port}/metrics", pid

    def read(self) -> dict:
        text = httpx.get(self.url, timeout=5).text
        out = {"events": 0.0, "lost": 0.0, "batches": 0.0, "delivered": 0.0, "waits": 0.0, "spooled": 0.0}
        names = {
            "obshub_agent_events": "events",
            "obshub_agent_lost_events": "lost",
            "obshub_agent_batches": "batches",
            "obshub_agent_batches_delivered": "delivered",
            "obshub_agent_backpressure_waits": "waits",
            "obshub_agent_spooled_batches": "spooled",
        }
        for fam in text_string_to_metric_families(text):
            key = names.get(fam.name)
            if key:  # events: only the firehose's kind (AGENT_LOSS reports are events too)
                out[key] += sum(
                    s.value
                    for s in fam.samples
                    if s.name.endswith("_total") and (key != "events" or s.labels.get("kind") == "STEP_BEGIN")
                )
        out["cpu_s"] = cpu_seconds(self.pid)
        return out

    def settled(self, timeout_s: float = 8.0) -> dict:
        """Counters once the events counter stopped moving for 0.6 s (the ring buffer is drained)."""
        last, since, deadline = self.read(), time.monotonic(), time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            time.sleep(0.2)
            cur = self.read()
            if cur["events"] != last["events"]:
                last, since = cur, time.monotonic()
            elif time.monotonic() - since >= 0.6:
                return cur
        return last


class Rig:
    """The firehose and the agent, both running; :meth:`level` offers one rate. ``ringbuf_pages``: the
    agent's ring-buffer size in 4 KiB pages (its spool and host name follow it, so two rigs can run at once).
    Raises RuntimeError when the firehose does not build or the agent does not start."""

    def __init__(self, tmp: Path, burst: bool = True, ringbuf_pages: int = 16384):
        cpus = sorted(os.sched_getaffinity(0))
        agent_cpu, gen_cpu = (cpus[0], cpus[1]) if len(cpus) > 1 else (None, None)
        self.cpus = {"agent": agent_cpu, "firehose": gen_cpu}
        exe = build_firehose(tmp)
        self.gen = subprocess.Popen(
            [str(exe)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=_pin(gen_cpu, FIREHOSE_NICE),
            start_new_session=True,
        )
        port = free_port()
        cmd = (
            [
                sys.executable,
                "-m",
                "bench.agent_host",
                "--usdt",
                str(exe),
                "--pid",
                str(self.gen.pid),
                "--metrics-port",
                str(port),
            ]
            + (["--cpu", str(agent_cpu)] if agent_cpu is not None else [])
            + (["--burst"] if burst else [])
            + ["--ringbuf-pages", str(ringbuf_pages), "--host", f"bench-firehose-{ringbuf_pages}"]
        )
        self.log = tmp / "agent.log"
        self._logf = open(self.log, "w")
        self.agent = subprocess.Popen(
            cmd, stdout=self._logf, stderr=subprocess.STDOUT, start_new_session=True, cwd=HERE.parent
        )
        self.counters = Counters(port, self.agent.pid)
        try:
            self._wait_started()
        except BaseException:
            stop_group(self.gen, 5)
            stop_group(self.agent, 30)
            self._logf.close()
            raise

    def _wait_started(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.agent.poll() is not None:
                raise RuntimeError(f"the agent exited with {self.agent.returncode}:\n{self.log.read_text()[-2000:]}")
            if "metrics on" in self.log.read_text():
                break
            time.sleep(0.3)
        else:
            raise RuntimeError(f"the agent did not start in 120 s:\n{self.log.read_text()[-2000:]}")
        if not any(ln.startswith("pytorch_step") and " attached" in ln for ln in self.log.read_text().splitlines()):
            raise RuntimeError(f"the pytorch_step probe did not attach:\n{self.log.read_text()[-2000:]}")

    def level(self, rate: float, seconds: float, burst: int = BURST) -> dict:
        """Offer ``rate`` events/s for ``seconds`` (``burst`` events per uprobe hit, 0: one USDT hit per
        event); returns offered/carried rates, lost, the agent's and the firehose's CPU."""
        before = self.counters.settled()
        self.gen.stdin.write(f"{rate} {seconds} {burst}\n")
        self.gen.stdin.flush()
        reply = self.gen.stdout.readline().split()  # fired N in S s cpu C
        fired, elapsed, gen_cpu = int(reply[1]), float(reply[3]), float(reply[6])
        after = self.counters.settled()
        ev, lost = after["events"] - before["events"], after["lost"] - before["lost"]
        cpu = after["cpu_s"] - before["cpu_s"]
        return {
            "requested": rate,
            "burst": burst,
            "fired": fired,
            "seconds": elapsed,
            "offered": fired / elapsed,
            "firehose_cpu_util": gen_cpu / elapsed,
            "kafka_waits": int(after["waits"] - before["waits"]),
            "spooled": int(after["spooled"] - before["spooled"]),
            "read": int(ev),
            "lost": int(lost),
            "carried": ev / elapsed,
            "cpu_s": cpu,
            "cpu_util": cpu / elapsed,
            "cpu_s_per_M": cpu / ev * 1e6 if ev else float("nan"),
            "lossless": lost == 0 and ev >= fired,
        }

    def close(self) -> dict:
        """Stop both; returns the agent's final delivery state and exit code."""
        final = self.counters.settled()
        try:
            self.gen.stdin.write("quit\n")
            self.gen.stdin.flush()
        except OSError:
            pass
        stop_group(self.gen, 5)
        rc = stop_group(self.agent, 60)
        self._logf.close()
        return {
            "batches": final["batches"],
            "delivered": final["delivered"],
            "exit_code": rc,
            "tail": self.log.read_text()[-400:],
        }


def _levels_table(rows: list[dict], title: str) -> Table:
    t = Table(title=title, caption=common.describe_machine())
    for col in (
        "requested ev/s",
        "offered ev/s",
        "carried ev/s",
        "lost (ring buffer)",
        "agent CPU",
        "CPU s / M events",
        "waits on a full Kafka queue",
        "lossless",
    ):
        t.add_column(col)
    for r in rows:
        t.add_row(
            f"{r['requested']:,.0f}",
            f"{r['offered']:,.0f}",
            f"{r['carried']:,.0f}",
            f"{r['lost']:,}",
            f"{r['cpu_util'] * 100:.0f} %",
            f"{r['cpu_s_per_M']:.2f}",
            f"{r.get('kafka_waits', 0):,}",
            "[green]yes[/green]" if r["lossless"] else "[red]no[/red]",
        )
    return t


def _ladder(rigs: dict[str, Rig], levels, level_s: float) -> dict[str, list[dict]]:
    """Burst levels offered to every rig in turn (interleaved: A B, A B, ...); a rig leaves the ladder after
    two lossy levels in a row or when the firehose falls short of 80 % of the request."""
    rows: dict[str, list[dict]] = {name: [] for name in rigs}
    lossy = dict.fromkeys(rigs, 0)
    active = list(rigs)
    for rate in levels:
        for name in list(active):
            r = rigs[name].level(rate, level_s)
            rows[name].append(r)
            common.console.print(
                f"[dim]  {name}: {rate:,} ev/s offered {r['offered']:,.0f}: read {r['read']:,}, "
                f"lost {r['lost']:,}, CPU {r['cpu_util'] * 100:.0f} %[/dim]"
            )
            lossy[name] = 0 if r["lossless"] else lossy[name] + 1
            if lossy[name] >= 2 or r["offered"] < 0.8 * rate:
                active.remove(name)
        if not active:
            break
    return rows


def _confirm(rig: Rig, name: str, rows: list[dict], rounds: int, level_s: float) -> tuple[list, list]:
    """Repeat the best lossless level ``rounds`` times; step down a level while any repeat loses events.
    Returns (accepted repeats or [], rejected repeats per level)."""
    rejected: list[list[dict]] = []
    for cand in sorted((r for r in rows if r["lossless"]), key=lambda r: -r["offered"]):
        tries = [rig.level(cand["requested"], level_s) for _ in range(rounds)]
        if all(t["lossless"] for t in tries):
            return tries, rejected
        rejected.append(tries)
        common.console.print(
            f"[dim]  {name}: {cand['requested']:,} ev/s lost events in "
            f"{sum(not t['lossless'] for t in tries)} of {rounds} repeats: stepping down[/dim]"
        )
    return [], rejected


def _summarise(name: str, rows: list[dict], confirm: list[dict], at2x: dict | None, rounds: int) -> dict:
    """Print one ring size's accepted level and 2x line; returns its result fields."""
    out: dict = {"levels": rows, "confirm": confirm, "at_2x": at2x}
    if not confirm:
        common.console.print(f"{name}: no level was lossless")
        return out
    series = {
        "carried ev/s": common.Series("carried ev/s", [r["carried"] for r in confirm]),
        "CPU s / M events": common.Series("CPU s / M events", [r["cpu_s_per_M"] for r in confirm]),
    }
    common.console.print(
        common.table(
            f"{name}: largest rate lossless in {rounds} of {rounds} repeats "
            f"({confirm[0]['requested']:,.0f} ev/s requested)",
            series,
            "per row",
            fmt="{:,.2f}",
        )
    )
    if at2x is not None:
        common.console.print(
            f"{name} at 2x ({at2x['requested']:,.0f} ev/s requested, {at2x['offered']:,.0f} offered): "
            f"lost {at2x['lost']:,} of {at2x['fired']:,} ({at2x['lost'] / max(1, at2x['fired']) * 100:.1f} %), "
            f"read {at2x['read']:,}"
        )
    out.update(
        best_rate=series["carried ev/s"].median,
        cpu_s_per_M=series["CPU s / M events"].median,
        lost_at_2x=at2x["lost"] if at2x else None,
        generator_bound=bool(rows) and rows[-1]["lossless"] and rows[-1]["offered"] < 0.8 * rows[-1]["requested"],
    )
    return out


def run(quick: bool = False, rounds: int | None = None) -> dict:
    """Run the benchmark, print the tables and verdict, save the JSON. Returns the results dict."""
    rounds = rounds or (1 if quick else ROUNDS)
    levels, level_s = (QUICK_LEVELS, QUICK_LEVEL_S) if quick else (LEVELS, LEVEL_S)
    common.console.rule("[bold]2. agent throughput[/bold]: BPF ring buffer -> Kafka on one core")
    no_bpf = bpf_unavailable()
    if no_bpf:
        common.console.print(f"[yellow]skipped: {no_bpf}[/yellow]")
        return {"skipped": no_bpf}
    tmp = Path(tempfile.mkdtemp(prefix="obshub-bench-agent-"))
    usdt_rows: list[dict] = []
    per: dict[str, dict] = {}
    finals: dict[str, dict] = {}
    try:
        with private_stack(common.console.print):
            rigs: dict[str, Rig] = {}
            try:
                for name, pages in RINGS.items():
                    sub = tmp / f"ring{pages}"
                    sub.mkdir()
                    rigs[name] = Rig(sub, ringbuf_pages=pages)
                default = rigs[DEFAULT_RING]
                for rig in rigs.values():
                    rig.level(levels[0], 0.5)  # warm-up: first batches, connections
                for rate in USDT_LEVELS[:1] if quick else USDT_LEVELS:  # one USDT hit per event
                    r = default.level(rate, level_s, burst=0)
                    usdt_rows.append(r)
                    common.console.print(
                        f"[dim]  USDT {rate:,} ev/s offered {r['offered']:,.0f}: read {r['read']:,}, "
                        f"lost {r['lost']:,}, CPU {r['cpu_util'] * 100:.0f} %[/dim]"
                    )
                rows = _ladder(rigs, levels, level_s)
                for name, rig in rigs.items():
                    confirm, rejected = _confirm(rig, name, rows[name], rounds, level_s)
                    at2x = rig.level(2 * confirm[0]["requested"], level_s) if confirm else None
                    per[name] = {"rows": rows[name], "confirm": confirm, "rejected": rejected, "at2x": at2x}
            finally:
                for name, rig in rigs.items():
                    finals[name] = rig.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    secs = QUICK_LEVEL_S if quick else LEVEL_S
    common.console.print(
        _levels_table(
            usdt_rows,
            f"{DEFAULT_RING}: agent on one CPU, one USDT hit per event ({secs:.0f} s per level; "
            f"firehose on the other CPU: the uprobe trap bounds what it offers)",
        )
    )
    for name, p in per.items():
        common.console.print(
            _levels_table(
                p["rows"],
                f"{name}: agent on one CPU, bursts of {BURST} records per uprobe hit ({secs:.0f} s "
                f"per level; firehose on the other CPU)",
            )
        )
    configs = {}
    for name, p in per.items():
        configs[name] = _summarise(name, p["rows"], p["confirm"], p["at2x"], rounds)
        configs[name].update(rejected_confirmations=p["rejected"], ringbuf_pages=RINGS[name], final=finals[name])
    main_cfg = configs.get(DEFAULT_RING, {})
    result = {
        "usdt_levels": usdt_rows,
        "configs": configs,
        "levels": main_cfg.get("levels", []),
        "confirm": main_cfg.get("confirm", []),
        "at_2x": main_cfg.get("at_2x"),
        "final": finals.get(DEFAULT_RING, {}),
        "rounds": rounds,
        "rev": common.git_rev(),
        "target": TARGET,
        "target_cpu_s_per_M": TARGET_CPU_PER_M,
    }
    for name, c in configs.items():
        if "best_rate" in c:
            common.console.print(f"{name}: {c['best_rate']:,.0f} events/s lossless, {c['cpu_s_per_M']:.3f} CPU s / M")
    if "best_rate" in main_cfg:
        best_rate, cpu_m = main_cfg["best_rate"], main_cfg["cpu_s_per_M"]
        result.update(
            best_rate=best_rate,
            cpu_s_per_M=cpu_m,
            lost_at_2x=main_cfg["lost_at_2x"],
            generator_bound=main_cfg["generator_bound"],
        )
        common.verdict(
            f">= {TARGET:,} events/s per core without loss",
            best_rate >= TARGET,
            f"{best_rate:,.0f} events/s with the {DEFAULT_RING} (CPU-bound ceiling 1e6 / CPU s per M = "
            f"{1e6 / cpu_m:,.0f} events/s)"
            + (" (bounded by the firehose, not by the agent)" if main_cfg["generator_bound"] else ""),
        )
        common.verdict(
            f"<= {TARGET_CPU_PER_M:g} CPU s per million events",
            cpu_m <= TARGET_CPU_PER_M,
            f"{cpu_m:.3f} CPU s per million events at the accepted level",
        )
        result.update(target_met=best_rate >= TARGET and cpu_m <= TARGET_CPU_PER_M)
    else:
        common.verdict(f">= {TARGET:,} events/s per core without loss", False, "no level was lossless")
        result.update(target_met=False)
    deliv_ok = all(f.get("exit_code") == 0 and f.get("batches") == f.get("delivered") for f in finals.values())
    for name, final in finals.items():
        common.console.print(
            f"{name}: delivery to Kafka: {final.get('delivered', 0):.0f} of {final.get('batches', 0):.0f} "
            f"batches acknowledged, agent exit code {final.get('exit_code')}"
            + ("" if deliv_ok else " [red](not everything was delivered)[/red]")
        )
    result["delivered_all"] = deliv_ok
    common.console.print(f"raw results: {common.save('agent_throughput', result)}")
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m bench.agent_throughput [--quick] [--rounds N]``."""
    p = argparse.ArgumentParser(
        prog="python -m bench.agent_throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="smoke run: two low rates, 1 s each")
    p.add_argument("--rounds", type=common.positive_int, default=None, help=f"confirmation rounds (default {ROUNDS})")
    a = p.parse_args(argv)
    run(a.quick, a.rounds)
    return common.exit_code(a.quick)


if __name__ == "__main__":
    raise SystemExit(main())
