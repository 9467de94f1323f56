"""In-process PyTorch instrumentation: fires obshub's USDT probes (``obshub.instrument.usdt``) from global PyTorch
hooks and keeps the current TraceKey of every thread.

``enable()`` installs, process-wide and without touching the training script:

* **step boundaries** from the global optimizer step hooks
  (``torch.optim.optimizer.register_optimizer_step_pre_hook`` / ``..._post_hook``): the post-hook of the
  outermost ``optimizer.step()`` that ends the training iteration (every one with a single optimizer;
  see "several optimizers") fires ``step_end(N)`` and at once ``step_begin(N+1)`` and
  ``phase_begin("data")``, so data loading (the time from the end of one step to the next forward) is
  inside the step that consumes the data. Step 0 begins at the first root forward, because the start of
  the training loop is unknown; it has no data phase. Steps count training iterations from 0.
* **phases**: ``forward`` begins at a *root* module call (a per-thread depth counter keeps nested
  modules silent: ``torch.nn.modules.module.register_module_forward_pre_hook`` / ``forward_hook``) and
  lasts until the next phase begins, so the model and then the loss module (also a root call) make one
  forward phase; ``backward`` is a ``torch.autograd.backward`` call (what ``Tensor.backward`` calls;
  wrapped), wherever it runs (inside a module's forward too, as in PyTorch Lightning's manual
  optimisation), and otherwise (``torch.autograd.grad``) from a gradient hook on a root output (the first
  gradient computed) to an autograd end-of-pass callback (``Variable._execution_engine.queue_callback``);
  ``optimizer`` is the parameter update: the outermost ``optimizer.step()``, or, for
  ``optimizer.step(closure)``, from the closure's return to the step's end (the pre-hook replaces the
  closure by a wrapper, so the closure's forward and backward are phases of their own: PyTorch
  Lightning's automatic optimisation, LBFGS). Under gradient accumulation each micro-batch makes its own
  forward/backward pair. LBFGS re-evaluates the closure inside one ``step()``: each evaluation is another
  forward/backward pair followed by another optimizer phase in the same step. Forwards during backward
  (activation checkpointing) stay in the backward phase.
* **several optimizers**: a step is one training iteration. ``OBSHUB_OPTIMIZERS_PER_STEP=K`` (or
  ``enable(optimizers_per_step=K)``) makes every K-th outermost ``optimizer.step()`` end the step. Without
  it the cycle is learned: until an optimizer steps a second time every ``optimizer.step()`` ends a step
  (one optimizer: exactly one step per iteration from the start); at the first repeat, the optimizers
  that stepped since that optimizer's previous step are the cycle, and from then on only the step of the
  cycle's last optimizer ends the step; an optimizer outside the cycle (one created later) starts the
  learning again. So a GAN (two optimizers) counts its first iteration as two steps, then one per
  iteration; set ``OBSHUB_OPTIMIZERS_PER_STEP=2`` to count from the start.
* **collectives**: a kernel at the ``BackendSelect`` dispatch key of every op of the ``c10d``
  dispatcher namespace that takes a ProcessGroup (:func:`c10d_ops`, read from the dispatcher's registry:
  ``allreduce_``, ``_allgather_base_``, ``_reduce_scatter_base_``, ``send``, ``recv_``, ...). Every
  ProcessGroup method runs through these ops, whoever calls it: the ``torch.distributed`` functions,
  functional collectives (``torch.ops._c10d_functional``: DTensor, FSDP2, compiled graphs), DDP's C++
  reducer (compiled or not), FSDP1/FSDP2, pipeline send/recv. ``BackendSelect`` is in the dispatcher's
  default-included key set, so inference mode and below-autograd guards do not skip it; the kernel
  redispatches to the keys after it (the backend's kernel). Fake and meta tensors (tracing) and an op
  issued inside another are not counted. Probe op names are the ``torch.distributed`` names
  (:data:`OP_NAMES`; ``isend``/``irecv`` are ``send``/``recv``: the dispatcher cannot tell them apart);
  ``bytes`` is the size of the op's input tensor(s) (a scatter's output, a broadcast's, send's or recv's
  tensor), 0 for barriers. Sequence
  numbers ``coll_seq`` count per process-group name from 0 and are the same on every rank because ranks
  issue collectives of a group in the same order. Point-to-point ops count on their own pair, named
  ``"<pg>:p2p:<lo>-<hi>"`` in group ranks (``"<pg>:p2p:any"`` for a recv from any source).
  The kernel is C++ (``obshub.instrument._c10d_kernel``, obshub/instrument/_c10d_kernel.cpp: no boxing
  into Python, no GIL) when it is built and loads, else the Python kernel of :func:`_make_kernel`
  (``OBSHUB_COLLECTIVE_KERNEL``: ``auto``, ``python``, ``native``; :func:`collective_kernel`); both fire
  the same probe sites with the same arguments.
  ``coll_end`` fires when the op's Work future completes (at once for a Work without one). On CPU/gloo
  that is completion; on CUDA/NCCL it is the enqueue (PyTorch completes NCCL futures at enqueue; GPU
  completion is the CUDA/NCCL probes' to see).
* **registration**: ``register`` fires once per process, when ``torch.distributed`` is initialised
  (wrapped ``init_process_group``, or at ``enable()`` when it already is); a process that reaches its
  first step without it (single-process training) registers then as rank ``$RANK`` (0) of
  ``$WORLD_SIZE`` (1). It fires again, with the same arguments, at the first step boundary after a tracer
  attached to it: a uprobe turns the probe site's NOP into a breakpoint (on Linux 6.18+, after its first
  hit, into a call of the kernel's uprobe trampoline), which the process sees in its own memory
  (``usdt.site_traced``, x86-64), so a node agent that started, or followed this process's copy of
  the extension, after the registration still learns the process and its job.

TraceKeys follow ``obshub.core.schema.make_trace_key(host_id, step, op_seq)``: ``op_seq`` is 0 for the step
itself and counts every phase and collective of the step from 1. Outside a step (before the first one)
``step`` is -1 and the key's 16-bit step field is 0xFFFF (``-1 & 0xFFFF``). Every change of a thread's
current key reaches the agent's BPF map ``tid -> (trace_key, step)``, so the map is exact: ``step_begin``,
``phase_begin`` and ``coll_begin`` carry the thread's new key themselves, ``phase_end`` restores the step's
key (its own key with ``op_seq`` 0), and any other change fires ``tracekey(key, step)``. Each probe site
costs a uprobe trap (a few µs) while an agent is attached, so none fires twice for one change.

Merged probes: where probes fall at one instant, ``phase_next`` stands for a phase's end and the next
phase's begin (data -> forward, forward -> backward) and ``step_next`` for the step boundary (the open
phase's end, ``step_end(N)``, ``step_begin(N+1)``, ``phase_begin("data")``), with the same arguments. They
are fired only while a tracer is attached to them: at every step boundary the hooks read both probe
sites (``usdt.site_traced``) and until the next boundary use a merged probe where it is traced, the
separate probes otherwise, so a tracer that knows only the separate probes sees them all.

Host id: ``OBSHUB_HOST_ID`` (0..65535) if set, else the rank (known at registration; ``$RANK`` or 0 before
it). Job: the ``job`` given to ``enable()``, else what the workload's environment names when the process
registers (:func:`obshub.core.workload.resolve_job`: ``OBSHUB_JOB``, the Slurm job, the torchrun run, a pod
label, else ``"default"``); the register probe carries it, and the node agent files every event of the
process under it.

Limits: the last ``step_begin`` of a process has no ``step_end`` (the loop ended in its data
phase; ``phase_end("data")`` fires at exit). Hooks never raise into the training program: an internal
error is logged once per hook on the ``obshub.instrument`` logger and the hook does nothing more.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import logging
import os
import threading
import weakref
from typing import Any, Callable

from obshub.core import workload
from obshub.core.errors import ConfigError
from obshub.instrument import stepsource, usdt

log = logging.getLogger("obshub.instrument")

_NO_STEP_FIELD = 0xFFFF  # the TraceKey step field outside a step (-1 & 0xFFFF)


class _State:
    """Process-wide instrumentation state; every field is guarded by ``_lock``."""

    def __init__(self) -> None:
        self.enabled = False
        self.job = ""  # "" = resolved from the environment at registration
        self.host_id = 0
        self.host_id_explicit = False
        self.registered = False
        self.reg_args: tuple = ()  # what the register probe carried
        self.reg_site: int | None = None  # the register probe's site (usdt.probe_site), None: unknown
        self.traced = False  # a tracer was attached at the register probe when it last fired
        self.step = -1  # the open step, -1 when none
        self.next_step = 0
        self.op_seq = 0
        self.step_key = 0
        self.phase: str | None = None
        self.phase_key = 0
        # the merged probes' sites (usdt.probe_site) and whether a tracer was attached to each at the
        # last step boundary: then a phase change fires phase_next, a step boundary step_next
        self.next_sites: tuple[int | None, int | None] = (None, None)
        self.merge_phase = False
        self.merge_step = False
        self.coll_seq: dict[str, int] = {}
        # the training iteration with several optimizers: optimizer steps per iteration when set
        # (OBSHUB_OPTIMIZERS_PER_STEP), else the learned optimizer that closes the cycle (id())
        self.per_step = 0
        self.opt_count = 0
        self.closer: int | None = None
        self.opt_order: list[int] = []
        self.cycle: set[int] = set()
        self.undo: list[Callable[[], None]] = []  # what disable() runs, in reverse order


_lock = threading.RLock()
_st = _State()
_tls = threading.local()
_warned: set[str] = set()


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) gets a fresh lock: another thread may have held it at fork."""
    global _lock
    _lock = threading.RLock()


