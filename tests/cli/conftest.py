"""Fixtures shared by the CLI tests of ``task submit``: a fresh key file and the submit_task payloads the
command would send (the ledger is never reached)."""
import pytest

import cli.task_submit as task_submit
from node.identity import Identity
from node.keystore import save_identity


@pytest.fixture
def key(tmp_path):
    path = tmp_path / "key.json"
    save_identity(path, Identity.generate())
    return path


@pytest.fixture
def sent(monkeypatch):
    """The submit_task payloads the command would send (the ledger is never reached)."""
    payloads = []

    async def fake_submit(args, identity, payload, inputs):
        payloads.append(payload)
        return 0

    monkeypatch.setattr(task_submit, "submit", fake_submit)
    return payloads
