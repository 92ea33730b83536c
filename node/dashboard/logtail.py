"""The log tail on the provider dashboard (docs/adr/0198): the last records of this process's log, kept
in a bounded ring by a handler on the root logger while the HTTP server runs. Messages are cut to a
bounded length; the page shows them as text (never as HTML)."""
from __future__ import annotations

import collections
import logging
import time

MAX_LINES = 200
MAX_LINE_CHARS = 500


class LogTail(logging.Handler):
    """Keeps the last ``MAX_LINES`` records at INFO or above as {"time", "level", "logger", "message"}."""

    def __init__(self, level: int = logging.INFO) -> None:
        super().__init__(level)
        self.lines: collections.deque[dict] = collections.deque(maxlen=MAX_LINES)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:   # a bad format string in someone's log call: show it raw
            message = str(record.msg)
        self.lines.append({"time": time.strftime("%H:%M:%S", time.localtime(record.created)),
                           "level": record.levelname, "logger": record.name,
                           "message": message[:MAX_LINE_CHARS]})

    def tail(self, count: int = 50) -> list[dict]:
        return list(self.lines)[-count:]

    def attach(self) -> None:
        root = logging.getLogger()
        root.addHandler(self)
        if root.getEffectiveLevel() > self.level:   # records below the root's level never reach us
            self.setLevel(root.getEffectiveLevel())

    def detach(self) -> None:
        logging.getLogger().removeHandler(self)