os.register_at_fork(after_in_child=_after_fork_in_child)


# --------------------------------------------------------------------------------------------------------
# TraceKeys and the per-thread current key
# --------------------------------------------------------------------------------------------------------
def _key(step: int, op_seq: int) -> int:
    """The TraceKey of ``op_seq`` in ``step`` (-1 = outside a step) for this process's host id."""
    step16 = _NO_STEP_FIELD if step < 0 else step & 0xFFFF
    return (_st.host_id << 48) | (step16 << 32) | (op_seq & 0xFFFF_FFFF)


def _set_thread_key(key: int, step: int, announced: bool = False) -> None:
    """Make ``key`` the calling thread's current TraceKey; fires ``tracekey`` only when it changes and the
    probe just fired did not already set it in the agent's map (``announced``: step_begin, phase_begin,
    coll_begin set the key they carry, phase_end the step's key)."""
    if getattr(_tls, "key", None) != key:
        _tls.key = key
        _tls.step = step
        if _native is not None:  # the C++ kernel restores it after each collective of this thread
            _native.set_thread_key(key, step)
        if not announced:
            usdt.tracekey(key, step)


def current_trace_key() -> tuple[int, int]:
    """``(trace_key, step)`` the calling thread carries now: ``(0, -1)`` before it took part in anything."""
    return getattr(_tls, "key", 0), getattr(_tls, "step", -1)


def _next_op_locked() -> int:
    if _native is not None:  # collectives count in the C++ kernel: one sequence for both
        _st.op_seq = _native.next_op()
    else:
        _st.op_seq += 1
    return _key(_st.step, _st.op_seq)


def _sync_native_locked() -> None:
    """Tell the C++ kernel (when installed) the open step, its op counter and the host id."""
    if _native is not None:
        _native.set_state(_st.step, _st.op_seq, _st.host_id)


