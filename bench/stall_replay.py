"""Replay kept step summaries (``python -m bench.ttd --keep DIR``) through two versions of the step culprit
and the builtin rule pack, and compare the alerts of every rule the step summaries drive (issue #30;
docs/BENCHMARKS.md 8).

Each kept run (``DIR/**/steps.jsonl`` beside its ``report.json``) is read in close order. Every closed step
(``complete``, ``window``, ``restart``) whose kept culprit is not a hang's gets its culprit recomputed with
``analysis.culprit.culprit``, ``charge_starved``, ``charge_persistent`` (the worker's charge of a persistent
fault's victims, each side keeping its own recent culprits per job) and the charge to a running record's
network culprit (``running_applies``) of ``--base`` (a checkout of the commit to
compare with, e.g. ``git worktree add /tmp/base main``) on one side and of this tree on the other; steps
where the two differ are listed. Each sequence goes through its own side's builtin pack (``--base``'s
``obshub/rules/builtin``, this tree's; ``rules.engine.Engine``, ticked at each step's close), so the
sequential rules (the CUSUMs, ``network_loss_in_slow_steps``) replay too; event-driven rules (memory
reclaim, health) get no events and fire on neither side. An alert is right when it names the host and
layer of a fault episode in effect, else wrong: from its injection to 5 s after its removal where the kept
report says when (a ``--sequence`` run's ``removed_ns``; a single fault's ``scenario``: ``duration_s`` minus
``fault_at_s`` after the injection), else to 5 s after its last stall (a sporadic fault) or after the run's
last step summary (a persistent one: bench.ttd removes it when the training window ends); each stall of a ``stall:LAYER`` episode is named when a right ``step_stall`` alert starts within
5 s of it (``named``), or a right alert of any rule (``named_all``, as ``bench.ttd`` judges a stall; the
worker's memory episodes, ``memory_episode``, are replayed on each side that has them). Prints the changed
culprits, the alerts (any rule) only one side fired, per-stall naming that differs, and totals
(``right``/``wrong``: ``step_stall``; ``all_right``/``all_wrong``: every rule).
Reads only the culprit's and the rules' inputs in the summaries (``culprit`` reads no raw events), so it
replays a change of ``culprit.py`` or of the pack; a change of the fold or the agent needs new runs. The
running records (``closed_by`` "running") go through each side's ``running_rejudge`` where it has one
(the hosts a running record no longer names: ``culprit.running_own_work``), else as kept; one kept before
they carried their step's age gets the least age the worker's check allows (``running_age``).

    python -m bench.stall_replay --base /tmp/base /tmp/s6runs/*/ /tmp/stall5-runs/*/
    python -m bench.stall_replay --base /tmp/base      # the committed corpus, bench/corpus/*.jsonl.gz
    python -m bench.stall_replay --base /tmp/base bench/corpus/early19-new-1-stall-node-03.jsonl.gz   # one run
    python -m bench.stall_replay --base /tmp/base /work/runs19/early19-new-1/stall-node-03/steps.jsonl
    python -m bench.stall_replay --pack bench/corpus /work/runs19/stop19-*/   # add kept runs to it

A packed run (``--pack``) is one ``NAME.jsonl.gz``: its first line ``{"report": ...}`` (the kept report's
``verdict`` and ``episodes``, and the ``scenario``'s times), then its step summaries as kept, without what neither the culprit nor the
rules read (``collectives``, ``layer_stats`` of a step with every row, a rank row's fields but its
``layers``' ``time_ns`` and ``count``).
"""

from __future__ import annotations

import argparse
import collections
import copy
import gzip
import importlib
import importlib.util
import json
import sys
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus"
"""The committed replay corpus: packed kept runs (``--pack``), replayed when no folder is given."""
LAYER = {"stall:net": "network", "stall:cpu": "sched", "stall:process": "process", "stall:mem": "memory"}
LAYER.update({"cpu": "sched", "net-slow": "network", "net-loss": "network", "mem": "memory"})
LAYER.update({"hang": "process", "exit": "process"})
CLOSED = ("complete", "window", "restart")


