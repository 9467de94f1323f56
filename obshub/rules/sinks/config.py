"""The alerting config (``obshub rules serve --config alerting.yaml``): sinks, route and delivery,
validated with pydantic. Secrets are never written in the file: each secret field takes ``*_env`` (an
environment variable name) or ``*_file`` (a file holding the value, e.g. a Kubernetes secret mount) and is
held as a pydantic ``SecretStr``, which prints as ``**********``.

Example::

    version: 1
    route: {group_by: [alertname, job], group_wait: 10s, group_interval: 1m, repeat_interval: 4h}
    delivery: {max_attempts: 6, max_elapsed: 5m, timeout: 10s}
    sinks:
      - {name: oncall-slack, type: slack, url_env: OBSHUB_SLACK_WEBHOOK, min_severity: warning}
      - {name: pager, type: pagerduty, routing_key_file: /run/secrets/pd_key, min_severity: error}
      - {name: am, type: alertmanager, url: "http://alertmanager:9093", resend_every: 1m}
      - {name: hook, type: webhook, url_env: OBSHUB_WEBHOOK_URL}
      - {name: console, type: console}
      - {name: dive, type: deep_dive, min_severity: warning, steps: 20, max_time: 2m, host_every: 10m}

A ``deep_dive`` sink is an action, not a notification: it asks the agent of the host a firing alert names
(its ``host`` label) for a deep dive through the control topic, rate-limited
(``obshub/rules/sinks/deep_dive.py``; ``bootstrap`` defaults to the settings' Kafka).

Alertmanager-first (``mode: alertmanager``): obshub does no grouping, inhibition or silencing of its
own; every firing and resolved change goes straight to the Alertmanager sinks (firing alerts re-sent
every ``resend_every``), and the team's Alertmanager groups, inhibits, silences and routes them to its
receivers. Only ``alertmanager`` and ``console`` sinks are allowed in this mode; ``route`` and rule
``inhibit`` entries are not applied (a warning says so)::

    version: 1
    mode: alertmanager
    external_url: http://obshub-rules.monitoring:9108      # where generatorURL links lead (/rules#<rule>)
    runbook_base_url: https://git.example.com/obshub/blob/main/   # runbook_url = base + rule's runbook path
    sinks:
      - {name: am, type: alertmanager, url: "http://alertmanager:9093", resend_every: 1m}
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Literal, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from obshub.rules.durations import MAX_DURATION_NS, parse_duration_ns
from obshub.rules.errors import SinkConfigError
from obshub.rules.sinks.alertmanager import AlertmanagerSink
from obshub.rules.sinks.base import DeliveryPolicy, Sink
from obshub.rules.sinks.console import ConsoleSink
from obshub.rules.sinks.deep_dive import DeepDiveSink
from obshub.rules.sinks.pagerduty import DEFAULT_URL, PagerDutySink
from obshub.rules.sinks.slack import SlackSink
from obshub.rules.sinks.webhook import WebhookSink


def _dur_s(v: str) -> float:
    return parse_duration_ns(v) / 1e9


def _duration(v: str) -> str:
    """A duration setting (``500ms``, ``10s``, ``1h30m``) of at most ``MAX_DURATION_NS`` (10 years);
    raises ValueError naming the text."""
    if parse_duration_ns(v) > MAX_DURATION_NS:
        raise ValueError(f"{v} is longer than 3650d (10 years), the longest a setting may give")
    return v


def _positive_duration(v: str) -> str:
    """A duration setting that must be longer than 0 (a period, a timeout); raises ValueError."""
    if parse_duration_ns(v) == 0:
        raise ValueError(f"{v} must be longer than 0")
    return _duration(v)


class Route(BaseModel):
    """Grouping (Alertmanager's route): alerts with equal ``group_by`` label values form one group;
    the first notification of a group waits ``group_wait``, later changes are batched every
    ``group_interval``, and a group still firing is re-notified every ``repeat_interval``."""

    model_config = ConfigDict(extra="forbid")
    group_by: list[str] = Field(default_factory=lambda: ["alertname", "job"])
    group_wait: str = "10s"
    group_interval: str = "1m"
    repeat_interval: str = "4h"

    _check_waits = field_validator("group_wait", "group_interval")(_duration)  # 0: at once
    _check_repeat = field_validator("repeat_interval")(_positive_duration)


class Delivery(BaseModel):
    """Retry settings shared by all sinks (see rules.sinks.base)."""

    model_config = ConfigDict(extra="forbid")
    max_attempts: int = Field(6, ge=1, le=100_000, strict=True)  # "6" (a string) is refused, as in rule files
    max_elapsed: str = "5m"
    timeout: str = "10s"
    backoff_initial: str = "1s"
    backoff_max: str = "1m"
    retry_after_max: str = "5m"

    _check_waits = field_validator("retry_after_max")(_duration)
    _check_periods = field_validator("max_elapsed", "timeout", "backoff_initial", "backoff_max")(_positive_duration)

    def policy(self) -> DeliveryPolicy:
        return DeliveryPolicy(
            self.max_attempts,
            _dur_s(self.max_elapsed),
            _dur_s(self.timeout),
            _dur_s(self.backoff_initial),
            _dur_s(self.backoff_max),
            _dur_s(self.retry_after_max),
        )


def http_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be the endpoint a sink posts to, or None: it must start ``http://`` or
    ``https://``, name a host, hold no white space, and a port must be 1..65535; a bracketed host must be
    an IPv6 address (``http://[::1]:9093``). The reason never quotes the URL: a URL may carry a secret (a
    token in its path, ``user:password@``)."""
    if any(c.isspace() for c in url):
        return "holds white space (a URL has none: percent-encode it, or remove a stray space or newline)"
    try:
        parts = urlsplit(url)
    except ValueError:  # "Invalid IPv6 URL", "'zz' does not appear to be an IPv4 or IPv6 address"
        return (
            "has a malformed [bracketed] host (an IPv6 address in brackets, e.g. http://[::1]:9093, "
            "or a host name without them)"
        )
    if parts.scheme.lower() not in ("http", "https"):
        return f"is not an http:// or https:// URL (scheme {parts.scheme + '://' if parts.scheme else 'missing'})"
    try:
        port = parts.port
    except ValueError:
        return "has a port that is not a number from 1 to 65535"
    if not parts.hostname:
        return "names no host (write http://HOST:PORT)"
    if port == 0:
        return "has port 0 (a port is 1 to 65535)"
    return None


#: the fields each sink type reads (``url`` of slack and webhook: refused by build_sink with the reason)
SINK_FIELDS: dict[str, frozenset[str]] = {
    t: frozenset({"name", "type", "min_severity", *more})
    for t, more in {
        "slack": ("url", "url_env", "url_file"),
        "webhook": ("url", "url_env", "url_file"),
        "pagerduty": ("url", "routing_key_env", "routing_key_file", "dedup_prefix"),
        "alertmanager": ("url", "resend_every"),
        "console": (),
        "deep_dive": ("steps", "max_time", "host_every", "max_per_hour", "host_label", "bootstrap"),
    }.items()
}

SINK_NAME_PATTERN = r"^[a-z][a-z0-9_-]*$"  # rule files' `routes` accept the same (obshub/rules/schema.json sink_name)


class SinkSpec(BaseModel):
    """One sink. ``type`` selects the fields that apply; secrets come from ``*_env`` or ``*_file``."""

    model_config = ConfigDict(extra="forbid")
    name: str
    type: Literal["slack", "pagerduty", "alertmanager", "webhook", "console", "deep_dive"]
    min_severity: Literal["critical", "error", "warning", "info"] = "info"
    url: str | None = None  # non-secret URL (alertmanager, pagerduty endpoint)
    url_env: str | None = None
    url_file: Path | None = None
    routing_key_env: str | None = None
    routing_key_file: Path | None = None
    resend_every: str = "1m"
    dedup_prefix: str = "obshub"
    # deep_dive only (obshub/rules/sinks/deep_dive.py)
    steps: int = Field(20, ge=1, le=100_000, strict=True)
    max_time: str = "2m"
    host_every: str = "10m"
    max_per_hour: int = Field(12, ge=1, le=100_000, strict=True)
    host_label: str = "host"
    bootstrap: str | None = None

    _check_resend = field_validator("resend_every", "max_time")(_positive_duration)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        """``SINK_NAME_PATTERN``, said in words (pydantic's own message quoted the regular expression)."""
        if not re.match(SINK_NAME_PATTERN, v):
            shown = repr(v) if len(v) <= 80 else f"{v[:80]!r}... ({len(v):,} characters)"
            raise ValueError(
                f"{shown} is no sink name: lower-case letters, digits, '-' and '_', starting with a letter "
                "(e.g. oncall-slack); rule files' `routes:` name sinks so"
            )
        return v

    _check_every = field_validator("host_every")(_duration)

    @model_validator(mode="after")
    def _fields_of_its_type(self) -> "SinkSpec":
        extra = sorted(self.model_fields_set - SINK_FIELDS[self.type])
        if extra:
            raise ValueError(
                f"{', '.join(extra)} {'does' if len(extra) == 1 else 'do'} not apply to a {self.type} sink, which "
                f"would ignore {'it' if len(extra) == 1 else 'them'} (its fields: {', '.join(sorted(SINK_FIELDS[self.type]))})"
            )
        return self

    @field_validator("url")
    @classmethod
    def _endpoint(cls, v: str | None, info: ValidationInfo) -> str | None:
        why = None if v is None else http_url_problem(v)
        if why:
            example = DEFAULT_URL if info.data.get("type") == "pagerduty" else "http://alertmanager:9093"
            raise ValueError(f"the URL {why}; e.g. {example}")
        return v


class AlertingConfig(BaseModel):
    """The whole alerting config file. ``mode``: ``obshub`` (obshub groups, inhibits and silences, then
    delivers to every sink) or ``alertmanager`` (Alertmanager-first, see the module docstring).
    ``external_url``: the base URL under which the rule engine's HTTP port is reachable (its ``/rules``
    page is every alert's ``generatorURL``); empty = ``http://<this host's name>:<metrics port>``.
    ``runbook_base_url``: prefix that turns a rule's runbook path into the ``runbook_url`` annotation."""

    model_config = ConfigDict(extra="forbid")
    version: Literal[1] = 1
    mode: Literal["obshub", "alertmanager"] = "obshub"
    route: Route = Field(default_factory=Route)
    delivery: Delivery = Field(default_factory=Delivery)
    sinks: list[SinkSpec] = Field(default_factory=lambda: [SinkSpec(name="console", type="console")])
    external_url: str = ""
    runbook_base_url: str = ""

    @field_validator("sinks")
    @classmethod
    def _unique_names(cls, sinks: list[SinkSpec]) -> list[SinkSpec]:
        names = [s.name for s in sinks]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"sink name(s) used twice: {', '.join(dup)} (give each sink its own name)")
        return sinks

    @field_validator("external_url", "runbook_base_url")
    @classmethod
    def _url(cls, v: str, info: ValidationInfo) -> str:
        """An http(s) URL as a sink's (``http_url_problem``: a host, a port 1..65535, no white space; only
        the ``http://`` prefix was checked, so ``http://`` alone or ``http://host:port x`` passed), or empty;
        ``external_url`` also without ``?query`` or ``#fragment`` (``/rules#<rule>`` is appended to it).
        Raises ValueError with the value and an example."""
        if not v:
            return v
        why = http_url_problem(v)
        if why is None and info.field_name == "external_url":
            parts = urlsplit(v)
            if parts.query or parts.fragment:
                why = "has a ?query or #fragment (/rules#<rule id> is appended to it)"
        if why:
            shown = repr(v) if len(v) <= 80 else f"{v[:80]!r}... ({len(v):,} characters)"
            example = (
                "http://obshub-rules.monitoring:9108"
                if info.field_name == "external_url"
                else "https://git.example.com/obshub/blob/main/"
            )
            raise ValueError(f"{shown} {why}; e.g. {example}")
        return v

    @model_validator(mode="after")
    def _alertmanager_first(self) -> "AlertingConfig":
        if self.mode == "alertmanager":
            other = [
                f"{s.name} ({s.type})" for s in self.sinks if s.type not in ("alertmanager", "console", "deep_dive")
            ]
            if other:
                raise ValueError(
                    f"mode alertmanager sends every alert to Alertmanager only; sinks {', '.join(other)} "
                    "belong in Alertmanager's receivers"
                )
            if not any(s.type == "alertmanager" for s in self.sinks):
                raise ValueError("mode alertmanager needs at least one sink of type alertmanager")
        return self