# --------------------------------------------------------------------------------------------------------
# steps and phases (callers hold _lock)
# --------------------------------------------------------------------------------------------------------
def _register_before_step_locked() -> None:
    if not _st.registered:
        _register_undistributed_locked()
    elif _st.reg_site is not None:
        _register_again_if_traced_locked()


def _begin_step_locked() -> None:
    _register_before_step_locked()
    _st.next_step = stepsource.take(_st.next_step)  # a resumed count (obshub/instrument/stepsource.py)
    _st.step = _st.next_step
    _st.next_step += 1
    _st.op_seq = 0
    _sync_native_locked()
    _st.step_key = _key(_st.step, 0)
    usdt.step_begin(_st.step, _st.step_key)
    _set_thread_key(_st.step_key, _st.step, announced=True)


def _end_step_locked() -> None:
    if _st.step < 0:
        return
    _phase_end_locked(None)
    usdt.step_end(_st.step, _st.step_key)
    _st.step = -1
    _sync_native_locked()


def _merge_check_locked() -> None:
    """At a step boundary: is a tracer attached to ``phase_next`` / ``step_next`` (a byte read per site,
    :func:`obshub.instrument.usdt.site_traced`)? Until the next boundary, phase changes and the boundary
    fire the merged probe when it is traced, else the separate probes: a tracer that attaches only those
    still sees every phase and step."""
    phase_site, step_site = _st.next_sites
    _st.merge_phase = phase_site is not None and usdt.site_traced(phase_site)
    _st.merge_step = step_site is not None and usdt.site_traced(step_site)


def _step_boundary_locked(next_phase: str) -> None:
    """End the open phase (the optimizer's) and the step, begin the next step in phase ``next_phase``: one
    ``step_next`` when it is traced and a phase is open, else the separate probes."""
    _st.next_step = stepsource.take(_st.next_step)  # a resumed count: then the separate probes
    if _st.merge_step and _st.phase is not None and _st.step >= 0 and _st.next_step == _st.step + 1:
        old, old_key, step, key = _st.phase, _st.phase_key, _st.step, _st.step_key
        _st.phase = None
        _register_before_step_locked()
        _st.step = _st.next_step
        _st.next_step += 1
        _st.op_seq = 0
        _sync_native_locked()
        _st.step_key = _key(_st.step, 0)
        _st.phase = next_phase
        _st.phase_key = _next_op_locked()
        usdt.step_next(step, key, _st.step_key, old, old_key, next_phase, _st.phase_key)
        _set_thread_key(_st.phase_key, _st.step, announced=True)
    else:
        _end_step_locked()
        _begin_step_locked()
        _phase_begin_locked(next_phase)
    _merge_check_locked()


def _phase_begin_locked(phase: str) -> None:
    if _st.phase is not None:
        if _st.merge_phase and _st.step >= 0:
            old, old_key = _st.phase, _st.phase_key
            _st.phase = phase
            _st.phase_key = _next_op_locked()
            usdt.phase_next(old, phase, _st.step, old_key, _st.phase_key)
            _set_thread_key(_st.phase_key, _st.step, announced=True)
            return
        _phase_end_locked(None)
    if _st.step < 0:
        _begin_step_locked()
    _st.phase = phase
    _st.phase_key = _next_op_locked()
    usdt.phase_begin(phase, _st.step, _st.phase_key)
    _set_thread_key(_st.phase_key, _st.step, announced=True)


def _phase_end_locked(phase: str | None) -> None:
    """End the open phase (only if it is ``phase``, when given)."""
    if _st.phase is None or (phase is not None and _st.phase != phase):
        return
    usdt.phase_end(_st.phase, _st.step, _st.phase_key)
    _st.phase = None
    # phases only run inside a step, so the step's key is the phase key with op_seq 0: phase_end set it
    _set_thread_key(_st.step_key if _st.step >= 0 else _key(-1, 0), _st.step, announced=_st.step >= 0)


def _guarded(fn: Callable) -> Callable:
    """Run a hook body; an internal error is logged once per hook and never reaches the training code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception:  # noqa: BLE001 - instrumentation must not break training
            _caught("hook")
            if fn.__name__ not in _warned:
                _warned.add(fn.__name__)
                log.exception("obshub instrumentation hook %s failed; it keeps running without it", fn.__name__)
            return None

    return wrapper


# --------------------------------------------------------------------------------------------------------
# global module and optimizer hooks
# --------------------------------------------------------------------------------------------------------
# The per-call hot path (issue #34; docs/ARCHITECTURE.md "the price of watching a step"): global module
# hooks take every module call off PyTorch's fast path (~3.5 µs a call here, ~1 ms a step of a 24-block
# transformer). They are installed for discovery only: every module called at depth 1 (a root) gets the two
# hooks of its own, and once a step has ended with a root forward in it the global hooks are removed, so
# inner modules run hook-free. A step that ends without any root forward (a new model?) installs them
# again for the next step. A root module first called after discovery is not seen (its forward stays in the
# phase open then).
_global_mod: list = []  # handles of the global module hooks while installed
_roots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # root module -> handles of its own hooks
_fwd_seen = [False]  # a root forward began since the last step boundary


def _install_global_module_hooks() -> None:
    import torch.nn.modules.module as nn_module

    if not _global_mod:
        _global_mod.append(nn_module.register_module_forward_pre_hook(_forward_pre_hook))
        _global_mod.append(nn_module.register_module_forward_hook(_forward_hook, always_call=True))


def _remove_module_hooks() -> None:
    """Remove the global module hooks and every root's own hooks (disable())."""
    while _global_mod:
        _global_mod.pop().remove()
    for handles in list(_roots.values()):
        for h in handles:
            h.remove()
    _roots.clear()


def _root_pre_hook(module, args) -> None:
    if not _global_mod:  # while the global hooks are there, they do the work
        _forward_pre_hook(module, args)


