"""Option types shared by the command lines of every stage (click is part of the ground floor's ``cli``
extra)."""

from __future__ import annotations

import math

import click


class Finite(click.FloatRange):
    """A float option in a range that refuses ``nan`` and ``inf`` as well: click's FloatRange lets ``nan``
    through every bound (each comparison with it is false), so ``--timeout-s nan`` was taken and read as
    "no time at all" or "forever". Same arguments as ``click.FloatRange``; a bad value is a usage error
    (exit 2) naming the option."""

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv
