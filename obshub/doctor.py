"""``obshub doctor``: what this host offers and what obshub will use.

It tries rather than guesses: every BPF line loads (and attaches) a tiny program of that kind into the
running kernel and reports the kernel's answer. Each failed line says what it costs (which probes are
lost) and how to fix it. Checks run in a child process per BPF program kind, so one that crashes or hangs
inside libbcc cannot take the report down.

Exit status: 0 when every check that the chosen roles need passed (``--role``, default ``agent``), 1
when one of them failed (the report names it), so ``obshub doctor`` can gate a deployment (an init
container, a CI step). Checks no role needs (BTF, kprobe, fentry, ...) only inform.

The ``qdisc`` rows (tc netem, tbf: what the demo's network faults shape traffic with, tried in a
throwaway network namespace) only inform too.

Roles and the checks they need: ``agent``: capabilities, tracefs, kernel headers, bcc import, bpf:
compile, bpf: tracepoint; ``broker`` (the local broker of ``obshub up``): java, and maven while the
Kafka jars are not cached; ``kafka``: the Kafka broker answers.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import click

from obshub import stack
from obshub.core import usdt as usdt_contract
from obshub.core.errors import StackError
from obshub.core.settings import Settings, load_settings
from obshub.producer import kheaders


@dataclass
class Check:
    """One line of the report: ``ok`` True/False (None = informational), what was ``found``, what a
    failure ``costs`` and how to ``fix`` it."""

    name: str
    ok: bool | None
    found: str
    costs: str = ""
    fix: str = ""
    needed_by: str = ""  # the role that needs this check to pass ("" = informational)


ROLES = ("agent", "broker", "kafka")
_NEEDED = {
    "capabilities": "agent",
    "tracefs": "agent",
    "kernel headers": "agent",
    "bcc import": "agent",
    "bpf: compile": "agent",
    "bpf: tracepoint": "agent",
    "java": "broker",
    "kafka broker": "kafka",
}


def failed_needs(checks: list[Check], roles: tuple[str, ...]) -> list[Check]:
    """The checks that one of ``roles`` needs and that failed."""
    return [c for c in checks if c.needed_by in roles and c.ok is False]


# Tiny BPF programs, one per attach type, compiled by bcc in a child process. Each prints "ok" or raises.
_PROGRAMS: dict[str, str] = {
    "compile": r"""
from bcc import BPF
BPF(text='int f(void *ctx) { return 0; }')
print("ok")
""",
    "tracepoint": r"""
from bcc import BPF
b = BPF(text='TRACEPOINT_PROBE(sched, sched_process_exec) { return 0; }')
assert b.num_open_tracepoints() == 1
print("ok")
""",
    "raw_tracepoint": r"""
from bcc import BPF
b = BPF(text='RAW_TRACEPOINT_PROBE(sched_switch) { return 0; }')
print("ok")
""",
    "uprobe": r"""
import ctypes.util
from bcc import BPF
b = BPF(text='int f(void *ctx) { return 0; }')
b.attach_uprobe(name="c", sym="getpid", fn_name="f")
b.attach_uretprobe(name="c", sym="getpid", fn_name="f")
print("ok")
""",
    "usdt": r"""
import os, sys
from bcc import BPF, USDT
path = sys.argv[1]
u = USDT(path=path)
probes = [p.name.decode() for p in u.enumerate_probes()]
assert probes, "no USDT probes in " + path
u.enable_probe(probe=probes[0], fn_name="f")
BPF(text='int f(void *ctx) { return 0; }', usdt_contexts=[u])
print("ok", path, len(probes))
""",
    "kprobe": r"""
from bcc import BPF
b = BPF(text='int f(void *ctx) { return 0; }')
b.attach_kprobe(event=b.get_syscall_fnname("getpid"), fn_name="f")
print("ok")
""",
    "fentry": r"""
from bcc import BPF
BPF(text='KFUNC_PROBE(do_nanosleep) { return 0; }')
print("ok")
""",
    "perf_event": r"""