def removed_at(rep: dict, t0_ns: int) -> int | None:
    """When a single-fault run's fault was removed (CLOCK_REALTIME ns), from its kept report's ``scenario``
    (``obshub demo``: injected ``fault_at_s`` after warm-up at ``t0_ns``, removed at ``duration_s``, i.e.
    ``duration_s - fault_at_s`` s after ``t0_ns``; the demo polls every 0.2 s). None when it is not known:
    no scenario (a packed run of before ``pack_run`` kept it), a ``--sequence`` run (its ``episodes`` carry
    ``removed_ns``), a run of ``steps`` (its ranks may have stopped earlier) or a fault never injected."""
    sc = rep.get("scenario")
    if not isinstance(sc, dict) or sc.get("sequence") or sc.get("steps") is not None or not t0_ns:
        return None
    try:
        span = float(sc["duration_s"]) - float(sc["fault_at_s"])
    except (KeyError, TypeError, ValueError):
        return None
    return t0_ns + int(span * 1e9) if span > 0 else None


def _episodes(rep: dict, last_ns: int = 0) -> list[tuple]:
    """``(kind, host, layer, t_from_ns, t_to_ns, stall_starts_ns)`` of a kept report (a ``--sequence`` run
    has ``episodes``; a single-fault one only its ``verdict`` and ``scenario``). An episode is in effect
    from its injection to 5 s after its end: its removal (``removed_ns``, or ``removed_at`` the report's
    scenario) where that is known; else a sporadic fault's last stall, and a persistent fault's end is
    taken to be the run's last step summary (``last_ns``, CLOCK_REALTIME ns: bench.ttd removes a single
    fault when the training window ends, and the run's steps stop a few seconds later)."""
    eps = rep.get("episodes")
    if not eps:
        v = rep.get("verdict") or {}
        kind = v.get("fault") or "none"
        if kind == "stall":
            kind = "stall:" + {"network": "net", "sched": "cpu", "memory": "mem"}.get(v.get("layer"), "process")
        t0 = v.get("t0_ns") or 0
        eps = [{"kind": kind, "host": v.get("host"), "t0_ns": t0, "removed_ns": removed_at(rep, t0)}]
        eps[0]["stall_starts_ns"] = [x["t0_ns"] for x in v.get("stalls") or []]
    out = []
    for ep in eps:
        lo = ep.get("t0_ns") or 0
        end = ep.get("removed_ns")
        if not end:
            starts = ep.get("stall_starts_ns") or []
            end = max(starts) if starts or ep["kind"].startswith("stall:") else max(lo, last_ns)
        out.append(
            (
                ep["kind"],
                ep.get("host"),
                LAYER.get(ep["kind"], "?"),
                lo,
                end + 5_000_000_000,
                ep.get("stall_starts_ns") or [],
            )
        )
    return out


def read_run(steps_file: Path) -> tuple[dict, list[dict]]:
    """A kept run: its ``report.json`` (beside ``steps_file``) and its step summaries (``steps_file``, one
    JSON object a line, blank lines skipped) sorted by ``closed_at_ns``. Raises ValueError naming the file
    (and the line) that is no JSON object, or a summary without an integer ``closed_at_ns`` (a run cut off
    while it was written)."""
    report = steps_file.parent / "report.json"
    try:
        rep = json.loads(report.read_text())
    except ValueError as exc:
        raise ValueError(f"{report}: not JSON ({exc})") from None
    if not isinstance(rep, dict):
        raise ValueError(f"{report}: not a JSON object (a bench.ttd --keep report)")
    steps = []
    with steps_file.open() as f:
        for no, ln in enumerate(f, 1):
            if not ln.strip():
                continue
            try:
                s = json.loads(ln)
            except ValueError as exc:
                raise ValueError(f"{steps_file}:{no}: not JSON ({exc})") from None
            if not isinstance(s, dict) or not isinstance(s.get("closed_at_ns"), int):
                raise ValueError(f"{steps_file}:{no}: not a step summary (no integer closed_at_ns)")
            steps.append(s)
    return rep, sorted(steps, key=lambda s: s["closed_at_ns"])


