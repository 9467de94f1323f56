"""Fixtures of the in-process hook tests (test_instrument_hooks.py, test_instrument_hotpath.py)."""

from __future__ import annotations

import pytest

from obshub.instrument import usdt


@pytest.fixture
def untraced(monkeypatch):
    """The real extension's probe sites read as untraced for the test's length.

    An agent elsewhere on this machine that follows every registered process (a node's agent, a
    benchmark's) attaches to this process's copy of the extension: its uprobes put breakpoints at the real
    probe sites and the hooks would take the traced path (merged probes, register again), failing tests
    that judge the untraced one. A test that wants a tracer points the hooks at sites of its own
    (test_instrument_hooks.py), which are read as they are."""
    real_sites = {usdt.probe_site(n) for n in ("register", "phase_next", "step_next", "coll")} - {None}
    site_traced = usdt.site_traced
    monkeypatch.setattr(usdt, "site_traced", lambda address: address not in real_sites and site_traced(address))


@pytest.fixture
def probes(monkeypatch, untraced):
    """Enable instrumentation (job "j", host id 2) with recording probes; yields the call log, a list of
    ``(probe, *args)``. Disables and restores everything afterwards."""
    from obshub.instrument import hooks as instrument

    calls: list[tuple] = []
    # the recorders replace the Python probe functions, which the Python collective kernel calls; the C++
    # kernel fires the C probe sites directly (its events: test_instrument_usdt.py, test_instrument_native.py)
    monkeypatch.setenv("OBSHUB_COLLECTIVE_KERNEL", "python")
    for name in usdt.PROBES:
        monkeypatch.setattr(usdt, name, lambda *a, _n=name: calls.append((_n, *a)))
    # like the C function, coll_end ignores a 7th argument (the future of the done-callback it serves as)
    monkeypatch.setattr(usdt, "coll_end", lambda *a: calls.append(("coll_end", *a[:6])))
    import torch

    torch.set_num_threads(1)
    instrument.enable(job="j", host_id=2)
    try:
        yield calls
    finally:
        instrument.disable()
        # counters are process-wide: start the next test from a clean state
        instrument._st.__init__()
        instrument._tls.__dict__.clear()
