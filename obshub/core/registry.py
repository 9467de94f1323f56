"""The component registry: one JSON record per running obshub component under ``$OBSHUB_HOME/run``
(``run/<name>.json`` with ``name``, ``pid``, ``started`` and free-form details such as the log path).

Every long-running component (agent, stream worker, rule engine, the broker) registers itself at start
and unregisters at exit; ``obshub status`` lists the records and ``obshub down`` stops their pids.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from obshub.core.settings import Settings


def pid_alive(pid: int) -> bool:
    """True when process ``pid`` exists and is not a zombie (a process whose main thread ended while
    others still run is alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child still "exists"; treat it as dead. A process whose main thread ended while other
    # threads run (a worker's shutdown in its threads) shows its leader as a zombie too: it is alive while
    # any of its tasks (/proc/PID/task/TID) is not a zombie.
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split(") ", 1)[1][0] != "Z":
                return True
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                if f.read().split(") ", 1)[1][0] != "Z":
                    return True
        except (OSError, IndexError):
            continue
    return False


def register_component(settings: Settings, name: str, pid: int, **info: Any) -> Path:
    """Record that component ``name`` runs as ``pid`` (for ``obshub status`` and ``obshub down``).
    ``info`` may carry e.g. the log path. Returns the record's path."""
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    path = settings.run_dir / f"{name}.json"
    path.write_text(json.dumps({"name": name, "pid": pid, "started": time.time(), **info}))
    return path


def update_component(settings: Settings, name: str, **info: Any) -> bool:
    """Merge ``info`` into the record of ``name`` (e.g. ``ready=True`` once a worker recovered its tables),
    keeping its ``pid`` and ``started``; the file is replaced whole (a reader never sees half of it).
    Returns False when there is no readable record (it was removed: nothing is written)."""
    path = settings.run_dir / f"{name}.json"
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    tmp = path.with_name(f".{name}.json.{os.getpid()}")
    tmp.write_text(json.dumps({**rec, **info}))
    os.replace(tmp, path)
    return True


def free_name(settings: Settings, base: str) -> str:
    """The first of ``base``, ``base-2``, ``base-3``, ... that no running component holds, so a second
    instance of a component beside the first gets its own record (``obshub down`` stops both). A stale
    record (its pid gone) is free."""
    running = {c["name"] for c in components(settings) if c["running"]}
    n, name = 1, base
    while name in running:
        n += 1
        name = f"{base}-{n}"
    return name


def unregister_component(settings: Settings, name: str) -> None:
    """Remove ``name``'s record (a component that stops by itself calls this)."""
    (settings.run_dir / f"{name}.json").unlink(missing_ok=True)


def forget_exited(settings: Settings, pids: Iterable[int]) -> list[str]:
    """Remove the record of every component that ran as one of ``pids`` and has exited: one stopped by
    force before it could remove its own (``obshub demo`` stops its agents and parts after a few seconds'
    grace, then SIGKILLs them), so ``obshub status`` does not list a finished run's components as stale.
    Records of live processes and of other pids stay. Returns the names removed."""
    wanted = set(pids)
    gone = [c["name"] for c in components(settings) if int(c.get("pid", 0)) in wanted and not c["running"]]
    for name in gone:
        unregister_component(settings, name)
    return gone


def components(settings: Settings) -> list[dict]:
    """Every registered component with ``running`` true/false; stale records stay listed as not running."""
    out = []
    if settings.run_dir.exists():
        for p in sorted(settings.run_dir.glob("*.json")):
            try:
                rec = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            rec["running"] = pid_alive(int(rec.get("pid", 0)))
            out.append(rec)
    return out
