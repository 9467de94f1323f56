"""Where the number of the next training step comes from (docs/AGENT.md "Step numbers across restarts and
resumes").

The hooks of :mod:`obshub.instrument.hooks` count steps from 0 in every process. A job resumed from a
checkpoint after N optimizer steps should show steps N, N+1, ... in its new life, so the count follows the
training's own progress where it can be read without user code. Sources, in the order in which they win
when several name a number before the same step begins:

1. :func:`set_step` (``obshub.instrument.set_step(n)``): ``n`` steps are done, the step that runs the
   next optimizer step is step ``n`` (see the open-step rule below).
2. ``$OBSHUB_START_STEP=n`` (read by ``enable()``): the process's first step is step ``n``.
3. The optimizer's own count, read after every ``optimizer.load_state_dict()`` (the class method of
   ``torch.optim.Optimizer`` is wrapped): the largest ``state[p]["step"]`` of its parameters (Adam, AdamW,
   Adagrad, RMSprop, ... keep one; plain SGD, with or without momentum, keeps none and says nothing). N
   optimizer steps done make the next step N.
   PyTorch Lightning (``Trainer.fit(ckpt_path=...)``) and the Hugging Face Trainer
   (``resume_from_checkpoint``) restore the optimizer through ``load_state_dict``, so their resumed steps
   continue from the optimizer's count, which equals their ``global_step`` with one optimizer.

The open-step rule: N steps done, named while no step is open (before the loop), make the next step to
begin step N; named inside an open step (a rollback in the data phase of step s, announced as s), that
step is taken to be step N and the one after it is N + 1.

A number is applied at the next step begin (never renumbering a step already announced) and then
forgotten; later steps count on from it. A lower-ranked source never replaces a pending number of a
higher-ranked one. This module imports only the standard library; torch is passed in by ``enable()``.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable

from obshub.core.errors import ConfigError

log = logging.getLogger("obshub.instrument")

#: source name -> rank (higher wins over a pending number of a lower rank)
SOURCES = {"optimizer": 1, "env": 2, "set_step": 3}
ENV_VAR = "OBSHUB_START_STEP"

_lock = threading.Lock()
# the pending number: (step, source) or None. Read unlocked on the per-step path (a list item read).
_pending: list[tuple[int, str] | None] = [None]
_applied: list[tuple[int, str]] = []  # (step, source) of every number applied, for tests and debugging
_step_open: list[Callable[[], bool]] = [lambda: False]  # set by install(): whether a step is open now


def propose(step: int, source: str) -> bool:
    """Make ``step`` (an int >= 0) the number of the next step to begin, from ``source`` (a key of
    :data:`SOURCES`), unless a number of a higher-ranked source is pending. Returns whether it is now
    pending. Raises ValueError for a negative step or an unknown source."""
    if source not in SOURCES:
        raise ValueError(f"unknown step source {source!r}; known: {sorted(SOURCES)}")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step number {step!r} from {source} is not an integer >= 0")
    with _lock:
        cur = _pending[0]
        if cur is not None and SOURCES[cur[1]] > SOURCES[source]:
            return False
        _pending[0] = (step, source)
        return True


def steps_done(count: int, source: str) -> bool:
    """``count`` training steps are done (from ``source``): propose ``count`` as the next step's number,
    or ``count + 1`` when a step is open (the open-step rule of the module docstring). As
    :func:`propose`."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"step count {count!r} from {source} is not an integer >= 0")
    return propose(count + 1 if _step_open[0]() else count, source)


def take(next_step: int) -> int:
    """At a step begin (the hooks' lock held): the pending number, consumed, else ``next_step``."""
    if _pending[0] is None:
        return next_step
    with _lock:
        cur, _pending[0] = _pending[0], None
    if cur is None:
        return next_step
    _applied.append(cur)
    return cur[0]


def pending() -> tuple[int, str] | None:
    """The pending ``(step, source)``, None when no source named a number since the last step begin."""
    return _pending[0]