def _root_hook(module, args, output) -> None:
    if not _global_mod:
        _forward_hook(module, args, output)


def _adopt_root(module) -> None:
    """Give a module called at depth 1 hooks of its own (once)."""
    if _global_mod and module not in _roots:
        try:
            _roots[module] = (
                module.register_forward_pre_hook(_root_pre_hook),
                module.register_forward_hook(_root_hook, always_call=True),
            )
        except TypeError:  # not weak-referenceable (no nn.Module is): seen while the global hooks are there
            pass


def _rearm_at_step_boundary() -> None:
    """After a step: drop the global module hooks once a root forward was seen; put them back when a step
    had none. Never while a forward is running in this thread (a step that ends inside a module's forward:
    PyTorch Lightning's manual optimisation steps inside ``training_step``): the global post-hooks of the
    modules still open would never run, and the forward depth would stay off by their number."""
    if _global_mod and _fwd_seen[0] and len(_roots) and getattr(_tls, "fwd_depth", 0) == 0:
        while _global_mod:
            _global_mod.pop().remove()
    elif not _global_mod and not _fwd_seen[0] and _st.enabled:
        _install_global_module_hooks()
    _fwd_seen[0] = False


@_guarded
def _forward_pre_hook(module, args) -> None:
    depth = getattr(_tls, "fwd_depth", 0) + 1
    _tls.fwd_depth = depth
    if depth != 1:
        return
    _fwd_seen[0] = True
    _adopt_root(module)
    with _lock:
        if _st.phase == "backward" or (_st.phase == "optimizer" and not _tls.__dict__.get("in_closure")):
            _tls.fwd_nested = True  # recomputation or an optimizer closure: stays in that phase
            return
        _tls.fwd_nested = False
        if _st.phase != "forward":  # the loss module after the model: the same forward phase
            _phase_begin_locked("forward")
            _tls.bwd_hooked = False


@_guarded
def _forward_hook(module, args, output) -> None:
    depth = getattr(_tls, "fwd_depth", 1) - 1
    _tls.fwd_depth = max(depth, 0)
    if depth != 0 or getattr(_tls, "fwd_nested", False):
        return
    # one backward-start hook per forward phase: on the first root output that has a graph
    if output is not None and not _tls.__dict__.get("bwd_hooked") and _torch.is_grad_enabled():
        tensor = _first_grad_tensor(output)
        if tensor is not None:
            # a pre-hook of the node that computes the output's gradient: the moment a tensor hook fires,
            # without Tensor.register_hook's Python (its hook dict and handle: ~2.4 vs ~1.6 µs)
            tensor.grad_fn.register_prehook(_on_backward_start)
            _tls.bwd_hooked = True


def _first_grad_tensor(obj: Any, depth: int = 0):
    """The first tensor with a ``grad_fn`` in a module output (tensor, list/tuple, dict; 3 levels)."""
    if isinstance(obj, _torch.Tensor):
        return obj if obj.grad_fn is not None else None
    if depth < 3:
        items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
        for item in items:
            found = _first_grad_tensor(item, depth + 1)
            if found is not None:
                return found
    return None


@_guarded
def _on_backward_start(grad_outputs) -> None:
    with _lock:
        if _st.phase == "backward" or (_st.phase == "optimizer" and not _tls.__dict__.get("in_closure")):
            return
        _phase_begin_locked("backward")
    _torch.autograd.Variable._execution_engine.queue_callback(_on_backward_end)


@_guarded
def _on_backward_end() -> None:
    with _lock:
        _phase_end_locked("backward")


@_guarded
def _optimizer_pre_hook(optimizer, args, kwargs):
    """Outermost ``optimizer.step()``: without a closure the optimizer phase begins now; with one
    (``step(closure)``: LBFGS, PyTorch Lightning's automatic optimisation) the closure is replaced by
    :func:`_closure_wrapper`, so its forward and backward are phases of their own and the optimizer
    phase begins when the closure returns."""
    depth = getattr(_tls, "opt_depth", 0) + 1
    _tls.opt_depth = depth
    if depth != 1:
        return None
    # args are step()'s own: (self, closure, ...)
    closure = kwargs.get("closure") if "closure" in kwargs else args[1] if len(args) > 1 else None
    if closure is None or not callable(closure):
        with _lock:
            _phase_begin_locked("optimizer")
        return None
    wrapped = functools.partial(_closure_wrapper, closure)
    if "closure" in kwargs:
        return args, {**kwargs, "closure": wrapped}
    return (args[0], wrapped, *args[2:]), kwargs


def _closure_wrapper(closure: Callable):
    """Run an optimizer's closure (its forward and backward open their phases as anywhere else), then
    begin the optimizer phase: the parameter update follows the closure. A closure the optimizer calls
    again (LBFGS line search) makes another forward/backward pair and optimizer phase in the same step."""
    _tls.in_closure = getattr(_tls, "in_closure", 0) + 1
    try:
        result = closure()
    finally:
        _tls.in_closure -= 1
    try:
        with _lock:
            if _st.phase != "optimizer":
                _phase_begin_locked("optimizer")
    except Exception:  # noqa: BLE001 - instrumentation must not break training
        _caught("closure")
        _warn_once("closure")
    return result


@_guarded
def _optimizer_post_hook(optimizer, args, kwargs) -> None:
    depth = getattr(_tls, "opt_depth", 1) - 1
    _tls.opt_depth = max(depth, 0)
    if depth == 0:
        with _lock:
            if _ends_iteration_locked(_optimizer_key(optimizer)):
                _step_boundary_locked("data")
                _rearm_at_step_boundary()
            else:
                _phase_end_locked("optimizer")


_opt_keys = itertools.count(1)


