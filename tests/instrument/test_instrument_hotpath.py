"""The hooks' per-call hot path (issue #34): after the first step with a root forward, the global module
hooks are gone (inner modules run on PyTorch's fast path, no obshub code per call) and the root modules'
own hooks keep the phases exactly as before; a step without any root forward brings the global hooks
back for the next step. Probe functions replaced by recorders, as in test_instrument_hooks.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def _global_hooks() -> int:
    import torch.nn.modules.module as m

    return len(m._global_forward_pre_hooks) + len(m._global_forward_hooks)


def _phases(calls, step):
    return [c[1] for c in calls if c[0] == "phase_begin" and c[2] == step]


def test_inner_modules_run_hook_free_after_the_first_step(probes):
    from obshub.instrument import hooks as instrument

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    loss_fn = torch.nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(3, 4), torch.randn(3, 2)
    assert _global_hooks() == 2
    for step in range(4):
        if step == 1:
            assert _global_hooks() == 0  # discovery done after step 0
            assert set(instrument._roots) == {model, loss_fn}
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    for step in (1, 2, 3):
        assert _phases(probes, step) == ["data", "forward", "backward", "optimizer"], (step, probes)
    # the roots' own hooks fire per root call; the 3 inner modules (Linear, ReLU, Linear) have none
    for inner in model:
        assert not inner._forward_pre_hooks and not inner._forward_hooks
    assert model._forward_pre_hooks and loss_fn._forward_pre_hooks


def test_a_step_without_forward_installs_the_global_hooks_again(probes):
    from obshub.instrument import hooks as instrument

    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    assert _global_hooks() == 0
    opt.step()  # a step with no forward in it: look for (new) roots again
    assert _global_hooks() == 2
    other = torch.nn.Linear(4, 2)  # a new model: a root the global hooks find
    other(torch.randn(2, 4)).sum().backward()
    opt.step()
    assert other in instrument._roots and _global_hooks() == 0
    assert _phases(probes, 3) == ["data"] and "forward" in _phases(probes, 2)


def test_disable_removes_the_roots_hooks(probes):
    from obshub.instrument import hooks as instrument

    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    assert model._forward_pre_hooks
    instrument.disable()
    assert not model._forward_pre_hooks and not model._forward_hooks and _global_hooks() == 0
