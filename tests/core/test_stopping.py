"""obshub/core/stopping.py: the children of a process that blocks SIGTERM/SIGINT (``rules serve``, ``streams
worker``, ``agent``) still get those signals."""

from __future__ import annotations

import signal
import subprocess

import pytest

from obshub.core import stopping
from obshub.producer.kheaders import merge_tree

#: a shell that sends itself SIGTERM: it dies of it unless the signal is blocked, then says it survived
SELF_TERM = ["sh", "-c", "kill -TERM $$; echo survived"]


@pytest.fixture
def stop_signals_blocked():
    """This (main) thread blocks SIGTERM and SIGINT as a guarded service does; the old mask after."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def test_a_child_gets_sigterm_while_its_parent_blocks_it(stop_signals_blocked):
    # what subprocess does here: the child inherits the blocked mask and shrugs SIGTERM off
    assert subprocess.run(SELF_TERM, capture_output=True, text=True).stdout == "survived\n"
    got = stopping.run_child(SELF_TERM)
    assert (got.returncode, got.stdout) == (-signal.SIGTERM, "")
    # nothing blocked, SIGPIPE at its default (Python ignores it, and an ignored signal survives exec)
    status = stopping.run_child(["cat", "/proc/self/status"]).stdout
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert int(fields["SigBlk"], 16) == 0, fields["SigBlk"]
    assert not int(fields["SigIgn"], 16) & (1 << (signal.SIGPIPE - 1)), fields["SigIgn"]


def test_run_child_returns_the_output_and_the_exit_code_and_check_raises():
    got = stopping.run_child(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (got.returncode, got.stdout, got.stderr) == (3, "out\n", "err\n")
    with pytest.raises(subprocess.CalledProcessError) as exc:
        stopping.run_child(["sh", "-c", "exit 2"], check=True)
    assert exc.value.returncode == 2
    with pytest.raises(FileNotFoundError):
        stopping.run_child(["obshub-no-such-command"])


def test_merge_tree_links_common_then_arch_files(tmp_path):
    common, arch = tmp_path / "common", tmp_path / "arch"
    for d, text in ((common, "common"), (arch, "arch")):
        (d / "include").mkdir(parents=True)
        (d / "include" / "both.h").write_text(text)
    (common / "include" / "only_common.h").write_text("c")
    dest = merge_tree(arch, common, tmp_path / "merged")
    assert (dest / "include" / "both.h").read_text() == "arch"
    assert (dest / "include" / "only_common.h").is_symlink()
    with pytest.raises(subprocess.CalledProcessError):
        merge_tree(tmp_path / "missing", common, tmp_path / "merged-2")
