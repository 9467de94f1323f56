"""The command lines' tables off a terminal (piped, redirected to a file): every cell whole, on one line.
rich lays a table out within ``$COLUMNS`` (``obshub`` sets 200 off a terminal) or 80 columns and wrapped
or cut ('…') the cells that did not fit, so ``obshub status | grep`` or a log file lost a path's end."""

from __future__ import annotations

import io
import os
import subprocess
import sys

from rich.console import Console
from rich.table import Table

from obshub.core.tables import print_table

OBSHUB = [sys.executable, "-m", "obshub.cli"]


def _table(cell: str) -> Table:
    t = Table("probe", "reason", title="probes")
    t.add_row("cuda_cuLaunchKernel", cell)
    t.add_row("sched", "")
    return t


def test_a_piped_table_keeps_its_long_cells_whole_and_a_narrow_one_is_laid_out_as_before():
    reason = "library libcuda.so* not mapped by the target nor found in " + "/very/long/lib/dir" * 12 + " and 5 more"
    out = io.StringIO()  # not a terminal
    console = Console(file=out, width=80, highlight=False)
    print_table(console, _table(reason))
    lines = out.getvalue().splitlines()
    assert any(reason in ln for ln in lines), out.getvalue()  # one line, not wrapped, not cut
    assert "…" not in out.getvalue()
    assert len({len(ln) for ln in lines[1:]}) == 1  # the frame is whole: every row as wide as the header
    narrow = io.StringIO()
    Console(file=narrow, width=80, highlight=False).print(_table("short"))
    again = io.StringIO()
    print_table(Console(file=again, width=80, highlight=False), _table("short"))
    assert again.getvalue() == narrow.getvalue()


def test_obshub_status_piped_prints_a_long_log_path_whole(tmp_path):
    """`obshub status > status.txt`: the components table's log column kept 200 columns and wrapped a deep
    log path over several lines."""
    from obshub.core import registry
    from obshub.core.settings import load_settings

    home = tmp_path / "home"
    log = str(tmp_path / ("logs-" + "x" * 120) / ("rules-" + "y" * 120) / "rules.log")
    registry.register_component(load_settings(home=home), "rules", os.getpid(), log=log)
    env = {**os.environ, "OBSHUB_HOME": str(home), "OBSHUB_KAFKA_PORT": "1"}
    env.pop("COLUMNS", None)
    r = subprocess.run([*OBSHUB, "status"], capture_output=True, text=True, env=env, timeout=120)
    assert "components" in r.stdout and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert any(log in ln and "rules" in ln for ln in r.stdout.splitlines()), r.stdout


def test_plain_lines_piped_stay_whole_on_stdout_and_stderr(tmp_path):
    """A plain line (not a table) of a command whose stdout and stderr are pipes: ``obshub`` sets 200
    columns off a terminal and rich wrapped every longer line there, so ``obshub status | grep`` and a log
    of an error lost the end of a long path (tables were mended by print_table; obshub.core.tables)."""
    from tests.apps.test_no_broker import closed_port

    home = tmp_path / ("state-" + "h" * 220)
    env = {**os.environ, "OBSHUB_HOME": str(home), "OBSHUB_KAFKA_PORT": str(closed_port())}
    env.pop("COLUMNS", None)
    env.pop("OBSHUB_BOOTSTRAP", None)
    r = subprocess.run([*OBSHUB, "status"], capture_output=True, text=True, env=env, timeout=120)
    lines = r.stdout.splitlines()
    assert any(ln.startswith(f"state {home}; logs in {home}") and "(broker log " in ln for ln in lines), r.stdout
    (tmp_path / "a-file").write_text("")
    bad = tmp_path / "a-file" / ("d" * 220)  # a home below a file: an error naming the whole path
    r = subprocess.run(
        [*OBSHUB, "up"], capture_output=True, text=True, env={**env, "OBSHUB_HOME": str(bad)}, timeout=120
    )
    assert r.returncode != 0
    assert any(ln.startswith("error: ") and str(bad) in ln for ln in r.stderr.splitlines()), r.stderr