def read_secret(name: str, env: str | None, file: Path | None, what: str) -> SecretStr:
    """A secret from the environment variable ``env`` or the file ``file`` (trailing newline stripped).
    Raises SinkConfigError naming the variable or file, never the value."""
    if env:
        val = os.environ.get(env)
        if not val:
            raise SinkConfigError(
                f"sink '{name}': environment variable {env} (its {what}) is not set or empty",
                f"export {env}=... before starting `obshub rules serve`",
            )
        return SecretStr(val)
    if file:
        try:
            val = Path(file).read_text().strip()
        except OSError as exc:
            raise SinkConfigError(
                f"sink '{name}': cannot read {what} from {file}: {exc.strerror}", "check the path and its permissions"
            ) from None
        if not val:
            raise SinkConfigError(f"sink '{name}': {file} (its {what}) is empty", "write the secret into it")
        return SecretStr(val)
    raise SinkConfigError(
        f"sink '{name}': no {what} given",
        f"set `{'url' if what == 'webhook URL' else 'routing_key'}"
        "_env:` (an environment variable) or `..._file:` (a file) in the sink",
    )


def _secret_url(spec: SinkSpec) -> SecretStr:
    """The webhook URL of slack/webhook sink ``spec`` from its ``url_env`` or ``url_file``. Raises
    SinkConfigError naming the variable or file (never the URL) when it is missing or not an http(s) URL."""
    url = read_secret(spec.name, spec.url_env, spec.url_file, "webhook URL")
    why = http_url_problem(url.get_secret_value())
    if why:
        source = f"environment variable {spec.url_env}" if spec.url_env else f"file {spec.url_file}"
        raise SinkConfigError(
            f"sink '{spec.name}': the webhook URL in {source} {why}",
            f"put the whole URL the {spec.type} service gave you (https://...) into {source}",
        )
    return url


