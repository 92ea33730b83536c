"""Logging setup: human text lines or JSON lines (one object per record) on stdlib logging.

Structured fields ride on ``extra``: ``log.info("peer connected", extra={"peer": pid})`` prints
``peer=...`` in text mode and a ``"peer"`` member in JSON mode.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from typing import IO

_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


def _extra_fields(record: logging.LogRecord) -> dict:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and not k.startswith("_")}


def _timestamp(record: logging.LogRecord) -> str:
    millis = int(record.msecs)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{millis:03d}Z"


class JsonLinesFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, extra fields, and exc for exceptions."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {"ts": _timestamp(record), "level": record.levelname.lower(), "logger": record.name,
               "msg": record.getMessage()}
        for key, value in _extra_fields(record).items():
            doc.setdefault(key, value)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``2026-01-01T00:00:00.000Z INFO  node.runtime: message key=value ...``"""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname:<7} {record.name}: {record.getMessage()}"
        fields = _extra_fields(record)
        if fields:
            line += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup_logging(log_format: str = "text", level: str = "info", stream: IO[str] | None = None) -> None:
    """Route the root logger to ``stream`` (stderr by default) in ``log_format`` (text|json)."""
    if log_format not in ("text", "json"):
        raise ValueError(f"unknown log format {log_format!r} (text or json)")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonLinesFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # aiohttp's per-request access log is noise next to our metrics.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
