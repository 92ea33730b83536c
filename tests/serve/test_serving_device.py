"""Where serving computes (ADR 0179), on the CPU path: `--device` / `[serve] device` resolve (auto is cpu
without CUDA, cuda without CUDA is a clear error at start), parts, KV caches and answers live where they
should, a CPU server announces the CPU profile, and a spot check never accuses a server that computes in
another profile: it leaves it unchecked, or has a second server of that profile replay it."""
import asyncio
import json
from functools import partial

import pytest
import torch

from cli.main import main
from ml.profiles import default_profile
from ml.serve import protocol
from ml.serve.catalog import parse_model
from ml.serve.client import RemoteGenerator, local_generate
from ml.serve.device import DeviceError, prepare_device, resolve_device, serving_profile
from ml.serve.server import BlockServer
from node.config import ConfigError, defaults, load_config
from node.identity import Identity
from node.p2p.host import Host
from node.roles import RoleStartError
from tests.serve.test_generation import Network

MODEL = "random:4x32:4@5"
PROMPT = [3, 14, 15, 9, 2, 6, 5, 35]
CPU = default_profile("cpu")
OTHER = "cuda-nvidia-h100-80gb-hbm3-cc9.0-cuda12.8/torch-2.11.0"   # a profile this client does not compute in
SPEC = parse_model(MODEL)
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour of a machine without CUDA")