def applied() -> list[tuple[int, str]]:
    """Every ``(step, source)`` applied in this process, oldest first."""
    return list(_applied)


def reset() -> None:
    """Forget the pending number and the applied ones (tests)."""
    with _lock:
        _pending[0] = None
        _applied.clear()


def set_step(step: int) -> None:
    """``step`` training steps are done (an int >= 0): the step that runs the next optimizer step is step
    ``step`` and later steps count on from it, whatever the optimizer's state or ``$OBSHUB_START_STEP``
    say. Call it after restoring a checkpoint, with the number of steps the checkpoint had done (before
    the loop: the first step is ``step``; inside a step: that step is taken to be ``step``, the next is
    ``step + 1``). Raises ValueError for anything but an int >= 0."""
    steps_done(step, "set_step")


def start_step_from_env(environ: Any = None) -> int | None:
    """``$OBSHUB_START_STEP`` as an int (None when unset or blank). Raises ConfigError naming the
    variable for anything but an integer >= 0."""
    raw = (os.environ if environ is None else environ).get(ENV_VAR, "").strip()
    if raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(
            f"{ENV_VAR}={raw!r} is not an integer >= 0",
            hint="set it to the number of training steps the resumed checkpoint had done, or unset it",
        )
    return value


def optimizer_step_count(optimizer: Any) -> int | None:
    """The optimizer's own count of steps done: the largest ``state[p]["step"]`` (a tensor or number) of
    its parameters, None when no parameter state holds one (SGD) or a value is not a finite number."""
    best: int | None = None
    state = getattr(optimizer, "state", None)
    if not state:
        return None
    for per_param in state.values():
        if not isinstance(per_param, dict) or "step" not in per_param:
            continue
        raw = per_param["step"]
        try:
            value = float(raw.item() if hasattr(raw, "item") else raw)
        except (TypeError, ValueError, RuntimeError):
            return None
        if value != value or value in (float("inf"), float("-inf")) or value < 0:
            return None
        if best is None or int(value) > best:
            best = int(value)
    return best


def wrap_load_state_dict(orig: Callable) -> Callable:
    """``Optimizer.load_state_dict`` that, after loading, names the optimizer's count
    (:func:`optimizer_step_count`) as the steps done (:func:`steps_done`). Reading the count never raises
    into the training code."""

    def load_state_dict(self, state_dict, *args, **kwargs):
        result = orig(self, state_dict, *args, **kwargs)
        try:
            count = optimizer_step_count(self)
            if count is not None:
                steps_done(count, "optimizer")
        except Exception:  # noqa: BLE001 - instrumentation must not break training
            log.exception("obshub: reading the step count of a loaded optimizer failed; steps count on")
            from obshub.instrument import usdt  # the catch path only (obshub_agent_caught_errors_total)

            usdt.caught("load_state_dict")
        return result

    load_state_dict.__obshub_wrapped__ = orig  # type: ignore[attr-defined]
    load_state_dict.__doc__ = orig.__doc__
    load_state_dict.__name__ = getattr(orig, "__name__", "load_state_dict")
    return load_state_dict


def install(torch: Any, step_open: Callable[[], bool]) -> Callable[[], None]:
    """Wrap ``torch.optim.Optimizer.load_state_dict`` and apply ``$OBSHUB_START_STEP`` (the first step's
    number); ``step_open()`` tells whether a step is open now. Returns the undo. Raises ConfigError for a
    bad ``$OBSHUB_START_STEP`` (before wrapping anything)."""
    start = start_step_from_env()
    if start is not None:
        propose(start, "env")
    _step_open[0] = step_open
    cls = torch.optim.Optimizer
    orig = cls.__dict__["load_state_dict"]
    cls.load_state_dict = wrap_load_state_dict(orig)

    def undo() -> None:
        cls.load_state_dict = orig
        _step_open[0] = lambda: False

    return undo
