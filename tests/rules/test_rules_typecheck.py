"""Static type check of rule expressions (obshub.rules.typecheck): every shape that fails on every record
or can never be true is refused by `rules check` at its file:line:col with a fix, inside comprehensions,
through macros, in arithmetic and comparisons; every valid shape, the builtin pack and the documented
examples still load; a hot reload with such a rule keeps the old rules. Each refused expression is also
run through the CEL implementation on a real record, to show it really fails (or is never true)."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from obshub.rules import fields
from obshub.rules.errors import RuleValidationError
from obshub.rules.expr import Compiled, EvalError, compile_expr, expand
from obshub.rules.loader import load_ruleset
from obshub.rules.typecheck import Checker, signal_types

REPO = Path(__file__).resolve().parents[2]
BUILTIN = REPO / "obshub" / "rules" / "builtin"
OBSHUB = [sys.executable, "-m", "obshub.cli"]

RULE = """\
version: 1
macros:
  stalled: stall == true && straggler != null
  bad_member: blame.exists(b, b.layerr == 'network')
  ratio5: 5.0 * baseline.median_ns
rules:
  - id: r
    description: d
    severity: warning
    signal: {signal}
    condition: {cond}
"""

# a step record with a straggler, blame, hang, evidence and baseline: the refused shapes are evaluated on
# it to show they fail (or are never true) on a real record too
STEP = fields.step_record(
    {
        "job": "j",
        "step": 20,
        "closed_by": "complete",
        "hosts": ["a", "b"],
        "step_time_ns": {"a": 100, "b": 900},
        "step_time_max_ns": 900,
        "straggler": {"host": "b", "score": 2.5, "excess_ns": 800, "reason": "r", "group": []},
        "blame": [{"host": "b", "layer": "network", "excess_ns": 700, "straggler_ns": 700, "peer_median_ns": 0}],
        "evidence": {"spread_ns": 10, "hosts": {"b": {"network": 3.0}}},
        "baseline": {"median_ns": 100, "p99_ns": 120, "n": 20, "spread_ns": 10},
        "stall": True,
        "stall_ratio": 9.0,
    }
)
STEP["blame"][0].update(count=3, max_ns=5)

EV = "events\n    kinds: [RDMA_CQ_DONE]"
# (signal, condition as written, where the problem is: the text it starts with in the condition, or
# "line:col" for one in a macro, message fragments)
REFUSED = [
    # float times int: CEL has no implicit int/double conversion
    (
        "steps",
        "step_time_max_ns > 5.0 * baseline.median_ns",
        "5.0",
        ["`5.0 * baseline.median_ns` mixes a double and an int", "write `5.0 * double(baseline.median_ns)`"],
    ),
    ("steps", "step_time_max_ns > baseline.median_ns * 1.5", "baseline", ["write `double(baseline.median_ns) * 1.5`"]),
    (
        "steps",
        "stall_ratio + 1 > 5.0",
        "stall_ratio",
        ["`stall_ratio + 1` mixes a double and an int", "stall_ratio + 1.0"],
    ),
    (EV, "duration_ns / 1000.0 > 20.0", "duration_ns", ["write `double(duration_ns) / 1000.0`"]),
    (EV, "duration_us > 20.0 && value * 2.0 > 1.0", "value", ["mixes an int and a double"]),
    # members compared with the wrong type
    (
        "steps",
        "straggler.host == 5",
        "straggler",
        ["compares a string with an int", "false on every record", "compare it with a string, e.g. '5'"],
    ),
    ("steps", "straggler.host != 5", "straggler", ["true on every record"]),
    ("steps", 'straggler.score > "x"', "straggler", ["orders a double and a string", "fails on every record"]),
    ("steps", "baseline.n >= '10'", "baseline", ["orders an int and a string", "e.g. 10"]),
    (
        "steps",
        "straggler != null && straggler.excess_ns > '5ms'",
        "straggler.excess_ns",
        ["orders an int and a string"],
    ),
    ("steps", "stall == 'true'", "stall", ["compares the bool field 'stall' with a string"]),
    ("steps", "closed_by == 1", "closed_by", ["compares the string field 'closed_by' with an int"]),
    # misspelt members, in comprehensions too
    (
        "steps",
        "blame.exists(b, b.layerr == 'network')",
        "layerr",
        ["unknown field 'b.layerr'", "a blame entry has", "did you mean 'layer'?"],
    ),
    ("steps", "blame.all(b, b.excess_ns > 0) && blame.exists(x, x.hostt == 'a')", "hostt", ["did you mean 'host'?"]),
    ("steps", "straggler.group.exists(g, g.late > 0)", "late", ["did you mean 'late_ns'?"]),
    ("steps", "hang != null && hang.hosts.exists(h, h.sate == 'frozen')", "sate", ["did you mean 'state'?"]),
    ("steps", "collectives.exists(c, c.skew > 1000)", "skew", ["did you mean 'skew_ns'?"]),
    ("steps", "layer_stats.exists(l, layer_stats[l].time_p99 > 0)", "time_p99", ["did you mean 'time_p99_ns'?"]),
    ("steps", "evidence.spread > 0", "evidence", ["did you mean 'spread_ns'?"]),
    # the members of a memory episode (memory_episode: was map(string, dyn), so neither was found)
    (
        "steps",
        "memory_episode.reclaim_nss > 0",
        "memory",
        ["unknown field 'memory_episode.reclaim_nss'", "'reclaim_ns'?"],
    ),
    ("steps", "memory_episode.reclaim_ns > '5ms'", "memory", ["orders an int and a string"]),
    ("steps", "culprit != null && culprit.runq_veto > 3", "culprit.runq_veto", ["orders a bool and an int"]),
    ("steps", "culprit != null && culprit.net_view == 'towards'", "'towards'", ["did you mean 'toward'?"]),
    # comprehension results and predicates
    ("steps", "blame.exists(b, b.excess_ns)", "b.excess_ns", ["the predicate of exists() must be a bool"]),
    ("steps", "blame.map(b, b.host).exists(h, h > 5)", "h > 5", ["orders a string and an int"]),
    ("steps", "blame.exists(b, b.excess_ns > 1.5 * b.peer_median_ns)", "1.5", ["mixes a double and an int"]),
    ("steps", "step_time_ns.exists(h, step_time_ns[h] > 2.0 * baseline.median_ns)", "2.0", ["mixes"]),
    ("steps", "hosts.exists(h, h == 1)", "h == 1", ["compares a string with an int"]),
    # members of what has none; operators on the wrong types
    ("steps", "stall_ratio.value > 1.0", "value", ["is a double, which has no fields"]),
    ("steps", "job + 1 == 'j1'", "job", ["`+` is not defined for a string and an int", "both sides must be strings"]),
    ("steps", "stall && !stall_ratio", "!", ["`!` needs a bool"]),
    ("steps", "stall && world_size", "world_size", ["`&&` needs bools, but 'world_size' is an int"]),
    ("steps", "job.startsWith(5)", "5", ["startsWith() needs a string argument"]),
    ("steps", "size(world_size) > 1", "world_size", ["size() needs a string, list or map"]),
    ("steps", "stall_ratio % 2.0 == 0.0", "stall_ratio", ["`%` is defined for ints only"]),
    ("steps", "stall && 'b' in step_time_max_ns", "step_time_max_ns", ["`in` needs a list or a map"]),
    ("steps", "5 in hosts", "5", ["looks for an int in a list of strings"]),
    # a value that is no bool
    ("steps", "baseline.median_ns", "baseline", ["gives an int, not true or false"]),
    ("steps", "straggler.host", "straggler", ["gives a string, not true or false"]),
    ("steps", "stall ? 1 :0", "stall", ["gives an int, not true or false"]),
    # through a macro: reported at the macro
    ("steps", "stalled && bad_member", "4:33", ["in macro 'bad_member'", "did you mean 'layer'?"]),
    ("steps", "stalled && step_time_max_ns > ratio5", "5:11", ["in macro 'ratio5'", "mixes a double and an int"]),
    # string fields with a known set of values, and maps keyed by layer name
    ("steps", "closed_by == 'completed'", "'completed'", ["false on every record", "did you mean 'complete'?"]),
    ("steps", "blame.exists(b, b.layer == 'netwrok')", "'netwrok'", ["did you mean 'network'?"]),
    ("steps", "hang != null && hang.hosts.exists(h, h.state == 'frozn')", "'frozn'", ["did you mean 'frozen'?"]),
    (
        "steps",
        "evidence.hosts.exists(h, evidence.hosts[h].netwrok > 1.0)",
        "netwrok",
        ["unknown field 'evidence.hosts[h].netwrok'", "did you mean 'network'?"],
    ),
    ("steps", "layer_stats.shed.time_p99_ns > 0", "shed", ["did you mean 'sched'?"]),
    ("steps", "closed_by in ['hang', 'runing']", "'runing'", ["never matches", "did you mean 'running'?"]),
    ("events\n    kinds: [NCCL_COLL]", "kind == 'CUDA_SYNC'", "'CUDA_SYNC'", ["'kind' is one of NCCL_COLL"]),
    # event payloads and health records
    ("events\n    kinds: [RDMA_CQ_DONE]", "payload.qp == 'x'", "payload", ["compares an int with a string"]),
    ("events\n    kinds: [TCP_RETRANSMIT]", "payload.dport > 'x'", "payload", ["orders an int and a string"]),
    ("events\n    kinds: [PCIE_AER]", "payload.replay_timeout > 0", "payload", ["orders a bool and an int"]),
    ("health", "idle_s > 30 * uptime_s", "30", ["mixes an int and a double", "write `30.0 * uptime_s`"]),
    ("health", "topic.size() > 'x'", "topic", ["orders an int and a string"]),
    # a literal pattern the engine's regex crate cannot compile: matches() fails on every record (newuser20)
    ("steps", "job.matches('([a-')", "'([a-'", ["matches(): '([a-' is no regex the engine accepts", "unclosed"]),
    ("steps", "stall && matches(job, '^(?!eval-)')", "'^(?!", ["no regex the engine accepts (look-around"]),
    ("steps", "job.startsWith('x') || job.matches(r'(a')", "r'(a'", ["r'(a' is no regex", "unclosed group"]),
]


def _where(signal: str, cond: str, at: str) -> str:
    if re.fullmatch(r"\d+:\d+", at):
        return at
    line = 12 if "kinds" in signal else 11
    return f"{line}:{16 + cond.index(at)}"


def _problems(path: Path) -> list[str]:
    with pytest.raises(RuleValidationError) as exc:
        load_ruleset([path])
    return [str(p) for p in exc.value.problems]


@pytest.mark.parametrize("signal,cond,where,frags", REFUSED, ids=[c[1] for c in REFUSED])
def test_expressions_that_fail_on_every_record_are_refused_at_their_position(tmp_path, signal, cond, where, frags):
    f = tmp_path / "r.yaml"
    f.write_text(RULE.format(signal=signal, cond=cond))
    got = _problems(f)
    assert len(got) == 1, got
    assert got[0].startswith(f'{f}:{_where(signal, cond, where)}: rule "r": condition'), got
    for frag in frags:
        assert frag in got[0], got


@pytest.mark.parametrize(
    "cond",
    [c[1] for c in REFUSED if c[0] == "steps"],
    ids=[c[1] for c in REFUSED if c[0] == "steps"],
)
def test_refused_step_expressions_really_fail_or_are_never_true(cond):
    """The refusals are true: on a real step record each refused condition errors or is not ``true``,
    and stays so with its literals of the right type (not a coincidence of this record)."""
    macros = {m.split(":")[0].strip(): m.split(":", 1)[1].strip() for m in RULE.split("rules:")[0].splitlines()[2:]}
    source = expand(cond, macros, {})
    try:
        got = Compiled(source, compile_expr(source)).eval(STEP)
    except EvalError:
        return
    if cond == "straggler.host != 5":
        assert got is True, (cond, got)  # true on every record: it filters nothing
    else:
        assert got is not True, (cond, got)


GOOD_SHAPES = [
    ("steps", "step_time_max_ns > 5 * baseline.median_ns"),
    ("steps", "double(step_time_max_ns) > 5.0 * double(baseline.median_ns)"),
    ("steps", "stall_ratio > 5.0 && straggler != null"),
    ("steps", "stall_ratio > 5"),  # comparisons (not arithmetic) cross int/double in CEL
    ("steps", "baseline.n >= 10 && stall"),
    ("steps", "straggler != null && straggler.host == 'node2'"),
    ("steps", "straggler != null && straggler.score > 2.0"),
    ("steps", "straggler != null && straggler.host in hosts"),
    ("steps", "blame.exists(b, b.layer == 'network' && b.excess_ns > 1000000)"),
    ("steps", "blame.exists(b, b.host == straggler.host && b.layer in ['sched', 'memory'])"),
    ("steps", "blame.map(b, b.excess_ns).exists(x, x > 0)"),
    ("steps", "blame.filter(b, b.count > 3).size() > 0"),
    ("steps", "size(blame.filter(b, b.layer == 'network')) >= 1"),
    ("steps", "blame.map(b, b.layer == 'network', b.excess_ns).exists(x, x > 0)"),
    ("steps", "straggler.group.exists(g, g.late_ns > 1000) || hang != null"),
    ("steps", "hang != null && hang.hosts.exists(h, h.state in ['frozen', 'stopped'])"),
    ("steps", "hang != null && hang.waited_ns > hang.after_ns"),
    ("steps", "evidence.hosts.exists(h, evidence.hosts[h].network > 2.0)"),
    ("steps", "'n1' in evidence.hosts && evidence.hosts['n1'].sched > 3.0"),
    ("steps", "step_time_ns.exists(h, step_time_ns[h] > 2 * baseline.median_ns)"),
    ("steps", "layers.exists(h, layers[h].network.time_ns > 1000000)"),
    ("steps", "layer_stats.exists(l, layer_stats[l].time_p99_ns > 2 * layer_stats[l].time_p50_ns)"),
    ("steps", "has(layer_stats.network) && layer_stats.network.max_host != ''"),
    ("steps", "closed_by == 'complete' ? stall : false"),
    ("steps", "(closed_by in ['hang', 'running']) == false && stall"),
    ("steps", "size(missing_hosts) > 0 && world_size > 1"),
    ("steps", "quality.lost_batches + quality.ringbuf_lost > 0"),
    ("steps", "double(late_max_ns) / double(baseline.spread_ns) > 3.0"),
    ("steps", "late_max_ns > baseline.spread_ns * 3"),
    ("steps", "job.startsWith('train-') && job.matches('^train-[a-z]+$')"),
    ("steps", "job.matches(r'^(?i)llama-\\d{1,3}b$') && matches(job, '[[:alpha:]]+')"),
    ("steps", "int(stall_ratio) >= 5"),
    ("steps", "stall_ratio >= 1.5 && !net_directed"),
    ("steps", "stalled && -step > -100"),
    ("steps", "closed_by in ['complete', 'window'] && has(layer_stats.network) && layer_stats.network.time_p99_ns > 0"),
    (
        "steps",
        "layers.exists(h, has(layers[h].nccl) && layers[h].nccl.time_ns > 1) && blame.exists(b, b.layer == 'nccl')",
    ),
    ("steps", "type(straggler) == map || straggler == null"),
    ("steps", "dyn(baseline.median_ns) * 5.0 > 0.0 || stall"),
    ("steps", "inconsistent.exists(c, c.why != '') || collectives.all(c, c.skew_ns < 1000000000)"),
    ("events\n    kinds: [NCCL_COLL]", "payload.symbol == 'ncclAllReduce' && duration_ms > 5.0"),
    ("events\n    kinds: [PYTORCH_OP]", "has(payload.op) && payload.op == 'all_reduce' && duration_ns > 5000000"),
    ("events\n    kinds: [RDMA_CQ_DONE]", "payload.status != 0 && payload.qp > 0"),
    ("events\n    kinds: [RDMA_CQ_DONE]", "duration_us > 20.0 && host != 'x'"),
    ("events\n    kinds: [RDMA_CQ_DONE]", "duration_ns / 1000 > 20 && gpu >= 0"),
    ("health", "idle_s > 30.0 && uptime_s > 60.0"),
    ("health", "lag_messages > 10000 && topic.endsWith('.v1')"),
]


@pytest.mark.parametrize("signal,cond", GOOD_SHAPES, ids=[c[1] for c in GOOD_SHAPES])
def test_valid_shapes_load(tmp_path, signal, cond):
    f = tmp_path / "r.yaml"
    f.write_text(RULE.format(signal=signal, cond=json.dumps(cond)))  # a YAML double-quoted scalar
    rs = load_ruleset([f])
    assert list(rs.rules) == ["r"]


def test_valid_shapes_really_evaluate_on_a_step_record():
    """The accepted step shapes evaluate to a bool on a real record (so the check accepts what works)."""
    for signal, cond in GOOD_SHAPES:
        if signal != "steps":
            continue
        source = expand(cond, {"stalled": "stall == true && straggler != null"}, {})
        got = Compiled(source, compile_expr(source)).eval(STEP)
        assert isinstance(got, bool), (cond, got)


def test_builtin_pack_and_documented_examples_pass_the_type_check(tmp_path):
    load_ruleset([BUILTIN])
    text = (REPO / "docs" / "RULES.md").read_text()
    checked = 0
    for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", text, re.S)):
        if "\nrules:" not in "\n" + block and "\noverrides:" not in "\n" + block:
            continue
        f = tmp_path / f"doc{i}.yaml"
        f.write_text(block)
        load_ruleset([BUILTIN, f])
        checked += 1
    assert checked >= 2


def test_foreach_item_is_typed_from_the_foreach_expression(tmp_path):
    f = tmp_path / "r.yaml"
    text = RULE.format(signal="steps", cond="item == 5") + "    foreach: hosts\n"
    f.write_text(text)
    got = _problems(f)
    assert len(got) == 1 and "compares a string with an int" in got[0] and ":11:16:" in got[0], got
    f.write_text(RULE.format(signal="steps", cond="blame.exists(b, b.host == item)") + "    foreach: hosts\n")
    load_ruleset([f])


def test_threshold_of_and_correlation_keys_are_checked(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text(
        RULE.format(signal="steps", cond="stall")
        + "    threshold: {aggregate: max, of: 'stall_ratio * 2', at_least: 5}\n"
    )
    got = _problems(f)
    assert len(got) == 1 and "`stall_ratio * 2` mixes a double and an int" in got[0], got
    assert ":12:" in got[0], got


def test_checker_types_members_of_every_step_field():
    """Every documented step field and nested member has a type, so no member goes unchecked."""
    env = signal_types("steps")
    assert set(fields.STEP_VARS) == set(env)
    for base, members in fields.NESTED_VARS.items():
        for m in members:
            assert env[base].member(m) is not None, (base, m)
    assert Checker(env).check("baseline.median_nss > 0")[0].message.endswith("did you mean 'median_ns'?")


def test_rules_check_cli_refuses_and_hot_reload_keeps_old_rules(tmp_path, caplog):
    f = tmp_path / "r.yaml"
    f.write_text(RULE.format(signal="steps", cond="blame.exists(b, b.layerr == 'network')"))
    res = subprocess.run([*OBSHUB, "rules", "check", str(f)], capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and f"{f}:11:34:" in res.stdout + res.stderr, res.stdout + res.stderr
    from obshub.core.settings import load_settings
    from obshub.rules.service import RuleService
    from obshub.rules.sinks.config import AlertingConfig

    f.write_text(RULE.format(signal="steps", cond="stalled"))
    svc = RuleService(load_settings(home=tmp_path / "home"), [f], AlertingConfig())
    try:
        f.write_text(RULE.format(signal="steps", cond="stalled && straggler.score > 'x'"))
        import os

        os.utime(f, (1, 1))
        with caplog.at_level(logging.ERROR, logger="obshub.rules.service"):
            assert svc.maybe_reload() is False
        assert "orders a double and a string" in caplog.text and f"{f}:11:27:" in caplog.text, caplog.text
        assert list(svc.engine.ruleset.rules) == ["r"]
        assert svc.engine.ruleset.rules["r"].condition.source == "(stall == true && straggler != null)"
        empty = tmp_path / "empty.yaml"  # a served rule file that holds nothing is refused, as `check` does
        empty.write_text("# later\n")
        f.write_text(RULE.format(signal="steps", cond="stalled"))
        svc.rule_paths.append(empty)
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="obshub.rules.service"):
            assert svc.maybe_reload() is False
        assert f"{empty}: no rules: the file is empty" in caplog.text, caplog.text
        assert list(svc.engine.ruleset.rules) == ["r"]
        with pytest.raises(RuleValidationError, match="no rules: the file is empty"):  # serve refuses to start
            RuleService(load_settings(home=tmp_path / "home"), [empty], AlertingConfig())
        empty.write_text("version: 1\nrules: []  # later\n")  # empty on purpose: served, noted
        os.utime(empty, (2, 2))
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="obshub.rules.service"):
            assert svc.maybe_reload() is True
        assert f"{empty}: no rules (`rules: []`, as written)" in caplog.text, caplog.text
    finally:
        svc.dispatcher.close()


def test_an_engine_of_another_group_prefix_never_restores_the_firing_alerts_of_another(tmp_path):
    """Each demo run has its own ``--group-prefix``: a new run's notify loop restored ``dispatch.json``
    of the earlier runs and re-sent their firing alerts to its sinks. The notify state is per prefix."""
    from obshub.core.settings import load_settings
    from obshub.rules.service import RuleService
    from obshub.rules.service_common import atomic_write
    from obshub.rules.sinks.config import AlertingConfig

    f = tmp_path / "r.yaml"
    f.write_text(RULE.format(signal="steps", cond="stalled"))
    settings = load_settings(home=tmp_path / "home")
    change = {"fingerprint": "ab", "rule": "r", "status": "firing", "labels": {"alertname": "r", "job": "old"}}
    first = RuleService(settings, [f], AlertingConfig())
    try:
        atomic_write(first.notify_loop.state_path, {"v": 2, "firing": {"ab": change}})
    finally:
        first.dispatcher.close()
    other = RuleService(settings, [f], AlertingConfig(), group_prefix="obshub-rules-demo-run2")
    again = RuleService(settings, [f], AlertingConfig())
    try:
        assert (
            other.dispatcher.firing == {}
            and other.notify_loop.state_path.name == "dispatch-obshub-rules-demo-run2.json"
        )
        assert list(again.dispatcher.firing) == ["ab"]  # its own prefix's state: re-sends continue after a restart
    finally:
        other.dispatcher.close()
        again.dispatcher.close()
