"""HttpPolicy's Host/Origin rules and the [rpc] keys that configure it (the served behaviour is in
tests/attacks/test_http_attacks.py)."""
import pytest

from node.config import ConfigError, load_config
from node.rpc.limits import HttpPolicy


def test_host_names_need_the_allow_list_but_ip_literals_do_not():
    policy = HttpPolicy()
    for host in ("localhost", "LOCALHOST:8645", "127.0.0.1:8645", "[::1]:8645", "10.1.2.3", None, ""):
        assert policy.host_allowed(host), host
    for host in ("rebind.attacker.example", "localhost.attacker.example:8645", "attacker.example:80"):
        assert not policy.host_allowed(host), host
    assert HttpPolicy(allowed_hosts=("node.example.org",)).host_allowed("Node.Example.org:443")
    assert HttpPolicy(allowed_hosts=("*",)).host_allowed("anything.example")


def test_origins_match_scheme_and_host_and_the_port_when_given():
    policy = HttpPolicy()
    for origin in ("http://localhost", "http://localhost:3000", "http://127.0.0.1:8080", "http://[::1]:9"):
        assert policy.origin_allowed(origin), origin
    for origin in ("http://attacker.example", "https://localhost", "null", "file://", "http://localhost.evil",
                   "http://127.0.0.1.nip.io", "javascript:alert(1)", "http://localhost:99999"):
        assert not policy.origin_allowed(origin), origin
    pinned = HttpPolicy(allowed_origins=("https://dash.example.org:8443",))
    assert pinned.origin_allowed("https://dash.example.org:8443")
    assert not pinned.origin_allowed("https://dash.example.org")
    assert HttpPolicy(allowed_origins=("*",)).origin_allowed("http://anything.example")


def test_rpc_keys_have_loopback_defaults_and_reject_bad_origins():
    rpc = load_config(None, env={})["rpc"]
    policy = HttpPolicy.from_config(rpc)
    assert policy.cors is False and policy.max_connections == 256
    assert policy.allowed_origins == ("http://localhost", "http://127.0.0.1", "http://[::1]")
    named = HttpPolicy.from_config(load_config(None, env={}, overrides={("rpc", "host"): "node.example.org"})["rpc"])
    assert named.host_allowed("node.example.org:8645")        # the name it binds is its own
    for bad in ("attacker.example", "ftp://x.example", "http://x.example/path", "http://x.example:0x50"):
        with pytest.raises(ConfigError, match="allowed_origins"):
            load_config(None, env={}, overrides={("rpc", "allowed_origins"): bad})