def _optimizer_key(optimizer) -> int:
    """A number that names ``optimizer`` for as long as the process runs: never reused, unlike ``id()``,
    which a new optimizer may get from a freed one (a second training stage would then look like a
    member of the old cycle)."""
    key = optimizer.__dict__.get("_obshub_key")
    if key is None:
        key = optimizer.__dict__["_obshub_key"] = next(_opt_keys)
    return key


def _ends_iteration_locked(opt_id: int) -> bool:
    """Whether this ``optimizer.step()`` ends the training iteration (see "Several optimizers" in the
    module docstring): every ``optimizers_per_step``-th step when set, else the step of the optimizer
    that closes the learned cycle (every step until the cycle is known)."""
    if _st.per_step:
        _st.opt_count += 1
        if _st.opt_count >= _st.per_step:
            _st.opt_count = 0
            return True
        return False
    if _st.closer is not None and opt_id not in _st.cycle:
        _st.closer, _st.opt_order = None, []  # an optimizer outside the cycle (a new one): learn again
    if _st.closer is None:
        order = _st.opt_order
        if opt_id in order:  # the first repeat: the cycle is what stepped since its previous step
            cycle = order[order.index(opt_id) :]
            _st.closer, _st.cycle = cycle[-1], set(cycle)
            _st.opt_order = []
            return opt_id == _st.closer
        order.append(opt_id)
        return True
    return opt_id == _st.closer


def _wrap_backward(orig: Callable) -> Callable:
    """``torch.autograd.backward`` (what ``Tensor.backward`` calls): the backward phase is the call,
    wherever it runs (inside a module's forward too: PyTorch Lightning's manual optimisation runs
    ``training_step`` inside the DDP module's forward). Outside a call (``torch.autograd.grad``, an
    engine entered from C++) the gradient hook and end-of-pass callback of :func:`_forward_hook` see it."""

    @functools.wraps(orig)
    def backward(*args, **kwargs):
        opened = _backward_call_begin()
        try:
            return orig(*args, **kwargs)
        finally:
            if opened:
                _backward_call_end()

    backward.__obshub_wrapped__ = orig
    return backward


@_guarded
def _backward_call_begin() -> bool:
    with _lock:
        if _st.phase == "backward" or (_st.phase == "optimizer" and not _tls.__dict__.get("in_closure")):
            return False
        _phase_begin_locked("backward")
        return True


@_guarded
def _backward_call_end() -> None:
    with _lock:
        _phase_end_locked("backward")


def _at_exit() -> None:
    """Close a trailing data phase (the loop ended after its last optimizer step)."""
    with _lock:
        if _st.enabled and _st.phase == "data":
            _phase_end_locked("data")


# --------------------------------------------------------------------------------------------------------
# collectives: one Python kernel per c10d dispatcher op, at the BackendSelect key
# --------------------------------------------------------------------------------------------------------
def _pg_name(group) -> str:
    """The process-group name PyTorch gives ``group`` (``"0"`` for the default group)."""
    if group is None:
        group = _c10d._get_default_group()
    return _c10d._get_process_group_name(group)


def _nbytes(value) -> int:
    """Bytes of a tensor, or of the tensors in a (nested, one level) list of them."""
    if isinstance(value, _torch.Tensor):
        return value.nbytes
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


#: c10d dispatcher op -> the op name the probe carries (the torch.distributed name users know). An op not
#: listed here is still hooked and counted, under its dispatcher name without the underscores around it.
OP_NAMES: dict[str, str] = {
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce_coalesced",
    "allgather_": "all_gather",
    "_allgather_base_": "all_gather_into_tensor",
    "allgather_coalesced_": "all_gather_coalesced",
    "allgather_into_tensor_coalesced_": "all_gather_tensor_coalesced",  # op names fit 31 bytes
    "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor_coalesced",
    "broadcast_": "broadcast",
    "reduce_": "reduce",
    "gather_": "gather",
    "gather_into_tensor_": "gather_into_tensor",
    "scatter_": "scatter",
    "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all_single",
    "barrier": "barrier",
    "monitored_barrier_": "monitored_barrier",
    "send": "send",
    "recv_": "recv",
    "recv_any_source_": "recv",
}
_NO_BYTES = {"barrier", "monitored_barrier_"}  # their tensor is a placeholder
_PEER_ARGS = ("dst", "src", "dstRank", "srcRank")  # the peer's group rank in point-to-point ops


class _OpInfo:
    """What the kernel of one c10d op needs: the op, its probe name, where its process group and (for
    point-to-point) its peer rank are among the positional arguments, which argument's tensors are the
    op's size (``size_index``) and the positions of every tensor argument in order (``tensor_indices``:
    the first tensor found there decides the backend)."""

    __slots__ = ("op", "name", "pg_index", "peer_index", "any_source", "size_index", "tensor_indices")

    def __init__(
        self,
        op,
        name: str,
        pg_index: int,
        peer_index: int | None,
        any_source: bool,
        size_index: int | None,
        tensor_indices: tuple[int, ...] = (),
    ) -> None:
        self.op, self.name, self.pg_index, self.peer_index = op, name, pg_index, peer_index
        self.any_source, self.size_index, self.tensor_indices = any_source, size_index, tensor_indices


