"""In-process PyTorch instrumentation: fires obshub's USDT probes (``obshub.instrument.usdt``) from global PyTorch
hooks and keeps the current TraceKey of every thread.

``enable()`` installs, process-wide and without touching the training script:

* **step boundaries** from the global optimizer step hooks
  (``torch.optim.optimizer.register_optimizer_step_pre_hook`` / ``..._post_hook``): the post-hook of the
  outermost ``optimizer.step()`` fires ``step_end(N)`` and at once ``step_begin(N+1)`` and
  ``phase_begin("data")``, so data loading (the time from the end of one step to the next forward) is
  inside the step that consumes the data. Step 0 begins at the first root forward, because the start of
  the training loop is unknown; it has no data phase. Steps count ``optimizer.step()`` calls from 0.
* **phases**: ``forward`` begins at a *root* module call (a per-thread depth counter keeps nested
  modules silent: ``torch.nn.modules.module.register_module_forward_pre_hook`` / ``forward_hook``) and
  lasts until the next phase begins, so the model and then the loss module (also a root call) make one
  forward phase; ``backward`` from a gradient hook on a root output (the first gradient computed) to an
  autograd end-of-pass callback (``Variable._execution_engine.queue_callback``, what DDP and FSDP use);
  ``optimizer`` around the outermost ``optimizer.step()``. Forwards during backward (activation
  checkpointing) and forward/backward inside ``optimizer.step(closure)`` (LBFGS) stay in the enclosing
  phase.
* **collectives**: the ``torch.distributed`` functions (``COLLECTIVES``) are wrapped; the DDP gradient
  all-reduce (done by the C++ reducer, invisible to Python) is made visible by registering, before a DDP
  module's first forward, a comm hook equal to PyTorch's default ``allreduce_hook`` with
  ``coll_begin``/``coll_end`` around it; ``coll_end`` fires when the bucket's future completes. A user's own
  ``register_comm_hook`` wins (ours is then not registered; the ``torch.distributed`` calls inside the
  user's hook are seen). Sequence numbers ``coll_seq`` count per process-group name from 0 and are the same
  on every rank because ranks issue collectives of a group in the same order. Point-to-point ops count on
  their own pair, named ``"<pg>:p2p:<lo>-<hi>"`` (``"<pg>:p2p:any"`` for a recv from any source).
  ``coll_end`` of an ``async_op=True`` call fires when its Work's future completes; of a synchronous call,
  when the call returns. On CPU/gloo both are completion; on CUDA/NCCL both are the enqueue (PyTorch
  completes NCCL futures at enqueue; GPU completion is the CUDA/NCCL probes' to see).
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

Limits: one ``optimizer.step()`` per training iteration is assumed (two optimizers stepped one after the
other make two steps); the last ``step_begin`` of a process has no ``step_end`` (the loop ended in its data
phase; ``phase_end("data")`` fires at exit). Hooks never raise into the training program: an internal
error is logged once per hook on the ``obshub.instrument`` logger and the hook does nothing more.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import logging
import os
import threading
import weakref
from typing import Any, Callable

from obshub.core import workload
from obshub.core.errors import ConfigError
from obshub.instrument import usdt

log = logging.getLogger("obshub.instrument")

#: torch.distributed functions wrapped by enable(): name -> (op name in the probe, input argument whose
#: size is the probe's ``bytes``, or None for 0 bytes).
COLLECTIVES: dict[str, tuple[str, str | None]] = {
    "all_reduce": ("all_reduce", "tensor"),
    "all_reduce_coalesced": ("all_reduce_coalesced", "tensors"),
    "all_gather": ("all_gather", "tensor"),
    "all_gather_into_tensor": ("all_gather_into_tensor", "input_tensor"),
    "reduce_scatter": ("reduce_scatter", "input_list"),
    "reduce_scatter_tensor": ("reduce_scatter_tensor", "input"),
    "broadcast": ("broadcast", "tensor"),
    "reduce": ("reduce", "tensor"),
    "gather": ("gather", "tensor"),
    "scatter": ("scatter", "tensor"),
    "all_to_all": ("all_to_all", "input_tensor_list"),
    "all_to_all_single": ("all_to_all_single", "input"),
    "barrier": ("barrier", None),
    "monitored_barrier": ("monitored_barrier", None),
    "all_gather_object": ("all_gather_object", None),
    "broadcast_object_list": ("broadcast_object_list", None),
    "gather_object": ("gather_object", None),
    "scatter_object_list": ("scatter_object_list", None),
    "send": ("send", "tensor"),
    "recv": ("recv", "tensor"),
    "isend": ("isend", "tensor"),
    "irecv": ("irecv", "tensor"),
}
_P2P = {"send": "dst", "isend": "dst", "recv": "src", "irecv": "src"}

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
        if not announced:
            usdt.tracekey(key, step)


def current_trace_key() -> tuple[int, int]:
    """``(trace_key, step)`` the calling thread carries now: ``(0, -1)`` before it took part in anything."""
    return getattr(_tls, "key", 0), getattr(_tls, "step", -1)


def _next_op_locked() -> int:
    _st.op_seq += 1
    return _key(_st.step, _st.op_seq)


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
    _st.step = _st.next_step
    _st.next_step += 1
    _st.op_seq = 0
    _st.step_key = _key(_st.step, 0)
    usdt.step_begin(_st.step, _st.step_key)
    _set_thread_key(_st.step_key, _st.step, announced=True)


def _end_step_locked() -> None:
    if _st.step < 0:
        return
    _phase_end_locked(None)
    usdt.step_end(_st.step, _st.step_key)
    _st.step = -1


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
    if _st.merge_step and _st.phase is not None and _st.step >= 0 and _st.next_step == _st.step + 1:
        old, old_key, step, key = _st.phase, _st.phase_key, _st.step, _st.step_key
        _st.phase = None
        _register_before_step_locked()
        _st.step = _st.next_step
        _st.next_step += 1
        _st.op_seq = 0
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
    had none."""
    if _global_mod and _fwd_seen[0] and len(_roots):
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
    if _ddp_cls is not None and isinstance(module, _ddp_cls):
        _ensure_ddp_hook(module)
    with _lock:
        if _st.phase in ("backward", "optimizer"):
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
            tensor.register_hook(_on_backward_start)
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
def _on_backward_start(grad) -> None:
    with _lock:
        if _st.phase in ("backward", "optimizer"):
            return
        _phase_begin_locked("backward")
    _torch.autograd.Variable._execution_engine.queue_callback(_on_backward_end)