def test_auto_resolves_to_cuda_only_when_torch_sees_it(monkeypatch):
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    with pytest.raises(DeviceError, match="device cuda: torch .* sees no CUDA device"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda" and resolve_device("cuda") == "cuda"
    with pytest.raises(DeviceError, match="unknown device 'gpu'"):
        resolve_device("gpu")


def test_a_cpu_server_is_in_the_cpu_profile():
    assert prepare_device("cpu") == "cpu"
    assert serving_profile("cpu") == CPU
    with pytest.raises(DeviceError):
        serving_profile("tpu")


def test_serve_device_is_a_config_key_with_three_choices(tmp_path):
    assert defaults()["serve"]["device"] == "auto"
    (tmp_path / "config.toml").write_text('[serve]\ndevice = "gpu"\n')
    with pytest.raises(ConfigError, match="device"):
        load_config(tmp_path / "config.toml", env={})
    (tmp_path / "config.toml").write_text('[serve]\ndevice = "cpu"\n')
    assert load_config(tmp_path / "config.toml", env={})["serve"]["device"] == "cpu"


def test_parts_caches_and_answers_live_where_the_weights_are():
    part = SPEC.load_part((0, 2), False, "cpu")
    assert part.device == torch.device("cpu")
    assert all(c.keys.device == part.device for c in part.new_caches(1, 8))
    server = BlockServer(part, profile=CPU)
    assert server.device == torch.device("cpu") and server.profile == CPU
    server.open_session("s", 8)
    out = server.step("s", [torch.zeros(1, 3, 32)])
    assert out.device == torch.device("cpu") and out.shape == (1, 3, 32)
    grads = server.backward(torch.zeros(1, 3, 32), torch.ones(1, 3, 32))
    assert grads["grad_h"].device == torch.device("cpu")


def servers(ranges: list[tuple[int, int]], profiles: list[str], lie_after: dict[int, int] | None = None) -> Network:
    """CPU block servers of MODEL on their own Hosts, each telling its profile (`lie_after`: index -> steps
    before it lies), and a client Host."""
    lie_after = lie_after or {}
    kinds = {i: partial(BlockServer, profile=p, lie_after=lie_after.get(i)) for i, p in enumerate(profiles)}
    return Network(lambda block_range, ends: SPEC.load_part(block_range, ends, "cpu"), ranges, kinds)


def test_generation_on_an_explicit_cpu_equals_local_and_servers_tell_their_profile():
    async def scenario():
        async with servers([(0, 2), (2, 4)], [CPU, CPU]) as net:
            span = protocol.SpanClient(net.client, net.servers[0].peer_id, 0, 2)
            info = await span.info()
            await span.close()
            ends = SPEC.load_part((0, 0), True, "cpu")
            generator = RemoteGenerator(net.client, ends, net.servers)
            return info, generator, await generator.generate(PROMPT, 10)

    info, generator, tokens = asyncio.run(scenario())
    assert info["profile"] == CPU
    assert set(generator.profiles.values()) == {CPU} and len(generator.profiles) == 2
    whole = SPEC.load_part(None, True)
    assert tokens == local_generate(whole, PROMPT, 10, device="cpu") and whole.device == torch.device("cpu")
    checks = [generator.spot_check(i, SPEC.load_part(span, False, "cpu"), CPU)
              for i, span in enumerate(generator.spans)]
    assert all(c.ok and c.unchecked == () for c in checks)


def test_a_server_in_another_profile_is_never_accused_by_a_local_check():
    """Servers 0 and 2 say they compute in OTHER; server 0 'differs' from this CPU client after 3 steps (as
    another profile's rounding would, or a lie): the local check leaves it unchecked, a second server of
    OTHER replays it and finds the step where they differ (naming who lied takes a third opinion of that
    profile, ADR 0178), and without such a second server it stays unchecked."""
    async def scenario():
        async with servers([(0, 2), (2, 4), (0, 2)], [OTHER, CPU, OTHER], lie_after={0: 3}) as net:
            generator = RemoteGenerator(net.client, SPEC.load_part((0, 0), True, "cpu"), net.servers[:2])
            await generator.generate(PROMPT, 8)
            local = generator.spot_check(0, SPEC.load_part((0, 2), False, "cpu"), CPU)
            generator.servers = net.servers   # the client learns of the third server (the ledger, --server)
            second = await generator.spot_check_remote(0, net.servers[2], same_profile=True)
            local_second = generator.spot_check(1, SPEC.load_part((2, 4), False, "cpu"), CPU)
            return generator, net.servers, local, second, local_second

    generator, infos, local, second, local_second = asyncio.run(scenario())
    assert generator.profiles[infos[0].peer_id] == OTHER            # told in "opened"
    assert local.ok and local.culprit is None and local.unchecked == (infos[0].peer_id,)
    assert not second.ok and second.first_bad_step == 3 and second.culprit is None and second.unchecked == ()
    assert local_second.ok and local_second.unchecked == ()
    # a check that is not told its profile takes every server to be in it: the old behaviour, which names
    # the server of the other profile (why the CLI always passes the client's profile)
    blind = generator.spot_check(0, SPEC.load_part((0, 2), False, "cpu"))
    assert not blind.ok and blind.culprit == infos[0].peer_id


def test_generate_spot_check_reports_a_server_of_another_profile_unchecked(capsys):
    """The CLI path: a server that says it computes in OTHER and 'differs' is not named when no second
    server of OTHER holds its blocks; it is reported unchecked with the reason."""
    async def start():
        net = servers([(0, 2), (2, 4)], [OTHER, CPU], lie_after={0: 3})
        await net.__aenter__()
        return net

    loop = asyncio.new_event_loop()
    net = loop.run_until_complete(start())
    try:
        named = [f"{net.hosts[i].listen_addrs[0]}/p2p/{net.hosts[i].peer_id}={a}:{b}"
                 for i, (a, b) in enumerate(net.ranges)]
        runner = loop.run_in_executor(None, main, ["generate", "--model", MODEL, "--prompt", "hello", "--max-tokens",
                                                   "8", "--spot-check", "--device", "cpu",
                                                   *(arg for s in named for arg in ("--server", s))])
        code = loop.run_until_complete(runner)
    finally:
        loop.run_until_complete(net.__aexit__())
        loop.close()
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert code == 0 and out["device"] == "cpu" and out["profiles"] == sorted([CPU, OTHER])
    checks = out["spot_checks"]
    assert {k: checks[0][k] for k in ("blocks", "ok", "culprit", "by")} == {"blocks": "0:2", "ok": True,
                                                                          "culprit": None, "by": "local"}
    assert checks[1]["ok"] is None and checks[1]["unchecked"] == net.hosts[0].peer_id
    assert "no second server of that profile" in checks[1]["reason"] and "not checked" in captured.err
    assert checks[2]["blocks"] == "2:4" and checks[2]["ok"] is True
    assert not any(c.get("culprit") for c in checks)


@no_cuda
def test_cuda_without_cuda_is_a_clear_error_at_the_start_of_serve(capsys):
    assert main(["serve", "--model", MODEL, "--device", "cuda"]) != 0
    assert "device cuda: torch" in capsys.readouterr().err


@no_cuda
def test_a_serve_section_asking_for_cuda_without_cuda_stops_the_node_at_start():
    from devtools.ledger_chain import Chain
    from ml.serve.service import ServingService
    from tests.serve.test_serving_service import node_with_serving

    async def scenario():
        host = Host(Identity.generate())
        service = ServingService(node_with_serving(Chain(), host, device="cuda"))
        with pytest.raises(RoleStartError, match=r"\[serve\] device cuda: torch .* sees no CUDA device"):
            await asyncio.wait_for(service.run(), 30)
        assert service.server is None   # never served a session
        cpu = ServingService(node_with_serving(Chain(), host, device="cpu"))
        await cpu.start_device()
        assert (cpu.device, cpu.profile) == ("cpu", CPU)

    asyncio.run(scenario())


def test_the_cli_asks_a_third_server_of_the_profile_to_name_who_lied():
    """ADR 0182: `generate --spot-check` (`_remote_checks`) has a second server of the other profile replay
    the span and, when a third server of that profile holds it, asks it too: the liar is named (and can be
    disputed). With only two servers of that profile, their disagreement names nobody."""
    from cli.serve import _remote_checks

    async def scenario():
        async with servers([(0, 2), (2, 4), (0, 2), (0, 2)], [OTHER, CPU, OTHER, OTHER], lie_after={0: 3}) as net:
            generator = RemoteGenerator(net.client, SPEC.load_part((0, 0), True, "cpu"), net.servers[:2])
            await generator.generate(PROMPT, 8)
            local = generator.spot_check(0, SPEC.load_part((0, 2), False, "cpu"), CPU)
            generator.servers = net.servers[:3]   # one other server of OTHER: a disagreement, nobody named
            two = await _remote_checks(generator, 0, local.unchecked, CPU)
            generator.servers = net.servers       # and a third
            three = await _remote_checks(generator, 0, local.unchecked, CPU)
            return net.servers, local, two, three

    infos, local, (two_entries, two_checks), (three_entries, three_checks) = asyncio.run(scenario())
    assert local.unchecked == (infos[0].peer_id,)
    (entry,) = two_entries
    assert entry["ok"] is False and entry["culprit"] is None and entry["by"] == infos[2].peer_id
    assert "no third server" in entry["reason"] and "nobody named" in entry["reason"] and "third" not in entry
    assert [check.culprit for check, _ in two_checks] == [None]
    (entry,) = three_entries
    assert entry["ok"] is False and entry["culprit"] == infos[0].peer_id and entry["step"] == 3
    assert entry["by"] == infos[2].peer_id and entry["third"] == infos[3].peer_id
    ((check, profile),) = three_checks
    assert check.culprit == infos[0].peer_id and profile == OTHER