def c10d_ops() -> dict[str, _OpInfo]:
    """Every op of the ``c10d`` dispatcher namespace that takes a ProcessGroup (every collective and
    point-to-point op a ProcessGroup method, a functional collective, DDP's reducer, FSDP or DTensor
    issues goes through one of them), read from the dispatcher's registry, not from a list of names."""
    found: dict[str, _OpInfo] = {}
    for full in _torch._C._dispatch_get_all_op_names():
        ns, _, name = full.partition("::")
        if ns != "c10d" or "." in name:
            continue
        try:
            op = getattr(_torch.ops.c10d, name).default
        except (AttributeError, RuntimeError):
            continue
        args = op._schema.arguments
        pg_index = next((i for i, a in enumerate(args) if "ProcessGroup" in str(a.type)), None)
        if pg_index is None:  # not a communication op (e.g. check_for_nan)
            continue
        peer = next((i for i, a in enumerate(args) if a.name in _PEER_ARGS), None)
        probe_name = OP_NAMES.get(name, name.strip("_"))
        tensors = [i for i, a in enumerate(args) if "Tensor" in str(a.type) and a.name != "sparse_indices"]
        inputs = [i for i in tensors if args[i].name.startswith("input")]
        size = (
            None if name in _NO_BYTES or not tensors else tensors[0] if name == "scatter_" or not inputs else inputs[0]
        )
        every_tensor = tuple(i for i, a in enumerate(args) if "Tensor" in str(a.type))
        found[name] = _OpInfo(op, probe_name, pg_index, peer, name == "recv_any_source_", size, every_tensor)
    return found


