"""CLI init/keys and start's argument handling, run in-process: outputs, refusals and exit codes."""
import json
import os
import stat

import pytest

from cli.main import build_parser, main
from cli.start import flag_overrides
from node.keystore import load_identity


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_init_writes_config_and_private_key(tmp_path, capsys):
    home = tmp_path / "home"
    code, out, err = run_cli(capsys, "init", "--insecure-unencrypted-key", "--home", str(home),
                             "--role", "validator,relay")
    assert code == 0 and err == ""
    key = load_identity(home / "node_key.json")
    assert key.peer_id in out
    assert stat.S_IMODE(os.stat(home / "node_key.json").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o700
    assert 'roles = ["validator", "relay"]' in (home / "config.toml").read_text()


def test_init_refuses_to_overwrite_without_force(tmp_path, capsys):
    home = tmp_path / "home"
    assert run_cli(capsys, "init", "--insecure-unencrypted-key", "--home", str(home))[0] == 0
    before = load_identity(home / "node_key.json").peer_id
    code, out, err = run_cli(capsys, "init", "--insecure-unencrypted-key", "--home", str(home))
    assert code == 1 and "already exist" in err and "--force" in err and err.count("\n") == 1
    assert load_identity(home / "node_key.json").peer_id == before
    assert run_cli(capsys, "init", "--insecure-unencrypted-key", "--home", str(home), "--force")[0] == 0
    assert load_identity(home / "node_key.json").peer_id != before


def test_init_rejects_bad_role(tmp_path, capsys):
    code, _, err = run_cli(capsys, "init", "--insecure-unencrypted-key", "--home", str(tmp_path / "h"),
                           "--role", "miner")
    assert code == 1 and "unknown role 'miner'" in err
    assert not (tmp_path / "h" / "node_key.json").exists()


def test_keys_new_and_show(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DEKUBE_HOME", str(tmp_path / "envhome"))
    code, out, _ = run_cli(capsys, "keys", "new", "--insecure-unencrypted-key")
    assert code == 0
    peer_id = load_identity(tmp_path / "envhome" / "node_key.json").peer_id
    code, out, _ = run_cli(capsys, "keys", "show", "--json")
    assert code == 0 and json.loads(out)["peer_id"] == peer_id
    code, out, err = run_cli(capsys, "keys", "new", "--insecure-unencrypted-key")
    assert code == 1 and "refusing to overwrite" in err
    assert run_cli(capsys, "keys", "new", "--insecure-unencrypted-key", "--force")[0] == 0
    code, out, _ = run_cli(capsys, "keys", "show")
    assert code == 0 and "peer_id:" in out and peer_id not in out


def test_keys_show_refuses_unsafe_key(tmp_path, capsys):
    home = tmp_path / "h"
    run_cli(capsys, "keys", "new", "--insecure-unencrypted-key", "--home", str(home))
    os.chmod(home / "node_key.json", 0o644)
    code, out, err = run_cli(capsys, "keys", "show", "--home", str(home))
    assert code == 1 and "chmod 600" in err and out == ""


def test_start_errors_are_one_line(tmp_path, capsys):
    home = tmp_path / "h"
    code, _, err = run_cli(capsys, "start", "--home", str(home), "--role", "relay")
    assert code == 1 and "not found" in err and "dekube-node init" in err
    run_cli(capsys, "init", "--insecure-unencrypted-key", "--home", str(home))
    code, _, err = run_cli(capsys, "start", "--home", str(home))
    assert code == 1 and "no role to run" in err
    code, _, err = run_cli(capsys, "start", "--home", str(home), "--role", "relay", "--rpc-port", "http")
    assert code == 1 and "expected an integer" in err
    code, _, err = run_cli(capsys, "start", "--home", str(home), "--role", "relay", "--listen", "/ip4/x/tcp/1")
    assert code == 1 and "bad multiaddr" in err
    code, _, err = run_cli(capsys, "start", "--home", str(home), "--role", "relay", "--set", "rpc.nope=1")
    assert code == 1 and "unknown key 'nope'" in err
    code, _, err = run_cli(capsys, "start", "--home", str(home), "--role", "relay", "--set", "justtext")
    assert code == 1 and "SECTION.KEY=VALUE" in err


def test_start_flags_map_to_config_overrides():
    args = build_parser().parse_args([
        "start", "--role", "validator,relay", "--rpc-port", "9000", "--listen", "/ip4/1.2.3.4/tcp/1",
        "--listen", "/ip4/1.2.3.4/tcp/2", "--log-format", "json", "--set", "p2p.max_connections=8",
    ])
    assert flag_overrides(args) == {
        ("node", "roles"): "validator,relay",
        ("rpc", "port"): "9000",
        ("p2p", "listen"): "/ip4/1.2.3.4/tcp/1,/ip4/1.2.3.4/tcp/2",
        ("node", "log_format"): "json",
        ("p2p", "max_connections"): "8",
    }


def test_usage_error_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["frobnicate"])
    assert exit_info.value.code == 2


def test_status_url_comes_from_config(tmp_path, capsys, monkeypatch):
    from cli.status import node_url

    home = tmp_path / "h"
    run_cli(capsys, "init", "--insecure-unencrypted-key", "--home", str(home))
    args = build_parser().parse_args(["status", "--home", str(home)])
    assert node_url(args) == "http://127.0.0.1:8645"
    monkeypatch.setenv("DEKUBE_RPC_HOST", "0.0.0.0")
    monkeypatch.setenv("DEKUBE_RPC_PORT", "9100")
    assert node_url(args) == "http://127.0.0.1:9100"
    assert node_url(build_parser().parse_args(["status", "--url", "http://x:1/"])) == "http://x:1"


def test_new_keys_are_encrypted_unless_told_otherwise(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DEKUBE_KEY_PASSPHRASE", raising=False)
    home = tmp_path / "h"
    code, _, err = run_cli(capsys, "init", "--home", str(home))   # no passphrase, no terminal
    assert code == 1 and "--passphrase-file" in err and "--insecure-unencrypted-key" in err
    assert not (home / "node_key.json").exists()
    secret = tmp_path / "pass.txt"
    secret.write_text("s3cret phrase\n")
    code, out, _ = run_cli(capsys, "init", "--home", str(home), "--passphrase-file", str(secret))
    assert code == 0 and "encrypted" in out
    doc = json.loads((home / "node_key.json").read_text())
    assert doc["version"] == 2 and "seed" not in doc
    code, out, _ = run_cli(capsys, "keys", "show", "--json", "--home", str(home), "--passphrase-file", str(secret))
    assert code == 0 and json.loads(out)["peer_id"] == doc["peer_id"]
    monkeypatch.setenv("DEKUBE_KEY_PASSPHRASE", "s3cret phrase")
    assert json.loads(run_cli(capsys, "keys", "show", "--json", "--home", str(home))[1])["peer_id"] == doc["peer_id"]
    monkeypatch.setenv("DEKUBE_KEY_PASSPHRASE", "wrong")
    code, out, err = run_cli(capsys, "start", "--home", str(home), "--role", "relay")
    assert code == 1 and "wrong passphrase" in err and err.count("\n") == 1


def test_keys_passwd_keeps_the_peer_id(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DEKUBE_KEY_PASSPHRASE", raising=False)
    home = tmp_path / "h"
    run_cli(capsys, "keys", "new", "--insecure-unencrypted-key", "--home", str(home))
    peer_id = load_identity(home / "node_key.json").peer_id
    new = tmp_path / "new.txt"
    new.write_text("another phrase\n")
    code, out, _ = run_cli(capsys, "keys", "passwd", "--home", str(home), "--new-passphrase-file", str(new))
    assert code == 0 and peer_id in out
    assert load_identity(home / "node_key.json", b"another phrase").peer_id == peer_id
    code, _, err = run_cli(capsys, "keys", "show", "--home", str(home))
    assert code == 1 and "encrypted" in err


def test_wallet_unjail_sends_an_unjail_tx(monkeypatch, tmp_path, capsys):
    from node.ledger.jsonrpc import ValidatorPool

    home = tmp_path / "h"
    run_cli(capsys, "keys", "new", "--insecure-unencrypted-key", "--home", str(home))
    sent = []

    async def fake_call(pool, method, *params):   # the validator, as the node's one sender reaches it
        if method == "dkb_sendRawTransaction":
            sent.append(params[0])
            return "ab" * 32
        return {"dkb_chainId": "c", "dkb_getTransactionCount": 0}[method]
    monkeypatch.setattr(ValidatorPool, "call", fake_call)
    code, _, err = run_cli(capsys, "wallet", "unjail", "--home", str(home))
    assert code == 0, err
    from consensus.tx import decode_tx
    tx = decode_tx(bytes.fromhex(sent[0]), chain_id="c")
    assert tx.type == "unjail" and tx.payload == {}