def build_sink(spec: SinkSpec, external_url: str = "") -> Sink:
    """Construct the sink of ``spec``, reading its secrets. Raises SinkConfigError."""
    if spec.type in ("slack", "webhook") and spec.url:
        raise SinkConfigError(
            f"sink '{spec.name}': a {spec.type} sink's URL is a secret and is not read from `url:`",
            "put it in an environment variable (`url_env:`) or a file (`url_file:`), never in the config file",
        )
    if spec.type == "slack":
        return SlackSink(spec.name, _secret_url(spec), spec.min_severity)
    if spec.type == "webhook":
        return WebhookSink(
            spec.name,
            _secret_url(spec),
            spec.min_severity,
            external_url,
        )
    if spec.type == "pagerduty":
        key = read_secret(spec.name, spec.routing_key_env, spec.routing_key_file, "routing key")
        return PagerDutySink(spec.name, key, spec.url or DEFAULT_URL, spec.min_severity, spec.dedup_prefix)
    if spec.type == "alertmanager":
        if not spec.url:
            raise SinkConfigError(f"sink '{spec.name}': alertmanager needs `url:` (e.g. http://alertmanager:9093)")
        return AlertmanagerSink(spec.name, spec.url, spec.min_severity, _dur_s(spec.resend_every))
    if spec.type == "deep_dive":
        return _deep_dive_sink(spec)
    return ConsoleSink(spec.name, spec.min_severity)