def _first_tensor(value):
    """The first tensor in ``value`` (a tensor, or lists of them, e.g. an op's arguments), else None."""
    if isinstance(value, _torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _unbox_pg(pg):
    """The ProcessGroup behind a dispatcher argument (the dispatcher hands it over boxed)."""
    if isinstance(pg, _torch.ScriptObject):
        return _torch._C._distributed_c10d.ProcessGroup.unbox(pg)
    return pg


def _make_kernel(info: _OpInfo) -> Callable:
    """The BackendSelect kernel of one c10d op: count and announce the collective, redispatch to the
    backend's kernel (the keys below BackendSelect), end it when the returned Work's future completes.

    The hot path of every collective (a DDP bucket's all-reduce runs it once per bucket): the op's facts
    are looked up once here, the calling thread's state is read from its ``threading.local`` dict, and
    a future that is complete on return (a synchronous op; NCCL completes its futures at enqueue) ends the
    collective at once, and otherwise the completion callback is the C probe function itself
    (``usdt.coll_end`` bound to the token with ``functools.partial``; it ignores the future the callback
    receives), so no Python frame of obshub runs at completion (the callback still takes the GIL on the
    thread that completes the work: gloo's). ``bench.collective_hook`` prices it per call."""
    redispatch = info.op._handle.redispatch_boxed
    after = _after_backend_select
    tensor_indices, pg_index, peer_index, size_index = (
        info.tensor_indices,
        info.pg_index,
        info.peer_index,
        info.size_index,
    )
    any_source, probe_name = info.any_source, info.name
    tensor_type, script_object, dispatch_keys = _torch.Tensor, _torch.ScriptObject, _torch._C._dispatch_keys
    unbox_pg, unbox_work = _torch._C._distributed_c10d.ProcessGroup.unbox, _torch._C._distributed_c10d.Work.unbox
    future_type, coll_begin, coll_end, partial = (
        _torch.futures.Future,
        usdt.coll_begin,
        usdt.coll_end,
        functools.partial,
    )
    st, tls = _st, _tls

    def kernel(*args):
        # the tensors decide the backend (a gather's non-root rank has no output tensors: the input's)
        tensor = None
        for i in tensor_indices:
            tensor = _first_tensor(args[i])
            if tensor is not None:
                break
        keys = (dispatch_keys(tensor) if tensor is not None else _after_all) & after
        local = tls.__dict__
        # tracing (fake or meta tensors) or a nested op: the backend's kernel alone
        if local.get("in_coll") or (tensor is not None and (type(tensor) is not tensor_type or tensor.is_meta)):
            return redispatch(keys, *args)
        try:
            pg = args[pg_index]
            if type(pg) is script_object:
                pg = unbox_pg(pg)
            name = pg.group_name
            if peer_index is not None:
                lo, hi = sorted((int(args[peer_index]), pg.rank()))
                name = f"{name}:p2p:{lo}-{hi}"
            elif any_source:
                name = f"{name}:p2p:any"
            nbytes = _nbytes(args[size_index]) if size_index is not None else 0
            prev_key, prev_step = local.get("key", 0), local.get("step", -1)
            with _lock:
                seq = st.coll_seq.get(name, 0)
                st.coll_seq[name] = seq + 1
                st.op_seq += 1
                step = st.step
                key = _key(step, st.op_seq)
            coll_begin(name, seq, probe_name, nbytes, step, key)
            local["key"], local["step"] = key, step  # coll_begin carried the thread's new key
        except Exception:  # noqa: BLE001 - let PyTorch raise its own error, or run it unseen
            _caught("collective")
            _warn_once("collective")
            return redispatch(keys, *args)
        local["in_coll"] = 1
        try:
            result = redispatch(keys, *args)
        except BaseException:
            coll_end(name, seq, probe_name, nbytes, step, key)  # a failed collective ends where it failed
            raise
        finally:
            local["in_coll"] = 0
            _set_thread_key(prev_key, prev_step)
        work = result[-1] if type(result) is tuple else result
        try:
            if type(work) is not future_type:
                if type(work) is script_object:
                    work = unbox_work(work)
                work = work.get_future()
            if work.done():  # complete already (a synchronous op; NCCL completes its future at enqueue)
                coll_end(name, seq, probe_name, nbytes, step, key)
            else:
                work.add_done_callback(partial(coll_end, name, seq, probe_name, nbytes, step, key))
        except Exception:  # noqa: BLE001 - no future (a coalesced Work): end = enqueue
            _caught("collective_end")
            coll_end(name, seq, probe_name, nbytes, step, key)
        return result

    # called from compiled code (a DDP bucket's all-reduce under torch.compile), the kernel is a frame
    # TorchDynamo would try to compile: it runs eagerly instead, as every collective does
    return _torch.compiler.disable(kernel)


def _caught(where: str) -> None:
    """Tell a tracer that the instrumentation caught an exception at ``where`` and went on: the USDT probe
    ``obshub:caught`` (a NOP when none is attached; fired on the catch path only), which the agent counts
    in ``obshub_agent_caught_errors_total{where="instrument_<where>"}``."""
    usdt.caught(where)


def _warn_once(what: str) -> None:
    if what not in _warned:
        _warned.add(what)
        log.exception("obshub instrumentation hook %s failed; that call runs unseen", what)


_after_backend_select: Any = None
_after_all: Any = None


_native: Any = None  # obshub.instrument._c10d_kernel while its kernels are installed


def _load_native():
    """The C++ collective kernel module (obshub/instrument/_c10d_kernel.cpp, built by ``make setup``), or
    None: not built, failed to load (a torch other than the one it was built for), or
    ``OBSHUB_COLLECTIVE_KERNEL=python`` (the benchmarks' switch)."""
    choice = os.environ.get("OBSHUB_COLLECTIVE_KERNEL", "auto")
    if choice not in ("auto", "python", "native"):
        raise ConfigError(
            f"OBSHUB_COLLECTIVE_KERNEL={choice!r} is not one of auto, python, native",
            hint="unset it (auto: the C++ kernel when built), or python / native",
        )
    if choice == "python":
        return None
    try:
        from obshub.instrument import _c10d_kernel  # type: ignore[attr-defined]
    except ImportError as exc:
        if choice == "native":
            raise ConfigError(
                f"OBSHUB_COLLECTIVE_KERNEL=native but the C++ kernel does not load ({exc})",
                hint="run `python -m obshub.instrument.native_build --strict` to see why it does not build",
            ) from exc
        if "collective-native" not in _warned:
            _warned.add("collective-native")
            log.info("obshub: the C++ collective kernel is not available (%s); using the Python kernel", exc)
        return None
    return _c10d_kernel


def collective_kernel() -> str:
    """Which collective kernel is installed now: ``"native"`` (C++), ``"python"``, or ``""`` (none)."""
    if not _st.enabled or _c10d is None:
        return ""
    return "native" if _native is not None else "python"


def _install_collective_kernels() -> Callable[[], None]:
    """Register the kernels of :func:`c10d_ops` at the ``BackendSelect`` dispatch key (a key every call
    passes: it is in the dispatcher's default-included set, and neither inference mode nor
    below-autograd guards exclude it): the C++ kernel when it loads (:func:`_load_native`), else the
    Python kernels; returns the undo."""
    global _after_backend_select, _after_all, _native
    native = _load_native()
    if native is not None:
        ops = [
            (
                name,
                info.name,
                info.pg_index,
                -1 if info.peer_index is None else info.peer_index,
                info.any_source,
                -1 if info.size_index is None else info.size_index,
            )
            for name, info in c10d_ops().items()
        ]
        try:
            native.install(ops)
        except (RuntimeError, TypeError) as exc:
            log.warning("obshub: the C++ collective kernel did not install (%s); using the Python kernel", exc)
        else:
            _native = native
            _native.set_state(_st.step, _st.op_seq, _st.host_id)

            def undo() -> None:
                global _native
                native.uninstall()
                with _lock:  # the op counter goes on in Python (one number skipped: op_seq stays unique)
                    _st.op_seq = native.next_op()
                    _native = None

            return undo
    dk = _torch._C.DispatchKey
    _after_backend_select = _torch._C._dispatch_keyset_full_after(dk.BackendSelect)
    _after_all = _torch._C.DispatchKeySet(dk.CPU)
    lib = _torch.library.Library("c10d", "IMPL")  # noqa: TOR901 - a kernel per op, undone by disable()
    for name, info in c10d_ops().items():
        lib.impl(name, _make_kernel(info), "BackendSelect")
    return lib._destroy


# --------------------------------------------------------------------------------------------------------
# registration
# --------------------------------------------------------------------------------------------------------
def _register() -> None:
    """Fire ``register`` once per process, now that torch.distributed is initialised."""
    with _lock:
        if _st.registered or _c10d is None or not _c10d.is_initialized():
            return
        rank, world = _c10d.get_rank(), _c10d.get_world_size()
        if not _st.host_id_explicit:
            _st.host_id = rank & 0xFFFF
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        _st.registered = True
        _st.coll_seq.clear()
        if _native is not None:
            _native.reset_coll_seq()
            _sync_native_locked()
        _fire_register_locked((_job_locked(), rank, world, _st.host_id, local_rank))


def _register_undistributed_locked() -> None:
    """At the first step of a process that has not initialised torch.distributed (single-process
    training): register it anyway, as rank ``$RANK`` (0) of ``$WORLD_SIZE`` (1), so an agent watching
    "registered" processes sees it. Once per process: a later init_process_group does not register again."""
    if _st.registered:
        return
    if _c10d is not None and _c10d.is_initialized():
        _register()
        return

    def env_int(name: str, default: int) -> int:
        try:
            return int(os.environ.get(name, default))
        except ValueError:
            return default

    rank = env_int("RANK", 0)
    _st.registered = True
    _fire_register_locked((_job_locked(), rank, env_int("WORLD_SIZE", 1), _st.host_id, env_int("LOCAL_RANK", rank)))


def _fire_register_locked(args: tuple) -> None:
    """Fire ``register(job, rank, world_size, host_id, local_rank)`` and remember it, and whether a tracer
    was attached to it then."""
    _st.reg_args = args
    _st.traced = _st.reg_site is not None and usdt.site_traced(_st.reg_site)
    usdt.register(*args)


def _register_again_if_traced_locked() -> None:
    """At a step boundary: when a tracer attached to the register probe since it last fired (the node
    agent started, or followed this process's copy of the extension, after the process registered), fire
    it again with the same arguments, so the agent learns the process and its job. One byte read per
    step (:func:`obshub.instrument.usdt.site_traced`)."""
    now = usdt.site_traced(_st.reg_site)  # type: ignore[arg-type]
    if now and not _st.traced:
        usdt.register(*_st.reg_args)
    _st.traced = now


def _job_locked() -> str:
    """The job the register probe carries: ``enable(job=...)``, else resolved from the environment now
    (:func:`obshub.core.workload.resolve_job`), so a script may still set ``OBSHUB_JOB`` before it
    initialises torch.distributed."""
    if not _st.job:
        _st.job = workload.resolve_job(os.environ)[0]
    return _st.job


def _wrap_init(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def init_process_group(*args, **kwargs):
        result = orig(*args, **kwargs)
        _guarded(_register)()
        return result

    init_process_group.__obshub_wrapped__ = orig
    return init_process_group


# --------------------------------------------------------------------------------------------------------
# enable / disable
# --------------------------------------------------------------------------------------------------------
_torch: Any = None
_c10d: Any = None


def _host_id_from_env() -> tuple[int, bool]:
    raw = os.environ.get("OBSHUB_HOST_ID")
    if raw is None or raw == "":
        try:
            return int(os.environ.get("RANK", "0")) & 0xFFFF, False
        except ValueError:
            return 0, False
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= 0xFFFF:
        raise ConfigError(
            f"OBSHUB_HOST_ID={raw!r} is not an integer in 0..65535",
            hint="set OBSHUB_HOST_ID (or `obshub run --host-id N`) to this node's number",
        )
    return value, True


def _patch(module, name: str, new) -> None:
    old = getattr(module, name)
    setattr(module, name, new)
    _st.undo.append(lambda: setattr(module, name, old))


def _per_step_from_env(value: int | None) -> int:
    """Optimizer steps per training iteration: ``value``, else ``$OBSHUB_OPTIMIZERS_PER_STEP``, else 0
    (learned, see the module docstring). Raises ConfigError for anything but an integer >= 1."""
    raw: Any = value if value is not None else os.environ.get("OBSHUB_OPTIMIZERS_PER_STEP", "")
    if raw == "":
        return 0
    try:
        count = int(raw)
    except (TypeError, ValueError):
        count = 0
    if count < 1:
        raise ConfigError(
            f"optimizers per step {raw!r} (OBSHUB_OPTIMIZERS_PER_STEP or enable(optimizers_per_step=)) is "
            "not an integer >= 1",
            hint="set it to the number of optimizer.step() calls in one training iteration, e.g. 2 for a GAN",
        )
    return count


def enable(job: str | None = None, host_id: int | None = None, optimizers_per_step: int | None = None) -> None:
    """Install the hooks and wrappers described in the module docstring, process-wide. Idempotent.

    ``job`` defaults to what the environment names when the process registers
    (:func:`obshub.core.workload.resolve_job`: ``$OBSHUB_JOB``, Slurm, torchrun, a pod label, else
    ``"default"``); an explicit name is cut to 63 bytes of UTF-8. ``host_id`` defaults to
    ``$OBSHUB_HOST_ID`` (else the rank). ``optimizers_per_step`` (default ``$OBSHUB_OPTIMIZERS_PER_STEP``,
    else learned) is the number of ``optimizer.step()`` calls in one training iteration. Raises
    :class:`obshub.core.errors.ConfigError` for a host id outside 0..65535 or a bad ``optimizers_per_step``,
    ``ImportError`` when torch is not installed.
    """
    global _torch, _c10d
    import torch
    import torch.distributed as dist
    import torch.optim.optimizer as optim_mod

    with _lock:
        if _st.enabled:
            return
        if host_id is None:
            _st.host_id, _st.host_id_explicit = _host_id_from_env()
        elif isinstance(host_id, int) and 0 <= host_id <= 0xFFFF:
            _st.host_id, _st.host_id_explicit = host_id, True
        else:
            raise ConfigError(
                f"host_id {host_id!r} is not an integer in 0..65535", hint="pass the node's number, 0..65535"
            )
        _st.per_step = _per_step_from_env(optimizers_per_step)
        _st.undo.append(stepsource.install(torch, lambda: _st.step >= 0))  # $OBSHUB_START_STEP, load_state_dict
        _st.job = workload.clean_job(job) if job else ""
        _st.reg_site = usdt.probe_site("register")
        _st.next_sites = (usdt.probe_site("phase_next"), usdt.probe_site("step_next"))
        # the C++ collective kernel reads this site at each collective: one `coll` probe while it is traced
        usdt._usdt._set_coll_site(usdt.probe_site("coll") or 0)
        _merge_check_locked()
        _torch = torch
        undo = _st.undo
        _install_global_module_hooks()
        undo.append(_remove_module_hooks)
        undo.append(optim_mod.register_optimizer_step_pre_hook(_optimizer_pre_hook).remove)
        undo.append(optim_mod.register_optimizer_step_post_hook(_optimizer_post_hook).remove)
        _patch(torch.autograd, "backward", _wrap_backward(torch.autograd.backward))
        if dist.is_available():
            import torch.distributed.distributed_c10d as c10d

            _c10d = c10d
            undo.append(_install_collective_kernels())
            init = _wrap_init(c10d.init_process_group)
            if dist.init_process_group is c10d.init_process_group:
                _patch(dist, "init_process_group", init)
            _patch(c10d, "init_process_group", init)
        _st.enabled = True
    if _c10d is not None:
        _register()
    atexit.register(_at_exit)


def disable() -> None:
    """Remove every hook, wrapper and dispatcher kernel ``enable()`` installed. Step and sequence counters
    are kept."""
    with _lock:
        while _st.undo:
            _st.undo.pop()()
        _st.enabled = False
    atexit.unregister(_at_exit)


def is_enabled() -> bool:
    """True between ``enable()`` and ``disable()``."""
    return _st.enabled
