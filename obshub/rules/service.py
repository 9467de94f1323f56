"""``obshub rules serve``: the rule engine as a service on Kafka.

Two loops, each with its own consumer group, so evaluation and delivery fail and recover separately:

* **engine** (main thread, ``rules.service_engine.EngineLoop``), group ``<prefix>-engine``: steps and
  events in, ``Engine.process``, state changes out to ``obshub.alerts.v1``; per owned steps partition, its
  changes, engine snapshot (topic ``<prefix>-state``) and input offsets committed in one Kafka
  transaction. Several engines with one prefix split the jobs; one alone owns them all.
* **notify** (a thread, ``rules.service_notify.NotifyLoop``), group ``<prefix>-notify``: alert changes in,
  ``Dispatcher``, sinks; offsets committed only below what every sink has (at-least-once).

This module holds what both share: settings, the rule set and its hot reload (files checked every second
and on SIGHUP, validated first: a broken file keeps the old rules and logs every problem as
file:line:col), and the process lifecycle (signals, registration with the local stack, metrics/web).

State: the engine's on the topic ``<prefix>-state``; the notify loop's in ``<state_dir>/rules/``:
``dispatch.json`` (written atomically), silences in ``silences.json``.
"""

from __future__ import annotations

import difflib
import os
import signal
import socket
import threading
import time
from pathlib import Path

from obshub.core import kafka, registry
from obshub.core.reach import BrokerWatch
from obshub.core.settings import RULES, Settings
from obshub.rules.dispatch import Dispatcher
from obshub.rules.engine import freeze_heap
from obshub.rules.errors import Problem, RulesError, RuleValidationError, SinkConfigError
from obshub.rules.loader import BUILTIN_DIR, expand_paths, load_ruleset
from obshub.rules.service_common import RELOADS, log, state_dir
from obshub.rules.service_engine import EngineLoop
from obshub.rules.service_notify import NotifyLoop, OffsetTracker
from obshub.rules.silences import SilenceStore
from obshub.rules.sinks.config import AlertingConfig, build_sinks

__all__ = ["BUILTIN_DIR", "OffsetTracker", "RuleService", "state_dir"]


def _warn_empty(ruleset) -> None:
    """Log each rule file of ``ruleset`` that holds no rules on purpose (``rules: []``; as ``rules check``
    does; a file empty by mistake is refused by the loader)."""
    for f in ruleset.empty:
        log.info("%s: no rules (`rules: []`, as written)", f)
    for u in ruleset.unread:  # rules the user may think run
        log.warning("%s", u)


def route_problems(ruleset, sink_names: set[str]) -> list[Problem]:
    """One Problem per rule of ``ruleset`` whose ``routes:`` names a sink that ``sink_names`` (the alerting
    config's) lacks: that rule's alerts would reach no sink (only the named sinks get them). Each names the
    file:line:col where the route was written (``Rule.routes_at``: the rule's ``routes:`` or an override's,
    else the rule's file:line), the unknown sink, the nearest configured name ("did you mean") and the
    configured ones; [] when every route names a sink."""
    out = []
    for r in ruleset.rules.values():
        for name in dict.fromkeys(r.routes):
            if name in sink_names:
                continue
            near = difflib.get_close_matches(name, sorted(sink_names), n=1)
            guess = f"did you mean '{near[0]}'? " if near else ""
            out.append(
                Problem(
                    *r.routes_at.get(name, (r.file, r.line, 1)),
                    f"routes to sink '{name}', which the alerting config does not have: its alerts would "
                    f"reach no sink ({guess}configured: {', '.join(sorted(sink_names)) or 'none'})",
                    r.id,
                )
            )
    return out


