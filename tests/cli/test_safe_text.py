"""Text from the chain reaches the terminal escaped (a task's model/dataset with terminal escapes
reached `task list` raw: clear screen, window title): `task list`, `task show`, the final report,
the live view and `wallet` print through cli.safe_text."""
import json

import pytest

from cli.main import main
from cli.safe_text import safe
from cli.task_report import report_final
from cli.task_view import TaskView
from consensus.task_info import TaskInfo
from node.ledger import jsonrpc

OWNER, W1 = "12D3KooW" + "a" * 44, "12D3KooW" + "b" * 44
EVIL = "mlp\x1b[2J\x1b]0;pwned\x07\u202etxt.exe"
TASK = {"task_id": "11" * 32, "status": "rejected", "owner": OWNER, "workers": [W1], "price": 100, "escrow": 0,
        "spec": {"model": EVIL, "dataset": "digits\x9b31m", "codec": "int8", "workers": 1},
        "reason": "bad\x1bc", "rejections": {W1: "no\x1b[5m"}, "payouts": {OWNER: 100}}


def assert_clean(text: str) -> None:
    assert not any(ord(c) < 0x20 and c != "\n" or 0x7f <= ord(c) <= 0x9f or c == "\u202e" for c in text), repr(text)


def test_safe_escapes_controls_and_bidi_and_keeps_ordinary_text():
    assert safe(EVIL) == "mlp\\x1b[2J\\x1b]0;pwned\\x07\\u202etxt.exe"
    assert safe("naïve 模型 ok") == "naïve 模型 ok" and safe("a\nb\tc") == "a\\x0ab\\x09c"


@pytest.fixture
def stub_rpc(monkeypatch):
    answers = {"dkb_listTasks": [TASK], "dkb_getTask": TASK}
    monkeypatch.setattr(jsonrpc, "call", lambda url, method, *params: answers[method])   # cli/rpc_call.py


def test_task_list_and_show_escape_chain_text(stub_rpc, capsys):
    assert main(["task", "list"]) == 0
    out = capsys.readouterr().out
    assert_clean(out)
    assert "mlp\\x1b[2J\\x1b]0;pwned\\x07" in out and "digits\\x9b31m" in out
    assert main(["task", "show", TASK["task_id"]]) == 0
    out = capsys.readouterr().out
    assert_clean(out)
    assert "bad\\x1bc" in out
    assert main(["task", "list", "--json"]) == 0   # JSON keeps the exact value (escaped by JSON itself)
    assert json.loads(capsys.readouterr().out)[0]["spec"]["model"] == EVIL


def test_final_report_and_live_view_escape_reasons(capsys):
    assert report_final(TaskInfo.from_json(TASK)) == 1
    out = capsys.readouterr().out
    assert_clean(out)
    assert "no\\x1b[5m" in out
    view = TaskView(TASK["task_id"])
    view.status(TaskInfo.from_json(TASK))
    view.report(W1, {"state": "failed", "error": "boom\x1b]2;x\x07", "step": 1})
    out = capsys.readouterr().out
    assert_clean(out)
    assert "boom\\x1b]2;x\\x07" in out
