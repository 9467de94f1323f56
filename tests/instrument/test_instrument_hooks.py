"""obshub.instrument's hook logic in this process, with the probe functions replaced by recorders:
step/phase sequencing (gradient accumulation, activation checkpointing, the loss module, optimizer
closures and LBFGS, backward inside a module's forward, several optimizers), TraceKeys, the per-thread
current key, collectives at the c10d dispatcher (DDP, a user's comm hook, functional collectives,
inference mode) against the backend's own count, and disable().

The real probes and the real kernel are covered by tests/instrument/test_instrument_usdt.py; here every call the
instrumentation makes is seen directly, so the sequencing rules can be asserted exactly and fast.
"""

from __future__ import annotations

import socket
import time
from collections import Counter

import pytest

from obshub.core import schema
from obshub.instrument import usdt

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def gloo_world_of_one(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    yield dist
    if dist.is_initialized():
        dist.destroy_process_group()


class Checkpointed(torch.nn.Module):
    """Linear -> ReLU -> Linear with the first layer under activation checkpointing (recomputed during
    backward, which must not open a forward phase)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 2)
        self.keys_seen: list[tuple[int, int]] = []

    def forward(self, x):
        from obshub.instrument import current_trace_key

        self.keys_seen.append(current_trace_key())
        h = torch.utils.checkpoint.checkpoint(self.a, x, use_reentrant=False)
        return self.b(torch.relu(h))


def _events(calls, *names):
    return [c for c in calls if c[0] in names]


def _ends(calls, n: int, timeout_s: float = 30.0) -> list:
    """The ``coll_end`` calls once there are ``n`` of them (or the timeout passed). A collective's
    ``coll_end`` runs as a done-callback of its future, in the thread that completes it: the waiter (DDP's
    reducer) may wake before that callback has run, so the test waits for it instead of reading at once."""
    deadline = time.monotonic() + timeout_s
    while len(_events(calls, "coll_end")) < n and time.monotonic() < deadline:
        time.sleep(0.005)
    return _events(calls, "coll_end")


def test_steps_and_phases_with_accumulation_and_checkpointing(probes, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    model = Checkpointed()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    for _ in range(2):
        for _micro in range(2):  # gradient accumulation: 2 forward/backward per step
            loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    seq = [(c[0], c[1]) for c in _events(probes, "step_begin", "step_end", "phase_begin", "phase_end")]
    fb = [
        ("phase_begin", "forward"),
        ("phase_end", "forward"),
        ("phase_begin", "backward"),
        ("phase_end", "backward"),
    ] * 2
    opt_phase = [("phase_begin", "optimizer"), ("phase_end", "optimizer")]
    assert seq == (
        [
            ("step_begin", 0),
            *fb,
            *opt_phase,
            ("step_end", 0),
            ("step_begin", 1),
            ("phase_begin", "data"),
            ("phase_end", "data"),
            *fb,
            *opt_phase,
            ("step_end", 1),
            ("step_begin", 2),
            ("phase_begin", "data"),
        ]
    )
    # a process without torch.distributed registers at its first step, as rank 0 of 1
    assert probes[0] == ("register", "j", 0, 1, 2, 0)
    assert len(_events(probes, "register")) == 1
    # keys: host 2, the step, op_seq 0 for the step and 1, 2, 3... for its phases
    for step in (0, 1):
        step_keys = {c[2] for c in probes if c[0] in ("step_begin", "step_end") and c[1] == step}
        assert step_keys == {schema.make_trace_key(2, step, 0)}
        ops = [schema.parse_trace_key(c[3]) for c in _events(probes, "phase_begin") if c[2] == step]
        assert [(o.host_id, o.step16) for o in ops] == [(2, step)] * len(ops)
        assert [o.op_seq for o in ops] == list(range(1, len(ops) + 1))
    # every phase end carries its begin's key; the thread's key inside forward is the forward phase's
    begins = {(c[1], c[3]) for c in _events(probes, "phase_begin")}
    assert {(c[1], c[3]) for c in _events(probes, "phase_end")} <= begins
    forward_keys = [(c[3], c[2]) for c in _events(probes, "phase_begin") if c[1] == "forward"]
    assert model.keys_seen == forward_keys
    # tracekey fired for each change, never twice in a row with the same key
    tk = [c[1] for c in _events(probes, "tracekey")]
    assert all(a != b for a, b in zip(tk, tk[1:]))


def _backend_seq(dist, group=None) -> int:
    """What the process group itself counts: the backend's sequence number (every collective and
    point-to-point op it ran)."""
    pg = group or dist.group.WORLD
    return pg._get_backend(torch.device("cpu"))._get_sequence_number_for_group()


def test_ddp_collectives_are_seen_at_the_dispatcher(probes, gloo_world_of_one):
    """DDP's construction (parameter shape check, module-state broadcast) and its C++ reducer's bucket
    all-reduce are seen without a comm hook: every ProcessGroup call goes through a c10d dispatcher op."""
    dist = gloo_world_of_one
    dist.init_process_group("gloo", rank=0, world_size=1)
    (reg,) = _events(probes, "register")
    assert reg == ("register", "j", 0, 1, 2, 0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.randn(3, 16)).sum().backward()
        opt.step()
    colls = _events(probes, "coll_begin")
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    # every op the backend ran is seen once, with contiguous sequence numbers
    assert [c[2] for c in colls] == list(range(_backend_seq(dist)))
    assert [(c[1], c[3], c[4], c[5]) for c in colls if c[3] == "all_reduce"] == [
        ("0", "all_reduce", grad_bytes, 0),
        ("0", "all_reduce", grad_bytes, 1),
    ]
    assert {c[3] for c in colls if c[5] == -1} >= {"all_gather", "broadcast"}  # DDP's construction
    ends = _ends(probes, len(colls))
    assert sorted(c[1:] for c in ends) == sorted(c[1:] for c in colls)
    # the gradient all-reduce is issued inside the backward phase of its step
    open_phase = None
    for c in probes:
        if c[0] == "phase_begin":
            open_phase = c[1]
        elif c[0] == "phase_end":
            open_phase = None
        elif c[0] == "coll_begin" and c[3] == "all_reduce":
            assert open_phase == "backward"
            host, step16, op = schema.parse_trace_key(c[6])
            assert (host, step16) == (2, c[5]) and op >= 1


def test_a_users_comm_hook_is_seen_once(probes, gloo_world_of_one):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    dist = gloo_world_of_one
    dist.init_process_group("gloo", rank=0, world_size=1)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
    model.register_comm_hook(None, allreduce_hook)
    before = _backend_seq(dist)
    start = len(_events(probes, "coll_begin"))
    model(torch.randn(3, 16)).sum().backward()
    # the user's hook calls dist.all_reduce: seen once, through the dispatcher
    assert [(c[1], c[2], c[3]) for c in _events(probes, "coll_begin")[start:]] == [("0", before, "all_reduce")]
    assert _backend_seq(dist) == before + 1
    assert len(_ends(probes, start + 1)) == start + 1


def test_functional_collectives_point_to_point_and_inference_mode_are_seen(probes, gloo_world_of_one):
    import torch.distributed._functional_collectives as fc

    dist = gloo_world_of_one
    dist.init_process_group("gloo", rank=0, world_size=1)
    t = torch.ones(4)
    assert (fc.all_reduce(t, "sum", dist.group.WORLD) + 0).tolist() == [1.0] * 4
    out = torch.empty(4)
    dist.all_gather_into_tensor(out, t)
    dist.reduce_scatter_tensor(torch.empty(4), t)
    with torch.inference_mode():
        dist.all_reduce(torch.ones(2))
    dist.barrier()
    colls = [(c[1], c[2], c[3], c[4]) for c in _events(probes, "coll_begin")]
    assert colls == [
        ("0", 0, "all_reduce", 16),
        ("0", 1, "all_gather_into_tensor", 16),
        ("0", 2, "reduce_scatter_tensor", 16),
        ("0", 3, "all_reduce", 8),
        ("0", 4, "barrier", 0),
    ]
    assert _backend_seq(dist) == len(colls)
    assert len(_ends(probes, len(colls))) == len(colls)


def test_disable_removes_everything(probes, gloo_world_of_one):
    import torch.distributed as dist

    from obshub.instrument import hooks as instrument

    assert getattr(torch.autograd.backward, "__obshub_wrapped__", None) is not None
    assert torch._C._dispatch_has_kernel_for_dispatch_key("c10d::allreduce_", "BackendSelect")
    instrument.disable()
    assert not hasattr(torch.autograd.backward, "__obshub_wrapped__")
    assert not hasattr(dist.init_process_group, "__obshub_wrapped__")
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("c10d::allreduce_", "BackendSelect")
    dist.init_process_group("gloo", rank=0, world_size=1)
    before = len(probes)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    dist.all_reduce(torch.ones(2))
    assert len(probes) == before


def test_register_fires_again_when_a_tracer_attaches(probes, monkeypatch):
    import ctypes

    from obshub.instrument import hooks as instrument

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert instrument._st.reg_site == usdt.probe_site("register") is not None  # the real extension's site
    site = ctypes.create_string_buffer(b"\x90")  # stands for the probe site: a NOP, a breakpoint when traced
    instrument._st.reg_site = ctypes.addressof(site)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def steps(n: int) -> int:
        """Train ``n`` steps; the number of register calls so far."""
        for _ in range(n):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
        return len(_events(probes, "register"))

    assert steps(3) == 1  # no tracer: registered once, at the first step
    site.raw = b"\xcc"  # an agent attached a uprobe
    assert steps(1) == 2 and steps(3) == 2  # once more at the next step boundary, not again
    site.raw = b"\x90"  # it detached...
    assert steps(2) == 2
    site.raw = b"\xcc"  # ...and a new one attached
    assert steps(1) == 3
    assert set(_events(probes, "register")) == {("register", "j", 0, 1, 2, 0)}  # the same arguments


def _expand(calls: list[tuple]) -> list[tuple]:
    """The merged probes written as the separate probes they stand for."""
    out: list[tuple] = []
    for c in calls:
        if c[0] == "phase_next":
            _n, old, new, step, old_key, new_key = c
            out += [("phase_end", old, step, old_key), ("phase_begin", new, step, new_key)]
        elif c[0] == "step_next":
            _n, step, key, next_key, old, old_key, new, new_key = c
            out += [
                ("phase_end", old, step, old_key),
                ("step_end", step, key),
                ("step_begin", step + 1, next_key),
                ("phase_begin", new, step + 1, new_key),
            ]
        else:
            out.append(c)
    return out


def test_merged_probes_fire_only_while_traced_and_stand_for_the_separate_ones(probes, monkeypatch):
    """With a tracer on phase_next and step_next (seen from the next step boundary on), a phase change
    fires phase_next and the optimizer's step boundary step_next, carrying exactly what the separate
    probes carry; untraced again, the separate probes come back."""
    import ctypes

    from obshub.instrument import hooks as instrument

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert None not in instrument._st.next_sites  # the real extension has both sites
    sites = [ctypes.create_string_buffer(b"\x90") for _ in range(2)]  # NOPs; breakpoints when traced
    instrument._st.next_sites = tuple(ctypes.addressof(s) for s in sites)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def steps(n: int) -> list[tuple]:
        start = len(probes)
        for _ in range(n):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
        return [c for c in probes[start:] if c[0] not in ("register", "tracekey")]

    plain = steps(3)
    assert not _events(plain, "phase_next", "step_next")
    for s in sites:
        s.raw = b"\xcc"  # an agent attached to both
    first = steps(1)  # the sites are read at a step boundary: this step is still all separate
    merged = steps(3)
    assert not _events(first, "step_next", "phase_next")
    # per step: data->forward and forward->backward merged, the boundary merged; backward's end and the
    # optimizer's begin stay separate (nothing begins or ends with them)
    names = [c[0] for c in merged]
    assert names == ["phase_next", "phase_next", "phase_end", "phase_begin", "step_next"] * 3
    for s in sites:
        s.raw = b"\x90"  # detached: the separate probes again from the next step boundary on
    steps(1)
    again = steps(2)
    assert not _events(again, "phase_next", "step_next")

    # keys: expanding the merged steps gives the separate probes' shape, step for step
    def shape(calls: list[tuple]) -> list[tuple]:
        return [(c[0], c[1] if c[0].startswith("phase") else None) for c in calls]

    assert len(again) == 20 and shape(_expand(merged)[-20:]) == shape(again)
    exp = _expand(merged)
    for c in exp:  # every key is the step's, with op_seq counting from 1 within the step
        if c[0] in ("step_begin", "step_end"):
            assert c[2] == schema.make_trace_key(2, c[1], 0)
        else:
            assert schema.parse_trace_key(c[3]).step16 == c[2] & 0xFFFF
    ends = {(c[1], c[3]) for c in exp if c[0] == "phase_end"}
    assert ends <= {(c[1], c[3]) for c in _expand(first + merged) if c[0] == "phase_begin"}


def _step_phases(calls) -> list[tuple]:
    return [(c[0], c[1]) for c in _events(calls, "step_begin", "step_end", "phase_begin")]


def test_closure_forward_and_backward_are_phases_of_their_own(probes, monkeypatch):
    """``optimizer.step(closure)``: the closure's forward and backward are phases; the optimizer phase is
    the update after it. LBFGS re-evaluates the closure inside one step: each evaluation is another
    forward/backward pair, then the optimizer phase again, all in the same step."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    model = torch.nn.Linear(4, 1)
    x, y = torch.randn(8, 4), torch.randn(8, 1)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    closure()  # a first micro-batch outside the step (accumulation, as Lightning runs it)
    opt.step(closure)  # the second inside it
    opt.step(closure=closure)
    seq = _step_phases(probes)
    fb = [("phase_begin", "forward"), ("phase_begin", "backward")]
    assert seq == [
        ("step_begin", 0),
        *fb,
        *fb,
        ("phase_begin", "optimizer"),
        ("step_end", 0),
        ("step_begin", 1),
        ("phase_begin", "data"),
        *fb,
        ("phase_begin", "optimizer"),
        ("step_end", 1),
        ("step_begin", 2),
        ("phase_begin", "data"),
    ]
    start = len(probes)
    lbfgs = torch.optim.LBFGS(model.parameters(), max_iter=3)
    lbfgs.step(closure)
    names = [c[1] for c in _events(probes[start:], "phase_begin")]
    evaluations = names.count("forward")
    assert evaluations >= 2 and names.count("backward") == evaluations
    assert names == ["forward", "backward", "optimizer"] * evaluations + ["data"]
    assert [c[2] for c in _events(probes[start:], "phase_begin")] == [2] * (3 * evaluations) + [3]  # one step


