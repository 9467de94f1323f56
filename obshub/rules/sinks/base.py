"""What every sink shares: the notification shape, response classification, the retry stage and
secret redaction (after Alertmanager's notify/util.go and notify/retry_stage.go).

Classification of one HTTP attempt:

* 2xx                       -> delivered;
* 429                       -> retried after ``Retry-After`` (seconds or an HTTP date; capped), else backoff;
* 5xx, timeouts, connection -> retried with exponential backoff and full jitter;
* other 4xx                 -> not retried: reported as given up with the status and a short body.

A delivery gives up after ``max_attempts`` or ``max_elapsed_s``. Every error text passes through
``redact`` so webhook URLs and routing keys never reach a log line or an exception message.
"""

from __future__ import annotations

import email.utils
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx
import tenacity
from pydantic import SecretStr

from obshub.rules.model import SEVERITY_RANK

log = logging.getLogger("obshub.rules.sinks")
_SECRETS: set[str] = set()


class RedactFilter(logging.Filter):
    """Rewrites log records so no registered secret appears in them. Attached to the loggers of httpx
    and httpcore (httpx logs every request URL at INFO, and a Slack webhook URL *is* the secret) and of
    obshub's rule engine."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _SECRETS:
            msg = record.getMessage()
            clean = redact(msg, sorted(_SECRETS, key=len, reverse=True))
            if clean != msg:
                record.msg, record.args = clean, ()
        return True


def register_secrets(*values: str) -> None:
    """Remember secret values so ``RedactFilter`` removes them from every log line."""
    _SECRETS.update(v for v in values if v and len(v) >= 4)


_FILTER = RedactFilter()
for _name in ("httpx", "httpcore", "obshub.rules.sinks", "obshub.rules.dispatch", "obshub.rules.service"):
    if _FILTER not in logging.getLogger(_name).filters:
        logging.getLogger(_name).addFilter(_FILTER)


@dataclass
class Notification:
    """One group's alerts to send: ``alerts`` are change records (``lifecycle.change_record``) with
    status firing or resolved; ``group_labels`` the grouping labels; ``group_key`` a stable id."""

    group_key: str
    group_labels: dict[str, str]
    alerts: list[dict]
    receiver: str = ""

    @property
    def status(self) -> str:
        """'firing' when any alert fires, else 'resolved'."""
        return "firing" if any(a["status"] == "firing" for a in self.alerts) else "resolved"


@dataclass
class DeliveryPolicy:
    """Retry settings: attempts, total time, HTTP timeout (s), backoff bounds (s), Retry-After cap (s)."""

    max_attempts: int = 6
    max_elapsed_s: float = 300.0
    timeout_s: float = 10.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    retry_after_max_s: float = 300.0


@dataclass
class DeliveryResult:
    """Outcome of delivering one notification to one sink."""

    sink: str
    ok: bool
    attempts: int
    error: str = ""


class Retryable(Exception):
    """A failed attempt worth retrying (5xx, 429, timeout). ``retry_after_s`` from a 429's header."""

    def __init__(self, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Permanent(Exception):
    """A failed attempt not worth retrying (4xx other than 429, a payload the service rejects)."""


def redact(text: str, secrets: list[str]) -> str:
    """``text`` with every non-empty secret (and its URL-path form) replaced by ``<redacted>``."""
    for s in secrets:
        if s and len(s) >= 4:
            text = text.replace(s, "<redacted>")
            text = text.replace(httpx.URL(s).path if s.startswith("http") else s, "<redacted>")
    return text


def parse_retry_after(value: str | None, now_s: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date, RFC 9110 10.2.3);
    None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (now_s if now_s is not None else time.time()))


def classify(resp: httpx.Response) -> None:
    """Raise Retryable/Permanent for a failed response; return for 2xx."""
    if 200 <= resp.status_code < 300:
        return
    body = resp.text[:200].replace("\n", " ")
    if resp.status_code == 429:
        raise Retryable(f"HTTP 429 rate limited: {body}", parse_retry_after(resp.headers.get("retry-after")))
    if resp.status_code >= 500:
        raise Retryable(f"HTTP {resp.status_code}: {body}")
    raise Permanent(f"HTTP {resp.status_code} (not retried): {body}")


