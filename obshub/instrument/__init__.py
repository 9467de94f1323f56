"""The code that runs inside the training process: ``import obshub.instrument;
obshub.instrument.enable()`` installs the PyTorch hooks of :mod:`obshub.instrument.hooks`, which fire the
USDT probes of the C extension ``obshub.instrument._usdt`` (:mod:`obshub.instrument.usdt`).
``obshub run`` (:mod:`obshub.instrument.run`, command in :mod:`obshub.instrument.cli`) does the same for
an unchanged training command through the ``bootstrap/sitecustomize.py`` folder.

This package imports only the standard library, its extension and the stdlib-only ground-floor modules
:mod:`obshub.core.errors` and :mod:`obshub.core.usdt` (torch lazily, when enabled), so it can be installed
into a training environment without the rest of obshub's dependencies.
"""

from obshub.instrument.hooks import OP_NAMES, c10d_ops, current_trace_key, disable, enable, is_enabled
from obshub.instrument.stepsource import set_step

__all__ = ["OP_NAMES", "c10d_ops", "current_trace_key", "disable", "enable", "is_enabled", "set_step"]