def test_backward_inside_a_modules_forward_is_a_backward_phase(probes, monkeypatch):
    """Manual optimisation as PyTorch Lightning runs it under DDP: the training step (forward, backward,
    optimizer.step) runs inside a wrapping module's forward."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    net = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x):
            self.net(x).sum().backward()
            opt.step()
            opt.zero_grad()

    wrapper = Wrapper()
    for _ in range(2):
        wrapper(torch.randn(2, 4))
    assert _step_phases(probes) == [
        ("step_begin", 0),
        ("phase_begin", "forward"),
        ("phase_begin", "backward"),
        ("phase_begin", "optimizer"),
        ("step_end", 0),
        ("step_begin", 1),
        ("phase_begin", "data"),
        ("phase_begin", "forward"),
        ("phase_begin", "backward"),
        ("phase_begin", "optimizer"),
        ("step_end", 1),
        ("step_begin", 2),
        ("phase_begin", "data"),
    ]


def _gan_steps(n: int) -> None:
    """``n`` iterations of a two-optimizer loop: the discriminator's step, then the generator's."""
    gen, disc = torch.nn.Linear(2, 4), torch.nn.Linear(4, 1)
    opt_g, opt_d = torch.optim.SGD(gen.parameters(), lr=0.1), torch.optim.SGD(disc.parameters(), lr=0.1)
    for _ in range(n):
        fake = gen(torch.randn(3, 2))
        disc(fake.detach()).mean().backward()
        opt_d.step()
        opt_d.zero_grad()
        disc(fake).mean().backward()
        opt_g.step()
        opt_g.zero_grad()


def test_several_optimizers_make_one_step_per_iteration(probes, monkeypatch):
    """Learned: until an optimizer steps again every optimizer.step() ends a step (the first GAN
    iteration counts two), then only the cycle's last optimizer does."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    _gan_steps(4)
    ends = [c[1] for c in _events(probes, "step_end")]
    assert ends == [0, 1, 2, 3, 4]  # iteration 0 -> steps 0 and 1; iterations 1..3 -> steps 2..4
    per_step = Counter(c[2] for c in _events(probes, "phase_begin") if c[1] == "optimizer")
    assert [per_step[s] for s in range(5)] == [1, 1, 2, 2, 2]
    # a new optimizer (a second training stage): learned again, one step per iteration from its repeat
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    assert [c[1] for c in _events(probes, "step_end")] == [0, 1, 2, 3, 4, 5, 6, 7]


def test_optimizers_per_step_override(monkeypatch, untraced):
    from obshub.core.errors import ConfigError
    from obshub.instrument import hooks as instrument

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    calls: list[tuple] = []
    for name in usdt.PROBES:
        monkeypatch.setattr(usdt, name, lambda *a, _n=name: calls.append((_n, *a)))
    monkeypatch.setenv("OBSHUB_OPTIMIZERS_PER_STEP", "two")
    with pytest.raises(ConfigError, match="OBSHUB_OPTIMIZERS_PER_STEP"):
        instrument.enable(job="j", host_id=2)
    monkeypatch.setenv("OBSHUB_OPTIMIZERS_PER_STEP", "2")
    instrument.enable(job="j", host_id=2)
    try:
        _gan_steps(3)
    finally:
        instrument.disable()
        instrument._st.__init__()
        instrument._tls.__dict__.clear()
    assert [c[1] for c in _events(calls, "step_end")] == [0, 1, 2]
    per_step = Counter(c[2] for c in _events(calls, "phase_begin") if c[1] == "optimizer")
    assert [per_step[s] for s in range(3)] == [2, 2, 2]


def test_backward_by_autograd_grad_is_a_phase(probes):
    """A backward outside ``torch.autograd.backward`` (``torch.autograd.grad``, as functorch-style loops
    and some frameworks compute gradients) is seen from the pre-hook on the root output's ``grad_fn``
    and the engine's end-of-pass callback: forward, backward, optimizer, in that order, once each."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 4)
    for _ in range(2):
        out = model(x)
        grads = torch.autograd.grad(out.sum(), list(model.parameters()))
        for p, g in zip(model.parameters(), grads):
            p.grad = g
        opt.step()
    phases = [(c[0], c[1], c[2]) for c in _events(probes, "phase_begin", "phase_end")]
    per_step = ["forward", "backward", "optimizer"]
    assert [p for kind, p, step in phases if kind == "phase_begin" and step == 0] == per_step
    assert [p for kind, p, step in phases if kind == "phase_begin" and step == 1] == ["data", *per_step]
    assert [p for kind, p, _ in phases if kind == "phase_end"] == ["forward", "backward", "optimizer"] + [
        "data",
        *per_step,
    ]


def test_a_caught_exception_fires_the_caught_probe():
    """A hook that raises is caught (training goes on) and tells a tracer where (the ``caught`` probe, which
    the agent counts in obshub_agent_caught_errors_total{where="instrument_hook"}: tests/producer)."""
    from obshub.instrument import _usdt
    from obshub.instrument import hooks as instrument

    @instrument._guarded
    def broken_hook():
        raise RuntimeError("broken")

    _usdt._record(True)
    try:
        assert broken_hook() is None
        got = _usdt._recorded()
    finally:
        _usdt._record(False)
    assert got == [("caught", "hook")], got
