"""The command lines of ``python -m bench.width`` and ``bench.scale``, and the counts of ``bench.summary_size``
and ``bench.training_overhead`` (mends24): bad input exits 2 naming the option and the value (argparse),
before a broker or a process is started. On cfd471b ``--sizes 0``, ``--sizes -5`` and ``--sizes abc`` ended
in tracebacks (``abc`` at parsing, 0 and -5 in the run or the fleet), ``--workers 0`` ran and exited 0,
``--rounds`` was accepted and unused, and options of the broker run were silently ignored by ``--inproc`` /
``--decode``. Nothing runs here: ``run``, ``inproc_cost`` and ``decode_cost`` are replaced by functions that
fail the test if called."""

from __future__ import annotations

import pytest

from bench import scale, width

REFUSED = [
    (["--sizes", "0"], "argument --sizes: '0': 0 hosts; each size is 1 host or more"),
    (["--sizes", "-5"], "argument --sizes: '-5': -5 hosts; each size is 1 host or more"),
    (["--sizes", "abc"], "argument --sizes: 'abc': 'abc' is not a whole number of hosts"),
    (["--sizes", "8,,128"], "argument --sizes: '8,,128': '' is not a whole number of hosts"),
    (["--sizes", ","], "argument --sizes: ',': no host count given"),
    (["--decode", "--sizes", "0"], "argument --sizes: '0': 0 hosts"),
    (["--inproc", "--sizes", "-5"], "argument --sizes: '-5': -5 hosts"),
    (["--workers", "0"], "--workers 0: expected 1 to 8 (the topics have 8 partitions)"),
    (["--workers", "-1"], "--workers -1: expected 1 to 8"),
    (["--workers", "9"], "--workers 9: expected 1 to 8"),
    (["--workers", "two"], "argument --workers: invalid int value: 'two'"),
    (["--rounds", "3"], "unrecognized arguments: --rounds 3"),
    (["--steps", "0"], "--steps 0: expected 12 or more (the straggler slows from step 10"),
    (["--steps", "-4"], "--steps -4: expected 12 or more"),
    (["--steps", "11"], "--steps 11: expected 12 or more"),
    (["--steps", "many"], "argument --steps: invalid int value: 'many'"),
    (["--pause-s", "-1"], "--pause-s -1.0: expected 0 (no pause) or a finite positive number of seconds"),
    (["--pause-s", "nan"], "--pause-s nan: expected 0 (no pause)"),
    (["--pause-s", "inf"], "--pause-s inf: expected 0 (no pause)"),
    (["--pause-s", "soon"], "argument --pause-s: invalid float value: 'soon'"),
    (["--step-s", "inf"], "--step-s inf: expected a positive number of seconds, at most 60"),
    (["--step-s", "nan"], "--step-s nan: expected a positive number of seconds"),
    (["--step-s", "61"], "--step-s 61.0: expected a positive number of seconds, at most 60"),
    (["--ranks-per-host", "0"], "--ranks-per-host 0: expected 1 or more"),
    (["--ranks-per-host", "-2"], "--ranks-per-host -2: expected 1 or more"),
    (["--case", "mem"], "--case mem: only with --inproc"),
    (["--case", "nope", "--inproc"], "argument --case: invalid choice: 'nope'"),
    (["--inproc", "--steps", "20"], "--steps: only without --inproc"),
    (["--inproc", "--quick", "--workers", "2"], "--quick, --workers: only without --inproc"),
    (["--decode", "--step-s", "5", "--pause-s", "0"], "--pause-s, --step-s: only without --decode"),
    (["--inproc", "--decode"], "--inproc and --decode: one at a time"),
]


@pytest.fixture
def nothing_runs(monkeypatch):
    def never(*a, **kw):
        raise AssertionError(f"ran with {a} {kw}")

    for name in ("run", "inproc_cost", "decode_cost"):
        monkeypatch.setattr(width, name, never)


@pytest.mark.parametrize(("argv", "frag"), REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_bad_input_is_refused_naming_the_option_and_value(capsys, nothing_runs, argv, frag):
    with pytest.raises(SystemExit) as exc:
        width.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and frag in err and "Traceback" not in err, err


def test_good_input_reaches_the_run_with_its_defaults(monkeypatch):
    got: dict = {}
    monkeypatch.setattr(width, "run", lambda *a, **kw: got.update(kw, args=a) or {})
    assert width.main(["--sizes", " 8, 128", "--steps", "12", "--workers", "8", "--pause-s", "0"]) == 0
    assert got["sizes"] == (8, 128) and got["steps"] == 12 and got["workers"] == 8 and got["pause_s"] == 0.0
    assert got["step_s"] == 1.0 and got["ranks_per_host"] == 1 and got["args"] == (False,)
    got.clear()
    assert width.main(["--quick"]) == 0
    assert got["sizes"] is None and got["steps"] is None and got["workers"] == width.WORKERS and got["args"] == (True,)
    cases: list = []
    monkeypatch.setattr(width, "inproc_cost", lambda h, r, n, g, **kw: cases.append((h, r, n, g, kw)) or {})
    monkeypatch.setattr(width.common, "save", lambda name, data: "x")
    with pytest.raises(KeyError):  # the table reads the (here empty) rows: the cost ran with its case
        width.main(["--inproc", "--sizes", "16", "--case", "mem"])
    assert cases == [(16, 1, 21, 17, {"guilty_layer": "memory", "mem_share": 0.0})]


def test_scale_has_no_unused_rounds(capsys):
    with pytest.raises(SystemExit) as exc:
        scale.main(["--rounds", "3"])
    assert exc.value.code == 2 and "unrecognized arguments: --rounds 3" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("module", "argv", "frag"),
    [
        ("summary_size", ["--hosts", "0"], "argument --hosts: 0 is not 1 or more"),
        ("summary_size", ["--hosts", "128", "-3"], "argument --hosts: -3 is not 1 or more"),
        ("summary_size", ["--hosts", "wide"], "argument --hosts: 'wide' is not a whole number"),
        ("training_overhead", ["--steps", "0"], "--steps 0: expected 12 or more (the first 10 are warm-up"),
        ("training_overhead", ["--steps", "-5"], "--steps -5: expected 12 or more"),
        ("training_overhead", ["--quick", "--steps", "6"], "--steps 6: expected 7 or more (the first 5"),
    ],
)
def test_the_other_benchmarks_counts_are_refused_below_one_run(capsys, monkeypatch, module, argv, frag):
    """mends24: on cfd471b ``bench.summary_size --hosts 0`` ended in loadgen's ValueError traceback and
    ``bench.training_overhead --steps 0`` ran the default 80 steps (``steps or STEPS``), a negative count
    timed no step after the warm-up."""
    import importlib

    mod = importlib.import_module(f"bench.{module}")
    monkeypatch.setattr(mod, "run", lambda *a, **kw: pytest.fail(f"ran with {a} {kw}"))
    with pytest.raises(SystemExit) as exc:
        mod.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and frag in err and "Traceback" not in err, err
