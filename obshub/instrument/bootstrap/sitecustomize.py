"""obshub run's bootstrap: ``obshub run`` prepends this folder to PYTHONPATH, so every Python process of
the command (the launcher, each torchrun worker, their children) imports this ``sitecustomize`` at start.

It costs nothing for programs without torch: it only installs a one-shot import watcher. When ``torch``
is imported, the watcher lets the import finish and then calls ``obshub.instrument.enable()`` (job and
host id from ``OBSHUB_JOB`` / ``OBSHUB_HOST_ID``). If that fails (another interpreter without obshub
installed, a bad setting), one ``obshub:`` line goes to stderr and the program runs uninstrumented; the
agent counts it (the ``obshub:caught`` probe, ``where="instrument_enable"``) when the library loads.
A ``sitecustomize`` that this one shadows (later on sys.path) is still run.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _caught(where):
    """Fire the USDT probe ``obshub:caught`` (the agent counts it: ``obshub_agent_caught_errors_total
    {where="instrument_<where>"}``) when the instrumentation library loads here; else nothing."""
    try:
        from obshub.instrument import _usdt
    except ImportError:  # another interpreter without obshub, or the library not built: nothing to tell
        return
    _usdt.caught(where)


def _enable_instrumentation():
    try:
        from obshub import instrument

        instrument.enable()
    except Exception as exc:  # noqa: BLE001 - never break the user's program
        print(f"obshub: instrumentation not enabled in pid {os.getpid()}: {exc}", file=sys.stderr)
        _caught("enable")


class _TorchImportWatcher(importlib.abc.MetaPathFinder):
    """Finds nothing itself: on the first ``import torch`` it wraps torch's loader so that
    instrumentation is enabled right after torch's own ``__init__`` ran."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        orig_exec = loader.exec_module

        def exec_module(module):
            orig_exec(module)
            _enable_instrumentation()

        loader.exec_module = exec_module
        return spec


def _chain_shadowed_sitecustomize():
    """Run the ``sitecustomize`` this module hides, if any (a venv's or the distribution's)."""
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the same tolerance site.py shows
        print(f"obshub: the shadowed sitecustomize {spec.origin} failed: {exc}", file=sys.stderr)
        _caught("sitecustomize")


_OFF = ("0", "false", "no", "off")
_ON = ("", "1", "true", "yes", "on")
_WARNED = "OBSHUB_INSTRUMENT_WARNED"
"""Set by the first process that judged an unknown ``OBSHUB_INSTRUMENT`` (to its value): the processes it
starts inherit it and stay silent."""


def _says_unknown(raw):
    """Whether this process writes the line on an unknown ``OBSHUB_INSTRUMENT`` value ``raw``: once per
    process tree and host, not once per process (``obshub run -- torchrun --nproc-per-node 8`` wrote it 9
    times, the launcher's and each rank's). Not when a parent process already did (``OBSHUB_INSTRUMENT_WARNED``
    is ``raw``: torchrun's launcher judges it before it starts the ranks), nor in a rank other than a
    host's first when nothing of obshub's ran before it (``LOCAL_RANK``, else ``RANK``, set and not 0:
    ranks started each on its own, by a script or another launcher). Each host that has the value says it
    once: hosts may differ in it."""
    if os.environ.get(_WARNED) == raw:
        return False
    os.environ[_WARNED] = raw
    for var in ("LOCAL_RANK", "RANK"):
        rank = os.environ.get(var)
        if rank is not None:
            return rank.strip() == "0"
    return True


def _wanted():
    """False when ``OBSHUB_INSTRUMENT`` is 0, false, no or off (any case, spaces around ignored); True
    when unset, empty, 1, true, yes or on; any other value keeps the instrumentation on with one
    ``obshub:`` line on stderr naming it (``false`` used to mean on: only ``0`` was off), written once
    per process tree and host (``_says_unknown``)."""
    raw = os.environ.get("OBSHUB_INSTRUMENT", "1")
    value = raw.strip().lower()
    if value in _OFF:
        return False
    if value not in _ON and _says_unknown(raw):
        print(
            f"obshub: OBSHUB_INSTRUMENT={raw!r} is neither 0/false/no/off nor 1/true/yes/on; instrumentation "
            "stays on (set OBSHUB_INSTRUMENT=0 to turn it off)",
            file=sys.stderr,
        )
    return True


if _wanted():
    if "torch" in sys.modules:
        _enable_instrumentation()
    else:
        sys.meta_path.insert(0, _TorchImportWatcher())
_chain_shadowed_sitecustomize()
