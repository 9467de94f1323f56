"""Printing the command lines' rich output so that output piped or written to a file keeps every line whole.

Off a terminal rich lays a table out within ``$COLUMNS`` or 80 columns, wrapping long cells and cutting
the words that do not fit with '…': ``obshub alerts | grep node-07`` lost the end of a summary, a log or
path column of ``obshub status > status.txt`` was cut. :func:`print_table` prints such a table at its own
width instead (on a terminal, rich's layout within the terminal's width is kept). Plain lines wrapped the
same way (at the 200 columns ``obshub`` sets off a terminal: a long path in ``obshub status``, an error
naming one): :class:`WholeLineConsole` prints each line whole off a terminal."""

from __future__ import annotations

from typing import Any

import rich.console
from rich.console import RenderableType
from rich.measure import Measurement


class WholeLineConsole(rich.console.Console):
    """A rich Console whose :meth:`print` keeps each line whole (no wrap, no crop) where its file is not a
    terminal (a pipe, a file, a test's captured output; read at each call), as ``soft_wrap=True`` does; on a
    terminal (or with ``FORCE_COLOR``) lines wrap at the terminal's width as before. An explicit
    ``soft_wrap`` argument wins. Tables keep their own layout (:func:`print_table`)."""

    def print(self, *objects: Any, soft_wrap: bool | None = None, **kwargs: Any) -> None:
        if soft_wrap is None and not self.is_terminal:
            soft_wrap = True
        super().print(*objects, soft_wrap=soft_wrap, **kwargs)


PIPE_MAX_WIDTH = 10_000
"""The widest a table is printed off a terminal, in columns (a cell of 50 kB is still wrapped there)."""


def print_table(console: rich.console.Console, table: RenderableType) -> None:
    """Print ``table`` (a rich Table) on ``console``. On a terminal (or with ``FORCE_COLOR``) as rich lays
    it out within the console's width; elsewhere (stdout or stderr piped, redirected to a file) at the
    table's widest layout, up to ``PIPE_MAX_WIDTH`` columns, so no cell is wrapped or cut with '…' for want
    of width. A table narrower than the console prints as before."""
    if console.is_terminal:
        console.print(table)
        return
    need = Measurement.get(console, console.options.update_width(PIPE_MAX_WIDTH), table).maximum
    if need <= console.width:
        console.print(table)
        return
    # a console of the same file (read at this call: a test's captured stdout) as wide as the table
    rich.console.Console(file=console.file, width=need, highlight=False, no_color=console.no_color).print(table)
