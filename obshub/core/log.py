"""Small logging helpers shared by every stage."""

from __future__ import annotations

from typing import Any, Callable


class NullLogger:
    """librdkafka log sink (confluent-kafka's ``logger`` setting) that keeps connection-refused noise off
    the operator's terminal: every logging call is accepted and dropped."""

    def log(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, _name: str) -> Callable[..., None]:
        return lambda *a, **k: None