from bcc import BPF, PerfType, PerfSWConfig
b = BPF(text='int f(void *ctx) { return 0; }')
b.attach_perf_event(ev_type=PerfType.SOFTWARE, ev_config=PerfSWConfig.CPU_CLOCK, fn_name="f", sample_freq=9)
print("ok")
""",
    "ringbuf": r"""
from bcc import BPF
b = BPF(text='BPF_RINGBUF_OUTPUT(rb, 1); TRACEPOINT_PROBE(sched, sched_process_exec) { u32 x = 1; rb.ringbuf_output(&x, sizeof(x), 0); return 0; }')
print("ok")
""",
}

_COSTS = {
    "compile": (
        "every probe: bcc cannot compile BPF C",
        "apt-get install bpfcc-tools python3-bpfcc linux-headers-amd64; run `make setup`",
    ),
    "tracepoint": (
        "scheduler, memory, TCP and PCIe AER probes",
        "mount tracefs (`mount -t tracefs nodev /sys/kernel/tracing`) and run as root or with CAP_BPF+CAP_PERFMON",
    ),
    "raw_tracepoint": (
        "raw-tracepoint fallbacks of tracepoints whose structs do not compile",
        "kernel 4.17+ with CONFIG_BPF_EVENTS",
    ),
    "uprobe": (
        "CUDA, NCCL and verbs (NIC) probes",
        "kernel with CONFIG_UPROBE_EVENTS; root or CAP_SYS_ADMIN for other users' processes",
    ),
    "usdt": (
        "PyTorch step/phase/collective probes and TraceKey propagation",
        "kernel with CONFIG_UPROBE_EVENTS; build the USDT extension (`make setup`)",
    ),
    "kprobe": (
        "nothing: obshub uses tracepoints, raw tracepoints and uprobes only",
        "optional: a kernel with CONFIG_KPROBES (only in-kernel RDMA consumers would be visible)",
    ),
    "fentry": (
        "nothing: obshub does not need fentry/fexit",
        "optional: kernel with BTF and CONFIG_DEBUG_INFO_BTF; not refused by a security policy",
    ),
    "perf_event": (
        "sampling profiles (not used by the default probe set)",
        "kernel.perf_event_paranoid <= 1 or CAP_PERFMON",
    ),
    "ringbuf": ("the BPF ring buffer: the agent falls back to a perf buffer per CPU", "kernel 5.8+"),
}


_USDT_C = """
#include <sys/sdt.h>
void obshub_doctor_probe(int x) { DTRACE_PROBE1(obshub_doctor, ping, x); }
"""


def _usdt_target() -> str | None:
    """A shared library with a USDT note to test against: obshub's own probe library when built, else a
    three-line library compiled now with ``sys/sdt.h`` (no semaphore, so no pid is needed)."""
    path = usdt_contract.library_path()
    if path:
        return str(path)
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="obshub-doctor-"))
    (work / "p.c").write_text(_USDT_C)
    proc = subprocess.run(
        ["cc", "-shared", "-fPIC", "-O1", "-o", str(work / "libp.so"), str(work / "p.c")],
        capture_output=True,
        text=True,
    )
    return str(work / "libp.so") if proc.returncode == 0 else None


def _bcc_python() -> str:
    return sys.executable


def try_program(kind: str, env: dict[str, str], timeout_s: float = 60.0) -> tuple[bool, str]:
    """Compile/load/attach the tiny program of ``kind`` in a child process. Returns (ok, message)."""
    args = [_bcc_python(), "-c", _PROGRAMS[kind]]
    if kind == "usdt":
        target = _usdt_target()
        if not target:
            return False, "could not build a test library with sys/sdt.h (apt-get install systemtap-sdt-dev gcc)"
        args.append(target)
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **env})
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout_s:.0f} s"
    if proc.returncode == 0 and proc.stdout.startswith("ok"):
        return True, proc.stdout.strip()
    lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
    return False, _summarise_error(lines)


def _summarise_error(lines: list[str]) -> str:
    if not lines:
        return "failed without a message"
    for ln in lines:
        low = ln.lower()
        if "operation not permitted" in low or "eperm" in low:
            return "refused by the kernel (EPERM)"
    for ln in reversed(lines):
        if "Exception" in ln or "Error" in ln or "error:" in ln:
            return ln.strip()[:200]
    return lines[-1].strip()[:200]


def _caps() -> dict[str, bool]:
    bits = {"CAP_SYS_ADMIN": 21, "CAP_PERFMON": 38, "CAP_BPF": 39}
    try:
        for ln in Path("/proc/self/status").read_text().splitlines():
            if ln.startswith("CapEff:"):
                eff = int(ln.split()[1], 16)
                return {k: bool(eff >> b & 1) for k, b in bits.items()}
    except OSError:
        pass
    return {k: False for k in bits}


def run_checks(settings: Settings, bpf: bool = True) -> list[Check]:
    """Run every check and return the report lines. ``bpf`` False skips loading programs (fast mode)."""
    out: list[Check] = []
    out.append(Check("kernel", None, f"{platform.release()} ({platform.machine()})"))
    btf = Path("/sys/kernel/btf/vmlinux")
    out.append(
        Check(
            "BTF",
            btf.exists(),
            str(btf) if btf.exists() else "no /sys/kernel/btf/vmlinux",
            "CO-RE and fentry would be unavailable (bcc does not need BTF)",
            "kernel with CONFIG_DEBUG_INFO_BTF",
        )
    )
    caps = _caps()
    out.append(
        Check(
            "capabilities",
            caps["CAP_BPF"] and caps["CAP_PERFMON"] or caps["CAP_SYS_ADMIN"],
            ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in caps.items()),
            "no probe can be loaded",
            "run as root, or grant CAP_BPF,CAP_PERFMON (+CAP_SYS_ADMIN for uprobes on other users' processes)",
        )
    )
    tfs = kheaders.tracefs_mount()
    out.append(
        Check(
            "tracefs",
            tfs is not None,
            str(tfs) if tfs else "not mounted",
            "tracepoints, uprobes and USDT (bcc attaches through tracefs)",
            "`make setup` mounts it, or: mount -t tracefs nodev /sys/kernel/tracing",
        )
    )
    tree = kheaders.find_header_tree(settings, create=False)
    built = tree.path is None or (tree.path / ".obshub-merged").exists()
    out.append(
        Check(
            "kernel headers",
            tree.source != "none" and built,
            f"{tree.source}: {tree.detail}" + ("" if built else " (not built yet)"),
            "bcc cannot compile any probe",
            "apt-get install linux-headers-amd64; then `obshub setup`",
        )
    )
    try:
        import bcc  # noqa: F401

        out.append(
            Check("bcc import", True, f"bcc {getattr(bcc, '__version__', '?')} from {Path(bcc.__file__).parent}")
        )
        has_bcc = True
    except (ImportError, OSError, AttributeError) as exc:  # no bcc; libbcc.so missing; a libbcc of another version
        out.append(
            Check(
                "bcc import",
                False,
                f"{type(exc).__name__}: {exc}",
                "every BPF probe",
                "apt-get install python3-bpfcc; `make setup` links it into .venv",
            )
        )
        has_bcc = False
    if bpf and has_bcc:
        env = tree.env()
        for kind in _PROGRAMS:
            ok, msg = try_program(kind, env)
            cost, fix = _COSTS[kind]
            out.append(Check(f"bpf: {kind}", ok, msg if ok else msg, "" if ok else cost, "" if ok else fix))
    try:
        java = stack.java_binary()
        major = stack.java_version(java)
        out.append(
            Check(
                "java",
                major >= 17,
                f"Java {major} at {java}",
                "the local Kafka broker",
                "install openjdk-17-jre-headless",
            )
        )
    except (StackError, ValueError) as exc:  # no java, cannot run it, an unreadable version
        out.append(Check("java", False, str(exc), "the local Kafka broker", "install openjdk-17-jre-headless"))
    jars = settings.kafka_libs.is_dir() and any(settings.kafka_libs.glob("kafka_*.jar"))
    out.append(
        Check(
            "maven",
            shutil.which("mvn") is not None,
            shutil.which("mvn") or "not found",
            "the first install of the Kafka broker jars",
            "apt-get install maven",
            needed_by="" if jars else "broker",
        )
    )
    out.extend(qdisc_checks())
    local = settings.bootstrap is None
    up = (not local or stack.port_in_use(settings.kafka_port)) and stack._metadata_ok(settings)
    out.append(
        Check(
            "kafka broker",
            up,
            f"{settings.bootstrap_servers} {'answers' if up else 'does not answer'}",
            "" if up else "agents spool to disk, streams and rules cannot run",
            "" if up else ("obshub up" if local else "check $OBSHUB_BOOTSTRAP and the broker"),
        )
    )
    for c in out:
        if not c.needed_by:
            c.needed_by = _NEEDED.get(c.name, "")
    return out


def qdisc_checks() -> list[Check]:
    """One informational row per tc qdisc the demo's faults use (``obshub.core.qdisc.DEMO_QDISCS``), tried
    for real in a throwaway network namespace: present, or missing and what is lost (walk24: a demo with
    ``--param delay_ms`` learnt of a missing netem only after building the cluster)."""
    from obshub.core.qdisc import DEMO_QDISCS, qdisc_missing

    out = []
    for name, (_words, needs) in DEMO_QDISCS.items():
        missing = qdisc_missing(name)
        if missing is None:
            out.append(Check(f"qdisc {name}", None, "not tried (needs root, unshare and tc)"))
        elif missing:
            fix = f"modprobe sch_{name} (kernel CONFIG_NET_SCH_{name.upper()})"
            if name == "netem":
                fix += "; or shape the RTT spike with --param rate_kbit=N (tbf)"
            out.append(Check(f"qdisc {name}", False, f"missing: {missing}", needs, fix))
        else:
            out.append(Check(f"qdisc {name}", True, "present (tried in a throwaway network namespace)"))
    return out


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
@click.option("--no-bpf", is_flag=True, help="skip loading test programs (fast, but guesses)")
@click.option(
    "--role",
    "roles",
    multiple=True,
    type=click.Choice(ROLES),
    default=("agent",),
    show_default=True,
    help="what this host must be able to do (repeatable): the exit status is 1 when a check it needs fails",
)
def doctor_command(as_json, no_bpf, roles):
    """Report what this host offers (kernel, BTF, tracefs, headers, bcc, each BPF program kind loaded for
    real, capabilities, Java, Kafka) and what each missing piece costs.

    Exit status 0 when every check the roles need passed, 1 when one failed.

    \b
    Examples:
      obshub doctor                          # the full report, loads one tiny program per kind
      obshub doctor --json                   # for scripts and bug reports
      obshub doctor --role agent --role kafka   # gate an agent's start: probes work AND Kafka answers
      obshub doctor --no-bpf --role broker   # can this machine run the local broker (obshub up)?
    """
    from rich.console import Console
    from rich.table import Table

    from obshub.core.tables import print_table

    settings = load_settings()
    kheaders.apply_env(settings)
    checks = run_checks(settings, bpf=not no_bpf)
    failed = failed_needs(checks, tuple(roles))
    if as_json:
        click.echo(json.dumps([asdict(c) for c in checks], indent=2))
        sys.exit(1 if failed else 0)
    t = Table("check", "", "found", "costs / fix", title="obshub doctor", show_lines=False)
    for c in checks:
        mark = {True: "[green]ok[/green]", False: "[red]no[/red]", None: "[dim]--[/dim]"}[c.ok]
        extra = "" if c.ok in (True, None) else f"loses: {c.costs}\nfix: {c.fix}"
        t.add_row(c.name, mark, c.found, extra)
    print_table(Console(highlight=False), t)
    if failed:
        n = len(failed)
        click.echo(
            f"doctor: {n} check{'s' if n != 1 else ''} that {roles_need(roles)} failed: "
            + ", ".join(c.name for c in failed),
            err=True,
        )
        sys.exit(1)
    click.echo(f"doctor: everything {roles_need(roles)} works", err=True)


def roles_need(roles) -> str:
    """``the agent role needs`` / ``the agent and kafka roles need``: the subject of doctor's last line."""
    roles = list(dict.fromkeys(roles))
    if len(roles) == 1:
        return f"the {roles[0]} role needs"
    return f"the {', '.join(roles[:-1])} and {roles[-1]} roles need"