class Sink:
    """Base of the sinks. Subclasses set ``kind`` and implement ``requests`` (a list of
    ``(url, json_body)`` for one notification). ``min_severity`` filters alerts; ``secrets`` lists the
    strings ``redact`` removes; ``resend_every_s`` > 0 asks the dispatcher to re-send firing alerts."""

    kind = "base"

    def __init__(self, name: str, min_severity: str = "info", resend_every_s: float = 0.0):
        self.name = name
        self.min_severity = min_severity
        self.resend_every_s = resend_every_s

    def _register(self) -> None:
        """Subclasses call this once their secrets are set."""
        register_secrets(*self.secrets)

    @property
    def secrets(self) -> list[str]:
        return []

    def wants(self, alert: dict) -> bool:
        """True when the alert's severity is at least this sink's minimum and the rule routes here
        (an empty ``routes`` list means every sink)."""
        if SEVERITY_RANK.get(alert.get("severity", "info"), 0) < SEVERITY_RANK[self.min_severity]:
            return False
        routes = alert.get("routes") or []
        return not routes or self.name in routes

    def requests(self, n: Notification) -> list[tuple[str, Any]]:
        raise NotImplementedError

    def send(self, client: httpx.Client, n: Notification, policy: DeliveryPolicy) -> DeliveryResult:
        """Deliver ``n`` (every request, each with retries). Never raises."""
        attempts, errors = 0, []
        for url, body in self.requests(n):
            res = deliver(client, url, body, policy, self.secrets)
            attempts += res[0]
            if res[1]:
                errors.append(res[1])
        err = "; ".join(errors)
        if err:
            log.warning("sink %s (%s) gave up: %s", self.name, self.kind, err)
        return DeliveryResult(self.name, not errors, attempts, err)


def _wait(policy: DeliveryPolicy):
    expo = tenacity.wait_random_exponential(multiplier=policy.backoff_initial_s, max=policy.backoff_max_s)

    def wait(state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, Retryable) and exc.retry_after_s is not None:
            return min(exc.retry_after_s, policy.retry_after_max_s)
        return expo(state)

    return wait


def deliver(client: httpx.Client, url: str, body: Any, policy: DeliveryPolicy, secrets: list[str]) -> tuple[int, str]:
    """POST ``body`` as JSON to ``url`` with the retry stage. Returns ``(attempts, error)``; error is ''
    on success, else a redacted reason. Never raises."""
    counter = {"n": 0}

    def attempt() -> None:
        counter["n"] += 1
        try:
            resp = client.post(url, json=body, timeout=policy.timeout_s)
        except httpx.TimeoutException as exc:
            raise Retryable(f"timeout after {policy.timeout_s:g} s ({type(exc).__name__})") from None
        except httpx.TransportError as exc:
            raise Retryable(f"connection failed: {type(exc).__name__}: {exc}") from None
        classify(resp)

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(policy.max_attempts) | tenacity.stop_after_delay(policy.max_elapsed_s),
        wait=_wait(policy),
        retry=tenacity.retry_if_exception_type(Retryable),
        reraise=True,
    )
    try:
        retrying(attempt)
        return counter["n"], ""
    except (Retryable, Permanent) as exc:
        kind = "gave up after retries" if isinstance(exc, Retryable) else "rejected"
        return counter["n"], redact(f"{kind}: {exc}", secrets)
    except Exception as exc:  # noqa: BLE001 - a bug in a sink must not kill the worker: reported redacted as a
        # failed delivery (counted in obshub_rules_deliveries{outcome="gave_up"})
        return counter["n"], redact(f"unexpected {type(exc).__name__}: {exc}", secrets)


def secret_value(s: SecretStr | None) -> str:
    """The plain value of a SecretStr ('' for None)."""
    return s.get_secret_value() if s is not None else ""
