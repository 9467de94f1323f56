"""``bench.ttd``'s command line: bad input and options of another campaign are refused by argparse (exit 2,
the option named, no traceback) before a broker or demo starts. Only the parsing runs here (``parse_args``;
the campaigns need root and take minutes)."""

from __future__ import annotations

import pytest

from bench import ttd


@pytest.mark.parametrize(
    "argv,frag",
    [
        (["--stall", ","], "--stall ,: layers are net, cpu, process, mem"),
        (["--stall", "cpu", "--fault-hosts", "a"], "--fault-hosts 'a': comma-separated host indices"),
        (
            ["--stall", "cpu", "--stall-param", "stall_ms=abc"],
            "--stall-param 'stall_ms=abc': KEY=VALUE with a positive",
        ),
        (["--stall", "cpu", "--clean-s", "-5"], "argument --clean-s: '-5': seconds above 0"),
        (["--clean-s", "0"], "argument --clean-s: '0': seconds above 0"),
        (["--clean-s", "nan"], "argument --clean-s: 'nan': seconds above 0"),
        (["--clean-s", "soon"], "argument --clean-s: 'soon' is not a number of seconds"),
        (["--fault-rank", "1"], "--fault-rank: only with --stall"),
        (["--ranks-per-host", "2"], "--ranks-per-host: only with --stall"),
        (["--stall-param", "stall_ms=300"], "--stall-param: only with --stall"),
        (["--quick", "--stall", "cpu"], "--stall and --quick: one campaign at a time"),
        (["--stall", "cpu", "--combine", "a.json"], "--stall and --combine: one campaign at a time"),
    ],
)
def test_bad_input_is_refused_before_any_run(capsys, argv, frag):
    with pytest.raises(SystemExit) as exc:
        ttd.parse_args(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and frag in err and "Traceback" not in err, err


def test_a_stall_campaign_is_parsed_into_layers_hosts_and_params():
    a = ttd.parse_args(["--stall", "cpu,process", "--stall-param", "stall_ms=300", "--clean-s", "30"])
    assert a.layers == ("cpu", "process") and a.fault_host_list == (1, 3) and a.params == {"stall_ms": 300.0}
    assert a.clean_s == 30.0
    assert ttd.parse_args(["--fault-hosts", "0,2"]).fault_host_list == (0, 2)
