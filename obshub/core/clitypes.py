"""Option types shared by the command lines of every stage (click is part of the ground floor's ``cli``
extra)."""

from __future__ import annotations

import math
from collections.abc import Callable

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


class KafkaName(click.ParamType):
    """A name that becomes part of a Kafka topic name (a rule engine's ``--group-prefix``: its state topic
    is ``PREFIX-state``): 1 to ``max_len`` characters of ``[A-Za-z0-9._-]``, the only ones Kafka allows in
    a topic name (at most 249 in all). Anything else is a usage error (exit 2) naming the option, before
    the broker refuses the topic."""

    name = "name"
    ALLOWED = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")

    def __init__(self, max_len: int = 200):
        self.max_len = max_len

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        bad = sorted(set(text) - self.ALLOWED)
        if not text or len(text) > self.max_len or bad:
            why = (
                "is empty"
                if not text
                else f"is longer than {self.max_len} characters"
                if len(text) > self.max_len
                else f"holds {', '.join(map(repr, bad))}"
            )
            self.fail(f"{text!r} {why}: a Kafka topic name takes letters, digits, '.', '_' and '-'", param, ctx)
        return text


class NonEmpty(click.ParamType):
    """A text option that must say something when given: 1 to ``max_len`` characters, not only blanks.
    ``--job ""`` (or ``--bootstrap ""``, ``--host " "``) was read as the option left out (``replay``
    published under the folder's name, ``alerts`` listed every job's alerts, ``trace export`` and
    ``--bootstrap`` used the default broker) without a word; now a usage error (exit 2) naming the option.
    ``what`` names the value in the message ("a job name")."""

    name = "text"

    def __init__(self, what: str = "a value", max_len: int = 4096):
        self.what, self.max_len = what, max_len

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if not text.strip():
            default = "" if param is not None and param.required else ", or leave the option out for its default"
            self.fail(f"{text!r} is empty: give {self.what}{default}", param, ctx)
        if len(text) > self.max_len:
            self.fail(f"{len(text):,} characters is more than the {self.max_len:,} of {self.what}", param, ctx)
        return text


class HostName(NonEmpty):
    """An agent's host name (``--host``): letters, digits, '.', '_' or '-', starting with a letter or
    digit, as :class:`obshub.core.settings.AgentConfig` takes it (it names the Kafka key and the spool
    folder). Anything else is a usage error (exit 2) naming the option: ``deep-dive --host ''`` exited 1
    and ``--host 'a b'`` waited for the broker to ask for a host no agent can have."""

    def __init__(self) -> None:
        super().__init__("a host name")

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from obshub.core.settings import HOST_RE

        text = super().convert(value, param, ctx)
        if not HOST_RE.match(text):
            self.fail(
                f"{text!r} is not a host name: letters, digits, '.', '_' or '-' (as the agent's --host)", param, ctx
            )
        return text


class Bootstrap(NonEmpty):
    """Kafka bootstrap servers (``--bootstrap``): ``host:port``, several separated by commas, each port
    1-65535 (:func:`obshub.core.kafka.bootstrap_problem`). A malformed one (``127.0.0.1:99999``) is a
    usage error (exit 2) naming the option at once, and the variable when it came from one (``envvar``), not
    a connect timeout ending in "connection refused"."""

    def __init__(self) -> None:
        super().__init__("host:port[,host:port...]")

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from obshub.core.kafka import BOOTSTRAP_FORM, bootstrap_problem

        text = super().convert(value, param, ctx)
        why = bootstrap_problem(text)
        if why is not None:
            src = ctx.get_parameter_source(param.name) if ctx is not None and param is not None and param.name else None
            env = f" (from {param.envvar})" if src is click.core.ParameterSource.ENVIRONMENT and param else ""
            self.fail(f"{why}{env}; give {BOOTSTRAP_FORM}", param, ctx)
        return text.strip()


def stop_timeout_option(default: float | None, what_stops: str, default_text: str | None = None) -> Callable:
    """The ``--stop-timeout SECONDS`` option of a long-running command guarded by
    :class:`obshub.core.stopping.StopWatch` (``rules serve``, ``streams worker``, ``agent``): finite, > 0,
    at most a day (``MAX_STOP_GRACE_S``). ``what_stops`` ends the help's first sentence, e.g. "a second
    signal forces it at once"; ``default_text`` shows a default computed later (``default`` None)."""
    from obshub.core.stopping import MAX_STOP_GRACE_S

    return click.option(
        "--stop-timeout",
        type=Finite(min=0, min_open=True, max=MAX_STOP_GRACE_S),
        default=default,
        show_default=default_text or True,
        help="seconds from SIGTERM/SIGINT to a forced exit (exit 1, each thread's stack on stderr) when the stop "
        f"does not finish, e.g. a Kafka client call that does not return while the cluster is gone; {what_stops}",
    )