class RuleService:
    """The engine and notify loops. ``rule_paths`` default to the builtin pack; ``from_beginning``
    makes a new consumer group start at the earliest offsets (default: latest for inputs).
    ``max_replay_age_s``: changes older than this, read by a new notify group, are not delivered.
    ``checkpoint_every_s``: each owned partition's engine state and input offsets are committed at least
    this often while input arrives (a wide job's state takes milliseconds to encode). Services with one
    ``group_prefix`` split the jobs (``rules.service_engine``); ``scale_out`` is accepted for
    compatibility and changes nothing (every service scales out)."""

    # the loops' parts, for the web pages, the CLI and tests
    engine = property(lambda self: self.engine_loop.engine)
    dispatcher = property(lambda self: self.notify_loop.dispatcher)
    tracker = property(lambda self: self.notify_loop.tracker)
    outbox = property(lambda self: self.engine_loop.outbox)  # changes not yet published

    def __init__(
        self,
        settings: Settings,
        rule_paths: list[Path],
        config: AlertingConfig,
        *,
        group_prefix: str = RULES.group_prefix,
        from_beginning: bool = False,
        health_every_s: float = RULES.health_every_s,
        max_replay_age_s: float = RULES.max_replay_age_s,
        log_path: str = "stderr",
        checkpoint_every_s: float = 1.0,
        scale_out: bool = False,
        resolve_on_exit: bool = False,
    ):
        self.settings, self.rule_paths, self.config = settings, list(rule_paths) or [BUILTIN_DIR], config
        self.resolve_on_exit = resolve_on_exit
        self.group_prefix, self.from_beginning = group_prefix, from_beginning
        self.health_every_s = health_every_s
        self.state = state_dir(settings)
        self.log_path = log_path
        self.stop = threading.Event()
        self.watch = BrokerWatch(settings.bootstrap_servers, log, "the rule engine")
        self.running = threading.Event()  # both loops started (the readiness probe)
        self.http_port: int | None = None
        self.reload_requested = threading.Event()
        self.ruleset = load_ruleset(self.rule_paths)  # raises RuleValidationError: refuse to start broken
        self._check_routes(self.ruleset)  # raises SinkConfigError, before any client or thread starts
        _warn_empty(self.ruleset)
        self._mtimes = self._rule_mtimes()
        external_url = (config.external_url or f"http://{socket.getfqdn()}").rstrip("/") + "/rules"
        self.engine_loop = EngineLoop(self, external_url, checkpoint_every_s)
        self.notify_loop = NotifyLoop(
            self,
            lambda on_ack: Dispatcher(
                build_sinks(config),
                config.route,
                self.ruleset.inhibit,
                SilenceStore(self.state / "silences.json"),
                config.delivery.policy(),
                on_ack,
                passthrough=config.mode == "alertmanager",
            ),
            max_replay_age_s,
        )
        if config.mode == "alertmanager" and self.ruleset.inhibit:
            log.warning(
                "mode alertmanager: the %d inhibit rule(s) of the rule files are not applied (write them "
                "as inhibit_rules in Alertmanager's configuration)",
                len(self.ruleset.inhibit),
            )
        self.started = time.monotonic()
        freeze_heap()  # modules, rules and restored state: out of the full collections' way

    def _check_routes(self, ruleset) -> None:
        """Refuse rules routed to a sink the alerting config lacks (``route_problems``: their alerts would
        reach no sink). Raises SinkConfigError listing each as file:line:col: rule "id": why."""
        problems = route_problems(ruleset, {s.name for s in self.config.sinks})
        if problems:
            raise SinkConfigError(
                f"{len(problems)} rule route(s) name no sink of the alerting config:\n" + "\n".join(map(str, problems)),
                "name a sink of the alerting config (--config) in `routes:`, or add that sink to the config",
            )

    # -- reload ----------------------------------------------------------------------------------------------
    def _rule_mtimes(self) -> dict[str, float]:
        out = {}
        for p in expand_paths(self.rule_paths):
            try:
                out[str(p)] = p.stat().st_mtime
            except OSError:
                out[str(p)] = -1.0
        return out

    def maybe_reload(self) -> bool | None:
        """Reload when a rule file changed or SIGHUP arrived. True: new rules active; False: the new files
        were invalid and the old rules keep running (problems logged); None: nothing to do."""
        mtimes = self._rule_mtimes()
        if mtimes == self._mtimes and not self.reload_requested.is_set():
            return None
        self.reload_requested.clear()
        self._mtimes = mtimes
        try:
            new = load_ruleset(self.rule_paths)
        except RuleValidationError as exc:
            for p in exc.problems:
                log.error("reload rejected, keeping the previous %d rules: %s", len(self.ruleset.rules), p)
            RELOADS.labels("rejected").inc()
            return False
        problems = route_problems(new, {s.name for s in self.config.sinks})
        if problems:  # as a broken file: the old rules keep running, their alerts reach their sinks
            for p in problems:
                log.error("reload rejected, keeping the previous %d rules: %s", len(self.ruleset.rules), p)
            RELOADS.labels("rejected").inc()
            return False
        RELOADS.labels("ok").inc()
        self.ruleset = new
        _warn_empty(new)
        self.engine.replace_rules(new)
        self.dispatcher.inhibit = list(new.inhibit)
        log.info("reloaded %d rules from %s", len(new.rules), ", ".join(new.files))
        return True

    # -- the loops ------------------------------------------------------------------------------------------
    def run_engine(self) -> None:
        """The engine loop (``EngineLoop.run_engine``); returns when ``stop`` is set."""
        self.engine_loop.run_engine()

    def run_notify(self) -> None:
        """The notify loop (``NotifyLoop.run_notify``); returns when ``stop`` is set."""
        self.notify_loop.run_notify()

    def serve(self, metrics_port: int | None = None, metrics_addr: str = "0.0.0.0") -> None:
        """Run both loops until SIGTERM/SIGINT; SIGHUP reloads the rule files. Registers the component
        ``rules`` with the local stack while it runs. With ``metrics_port``, Prometheus metrics are
        served on http://<metrics_addr>:<port>/metrics (0 = any free port, logged)."""
        if metrics_port is not None:
            from obshub.rules import web

            try:
                server = web.serve(web.RulesWeb(self, ready=lambda: self.running.is_set()), metrics_port, metrics_addr)
            except OSError as exc:  # a port in use, an address that is not this host's (socket.gaierror too)
                raise RulesError(
                    f"Failed to serve metrics on {metrics_addr}:{metrics_port}: {exc}",
                    "choose a free port with --metrics-port (0: any free port) or another --metrics-addr",
                ) from None
            self.http_port = server.server_port
            if not self.config.external_url:
                self.engine.external_url = f"http://{socket.getfqdn()}:{self.http_port}/rules"
            log.info(
                "metrics on http://%s:%d/metrics, rules and alerts on /rules (generatorURL %s)",
                metrics_addr,
                self.http_port,
                self.engine.external_url,
            )
        signal.signal(signal.SIGHUP, lambda *_: self.reload_requested.set())
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop.set())
        # incomplete OBSHUB_KAFKA_* security settings fail here, in this thread, before a record is written or
        # the notify thread starts (whose own connection would fail beside it with a second traceback)
        admin = kafka.admin_config(kafka.connection(self.settings))
        # "rules" for the first engine of this $OBSHUB_HOME, "rules-2", ... beside it (its own record, so
        # `obshub down` stops every one and a stopping engine removes only its own)
        self.component = registry.free_name(self.settings, "rules")
        registry.register_component(
            self.settings,
            self.component,
            os.getpid(),
            log=self.log_path,
            rules=len(self.ruleset.rules),
            group_prefix=self.group_prefix,  # its state topic PREFIX-state (`obshub topics check`)
        )
        notify = threading.Thread(target=self.run_notify, name="notify", daemon=True)
        notify.start()
        # one line per broker lost / back (a cluster of several brokers keeps serving without one)
        self.watch.watch_members(admin, self.stop)
        self.running.set()
        try:
            self.run_engine()
        finally:
            self.stop.set()
            notify.join(30)
            self.dispatcher.close()
            registry.unregister_component(self.settings, self.component)