def _trim(s: dict) -> dict:
    """A step summary without what neither ``culprit`` nor the rules read (``--pack``): no ``collectives``,
    no ``layer_stats`` unless ``layers_omitted`` (a wide step's medians), rank rows reduced to their
    ``layers``' ``time_ns`` and ``count``."""
    s = {k: v for k, v in s.items() if k != "collectives" and (k != "layer_stats" or s.get("layers_omitted"))}
    if s.get("ranks"):
        s["ranks"] = {
            h: {
                r: {
                    "layers": {
                        ly: {"time_ns": int(c.get("time_ns", 0)), "count": int(c.get("count", 0))}
                        for ly, c in ((row or {}).get("layers") or {}).items()
                    }
                }
                for r, row in (rows or {}).items()
            }
            for h, rows in s["ranks"].items()
        }
    return s


def pack_run(steps_file: Path, out: Path) -> int:
    """Write the kept run of ``steps_file`` (``read_run``) packed to ``out`` (``NAME.jsonl.gz``, see the
    module's doc); returns its size in bytes. Raises ValueError naming a file that is no kept run."""
    rep, steps = read_run(steps_file)
    head = {"report": {k: rep[k] for k in ("verdict", "episodes") if k in rep}}
    sc = rep.get("scenario")
    if isinstance(sc, dict):  # what removed_at reads: when a single fault was removed
        head["report"]["scenario"] = {k: sc[k] for k in ("fault_at_s", "duration_s", "steps", "sequence") if k in sc}
    lines = [json.dumps(head, separators=(",", ":"))] + [json.dumps(_trim(s), separators=(",", ":")) for s in steps]
    out.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), 9))
    return out.stat().st_size


def read_packed(path: Path) -> tuple[dict, list[dict]]:
    """A packed run (``pack_run``): its report and its step summaries sorted by ``closed_at_ns``. Raises
    ValueError naming the file (and the line) that is no packed run."""
    try:
        text = gzip.decompress(path.read_bytes()).decode()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a gzip of JSON lines ({exc})") from None
    rep, steps = None, []
    for no, ln in enumerate(text.splitlines(), 1):
        if not ln.strip():
            continue
        try:
            obj = json.loads(ln)
        except ValueError as exc:
            raise ValueError(f"{path}:{no}: not JSON ({exc})") from None
        if rep is None:
            if not isinstance(obj, dict) or not isinstance(obj.get("report"), dict):
                raise ValueError(f"{path}:{no}: no report line first (a packed run, bench.stall_replay --pack)")
            rep = obj["report"]
        elif not isinstance(obj, dict) or not isinstance(obj.get("closed_at_ns"), int):
            raise ValueError(f"{path}:{no}: not a step summary (no integer closed_at_ns)")
        else:
            steps.append(obj)
    if rep is None:
        raise ValueError(f"{path}: empty (a packed run, bench.stall_replay --pack)")
    return rep, sorted(steps, key=lambda s: s["closed_at_ns"])


