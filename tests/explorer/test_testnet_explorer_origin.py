"""The explorer on the testnet the README starts (`testnet up --compute N`) can draw training curves:
the compute nodes' RPC sends CORS headers to the validators' origins (it sent none, so the page's
reads of dkb_taskProgress were blocked and the curves stayed empty), and `testnet up` prints the
explorer link that lists the compute nodes."""
from types import SimpleNamespace

from devtools.devnet import ComputeDevnet
from node.config import load_config
from node.rpc.limits import HttpPolicy


def request(origin: str):
    return SimpleNamespace(headers={"Origin": origin, "Host": "127.0.0.1"})


def test_compute_nodes_allow_the_validators_explorer_origin(tmp_path):
    net = ComputeDevnet.create(tmp_path / "devnet", validators=2, compute=2)
    validators = [v.rpc_url for v in net.testnet.nodes]
    for node in net.compute:
        policy = HttpPolicy.from_config(load_config(node.home / "config.toml", env={})["rpc"])
        for origin in validators:
            assert policy.cors_headers(request(origin))["Access-Control-Allow-Origin"] == origin
        assert policy.cors_headers(request("http://127.0.0.1:1")) == {}      # other local pages: no
        assert policy.cors_headers(request("https://evil.example")) == {}
    url = net.explorer_url()
    assert url == f"{validators[0]}/explorer/?nodes=" + ",".join(n.rpc_url for n in net.compute)
