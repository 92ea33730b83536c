"""$DEKUBE_KEY_PASSPHRASE is taken out of the environment when the CLI runs (it was left there and
inherited by every process the node started, such as a compute node's job subprocesses), and still
unlocks the key it was given for."""
import json
import os
import subprocess
import sys

from cli.main import main
from node.identity import Identity
from node.keystore import save_identity

VAR = "DEKUBE_KEY_PASSPHRASE"


def child_sees() -> str:
    return subprocess.run([sys.executable, "-c", f"import os; print(os.environ.get({VAR!r}, '<unset>'))"],
                          capture_output=True, text=True, timeout=60).stdout.strip()


def test_the_variable_unlocks_the_key_and_leaves_the_environment(tmp_path, capsys, monkeypatch):
    home = tmp_path / "h"
    home.mkdir(mode=0o700)
    identity = Identity.generate()
    save_identity(home / "node_key.json", identity, passphrase=b"s3cret phrase")
    monkeypatch.setenv(VAR, "s3cret phrase")
    assert child_sees() == "s3cret phrase"   # what a subprocess inherited before
    assert main(["keys", "show", "--json", "--home", str(home)]) == 0
    assert json.loads(capsys.readouterr().out)["peer_id"] == identity.peer_id
    assert VAR not in os.environ and child_sees() == "<unset>"


def test_removed_even_when_the_key_needs_no_passphrase(tmp_path, capsys, monkeypatch):
    home = tmp_path / "h"
    home.mkdir(mode=0o700)
    save_identity(home / "node_key.json", Identity.generate())
    monkeypatch.setenv(VAR, "unused")
    assert main(["keys", "show", "--json", "--home", str(home)]) == 0
    assert VAR not in os.environ


def test_a_later_run_without_the_variable_does_not_reuse_it(tmp_path, capsys, monkeypatch):
    home = tmp_path / "h"
    home.mkdir(mode=0o700)
    save_identity(home / "node_key.json", Identity.generate(), passphrase=b"phrase")
    monkeypatch.setenv(VAR, "phrase")
    assert main(["keys", "show", "--json", "--home", str(home)]) == 0
    capsys.readouterr()
    assert main(["keys", "show", "--json", "--home", str(home)]) == 1   # no terminal, no passphrase given now
    assert "encrypted" in capsys.readouterr().err
