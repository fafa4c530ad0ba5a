"""Structured logging: every line carries the service name and the current request id.

The request id lives in a contextvar set by the error boundary from the `x-request-id` gRPC
metadata (or the gateway's REST middleware), so code deep inside a handler logs it for free.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
import uuid

REQUEST_ID_HEADER = "x-request-id"
request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


def new_request_id() -> str:
    return uuid.uuid4().hex


class _ContextFilter(logging.Filter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def filter(self, record: logging.LogRecord) -> bool:
        record.service = self.service
        record.request_id = request_id_var.get()
        return True


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "service": record.service,
            "request_id": record.request_id,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


class _TextFormatter(logging.Formatter):
    converter = time.gmtime

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(service)s [%(request_id)s] %(message)s", "%H:%M:%S")


def configure_logging(service: str, level: str = "info", log_format: str = "text") -> None:
    """Routes all logging to stderr in the chosen format; idempotent (safe to call per process start)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_ContextFilter(service))
    handler.setFormatter(_JsonFormatter() if log_format == "json" else _TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