def _deep_dive_sink(spec: SinkSpec) -> DeepDiveSink:
    """The ``deep_dive`` sink of ``spec``: a rate-limited trigger on the control topic of ``spec.bootstrap``
    (default: the settings' Kafka, ``OBSHUB_BOOTSTRAP``). Raises SinkConfigError for a bad value."""
    from obshub.core.control import DeepDiveTrigger
    from obshub.core.kafka import KafkaConnection
    from obshub.core.settings import load_settings

    max_s = _dur_s(spec.max_time)
    if max_s > 86400:
        raise SinkConfigError(f"sink '{spec.name}': max_time {spec.max_time} is longer than 24h")
    try:
        conn = KafkaConnection(bootstrap=spec.bootstrap or load_settings().bootstrap_servers)
    except (ValueError, ValidationError) as exc:
        raise SinkConfigError(f"sink '{spec.name}': the Kafka connection is not usable: {exc}") from None
    trigger = DeepDiveTrigger(conn, spec.steps, max_s, _dur_s(spec.host_every), spec.max_per_hour)
    return DeepDiveSink(spec.name, trigger, spec.min_severity, spec.host_label)


def load_config(path: Path | None) -> AlertingConfig:
    """Read the alerting config (YAML); None gives the defaults (console sink only). Raises
    SinkConfigError that lists each problem as ``file:line:col: field/path: why`` (YAML syntax, a byte
    that is not UTF-8, a field of the wrong type or value, an unknown field)."""
    if path is None:
        return AlertingConfig()
    from obshub.rules.yamlfile import load_yaml, plain_value, position, read_text

    file = str(path)
    text, problems = read_text(Path(path))
    if problems and problems[0].line == 0:
        why = problems[0].message.removeprefix("cannot read: ")
        raise SinkConfigError(f"cannot read alerting config {path}: {why}", "check the path")
    doc = None
    if text is not None:
        doc, problems = load_yaml(text, file)
    if problems:
        raise SinkConfigError("invalid alerting config:\n" + "\n".join(map(str, problems)), "fix the YAML")
    try:
        return AlertingConfig.model_validate(plain_value(doc) if doc is not None else {})
    except ValidationError as exc:
        lines = []
        errors = exc.errors()
        misspelt = _misspelt_required(errors)
        for e in errors:
            loc = [int(p) if isinstance(p, int) else p for p in e["loc"]]
            if e["type"] == "missing" and tuple(loc) in misspelt.values():
                continue  # said once, at the misspelt key
            unknown = e["type"] == "extra_forbidden"  # point at the key itself
            line, col = position(doc, loc, key=unknown) if doc is not None else (1, 1)
            msg = e["msg"].removeprefix("Value error, ")
            if unknown:
                msg = _unknown_field(loc, misspelt)
            lines.append((line, col, f"{file}:{line}:{col}: {'/'.join(map(str, loc)) or 'config'}: {msg}"))
        lines = [text for *_, text in sorted(lines)]
        raise SinkConfigError(
            "invalid alerting config:\n" + "\n".join(lines), "see docs/RULES.md, section 'Alerting config'"
        ) from None


