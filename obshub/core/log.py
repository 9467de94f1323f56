"""Small logging helpers shared by every stage: a null sink for librdkafka, and JSON log lines.

JSON logs: one JSON object per line, for log collectors (Loki, Elasticsearch, Cloud Logging):
``{"time": "2026-12-01T02:00:00.123Z", "level": "warning", "logger": "obshub.rules.service",
"message": "...", "component": "rules"}``, plus ``"exception"`` (the formatted traceback) when there is
one. Chosen with ``--log-format json`` on the long-running commands (agent, streams worker, rules serve) or
``OBSHUB_LOG_FORMAT=json``; the default ``text`` keeps the human format.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable


class NullLogger:
    """librdkafka log sink (confluent-kafka's ``logger`` setting) that keeps connection-refused noise off
    the operator's terminal: every logging call is accepted and dropped."""

    def log(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, _name: str) -> Callable[..., None]:
        return lambda *a, **k: None


FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """Formats a LogRecord as one JSON object (keys above); ``component`` names the obshub process."""

    def __init__(self, component: str = "") -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        t = time.gmtime(record.created)
        out = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.component:
            out["component"] = self.component
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def setup(level: int | str, fmt: str, component: str, text_format: str, filename: str | None = None) -> None:
    """Configure the root logger: ``fmt`` ``json`` (JsonFormatter) or ``text`` (``text_format``), to
    ``filename`` (appended) or stderr."""
    handler: logging.Handler = logging.FileHandler(filename) if filename else logging.StreamHandler()
    handler.setFormatter(JsonFormatter(component) if fmt == "json" else logging.Formatter(text_format))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level if isinstance(level, int) else level.upper())


def dict_config(level: str, component: str) -> dict:
    """A ``logging.config.dictConfig`` dict with the JSON formatter on stderr (for Faust's worker, which
    configures logging itself)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter, "component": component}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "json"}},
        "root": {"level": level.upper(), "handlers": ["stderr"]},
    }
