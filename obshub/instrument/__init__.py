"""``import obshub.instrument; obshub.instrument.enable()``: the in-process PyTorch instrumentation of
:mod:`producer.instrument` under the front-door package name (same functions, same objects)."""

from producer.instrument import COLLECTIVES, current_trace_key, disable, enable, is_enabled

__all__ = ["COLLECTIVES", "current_trace_key", "disable", "enable", "is_enabled"]
