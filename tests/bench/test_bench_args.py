"""The command lines of ``bench.net_queue_cost``, ``bench.ttd`` and ``bench.exit_race``: bad input, and options of another
campaign, are refused by argparse (exit 2, the option named, no traceback) before the namespaces, a broker or
a demo are set up or the agent's BPF is compiled. Only the parsing runs here (each module's
``parse_args``): the benches themselves need root and take minutes."""

from __future__ import annotations

import pytest

from bench import exit_race, net_queue_cost, ttd

REFUSED = [
    (exit_race, ["--parents", "poll,wait"], "--parents 'poll,wait': comma-separated kinds of poll, block"),
    (exit_race, ["--parents", ","], "--parents ',': comma-separated kinds of poll, block"),
    (exit_race, ["--tries", "0"], "argument --tries: 0 is below 1"),
    (exit_race, ["--cost-n", "many"], "argument --cost-n: 'many' is not a whole number"),
    (exit_race, ["--poll-s", "0"], "argument --poll-s: '0': seconds above 0, at most 10"),
    (net_queue_cost, ["--tbf-rate", "fast"], "'fast' is not a rate in tc's words"),
    (net_queue_cost, ["--tbf-rate", "0mbit"], "a tbf's rate must be above 0"),
    (net_queue_cost, ["--tbf-rate=-5mbit"], "'-5mbit' is not a rate"),
    (net_queue_cost, ["--qdiscs", ","], "--qdiscs: no qdisc given"),
    (net_queue_cost, ["--qdiscs", ""], "--qdiscs: no qdisc given"),
    (net_queue_cost, ["--qdiscs", "tbf,tbf"], "--qdiscs: tbf given twice"),
    (net_queue_cost, ["--qdiscs", "fq-codel"], "--qdiscs: unknown fq-codel"),
    (net_queue_cost, ["--mb", "-1"], "-1 is not 1 or more"),
    (net_queue_cost, ["--rounds", "three"], "'three' is not a whole number"),
    (ttd, ["--stall", ","], "--stall ,: layers are net, cpu, process, mem"),
    (ttd, ["--stall", "cpu", "--fault-hosts", "a"], "--fault-hosts 'a': comma-separated host indices"),
    (ttd, ["--stall", "cpu", "--stall-param", "stall_ms=abc"], "--stall-param 'stall_ms=abc': KEY=VALUE with"),
    (ttd, ["--stall", "cpu", "--clean-s", "-5"], "argument --clean-s: '-5': seconds above 0"),
    (ttd, ["--clean-s", "0"], "argument --clean-s: '0': seconds above 0"),
    (ttd, ["--clean-s", "nan"], "argument --clean-s: 'nan': seconds above 0"),
    (ttd, ["--clean-s", "soon"], "argument --clean-s: 'soon' is not a number of seconds"),
    (ttd, ["--fault-rank", "1"], "--fault-rank: only with --stall"),
    (ttd, ["--ranks-per-host", "2"], "--ranks-per-host: only with --stall"),
    (ttd, ["--stall-param", "stall_ms=300"], "--stall-param: only with --stall"),
    (ttd, ["--quick", "--stall", "cpu"], "--stall and --quick: one campaign at a time"),
    (ttd, ["--stall", "cpu", "--combine", "a.json"], "--stall and --combine: one campaign at a time"),
    # `--stall ""` (an empty $LAYERS) ran the 40-minute fault campaign instead
    (ttd, ["--stall", ""], "--stall '': no layer named"),
    # the errors of obshub demo named its own options (--sequence, --fault stall --param layer=...)
    (ttd, ["--stall", "--fault-hosts", "7"], "--fault-hosts 7: host indices are 0..3"),
    (ttd, ["--stall", "net", "--ranks-per-host", "2", "--fault-rank", "0"], "use --stall cpu,process"),
    (ttd, ["--stall", "--stall-param", "layer=cpu"], "the layers are --stall's here (e.g. --stall cpu)"),
    (ttd, ["--stall", "cpu", "--ranks-per-host", "0"], "--ranks-per-host 0: at least 1 rank per host"),
    (
        ttd,
        ["--stall", "cpu", "--fault-rank", "1"],
        "--fault-rank 1 is outside 0..0: the local rank of the fault host; give --ranks-per-host 2..8",
    ),
]


@pytest.mark.parametrize("mod,argv,frag", REFUSED, ids=[f"{m.__name__} {' '.join(a)}" for m, a, _ in REFUSED])
def test_bad_input_is_refused_before_anything_is_set_up(capsys, mod, argv, frag):
    with pytest.raises(SystemExit) as exc:
        mod.parse_args(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and frag in err and "Traceback" not in err, err


def test_tc_rates_in_tcs_words_are_kept_as_written():
    for rate in ("1gbit", "500Mbit", "10mbps", "1.5gbit", "100kibit", "8000"):
        assert net_queue_cost.tc_rate(rate) == rate


def test_a_stall_campaign_is_parsed_into_layers_hosts_and_params():
    a = ttd.parse_args(["--stall", "cpu,process", "--stall-param", "stall_ms=300", "--clean-s", "30"])
    assert a.layers == ("cpu", "process") and a.fault_host_list == (1, 3) and a.params == {"stall_ms": 300.0}
    assert a.clean_s == 30.0
    assert ttd.parse_args(["--fault-hosts", "0,2"]).fault_host_list == (0, 2)