def run_files(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """The kept runs' step files and the packed runs that ``paths`` name, each list sorted: under a folder
    every ``steps.jsonl`` beside a ``report.json`` (not bench.ttd's own copy in ``run/`` beside the run's)
    and every ``*.jsonl.gz``; a file named directly is a packed run when its name ends in ``.jsonl.gz``,
    else a kept run's step file, which needs its ``report.json`` beside it. Raises ValueError naming a path
    that does not exist, or a file that is neither."""
    kept: set[Path] = set()
    packed: set[Path] = set()
    for d in paths:
        if d.is_dir():
            found = {q for q in d.glob("**/steps.jsonl") if (q.parent / "report.json").exists()}
            kept |= {q for q in found if not (q.parent.name == "run" and (q.parents[1] / "steps.jsonl").exists())}
            packed |= set(d.glob("**/*.jsonl.gz"))
        elif not d.exists():
            raise ValueError(f"{d}: no such folder or file (kept runs: bench.ttd --keep DIR)")
        elif d.name.endswith(".jsonl.gz"):
            packed.add(d)
        elif (d.parent / "report.json").is_file():
            kept.add(d)
        else:
            raise ValueError(
                f"{d}: not a kept run's steps.jsonl (no report.json beside it: bench.ttd --keep DIR) nor a "
                "packed run (NAME.jsonl.gz, bench.stall_replay --pack)"
            )
    return sorted(kept), sorted(packed)


def running_age(s: dict, th) -> dict:
    """A running record kept before running records carried their step's age (f10ef77 and older:
    ``step_time_max_ns`` 0) with the least age the worker's check allows for it: ``max(th.running_min_ns,
    th.running_factor * baseline median)`` ns (``analysis.running_check`` sends none younger), and
    ``stall_ratio`` that over the median (0.0 without a baseline). A copy; ``s`` is left as it is."""
    med = int((s.get("baseline") or {}).get("median_ns") or 0)
    age = max(th.running_min_ns, int(th.running_factor * med))
    return {**s, "step_time_max_ns": age, "stall_ratio": round(age / med, 3) if med > 0 else 0.0}


def main(argv: list[str] | None = None) -> int:
    """Replay the kept runs under the folders given, or named (``run_files``); 0 when at least one run was
    read, 2 otherwise (no kept run there, said on stderr). Bad input exits 2 naming it (argparse): a path
    that does not exist, a file that is no run, a ``--base`` that is no checkout, ``--base`` or ``--wrong``
    with ``--pack``, a kept run's file that is not JSON (``read_run``)."""
    p = argparse.ArgumentParser(
        prog="python -m bench.stall_replay", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "dirs",
        nargs="*",
        type=Path,
        metavar="PATH",
        help="folders of kept runs (bench.ttd --keep DIR) or packed ones (*.jsonl.gz), or such a run's file named "
        f"directly: its steps.jsonl (report.json beside it) or its NAME.jsonl.gz; default {CORPUS}",
    )
    p.add_argument("--base", type=Path, help="a checkout of the commit to compare with")
    p.add_argument("--wrong", action="store_true", help="also list every wrong alert of this tree's side")
    p.add_argument(
        "--pack",
        type=Path,
        metavar="OUT",
        help="replay nothing: pack the kept runs under (or named by) PATH into OUT/*.jsonl.gz",
    )
    a = p.parse_args(argv)
    a.dirs = a.dirs or [CORPUS]
    if a.pack is not None and (a.base is not None or a.wrong):
        p.error(
            f"{'--base' if a.base is not None else '--wrong'}: only when replaying, not with --pack (which replays nothing)"
        )
    try:
        kept, packed = run_files(a.dirs)
    except ValueError as exc:
        p.error(str(exc))
    if a.pack is not None:
        if not a.pack.is_dir():
            p.error(f"--pack {a.pack}: no such folder")
        for d in a.dirs:
            if d.is_file() and d.name.endswith(".jsonl.gz"):
                p.error(f"{d}: packed already (--pack packs kept runs: their folders or steps.jsonl)")
        for q in kept:
            q = q.resolve()
            name = "-".join(q.parent.relative_to(q.parents[min(2, len(q.parents) - 1)]).parts)
            try:
                print(f"{a.pack / (name + '.jsonl.gz')}: {pack_run(q, a.pack / (name + '.jsonl.gz'))} bytes")
            except (OSError, ValueError) as exc:
                p.error(str(exc))
        return 0 if kept else 2
    if a.base is None:
        p.error("--base is required to replay (a checkout of the commit to compare with)")
    base_file = a.base / "obshub/streams/analysis/culprit.py"
    if not base_file.is_file():
        p.error(f"--base {a.base}: no obshub/streams/analysis/culprit.py there (a checkout of obshub?)")
    spec = importlib.util.spec_from_file_location("base_culprit", base_file)
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    from obshub.rules import fields
    from obshub.rules.engine import Engine
    from obshub.rules.loader import load_ruleset

    this = importlib.import_module("obshub.streams.analysis.culprit")  # the package exports a function of that name
    th = importlib.import_module("obshub.streams.analysis.thresholds").Thresholds()

    pack = load_ruleset([Path(__file__).resolve().parent.parent / "obshub/rules/builtin"])
    base_dir = a.base / "obshub/rules/builtin"
    base_pack = load_ruleset([base_dir]) if base_dir.is_dir() else pack

    def fire(steps: list[dict], pk=pack) -> list[dict]:
        """Every firing change of pack ``pk`` over ``steps`` (every rule)."""
        got: list[dict] = []
        eng = Engine(pk, got.append)
        for s in steps:
            eng.process("steps", fields.step_record(s))
            eng.tick(s["closed_at_ns"])
        eng.tick(steps[-1]["closed_at_ns"] + 60_000_000_000)
        return [c for c in got if c["status"] == "firing"]

    tot = dict.fromkeys(("runs", "closed", "changed", "base_right", "base_wrong", "right", "wrong"), 0)
    tot.update(all_base_right=0, all_base_wrong=0, all_right=0, all_wrong=0)
    tot.update(stalls=0, named_base=0, named=0, named_all_base=0, named_all=0)
    paths = kept + packed
    for sp in paths:
        try:
            rep, steps = read_packed(sp) if sp.name.endswith(".jsonl.gz") else read_run(sp)
        except (OSError, ValueError) as exc:
            p.error(str(exc))
        where = sp if sp.name.endswith(".jsonl.gz") else sp.parent
        if not steps:
            continue
        tot["runs"] += 1
        old, new = [], []
        recent: dict[str, tuple[collections.deque, collections.deque]] = {}
        sched_recent: dict[tuple[int, str], collections.deque] = {}
        # (side, job, step) -> network culprit of its latest running record, as that side's worker sent it
        running: dict[tuple[int, str, int], dict] = {}
        held: dict[tuple[int, str], dict | None] = {}  # (side, job) -> its step held for hosts alike
        mem_state: dict[tuple[int, str], dict] = {}  # (side, job) -> its memory episodes' state
        for s in steps:
            c = s.get("culprit")
            s_old: dict | None = s
            s_new: dict | None = s
            if s.get("closed_by") == "running":
                if not s.get("step_time_max_ns"):
                    s_old = s_new = s = running_age(s, th)
                # the running record each side's worker sends (running_rejudge, where that side has one: a
                # host behind its peers at its own work is not named by its network; None: no record)
                s_old = base.running_rejudge(s) if hasattr(base, "running_rejudge") else s
                s_new = this.running_rejudge(s)
                for side, s_x in ((base, s_old), (this, s_new)):
                    c_x = (s_x or {}).get("culprit")
                    if c_x and c_x.get("layer") == "network":  # the latest running record of the open step
                        running[(id(side), s.get("job", ""), s.get("step"))] = c_x
            if s.get("closed_by") in CLOSED and not (c and c.get("source") == "hang"):
                tot["closed"] += 1
                r_old, r_new = recent.setdefault(
                    s.get("job", ""),
                    (collections.deque(maxlen=base.PERSIST_STEPS), collections.deque(maxlen=this.PERSIST_STEPS)),
                )
                s_old, s_new = copy.deepcopy(s), copy.deepcopy(s)
                s_old["culprit"], s_new["culprit"] = base.culprit(s), this.culprit(s)
                # the worker's check of a sched culprit against its host's own recent steps (fold.py),
                # where that side has one, each side with its own
                for side, s_x in ((base, s_old), (this, s_new)):
                    if hasattr(side, "charge_starved"):
                        r_s = sched_recent.setdefault(
                            (id(side), s.get("job", "")), collections.deque(maxlen=side.SELF_STEPS)
                        )
                        r_s.append(side.charge_starved(s_x, r_s))
                # the worker's charge of a persistent fault's victims (fold.py), each side with its own
                old_c, k_old = base.charge_persistent(s_old, r_old)
                new_c, k_new = this.charge_persistent(s_new, r_new)
                r_old.append(k_old)
                r_new.append(k_new)
                # the worker's charge of a close to the network culprit its running record named (fold.py),
                # each side by its own rule: base ``stall`` and no culprit where it has no running_applies
                n = running.pop((id(base), s.get("job", ""), s.get("step")), None)
                if n is not None:
                    if getattr(base, "running_applies", None):
                        old_c = (
                            base.charge_running(n, old_c)
                            if base.running_applies({**s_old, "culprit": old_c}, n)
                            else old_c
                        )
                    elif old_c is None and s.get("stall"):
                        old_c = base.charge_running(n)
                n = running.pop((id(this), s.get("job", ""), s.get("step")), None)
                if n is not None and this.running_applies({**s_new, "culprit": new_c}, n):
                    new_c = this.charge_running(n, new_c)
                s_old["culprit"], s_new["culprit"] = old_c, new_c
                # the worker's hold of a step whose hosts stood out alike (fold.py), where that side has one,
                # each side with its own held step per job (a kept summary's own hold is dropped first)
                for side, s_x in ((base, s_old), (this, s_new)):
                    s_x.pop("ambiguous", None)
                    s_x.pop("unexplained_before", None)
                    if hasattr(side, "hold_ambiguous"):
                        hk = (id(side), s.get("job", ""))
                        held[hk] = side.hold_ambiguous(s_x, held.get(hk))
                # the worker's memory episodes (fold.py), where that side has them, each side with its own state
                for side, s_x in ((base, s_old), (this, s_new)):
                    s_x.pop("memory_episode", None)
                    if hasattr(side, "memory_episode"):
                        mk = (id(side), s.get("job", ""))
                        mem_state[mk] = side.memory_episode(s_x, mem_state.get(mk))
                if old_c != new_c:
                    tot["changed"] += 1
                    o, n = old_c or {}, new_c or {}
                    print(
                        f"changed {where} step {s['step']}: {o.get('host')} / {o.get('layer')} -> {n.get('host')} / {n.get('layer')}"
                    )
            if s_old is not None:
                old.append(s_old)
            if s_new is not None:
                new.append(s_new)
        eps = _episodes(rep, steps[-1]["closed_at_ns"])

        def right(c: dict, eps: list[tuple] = eps) -> bool:
            t, h, ly = c["starts_at_ns"], c["labels"].get("host"), c["labels"].get("layer")
            return any(eh == h and el == ly and lo <= t <= hi for _k, eh, el, lo, hi, _s in eps)

        all_base, all_new = fire(old, base_pack), fire(new)
        fired_base = [c for c in all_base if c["rule"] == "step_stall"]
        fired = [c for c in all_new if c["rule"] == "step_stall"]
        for tag, f in (("base_", fired_base), ("", fired)):
            for c in f:
                tot[tag + ("right" if right(c) else "wrong")] += 1
        for tag, f in (("all_base_", all_base), ("all_", all_new)):
            for c in f:
                tot[tag + ("right" if right(c) else "wrong")] += 1
        key = lambda c: (  # noqa: E731
            c["rule"],
            c["annotations"].get("step"),
            c["labels"].get("host"),
            c["labels"].get("layer"),
        )
        if a.wrong:
            for c in all_new:
                if not right(c):
                    print(f"wrong {where} {key(c)}: {c['annotations'].get('evidence', '')[:200]}")
        ka, kb = {key(c): c for c in all_base}, {key(c): c for c in all_new}
        for k in sorted(set(ka) ^ set(kb), key=str):
            c = ka.get(k) or kb.get(k)
            print(
                f"{'gone' if k in ka else 'new '} {'right' if right(c) else 'WRONG'} {where} {k[0]} step {k[1]} {k[2]} / {k[3]}"
            )
        for kind, h, ly, _lo, _hi, starts in eps:
            if not starts or not kind.startswith("stall:"):
                continue

            def named(f: list[dict], h=h, ly=ly, starts=starts) -> int:
                return sum(
                    any(
                        t0 <= c["starts_at_ns"] <= t0 + 5e9
                        and (c["labels"].get("host"), c["labels"].get("layer")) == (h, ly)
                        for c in f
                    )
                    for t0 in starts
                )

            nb, nn = named(fired_base), named(fired)
            ab, an = named(all_base), named(all_new)  # by any rule's right alert (bench.ttd's judge_stalls)
            tot["stalls"] += len(starts)
            tot["named_base"] += nb
            tot["named"] += nn
            tot["named_all_base"] += ab
            tot["named_all"] += an
            if nb != nn or ab != an:
                print(
                    f"stalls {where} {kind}@{h}: named {nb} -> {nn} of {len(starts)} by step_stall,"
                    f" {ab} -> {an} by any rule"
                )
    print(" ".join(f"{k}={v}" for k, v in tot.items()))
    if not tot["runs"]:
        print(f"no kept run (steps.jsonl beside report.json) under {' '.join(map(str, a.dirs))}", file=sys.stderr)
    return 0 if tot["runs"] else 2


if __name__ == "__main__":
    sys.exit(main())