def _fields_at(loc: list) -> list[str]:
    """The field names of the config mapping at ``loc`` (keys and list indexes from the top: ``["sinks",
    0]`` is a sink), [] when ``loc`` names no mapping of the config."""
    model: type[BaseModel] = AlertingConfig
    for p in loc:
        if isinstance(p, int):
            continue  # an item of the list the previous key's field holds: its model was taken there
        field = model.model_fields.get(p)
        ann = field.annotation if field is not None else None
        if get_origin(ann) is list:
            ann = get_args(ann)[0]
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return list(model.model_fields)


def _misspelt_required(errors: list) -> dict[tuple, tuple]:
    """``{loc of an unknown key: loc of the required field it misspells}``: pydantic reports a misspelt
    required field twice, as "Field required" at its mapping and "Extra inputs are not permitted" at the
    key (``typ:`` for ``type:``); the pair is one problem, said at the key
    (:func:`~obshub.rules.yamlfile.nearest_missing_required`)."""
    from obshub.rules.yamlfile import nearest_missing_required

    missing = {tuple(e["loc"]) for e in errors if e["type"] == "missing"}
    out = {}
    for e in errors:
        if e["type"] == "extra_forbidden" and e["loc"]:
            *parent, key = e["loc"]
            absent = {str(m[-1]) for m in missing if list(m[:-1]) == parent}
            name = nearest_missing_required(key, _fields_at(parent), absent)
            if name is not None:
                out[tuple(e["loc"])] = (*parent, name)
    return out


def _unknown_field(loc: list, misspelt: dict[tuple, tuple]) -> str:
    """The message of an unknown key at ``loc``: the nearest field of its mapping, or the fields it has."""
    if tuple(loc) in misspelt:
        return f"unknown field: did you mean '{misspelt[tuple(loc)][-1]}'? (a required field)"
    allowed = _fields_at(loc[:-1])
    near = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
    if near:
        return f"unknown field: did you mean '{near[0]}'?"
    return "unknown field" + (f" (fields: {', '.join(allowed)})" if allowed else "")


def build_sinks(cfg: AlertingConfig) -> list[Sink]:
    """Every sink of ``cfg`` (its names are unique: :class:`AlertingConfig` checks). Raises
    SinkConfigError naming every sink that cannot be built (a missing secret, an unreadable file...), one
    line each in config order with its hint, so one start of ``obshub rules serve -c`` says all that is
    missing (it named the first sink's alone)."""
    sinks: list[Sink] = []
    problems: list[SinkConfigError] = []
    for spec in cfg.sinks:
        try:
            sinks.append(build_sink(spec, cfg.external_url))
        except SinkConfigError as exc:
            problems.append(exc)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        lines = [f"{exc}" + (f" ({exc.hint})" if exc.hint else "") for exc in problems]
        raise SinkConfigError(
            f"{len(problems)} of {len(cfg.sinks)} sinks cannot be built:\n" + "\n".join(lines),
            "fix each sink named above, then start `obshub rules serve` again",
        )
    return sinks
