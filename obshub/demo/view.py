"""What the user sees while the demo runs (rich): set-up steps, steps per host, the fault and its
evidence counters, alerts as they fire, then the verdict.

On a terminal a live panel is redrawn 4 times a second; otherwise (a pipe, CI, ``--json -``) every event
is printed as one plain line, and the host steps once every 5 s.
"""

from __future__ import annotations

import threading
import time

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from obshub.core.tables import WholeLineConsole
from obshub.demo.verdict import AlertSeen, Verdict


class DemoView:
    """Thread-safe sink of demo events. Use as a context manager around the run."""

    def __init__(self, console: Console | None = None, hosts: list[str] | None = None):
        self.console = console or WholeLineConsole(stderr=True, highlight=False)
        self.live_mode = self.console.is_terminal
        self.hosts = list(hosts or [])
        self.steps: dict[str, tuple[int, float]] = {}
        self.log: list[str] = []
        self.alerts: list[tuple[AlertSeen, str]] = []
        self.fault_line = ""
        self.evidence: dict = {}
        self._lock = threading.Lock()
        self._live: Live | None = None
        self._last_plain_steps = 0.0
        self._t_start = time.monotonic()

    # events -------------------------------------------------------------------------------------------
    def say(self, msg: str) -> None:
        """A set-up or tear-down step."""
        with self._lock:
            self.log.append(msg)
            self.log = self.log[-8:]
        self._plain(f"[dim]demo:[/dim] {msg}")

    def step(self, host: str, step: int, ms: float) -> None:
        """Host ``host`` finished step ``step`` in ``ms`` milliseconds."""
        with self._lock:
            if host not in self.hosts:
                self.hosts.append(host)
            self.steps[host] = (step, ms)
        if not self.live_mode and time.monotonic() - self._last_plain_steps > 5:
            self._last_plain_steps = time.monotonic()
            self._plain(
                "[dim]steps:[/dim] " + "  ".join(f"{h} {s[0]} ({s[1]:.0f} ms)" for h, s in sorted(self.steps.items()))
            )

    def fault(self, line: str) -> None:
        """The fault was injected (or removed)."""
        with self._lock:
            self.fault_line = line
        self._plain(f"[bold yellow]fault:[/bold yellow] {line}")

    def set_evidence(self, evidence: dict) -> None:
        """Latest counters of the fault."""
        with self._lock:
            self.evidence = dict(evidence)

    def alert(self, a: AlertSeen, mark: str) -> None:
        """An alert fired; ``mark`` is ``correct`` or ``wrong: <why>``."""
        with self._lock:
            self.alerts.append((a, mark))
        colour = "green" if mark == "correct" else "red"
        self._plain(
            f"[bold {colour}]alert[/bold {colour}] {_who(a.host, a.rank)} / {a.layer} step {a.step} "
            f"rule {a.rule}: {a.evidence or a.summary} [{colour}]({mark})[/{colour}]"
        )

    # rendering ----------------------------------------------------------------------------------------
    def _plain(self, markup: str) -> None:
        if self.live_mode and self._live is not None:
            return
        self.console.print(markup)

    def render(self) -> Group:
        """The live panel."""
        with self._lock:
            hosts = Table("host", "step", "last step", title="training", expand=False)
            for h in self.hosts:
                s = self.steps.get(h)
                hosts.add_row(h, str(s[0]) if s else "-", f"{s[1]:.0f} ms" if s else "-")
            parts = [Text("\n".join(self.log), style="dim"), hosts]
            if self.fault_line:
                ev = ", ".join(f"{k}={v}" for k, v in self.evidence.items())
                parts.append(Text(f"fault: {self.fault_line}" + (f"\nevidence: {ev}" if ev else ""), style="yellow"))
            if self.alerts:
                t = Table("host", "layer", "step", "rule", "evidence", "", title="alerts")
                for a, mark in self.alerts[-10:]:
                    t.add_row(
                        a.host,
                        a.layer,
                        a.step,
                        a.rule,
                        (a.evidence or a.summary)[:90],
                        Text(mark, style="green" if mark == "correct" else "red"),
                    )
                parts.append(t)
        return Group(*parts)

    def __enter__(self) -> "DemoView":
        if self.live_mode:
            self._live = Live(get_renderable=self.render, console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def verdict(self, v: Verdict, expected_host: str | None) -> None:
        """Print the verdict block."""
        c = self.console
        if v.fault == "none":
            c.print("[bold]verdict[/bold]: clean run (no fault injected)")
        else:
            c.print(f"[bold]verdict[/bold]: fault {v.fault} injected at t0 on {expected_host} in layer {v.layer}")
            if v.fault == "stall" and v.stalls:
                self._stall_lines(v)
            elif v.first_correct:
                fc = v.first_correct
                c.print(
                    f"  first correct alert at t1 = t0 + {v.ttd_s:.2f} s: {_who(fc['host'], fc.get('rank'))} / {fc['layer']} "
                    f"step {fc['step']} (rule {fc['rule']})"
                )
                c.print(f"  [bold]time to detection: {v.ttd_s:.2f} s[/bold]")
            else:
                c.print("  [red]no correct alert[/red]")
        c.print(f"  wrong alerts: {v.wrong_count}")
        for w in v.wrong:
            a = w["alert"]
            c.print(
                f"    [red]{_who(a['host'] or '?', a.get('rank'))} / {a['layer'] or '?'}[/red] rule {a['rule']}: {w['why']}"
            )
        c.print(("[bold green]PASS[/bold green] " if v.ok else "[bold red]FAIL[/bold red] ") + v.reason)

    def _stall_lines(self, v: Verdict) -> None:
        """A sporadic stall's verdict: each stall's own delay from its own start (``v.stalls``), then the
        median and worst over them. ``v.ttd_s`` is that median, not the first stall's delay (walk24: the
        demo printed "first correct alert at t1 = t0 + 0.92 s", the median, for a first alert 1.023 s after
        the first stall)."""
        c = self.console
        first = v.stalls[0]
        fc = v.first_correct
        if fc and first["ttd_s"] is not None:
            c.print(
                f"  first stall named {first['ttd_s']:.3f} s after its start: {_who(fc['host'], fc.get('rank'))} / "
                f"{fc['layer']} step {fc['step']} (rule {fc['rule']})"
            )
        for i, st in enumerate(v.stalls, 1):
            c.print(
                f"    stall {i}: "
                + (
                    f"named after {st['ttd_s']:.3f} s (rule {st['rule']})"
                    if st["ttd_s"] is not None
                    else "[red]not named[/red]"
                )
            )
        if v.named:
            worst = f"worst {v.worst_s:.2f} s" if v.worst_s is not None else "worst: a stall went unnamed"
            c.print(
                f"  [bold]time to detection over {v.named} of {len(v.stalls)} named stalls, each from its own start: "
                f"median {v.ttd_s:.2f} s, {worst}[/bold]"
            )
        else:
            c.print("  [red]no stall named[/red]")


def _who(host: str, rank: str | None) -> str:
    """``host``, and the global rank an alert names (its ``rank`` label) when it names one: ``node-01 rank 3``.
    Without it a run with ``--fault-rank`` showed only the host, though the verdict judges the rank."""
    return f"{host} rank {rank}" if rank else host
