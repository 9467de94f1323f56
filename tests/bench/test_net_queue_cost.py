"""``bench.net_queue_cost``'s command line: bad input is refused by argparse (exit 2, the option named,
no traceback) before the namespaces are set up and the agent's BPF is compiled. Only the parsing runs
here (``parse_args``): the bench itself needs root and two network namespaces."""

from __future__ import annotations

import pytest

from bench import net_queue_cost


@pytest.mark.parametrize(
    "argv,frag",
    [
        (["--tbf-rate", "fast"], "'fast' is not a rate in tc's words"),
        (["--tbf-rate", "0mbit"], "a tbf's rate must be above 0"),
        (["--tbf-rate=-5mbit"], "'-5mbit' is not a rate"),
        (["--qdiscs", ","], "--qdiscs: no qdisc given"),
        (["--qdiscs", ""], "--qdiscs: no qdisc given"),
        (["--qdiscs", "tbf,tbf"], "--qdiscs: tbf given twice"),
        (["--qdiscs", "fq-codel"], "--qdiscs: unknown fq-codel"),
        (["--mb", "-1"], "-1 is not 1 or more"),
        (["--rounds", "three"], "'three' is not a whole number"),
    ],
)
def test_bad_input_is_refused_before_anything_is_set_up(capsys, argv, frag):
    with pytest.raises(SystemExit) as exc:
        net_queue_cost.parse_args(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and frag in err and "Traceback" not in err, err


def test_tc_rates_in_tcs_words_are_kept_as_written():
    for rate in ("1gbit", "500Mbit", "10mbps", "1.5gbit", "100kibit", "8000"):
        assert net_queue_cost.tc_rate(rate) == rate