@_guarded
def _on_backward_end() -> None:
    with _lock:
        _phase_end_locked("backward")


@_guarded
def _optimizer_pre_hook(optimizer, args, kwargs) -> None:
    depth = getattr(_tls, "opt_depth", 0) + 1
    _tls.opt_depth = depth
    if depth == 1:
        with _lock:
            _phase_begin_locked("optimizer")


@_guarded
def _optimizer_post_hook(optimizer, args, kwargs) -> None:
    depth = getattr(_tls, "opt_depth", 1) - 1
    _tls.opt_depth = max(depth, 0)
    if depth == 0:
        with _lock:
            _step_boundary_locked("data")
            _rearm_at_step_boundary()


def _at_exit() -> None:
    """Close a trailing data phase (the loop ended after its last optimizer step)."""
    with _lock:
        if _st.enabled and _st.phase == "data":
            _phase_end_locked("data")


# --------------------------------------------------------------------------------------------------------
# collectives
# --------------------------------------------------------------------------------------------------------
def _pg_name(group) -> str:
    """The process-group name PyTorch gives ``group`` (``"0"`` for the default group)."""
    if group is None:
        group = _c10d._get_default_group()
    return _c10d._get_process_group_name(group)


def _nbytes(value) -> int:
    if isinstance(value, _torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(v.numel() * v.element_size() for v in value if isinstance(v, _torch.Tensor))
    return 0


def _coll_begin(pg: str, op: str, nbytes: int) -> tuple:
    """Count and announce one collective; returns the token ``_coll_end`` needs. The calling thread's key
    becomes the collective's key (the caller restores the previous one)."""
    with _lock:
        seq = _st.coll_seq.get(pg, 0)
        _st.coll_seq[pg] = seq + 1
        key = _next_op_locked()
        step = _st.step
    usdt.coll_begin(pg, seq, op, nbytes, step, key)
    _set_thread_key(key, step, announced=True)
    return (pg, seq, op, nbytes, step, key)


def _coll_end(token: tuple, *_ignored) -> None:
    usdt.coll_end(*token)


def _end_when_done(work, token: tuple) -> None:
    """Fire coll_end when ``work`` (a c10d Work, or a Future) completes; at once if it offers no future."""
    try:
        fut = work if isinstance(work, _torch.futures.Future) else work.get_future()
        fut.add_done_callback(functools.partial(_coll_end, token))
    except Exception:  # noqa: BLE001 - e.g. a coalesced Work without a future: end = enqueue
        _coll_end(token)


def _p2p_pg(name: str, group, bound: inspect.BoundArguments) -> str:
    side = _P2P[name]
    peer = bound.arguments.get(side)
    mine = _c10d.get_rank()
    if peer is None:
        peer = bound.arguments.get("group_" + side)
        mine = _c10d.get_rank(group) if group is not None else mine
    base = _pg_name(group)
    if peer is None:
        return f"{base}:p2p:any"
    lo, hi = sorted((int(peer), mine))
    return f"{base}:p2p:{lo}-{hi}"


def _wrap_collective(name: str, orig: Callable) -> Callable:
    op, size_arg = COLLECTIVES[name]
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def collective(*args, **kwargs):
        if getattr(_tls, "in_coll", 0) or not _c10d.is_initialized():
            return orig(*args, **kwargs)
        try:
            bound = sig.bind(*args, **kwargs)
            group = bound.arguments.get("group")
            pg = _p2p_pg(name, group, bound) if name in _P2P else _pg_name(group)
            nbytes = _nbytes(bound.arguments.get(size_arg)) if size_arg else 0
            prev = current_trace_key()
            token = _coll_begin(pg, op, nbytes)
        except Exception:  # noqa: BLE001 - a bad call: let PyTorch raise its own error
            return orig(*args, **kwargs)
        _tls.in_coll = 1
        try:
            result = orig(*args, **kwargs)
        except BaseException:
            _coll_end(token)  # a failed collective ends where it failed
            raise
        finally:
            _tls.in_coll = 0
            _set_thread_key(*prev)
        if result is not None and (
            bound.arguments.get("async_op") or name in ("isend", "irecv") or isinstance(result, _torch.futures.Future)
        ):
            _end_when_done(result, token)
        else:
            _coll_end(token)
        return result

    collective.__obshub_wrapped__ = orig
    return collective


def _ddp_comm_hook(process_group, bucket):
    """DDP comm hook: PyTorch's default ``allreduce_hook`` (the bucket divided by the group's size, then
    all-reduced: the average) with ``coll_begin`` when the bucket is handed to the backend and ``coll_end``
    when its all-reduce completes. The per-bucket hot path (issue #34): the unwrapped ``all_reduce`` is
    called directly and one ``then`` callback both fires ``coll_end`` and yields the tensor, where
    ``allreduce_hook`` plus a done-callback took the collective wrapper and two Python callbacks."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    buf = bucket.buffer()
    try:
        group = process_group if process_group is not None else _c10d.group.WORLD
        all_reduce = getattr(_c10d.all_reduce, "__obshub_wrapped__", _c10d.all_reduce)
        prev = current_trace_key()
        token = _coll_begin(_pg_name(process_group), "all_reduce", buf.numel() * buf.element_size())
    except Exception:  # noqa: BLE001
        return allreduce_hook(process_group, bucket)
    try:
        buf.div_(group.size())
        fut = all_reduce(buf, group=group, async_op=True).get_future()
    except BaseException:
        _coll_end(token)
        raise
    finally:
        _set_thread_key(*prev)
    return fut.then(functools.partial(_bucket_done, token))


def _bucket_done(token: tuple, fut):
    """A DDP bucket's all-reduce completed: ``coll_end``, then the averaged bucket for DDP."""
    try:
        usdt.coll_end(*token)
    except Exception:  # noqa: BLE001 - never into the reducer
        pass
    return fut.value()[0]


def _ensure_ddp_hook(module) -> None:
    """Register ``_ddp_comm_hook`` on a DDP module once, unless its user registered a comm hook."""
    if getattr(module, "_obshub_comm_hook", False):
        return
    module._obshub_comm_hook = True
    _orig_register_comm_hook(module, module.process_group, _ddp_comm_hook)


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
_ddp_cls: Any = None
_orig_register_comm_hook: Any = None


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


def enable(job: str | None = None, host_id: int | None = None) -> None:
    """Install the hooks and wrappers described in the module docstring, process-wide. Idempotent.

    ``job`` defaults to what the environment names when the process registers
    (:func:`obshub.core.workload.resolve_job`: ``$OBSHUB_JOB``, Slurm, torchrun, a pod label, else
    ``"default"``); an explicit name is cut to 63 bytes of UTF-8. ``host_id`` defaults to
    ``$OBSHUB_HOST_ID`` (else the rank). Raises :class:`obshub.core.errors.ConfigError` for a host id outside 0..65535, ``ImportError`` when
    torch is not installed.
    """
    global _torch, _c10d, _ddp_cls, _orig_register_comm_hook
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
        _st.job = workload.clean_job(job) if job else ""
        _st.reg_site = usdt.probe_site("register")
        _st.next_sites = (usdt.probe_site("phase_next"), usdt.probe_site("step_next"))
        _merge_check_locked()
        _torch = torch
        undo = _st.undo
        _install_global_module_hooks()
        undo.append(_remove_module_hooks)
        undo.append(optim_mod.register_optimizer_step_pre_hook(_optimizer_pre_hook).remove)
        undo.append(optim_mod.register_optimizer_step_post_hook(_optimizer_post_hook).remove)
        if dist.is_available():
            import torch.distributed.distributed_c10d as c10d
            from torch.nn.parallel import DistributedDataParallel as DDP

            _c10d, _ddp_cls = c10d, DDP
            for name in COLLECTIVES:
                orig = getattr(c10d, name, None)
                if orig is None:
                    continue
                wrapped = _wrap_collective(name, orig)
                if getattr(dist, name, None) is orig:
                    _patch(dist, name, wrapped)
                _patch(c10d, name, wrapped)
            init = _wrap_init(c10d.init_process_group)
            if dist.init_process_group is c10d.init_process_group:
                _patch(dist, "init_process_group", init)
            _patch(c10d, "init_process_group", init)
            _orig_register_comm_hook = DDP.register_comm_hook
            _patch(DDP, "register_comm_hook", _user_comm_hook(DDP.register_comm_hook))
            _patch(DDP, "_register_builtin_comm_hook", _user_comm_hook(DDP._register_builtin_comm_hook))
        _st.enabled = True
    if _c10d is not None:
        _register()
    atexit.register(_at_exit)


def _user_comm_hook(orig: Callable) -> Callable:
    """Wrap DDP's comm-hook registration: a user's hook marks the module so obshub registers none."""

    @functools.wraps(orig)
    def register(self, *args, **kwargs):
        self._obshub_comm_hook = True
        return orig(self, *args, **kwargs)

    return register


def disable() -> None:
    """Remove every hook and wrapper ``enable()`` installed (a DDP comm hook already registered on a
    module stays: DDP cannot unregister one). Step and sequence counters are kept."""
    with _lock:
        while _st.undo:
            _st.undo.pop()()
        _st.enabled = False
    atexit.unregister(_at_exit)


def is_enabled() -> bool:
    """True between ``enable()`` and ``disable()``."""
    return _st.enabled
