"""``dekube-node provide`` against a local dev chain (docs/adr/0195): a genesis with another hash refused
before anything is written, an unfunded key told which address to fund and how, then funded, bonded and
configured; a re-run keeps the key, the config and the bond; --service writes a user unit. The
networks.toml shipped names the local chain; descriptions are parsed with clear errors."""
import json
import os
import re
import time
import urllib.request

import pytest

from cli.errors import CliError
from cli.networks import known_networks, parse, resolve
from consensus.genesis import Genesis
from node.config import load_config
from node.identity import Identity
from tests.cli.test_operator_path import cli, env_for, free_ports, start, stop, wait_height

PHRASE = "provider test phrase"


def write_network(path, rpc_port, genesis_hash):
    path.write_text(f'rpc = ["http://127.0.0.1:{rpc_port}"]\ngenesis_hash = "{genesis_hash}"\n')
    return path


@pytest.mark.slow
def test_provide_against_a_dev_chain(tmp_path):
    p2p, http, own_p2p, own_http = free_ports(4)
    env = env_for(tmp_path, DEKUBE_KEY_PASSPHRASE=PHRASE, XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    dev_home = tmp_path / "dev"
    chain = start(["start", "--dev", "--home", str(dev_home), "--rpc-port", str(http),
                   "--listen", f"/ip4/127.0.0.1/tcp/{p2p}"], env)
    try:
        wait_height(http, 1, chain)
        genesis = Genesis.from_json((dev_home / "genesis.json").read_text())
        home = tmp_path / "provider"
        base = ["provide", "--home", str(home), "--yes", "--no-start", "--listen", f"/ip4/127.0.0.1/tcp/{own_p2p}",
                "--rpc-port", str(own_http)]

        wrong = write_network(tmp_path / "wrong.toml", http, "00" * 32)
        refused = cli(*base, "--network", str(wrong), env=env, check=False)
        assert refused.returncode == 1 and "genesis hash mismatch" in refused.stderr
        assert genesis.hash.hex() in refused.stderr and not home.exists()   # nothing written

        network = write_network(tmp_path / "dev.toml", http, genesis.hash.hex())
        unfunded = cli(*base, "--network", str(network), env=env, check=False)
        address = re.search(r"address (\S+)", unfunded.stdout).group(1)
        assert unfunded.returncode == 1, unfunded.stdout
        assert f"{address} needs" in unfunded.stderr and f"wallet send {address}" in unfunded.stderr
        assert "hardware:" in unfunded.stdout and ("no GPU found" in unfunded.stdout or "TFLOPS" in unfunded.stdout)

        cli("wallet", "send", address, "5000", "--rpc", f"http://127.0.0.1:{http}", "--key",
            str(dev_home / "dev_key.json"), "--wait", env=env)
        joined = cli(*base, "--network", str(network), "--service", env=env).stdout
        assert f"kept the key in {home / 'node_key.json'}: address {address}" in joined
        assert re.search(r"bonded 100 in block \d+", joined) and f"wrote {home / 'config.toml'}" in joined
        # the stake explained under the 10x-pay rule; bandwidth measured against the dev validator before start
        assert "a stake of 100 (the chain's floor is 100) is drawn for tasks paying up to 10 per worker" in joined
        assert re.search(r"network: bandwidth to \S+: \d+ Mbit/s up, \d+ Mbit/s down; reachability unknown", joined)
        config = load_config(home / "config.toml", env={})
        assert config.get("node", "roles") == ["compute"] and config.get("compute", "stake") == 100
        assert config.get("ledger", "rpc_urls") == [f"http://127.0.0.1:{http}"]
        assert config.get("consensus", "chain_id") == genesis.chain_id
        assert config.get("p2p", "bootstrap") == list(genesis.validators[0].listen_addrs)
        assert Genesis.from_json((home / "genesis.json").read_text()).hash == genesis.hash
        unit = (tmp_path / "xdg" / "systemd" / "user" / "dekube-provide.service").read_text()
        assert f"start --home {home}" in unit and "systemctl --user enable --now dekube-provide.service" in joined
        stake = json.loads(cli("wallet", "balance", address, "--rpc", f"http://127.0.0.1:{http}", "--json",
                               env=env).stdout)
        assert stake["bonded"] == 100

        before = (home / "config.toml").read_text(), (home / "node_key.json").read_text()
        again = cli(*base, "--network", str(network), env=env).stdout
        assert "stake already bonded: kept" in again and f"kept {home / 'config.toml'}" in again
        assert ((home / "config.toml").read_text(), (home / "node_key.json").read_text()) == before

        node = start(["provide", "--home", str(home), "--yes", "--network", str(network)], env)   # and start
        try:
            data = wait_registered(own_http, node)
            assert data["node"]["roles"] == ["compute"] and data["compute"]["wallet"]["bonded"] == 100
            assert any(not p["relayed"] for p in data["node"]["peers"])   # the dev validator, dialled directly
        finally:
            stop(node)
    finally:
        stop(chain)


def wait_registered(port, proc, timeout=90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/dashboard/data", timeout=5) as answer:
                data = json.loads(answer.read())
            if data.get("compute", {}).get("registered"):
                return data
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError("the provider node did not register in time")


def test_the_shipped_networks_name_the_local_chain(tmp_path, monkeypatch):
    local = known_networks()["local"]
    assert {k: v for k, v in known_networks()["dev"].items() if k != "description"} == \
        {k: v for k, v in local.items() if k != "description"}   # `provide --network dev` as in the README
    assert local["rpc"] == ["http://127.0.0.1:8645"] and local["genesis_file"].endswith(".dekube-dev/genesis.json")
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(CliError, match="start --dev"):
        resolve("local")   # no dev chain here: say how to make one
    with pytest.raises(CliError, match="unknown network 'nowhere'"):
        resolve("nowhere")


@pytest.mark.parametrize("doc, message", [
    ({"genesis_hash": "ab" * 32}, "no rpc URL"),
    ({"rpc": "http://127.0.0.1:1", "genesis_hash": "xyz"}, "64 hex digits"),
    ({"rpc": [1], "genesis_hash": "ab" * 32}, "list of strings"),
])
def test_bad_descriptions_are_named(doc, message):
    with pytest.raises(CliError, match=message):
        parse("test", doc)


def test_oversized_description_file_refused(tmp_path):
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * 70_000 + "\n")
    with pytest.raises(CliError, match="over 65536 bytes"):
        resolve(str(big))
    assert os.path.getsize(big) > 65536


def test_bonding_without_a_terminal_needs_yes(monkeypatch):
    import argparse
    import io

    from cli.provide import confirm
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    with pytest.raises(CliError, match="pass --yes"):
        confirm(argparse.Namespace(yes=False), "bond?")
    assert confirm(argparse.Namespace(yes=True), "bond?") is True


def test_an_encrypted_key_is_asked_once(tmp_path, monkeypatch):
    import argparse

    from cli import provide
    from node.keystore import save_identity
    save_identity(tmp_path / "node_key.json", Identity.generate(), passphrase=b"once")
    asks = []

    def ask(args, key_file=None):
        def get():
            asks.append(1)
            return b"once"
        return get
    monkeypatch.setattr(provide, "unlock_passphrase", ask)
    identity, unlock, new = provide.ensure_key(tmp_path, argparse.Namespace(keyring=False))
    assert not new and unlock() == b"once" and unlock() == b"once" and len(asks) == 1
