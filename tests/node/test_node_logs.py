"""Logs: JSON lines carry level, logger, message, extra fields and exceptions; text is one line."""
import io
import json
import logging

import pytest

from node.logs import setup_logging


@pytest.fixture
def restore_root_logger():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines(restore_root_logger):
    out = io.StringIO()
    setup_logging("json", "info", stream=out)
    log = logging.getLogger("dekube.test")
    log.debug("hidden")
    log.info("peer %s connected", "A", extra={"peer": "12D3KooW", "n": 3})
    try:
        raise ValueError("bad")
    except ValueError:
        log.exception("failed")
    lines = [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]
    assert len(lines) == 2
    assert lines[0]["level"] == "info" and lines[0]["logger"] == "dekube.test"
    assert lines[0]["msg"] == "peer A connected" and lines[0]["peer"] == "12D3KooW" and lines[0]["n"] == 3
    assert lines[0]["ts"].endswith("Z")
    assert lines[1]["level"] == "error" and "ValueError: bad" in lines[1]["exc"]


def test_text_lines(restore_root_logger):
    out = io.StringIO()
    setup_logging("text", "debug", stream=out)
    logging.getLogger("x").debug("hello", extra={"role": "relay"})
    assert out.getvalue().rstrip().endswith("DEBUG   x: hello role=relay")


def test_unknown_format(restore_root_logger):
    with pytest.raises(ValueError):
        setup_logging("xml")
