"""Config: defaults < file < environment < flags, typed parsing, and clear validation errors."""
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.config import (
    SCHEMA,
    ConfigError,
    check_listen_multiaddr,
    check_peer_multiaddr,
    defaults,
    load_config,
    render_toml,
)

PEER = "12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"


def write(tmp_path, text):
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_defaults_cover_every_schema_key():
    config = defaults()
    for section, keys in SCHEMA.items():
        for key, spec in keys.items():
            assert config.get(section, key) == spec.default


def test_precedence_defaults_file_env_flags(tmp_path):
    path = write(tmp_path, '[rpc]\nport = 9001\nhost = "0.0.0.0"\n[node]\nlog_level = "debug"\n')
    env = {"DEKUBE_RPC_PORT": "9002", "DEKUBE_NODE_LOG_FORMAT": "json"}
    config = load_config(path, env=env, overrides={("rpc", "port"): "9003"})
    assert config.get("rpc", "port") == 9003          # flag beats env beats file
    assert config.get("rpc", "host") == "0.0.0.0"     # file beats default
    assert config.get("node", "log_format") == "json"  # env beats default
    assert config.get("node", "log_level") == "debug"
    assert config.get("rpc", "max_batch") == SCHEMA["rpc"]["max_batch"].default
    assert load_config(path, env=env).get("rpc", "port") == 9002
    assert load_config(path).get("rpc", "port") == 9001


def test_env_keys_with_underscores_lists_and_bools():
    env = {
        "DEKUBE_P2P_MAX_CONNECTIONS": "64",
        "DEKUBE_P2P_LISTEN": "/ip4/127.0.0.1/tcp/1, /ip6/::1/tcp/2",
        "DEKUBE_RPC_ENABLED": "no",
        "DEKUBE_NODE_ROLES": "validator,relay",
        "DEKUBE_HOME": "/somewhere",  # not a config section: ignored
        "DEKUBE_SLOW": "1",
    }
    config = load_config(None, env=env)
    assert config.get("p2p", "max_connections") == 64
    assert config.get("p2p", "listen") == ["/ip4/127.0.0.1/tcp/1", "/ip6/::1/tcp/2"]
    assert config.get("rpc", "enabled") is False
    assert config.get("node", "roles") == ["validator", "relay"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("[rpc]\nprot = 1\n", "unknown key 'prot' in \\[rpc\\]"),
        ("[rcp]\nport = 1\n", "unknown section \\[rcp\\]"),
        ('[rpc]\nport = "80"\n', "\\[rpc\\] port must be an integer, got str"),
        ("[rpc]\nport = 70000\n", "port 70000 is out of range"),
        ("[rpc]\nport = true\n", "must be an integer, got bool"),
        ('[rpc]\nenabled = "yes"\n', "must be a bool"),
        ('[p2p]\nlisten = "/ip4/1.2.3.4/tcp/1"\n', "must be a list of strings"),
        ('[p2p]\nlisten = ["/ip4/1.2.3.999/tcp/1"]\n', "bad multiaddr '/ip4/1.2.3.999/tcp/1'"),
        ('[node]\nroles = ["miner"]\n', "unknown role 'miner'"),
        ('[node]\nlog_format = "xml"\n', "'xml' is not one of text, json"),
        ("[rpc\nport = 1\n", "not valid TOML"),
        ("rpc = 5\n", "must be a \\[section\\] table"),
        ("[p2p]\nmax_connections = 0\n", "must be positive"),
    ],
)
def test_file_errors_name_file_and_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as err:
        load_config(path)
    assert str(path) in str(err.value)


def test_missing_file_says_how_to_create_it(tmp_path):
    with pytest.raises(ConfigError, match="not found.*dekube-node init"):
        load_config(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    "env, message",
    [
        ({"DEKUBE_RPC_PORT": "eighty"}, "DEKUBE_RPC_PORT.*expected an integer"),
        ({"DEKUBE_RPC_PORT": "-1"}, "DEKUBE_RPC_PORT.*out of range"),
        ({"DEKUBE_RPC_NOPE": "1"}, "DEKUBE_RPC_NOPE.*unknown key 'nope'"),
        ({"DEKUBE_RPC_ENABLED": "maybe"}, "expected true or false"),
        ({"DEKUBE_NODE_ROLES": "validator,validator"}, "listed twice"),
    ],
)
def test_env_errors_name_the_variable(env, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, env=env)


