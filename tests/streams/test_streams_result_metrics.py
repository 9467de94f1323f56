"""Step summaries -> Prometheus series (streams.metrics.StepResultMetrics), on real summaries computed by
the offline analysis from synthetic batches with a known straggler."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from obshub.streams import offline, synthetic
from obshub.streams.metrics import StepResultMetrics


def _samples(reg: CollectorRegistry) -> dict[tuple[str, frozenset], float]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _summaries(scn: synthetic.Scenario) -> list[dict]:
    res = offline.summarize_batches(b for _k, b in synthetic.generate(scn))
    return [res[k] for k in sorted(res)]


def test_results_as_series_in_base_units_with_training_job_label():
    scn = synthetic.Scenario(job="m1", hosts=3, steps=12, straggler=1, guilty_steps=(3, 7), guilty_layer="memory")
    reg = CollectorRegistry()
    m = StepResultMetrics(reg)
    sums = _summaries(scn)
    for s in sums:
        m.observe(s)
    got = _samples(reg)
    J = ("training_job", "m1")
    assert got[("obshub_step_duration_seconds_count", frozenset({J, ("host", "node0")}))] == 12
    total = sum(s["step_time_ns"]["node0"] for s in sums) / 1e9
    assert abs(got[("obshub_step_duration_seconds_sum", frozenset({J, ("host", "node0")}))] - total) < 1e-6
    assert got[("obshub_straggler_steps_total", frozenset({J, ("host", "node1")}))] == 2
    assert got[("obshub_straggler_last_step", frozenset({J, ("host", "node1")}))] == 7
    assert got[("obshub_blamed_steps_total", frozenset({J, ("host", "node1"), ("layer", "memory")}))] == 2
    excess = sum(b["excess_ns"] for s in sums for b in s["blame"] if b["layer"] == "memory") / 1e9
    assert (
        abs(got[("obshub_blame_excess_seconds_total", frozenset({J, ("host", "node1"), ("layer", "memory")}))] - excess)
        < 1e-6
    )
    assert got[("obshub_last_step", frozenset({J}))] == 11
    assert got[("obshub_collective_skew_seconds_count", frozenset({J}))] == sum(len(s["collectives"]) for s in sums)
    assert not any(n.endswith("_ns") or ("job", "m1") in labels for n, labels in got)


def test_missing_hosts_and_idle_jobs_expire():
    scn = synthetic.Scenario(job="m2", hosts=3, steps=4, stop_host=2, stop_after=1)
    reg = CollectorRegistry()
    m = StepResultMetrics(reg, idle_s=0.0)
    for s in _summaries(scn):
        m.observe(s)
    got = _samples(reg)
    assert got[("obshub_missing_host_steps_total", frozenset({("training_job", "m2"), ("host", "node2")}))] == 2
    m.observe({"job": "other", "step": 1, "closed_by": "complete", "step_time_ns": {"a": 1}})
    left = {dict(labels).get("training_job") for _n, labels in _samples(reg)}
    assert "m2" not in left and "other" in left


def test_latest_step_gauges_only_grow_when_steps_close_out_of_order():
    reg = CollectorRegistry()
    m = StepResultMetrics(reg)
    strag = {"host": "n1", "excess_ns": 5_000_000}
    for step in (25, 28, 26, 29, 27):
        m.observe(
            {
                "job": "o",
                "step": step,
                "closed_by": "window",
                "step_time_ns": {"n1": 1},
                "straggler": strag if step in (26, 27) else None,
            }
        )
    got = _samples(reg)
    assert got[("obshub_last_step", frozenset({("training_job", "o")}))] == 29
    assert got[("obshub_straggler_last_step", frozenset({("training_job", "o"), ("host", "n1")}))] == 27


def test_a_wide_job_has_bounded_host_series_and_exact_job_counts():
    """300 hosts: the step-time histogram keeps its own series for at most ``host_series_max`` hosts plus
    the straggler, every other step time goes to ``host="_other"``, and every step time is counted once."""
    from obshub.streams.metrics import HOST_SLOWEST, OTHER_HOSTS

    reg = CollectorRegistry()
    m = StepResultMetrics(reg, host_series_max=16)
    hosts = [f"n{i}" for i in range(300)]
    for step in range(40):
        times = {h: 1_000_000_000 + ((i * 7919 + step * 104729) % 1000) * 1000 for i, h in enumerate(hosts)}
        strag = {"host": "n299", "excess_ns": 1} if step == 39 else None
        m.observe({"job": "w", "step": step, "closed_by": "complete", "step_time_ns": times, "straggler": strag})
    got = _samples(reg)
    counts = {dict(labels)["host"]: v for (n, labels), v in got.items() if n == "obshub_step_duration_seconds_count"}
    assert sum(counts.values()) == 300 * 40, "every step time observed once"
    assert OTHER_HOSTS in counts and "n299" in counts, "the straggler has its own series past the bound"
    assert 16 <= len(counts) - 1 <= 16 + HOST_SLOWEST + 1, sorted(counts)


def test_a_narrow_job_keeps_every_host_series():
    reg = CollectorRegistry()
    m = StepResultMetrics(reg, host_series_max=16)
    m.observe({"job": "n", "step": 0, "closed_by": "complete", "step_time_ns": {f"h{i}": 1 for i in range(16)}})
    hosts = {dict(labels)["host"] for (n, labels) in _samples(reg) if n == "obshub_step_duration_seconds_count"}
    assert hosts == {f"h{i}" for i in range(16)}
