"""Text from the chain or from peers, made safe for a terminal: every control character (C0, DEL, C1)
and every bidirectional-override mark is written as an escape (``\\x1b``, ``\\u202e``), so a task's
model name cannot clear the screen, retitle the window or reorder what is shown. Every CLI printer of
such text prints through ``safe`` (or ``echo``)."""
from __future__ import annotations

import re

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: object) -> str:
    """``str(text)`` with control characters and bidi overrides escaped."""
    return _UNSAFE.sub(_escape, str(text))


def echo(text: object) -> None:
    """print(safe(text))."""
    print(safe(text))