def test_flag_errors_name_the_key():
    with pytest.raises(ConfigError, match="^command line: \\[node\\] roles: unknown role 'gpu'") as err:
        load_config(None, overrides={("node", "roles"): "validator,gpu"})
    assert str(err.value).count("[node] roles") == 1  # named once, not "flag for [node] roles: [node] roles"
    with pytest.raises(ConfigError, match="unknown section"):
        load_config(None, overrides={("nosuch", "x"): "1"})


@pytest.mark.parametrize("addr", ["/ip4/127.0.0.1/tcp/4001", "/ip6/::1/tcp/0", "/dns4/relay.example.org/tcp/4001",
                                  f"/ip4/10.0.0.1/tcp/4001/p2p/{PEER}", "/ip4/0.0.0.0/udp/4001/quic-v1",
                                  "/ip6/::/udp/0/quic-v1"])
def test_good_listen_multiaddrs(addr):
    check_listen_multiaddr(addr)


@pytest.mark.parametrize("addr", [f"/ip4/10.0.0.1/tcp/4001/p2p/{PEER}", f"/dns/x.org/tcp/1/p2p/{PEER}",
                                  f"/ip4/10.0.0.1/udp/4001/quic-v1/p2p/{PEER}",
                                  f"/ip4/10.0.0.1/tcp/4001/p2p/{PEER}/p2p-circuit/p2p/{PEER}"])
def test_good_peer_multiaddrs(addr):
    check_peer_multiaddr(addr)


@pytest.mark.parametrize(
    "addr, reason",
    [
        ("ip4/1.2.3.4/tcp/1", "must start with '/'"),
        ("/ip4/1.2.3.4", "need a direct"),
        ("/ip4/1.2.3.4/tcp/99999", "bad multiaddr"),
        ("/ip4/1.2.3.4/tcp/", "bad multiaddr"),
        ("/ip4/1.2.3.4/udp/1", "need a direct"),
        ("/dns/x.org/udp/1/quic-v1", "need a direct"),   # QUIC listens on an IP
        ("/ip4/1.2.3.4/tcp/1/p2p/notapeer", "bad multiaddr"),
        ("/ip4/1.2.3.4/tcp/1/p2p", "bad multiaddr"),
        ("/ip4/1.2.3.999/tcp/1", "bad multiaddr"),
        (f"/ip4/1.2.3.4/tcp/1/p2p/{PEER}/p2p-circuit", "need a direct"),
        ("/foo/1", "bad multiaddr"),
    ],
)
def test_bad_listen_multiaddrs(addr, reason):
    with pytest.raises(ValueError, match=reason):
        check_listen_multiaddr(addr)


@pytest.mark.parametrize(
    "addr, reason",
    [
        ("/ip4/1.2.3.4/tcp/1", "needs a /p2p/<peer id> suffix"),
        (f"/ip4/1.2.3.4/udp/1/p2p/{PEER}", "need /ip4"),
        ("/ip4/1.2.3.4/tcp/1/p2p/12D3KooWnot", "bad multiaddr"),
    ],
)
def test_bad_peer_multiaddrs(addr, reason):
    with pytest.raises(ValueError, match=reason):
        check_peer_multiaddr(addr)


def test_rendered_toml_reads_back_identically(tmp_path):
    config = load_config(None, overrides={("consensus", "chain_id"): 'we"ird\\chain\n\x7f\tü',
                                          ("node", "roles"): "relay,compute"})
    text = config.to_toml()
    assert tomllib.loads(text) == config.as_dict()
    assert load_config(write(tmp_path, text)).as_dict() == config.as_dict()


def test_render_rejects_unsupported_values():
    with pytest.raises(TypeError):
        render_toml({"node": {"roles": {"a": 1}}})


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="/ip46tcdnsudp2-circuit0123456789.:abcfKooW", max_size=60))
def test_junk_multiaddrs_give_value_errors_only(text):
    for check in (check_listen_multiaddr, check_peer_multiaddr):
        try:
            check(text)
        except ValueError:
            pass


def test_the_serve_section_checks_its_blocks(tmp_path):
    config = load_config(write(tmp_path, '[serve]\nmodel = "random:4x32"\nblocks = "1:3"\nprice = 5\n'))
    assert config["serve"]["blocks"] == "1:3" and config["serve"]["price"] == 5
    assert defaults()["serve"]["model"] == "" and defaults()["serve"]["blocks"] == "auto:1"
    for bad in ("3:1", "auto:0", "a:b", "2"):
        with pytest.raises(ConfigError, match=r"\[serve\] blocks"):
            load_config(write(tmp_path, f'[serve]\nblocks = "{bad}"\n'))
    with pytest.raises(ConfigError, match=r"\[serve\] rebalance_every"):
        load_config(write(tmp_path, "[serve]\nrebalance_every = -1.0\n"))
