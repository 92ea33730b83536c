"""``dekube-node serve``, ``generate`` and ``tune``: serve a range of a decoder's blocks, generate
text through servers that together hold all of them, fine-tune parameters the client owns through
them (ml/serve, ADR 0171).

``serve --model SPEC --blocks A:B|auto:N [--known MULTIADDR ...] [--listen MULTIADDR]`` (auto: the
N blocks the known servers cover least, by measured throughput) starts a bare p2p Host with the
``/dekube/serve/1.0.0`` handler, prints one JSON line {"peer_id", "addrs", "model", "blocks"} and
serves until interrupted. ``generate --model SPEC --server MULTIADDR=A:B ... --prompt TEXT
[--max-tokens N] [--codec f32|f16|int8|int4] [--check-local] [--adapter FILE]`` chains the servers (a
second server with a range already covered is a spare used if the first one fails) and prints JSON
{"text", "tokens", "replays", "tokens_per_s"} (plus "identical_to_local" with --check-local);
``--adapter`` applies what ``tune`` wrote. ``tune ... --text FILE [--steps N] [--lora-rank R]
[--prompt-length P] --out FILE`` fits a LoRA adapter and/or prompts to the text's next-token loss
(measured on one fixed batch before and after) and writes them as safetensors. Discovery through
the ledger and payment (ADR 0174): ``serve --ledger URL --key FILE [--price P]`` announces the
model, blocks, measured tokens/s and profile in the node record (``hardware.serving``), bills clients
at P per GFLOP with co-signed receipts and claims them on chain (``serve_receipt``) every
``--claim-every`` seconds and at exit; ``--blocks auto:N`` then also reads the ledger's coverage.
``generate``/``tune --ledger URL`` find the servers in the ledger (``dkb_listNodes``) instead of
``--server``, and with ``--key FILE --max-price P`` pay from the key's serving escrow. A paid server
(``--price``) bonds what its key lacks of ``min_serve_stake`` from its free balance at start, or refuses
to start saying what to send it; ``generate`` reports as ``paid`` only receipts to servers that can
claim them (others under ``unclaimable``, with why; ml/serve/claimable.py). ``serve
--rebalance-every S`` moves an idle server to thinner blocks when that lifts the weakest block. A
server with a ledger also referees the serving disputes that drew it (ADR 0176): at each claim tick
it takes the step bundle the disputing client delivered (or fetches it), recomputes it and votes
(``serve_referee_vote``).
``generate --spot-check`` reruns every span on local copies of its blocks and names servers that
answered wrongly; with ``--dispute-bond B`` (and ``--max-price``) it files ``serve_dispute`` for each
and delivers the evidence to the drawn referees until they decide (``--dispute-wait`` seconds; ADR 0182).
``--device auto|cpu|cuda`` (all three commands; auto: CUDA when torch sees it) says where the server's
blocks, or the client's ends, local model and spot checks, compute (docs/adr/0179); a CUDA server
announces its GPU's execution profile, and a spot check compares only servers of the client's own
profile, asking a second server of another profile to replay the rest (and a third to name who lied
when they disagree), or reporting them unchecked.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.errors import CliError
from node.extras import require_compute

if TYPE_CHECKING:   # imported where used: the serving stack needs torch (require_compute)
    from ml.serve.adapters import ClientParams
    from ml.serve.announce import Announced
    from ml.serve.catalog import ModelSpec
    from ml.serve.client import RemoteGenerator, ServerInfo
    from ml.serve.model import DecoderConfig
    from ml.serve.protocol import Payer
    from ml.serve.spot_check import SpotCheck
    from node.identity import Identity
    from node.ledger.gateway import LedgerGateway
    from node.p2p.host import Host

Named = tuple[str, tuple[int, int]]   # a --server: (multiaddr, blocks)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = subparsers.add_parser("serve", help="serve a range of a decoder's blocks to generating clients")
    serve.add_argument("--model", required=True, help="random:<layers>x<width>[:heads][@seed], random:large, "
                                                      "or a char-transformer .safetensors file")
    serve.add_argument("--blocks", help="A:B, the blocks to serve (default: all), or auto:N to take the N blocks "
                                        "the --known servers cover least")
    serve.add_argument("--known", action="append", default=[], metavar="MULTIADDR",
                       help="a server of the same model (for --blocks auto:N; repeat)")
    serve.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0", help="p2p listen multiaddr")
    serve.add_argument("--max-sessions", type=int, default=64)
    _device_argument(serve)
    _ledger_arguments(serve)
    serve.add_argument("--price", type=int, default=0, help="per GFLOP served, billed with receipts (needs --ledger "
                                                           "and --key, a funded key: it bonds what it lacks of "
                                                           "min_serve_stake at start, or refuses; 0: free)")
    serve.add_argument("--credit-tokens", type=int, default=1024,
                       help="tokens served to a client ahead of its next receipt")
    serve.add_argument("--claim-every", type=float, default=30.0, help="seconds between on-chain receipt claims")
    serve.add_argument("--lie-after", type=int, default=None, help=argparse.SUPPRESS)   # TESTING ONLY (ADR 0176)
    serve.add_argument("--rebalance-every", type=float, default=0.0,
                       help="seconds between coverage checks on the ledger: move to thinner blocks when that lifts "
                            "the swarm's weakest block (ADR 0173; 0: keep the blocks)")
    serve.set_defaults(handler=run_serve)
    generate = subparsers.add_parser("generate", help="generate text through block servers")
    generate.add_argument("--model", required=True, help="the same model spec the servers use")
    generate.add_argument("--server", action="append", default=[], metavar="MULTIADDR=A:B",
                          help="a server's multiaddr ending in /p2p/<peer id>, and its blocks (repeat; "
                               "or --ledger)")
    _ledger_arguments(generate)
    generate.add_argument("--max-price", type=int, default=0,
                          help="pay servers up to this per GFLOP from the key's serving escrow (0: free servers)")
    generate.add_argument("--prompt", required=True)
    generate.add_argument("--max-tokens", type=int, default=32)
    generate.add_argument("--codec", choices=["f32", "f16", "int8", "int4"], default="f32",
                          help="hidden-state encoding (f32 is bit-exact)")
    generate.add_argument("--push", action=argparse.BooleanOptionalAction, default=True,
                          help="servers push each step's answer straight to the next server (ADR 0181): one pass "
                               "down the chain per token instead of a round trip to each server (default; "
                               "--no-push: the client sends every server its input)")
    generate.add_argument("--check-local", action="store_true",
                          help="also run the whole model locally and report whether the tokens are identical")
    generate.add_argument("--adapter", type=Path, help="parameters written by `tune` (LoRA adapter and/or prompts) "
                                                       "for the servers to apply")
    generate.add_argument("--spot-check", action="store_true",
                          help="afterwards rerun every span's steps on local copies of its blocks (loads the whole "
                               "model) and name servers that answered wrongly")
    generate.add_argument("--dispute-bond", type=int, default=0,
                          help="dispute each wrong answer the spot check finds on chain with this bond, and deliver "
                               "the evidence to the referees until they decide (ADR 0176, 0182; needs --max-price)")
    generate.add_argument("--dispute-wait", type=float, default=120.0,
                          help="seconds to wait for the referees' verdict")
    _device_argument(generate)
    generate.set_defaults(handler=run_generate)
    tune = subparsers.add_parser("tune", help="fine-tune a LoRA adapter / prompts through block servers")
    tune.add_argument("--model", required=True, help="the same model spec the servers use")
    tune.add_argument("--server", action="append", default=[], metavar="MULTIADDR=A:B",
                      help="a server's multiaddr ending in /p2p/<peer id>, and its blocks (repeat; or --ledger)")
    _ledger_arguments(tune)
    tune.add_argument("--max-price", type=int, default=0,
                      help="pay servers up to this per GFLOP from the key's serving escrow (0: free servers)")
    tune.add_argument("--text", type=Path, required=True, help="a text file to fit (next-token loss)")
    tune.add_argument("--steps", type=int, default=20)
    tune.add_argument("--batch", type=int, default=4)
    tune.add_argument("--length", type=int, default=64, help="tokens per example")
    tune.add_argument("--lora-rank", type=int, default=4)
    tune.add_argument("--prompt-length", type=int, default=0, help="deep prompt positions (0: none)")
    tune.add_argument("--lr", type=float, default=1e-2)
    tune.add_argument("--codec", choices=["f32", "f16", "int8", "int4"], default="f32")
    tune.add_argument("--out", type=Path, required=True, help="where to write the tuned parameters (.safetensors)")
    _device_argument(tune)
    tune.set_defaults(handler=run_tune)


def _ledger_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ledger", metavar="URL", help="a validator's JSON-RPC URL: announce / find servers there")
    parser.add_argument("--key", type=Path, help="node key file (signs records and receipts; default: a new key)")


def _device_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="where torch computes: auto (CUDA when present, else CPU), cpu or cuda (docs/adr/0179)")


def _device(args: argparse.Namespace) -> tuple[str, str]:
    """(device, execution profile) for --device, set up for deterministic compute; a clear error at start
    when it cannot be honoured (cuda without a CUDA device)."""
    from ml.serve.device import DeviceError, prepare_device, serving_profile

    try:
        device = prepare_device(args.device)
    except DeviceError as exc:
        raise CliError(str(exc)) from None
    return device, serving_profile(device)


def _identity(args: argparse.Namespace) -> Identity:
    from node.identity import Identity
    from node.keystore import load_identity

    if args.key is None:
        return Identity.generate()
    try:
        return load_identity(args.key)
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot load key {args.key}: {exc}") from None


def _gateway(args: argparse.Namespace, identity: Identity) -> LedgerGateway | None:
    from node.ledger.gateway import LedgerGateway

    return LedgerGateway(identity, [args.ledger]) if args.ledger else None


async def _ledger_servers(gateway: LedgerGateway, host: Host, spec: ModelSpec, exclude: str = ""
                          ) -> list[Announced]:
    """The servers of this model the ledger's records announce, their addresses added to `host`."""
    from ml.serve.loop import ledger_servers
    from node.ledger.errors import LedgerUnavailable

    try:
        return await ledger_servers(gateway, host, spec, exclude)
    except (LedgerUnavailable, OSError) as exc:
        raise CliError(f"cannot list servers on {gateway.url}: {exc}") from None


async def _payer(args: argparse.Namespace, gateway: LedgerGateway | None, identity: Identity) -> Payer | None:
    from ml.serve.protocol import Payer

    if args.max_price <= 0:
        return None
    if gateway is None or args.key is None:
        raise CliError("--max-price needs --ledger and --key (receipts are signed for the ledger's chain)")
    return Payer(identity, await gateway.chain_id(), args.max_price)


def _spec(text: str, command: str) -> ModelSpec:
    require_compute(f"dekube-node {command}")
    from ml.serve.catalog import ModelSpecError, parse_model

    try:
        return parse_model(text)
    except ModelSpecError as exc:
        raise CliError(str(exc)) from None


def run_serve(args: argparse.Namespace) -> int:
    spec = _spec(args.model, "serve")
    from ml.serve.catalog import ModelSpecError, parse_blocks

    auto = None
    if args.blocks and args.blocks.startswith("auto:"):
        count = args.blocks[5:]
        if not count.isdigit() or not 1 <= int(count) <= spec.config.layers:
            raise CliError(f"--blocks auto:N needs 1 <= N <= {spec.config.layers}")
        auto = int(count)
    try:
        blocks = (None if auto else parse_blocks(args.blocks, spec.config.layers) if args.blocks
                  else (0, spec.config.layers))
    except ModelSpecError as exc:
        raise CliError(str(exc)) from None
    if args.price < 0 or args.credit_tokens < 1 or args.claim_every <= 0 or args.rebalance_every < 0:
        raise CliError("need --price >= 0, --credit-tokens >= 1, --claim-every > 0 and --rebalance-every >= 0")
    if args.rebalance_every and not args.ledger:
        raise CliError("--rebalance-every reads the coverage from the ledger: give --ledger")
    if args.price and not (args.ledger and args.key):
        raise CliError("--price needs --ledger and --key (the server claims its receipts on chain)")
    return asyncio.run(_serve(spec, blocks, auto, args, *_device(args)))


async def _coverage(host: Host, spec: ModelSpec, known: list[str]) -> list[tuple[int, int, float]]:
    """(start, end, measured tokens/s) of the known servers of this model that answer."""
    from ml.serve.client import ServerInfo, measure
    from ml.serve.protocol import RemoteError, SpanClient, SpanUnavailable

    coverage = []
    for addr in known:
        try:
            peer_id = await asyncio.wait_for(host.connect(addr), 15)
            span = SpanClient(host, peer_id, 0, 0, timeout=15)
            try:
                info = await span.info()
            finally:
                await span.close()
        except (OSError, ValueError, TimeoutError, ConnectionError, SpanUnavailable, RemoteError) as exc:
            print(f"dekube-node: known server {addr} unreachable: {exc}", file=sys.stderr)
            continue
        start, end = info.get("start"), info.get("end")
        if info.get("model") != spec.model_id or not isinstance(start, int) or not isinstance(end, int):
            continue
        server = ServerInfo(peer_id, start, end)
        speed = (await measure(host, [server], spec.config.width))[peer_id]
        if speed > 0 and 0 <= start < end <= spec.config.layers:
            coverage.append((start, end, speed))
    return coverage


async def _serve(spec: ModelSpec, blocks: tuple[int, int] | None, auto: int | None, args: argparse.Namespace,
                 device: str, profile: str) -> int:
    from ml.serve.loop import ServeSettings, ServingLoop, standalone_publisher
    from node.ledger.errors import LedgerUnavailable
    from node.p2p.host import Host

    identity = _identity(args)
    gateway = _gateway(args, identity)
    host = Host(identity, [args.listen])
    try:
        await host.start()
    except OSError as exc:
        raise CliError(f"cannot listen on {args.listen}: {exc}") from None
    settings = ServeSettings(max_sessions=args.max_sessions, price=args.price, credit_tokens=args.credit_tokens,
                             claim_every=args.claim_every, rebalance_every=args.rebalance_every,
                             lie_after=args.lie_after)
    publish = standalone_publisher(gateway, host, profile) if gateway is not None else None
    loop = ServingLoop(host, gateway, identity, spec, settings, device, profile, publish)
    try:
        if args.price:   # a paid server the ledger would not pay refuses to start, saying why
            assert gateway is not None   # run_serve: --price needs --ledger
            await _ensure_claimable(gateway, host.peer_id)
        if blocks is None:   # fill the gap in what the known servers and the ledger's announcements cover
            assert auto is not None   # blocks is None only for --blocks auto:N
            try:
                ledger_known = await loop.coverage()
            except (LedgerUnavailable, OSError) as exc:
                assert gateway is not None   # the loop reads the ledger only through it
                raise CliError(f"cannot list servers on {gateway.url}: {exc}") from None
            blocks = loop.choose(auto, await _coverage(host, spec, args.known) + ledger_known)
        await loop.load(blocks)
        if args.price and loop.announced is None:
            raise CliError("a paid server must be announced on the ledger (the record registers it as a compute "
                           "node; receipt claims need that): see the warning above")
        print(json.dumps({"peer_id": host.peer_id, "addrs": list(host.listen_addrs), "model": spec.model_id,
                          "blocks": f"{blocks[0]}:{blocks[1]}", "tokens_per_s": round(loop.tokens_per_s, 1),
                          "device": device, "profile": profile, "announced": loop.announced is not None}),
              flush=True)

        def moved(blocks: tuple[int, int]) -> None:
            print(json.dumps({"moved": f"{blocks[0]}:{blocks[1]}", "announced": loop.last_error is None}),
                  flush=True)
        await loop.run(on_moved=moved)
    finally:
        await loop.close()
        if gateway is not None:
            await gateway.close()
        await host.stop()


async def _ensure_claimable(gateway: LedgerGateway, peer_id: str) -> None:
    """Bond what the key lacks of min_serve_stake from its free balance, or raise CliError with why."""
    from ml.serve.claimable import NotClaimable, ensure_claimable

    try:
        bonded = await ensure_claimable(gateway, peer_id)
    except NotClaimable as exc:
        raise CliError(str(exc)) from None
    if bonded:
        print(f"dekube-node: bonded {bonded} so that the ledger pays this server's receipts (min_serve_stake)",
              file=sys.stderr, flush=True)


def _parse_server(text: str, layers: int) -> tuple[str, tuple[int, int]]:
    from ml.serve.catalog import ModelSpecError, parse_blocks

    addr, sep, blocks = text.rpartition("=")
    if not sep or "/p2p/" not in addr:
        raise CliError(f"--server needs MULTIADDR/p2p/<peer id>=A:B, got {text!r}")
    try:
        return addr, parse_blocks(blocks, layers)
    except ModelSpecError as exc:
        raise CliError(str(exc)) from None


def _named_servers(args: argparse.Namespace, spec: ModelSpec) -> list[Named]:
    """The `--server MULTIADDR=A:B` list; an error when there are none and no `--ledger` to find them."""
    servers = [_parse_server(s, spec.config.layers) for s in args.server]
    if not servers and not args.ledger:
        raise CliError("name servers with --server, or find them with --ledger")
    return servers


def run_generate(args: argparse.Namespace) -> int:
    spec = _spec(args.model, "generate")
    from ml.serve.catalog import ModelSpecError

    servers = _named_servers(args, spec)
    try:
        prompt = spec.encode(args.prompt)
    except ModelSpecError as exc:
        raise CliError(str(exc)) from None
    if not prompt or args.max_tokens < 1 or len(prompt) + args.max_tokens > spec.config.context:
        raise CliError(f"need a non-empty prompt and 1 <= prompt + max-tokens <= {spec.config.context}")
    if args.dispute_bond < 0 or args.dispute_bond and not (args.spot_check and args.max_price > 0):
        raise CliError("--dispute-bond needs --spot-check and --max-price (the evidence is a paid receipt)")
    tuned = _load_adapter(args.adapter, spec.config) if args.adapter else None
    if tuned is not None and tuned.prompt_length + len(prompt) + args.max_tokens > spec.config.context:
        raise CliError(f"prompt + soft prompt + max-tokens exceed the context of {spec.config.context}")
    print(json.dumps(asyncio.run(_generate(spec, servers, prompt, args, tuned, *_device(args)))))
    return 0


async def _spot_check(spec: ModelSpec, generator: RemoteGenerator, gateway: LedgerGateway | None, host: Host,
                      args: argparse.Namespace, device: str, profile: str) -> dict[str, Any]:
    """Rerun each span locally (on `device`, in `profile`); the answers of servers in another profile are
    replayed by a second server of theirs (a third one naming the liar when they disagree), or reported
    unchecked (ADR 0179, 0182). With --dispute-bond, dispute on chain every wrong answer a check names a
    liar for (ADR 0176)."""
    from ml.serve.dispute import (
        BUNDLE_PROTOCOL,
        BundleStore,
        DisputeError,
        file_dispute,
        make_bundle_handler,
        server_profile,
    )
    from node.ledger.errors import LedgerUnavailable, TxFailed

    checks, entries = [], []   # checks: (check, the profile its answers were recomputed in)
    for index, blocks in enumerate(generator.spans):
        part = await asyncio.to_thread(spec.load_part, blocks, False, device)
        check = await asyncio.to_thread(generator.spot_check, index, part, profile)
        checks.append((check, profile))
        entries.append({"blocks": f"{blocks[0]}:{blocks[1]}", "ok": check.ok, "culprit": check.culprit,
                        "step": check.first_bad_step, "by": "local"})
        remote_entries, remote_checks = await _remote_checks(generator, index, check.unchecked, profile)
        entries += remote_entries
        checks += remote_checks
    out: dict[str, Any] = {"spot_checks": entries}
    if not args.dispute_bond:
        return out
    store = BundleStore()
    host.set_handler(BUNDLE_PROTOCOL, make_bundle_handler(store))
    out["disputes"] = []
    for check, computed in checks:
        if check.ok or check.culprit is None:   # nobody named: nothing to dispute
            continue
        if check.evidence is None:
            out["disputes"].append({"culprit": check.culprit, "error": "no countersigned receipt covers the step"})
            continue
        try:
            announced = await server_profile(gateway, check.culprit, check.evidence["receipt"]["model"])
            if announced != computed:   # referees are drawn in the announced profile: they would not see our bits
                out["disputes"].append({"culprit": check.culprit, "error": f"the server announces profile "
                                        f"{announced} on the ledger, the check computed in {computed}: not disputed"})
                continue
            out["disputes"].append({"culprit": check.culprit, **await file_dispute(
                gateway, host, store, check.evidence, args.dispute_bond, wait_s=args.dispute_wait)})
        except (DisputeError, LedgerUnavailable, TxFailed, OSError) as exc:
            out["disputes"].append({"culprit": check.culprit, "error": str(exc)[:300]})
    return out


async def _remote_checks(generator: RemoteGenerator, index: int, unchecked: tuple[str, ...],
                         profile: str) -> tuple[list[dict[str, Any]], list[tuple[SpotCheck, str]]]:
    """Spot checks of span `index`'s servers in other profiles than this client's, each by a second server
    of that profile (`spot_check_remote`) and, where a third server of that profile holds the span, with
    its opinion, which names the liar when the two disagree (ADR 0182); a disagreement without one names
    nobody, and a server without a second one is reported unchecked: neither is accused. Returns the
    report's entries and the (check, profile) pairs that could name a culprit."""
    from ml.serve.protocol import RemoteError, SpanUnavailable

    start, end = generator.spans[index]
    entries, checks, left = [], [], set(unchecked)

    def profile_of(server: ServerInfo) -> str:
        return server.profile or generator.profiles.get(server.peer_id, "")

    def may_replay(server: ServerInfo) -> bool:
        """Holds the span, is none of the servers checked, not known to compute in another profile."""
        known = profile_of(server)
        return ((server.start, server.end) == (start, end) and server.peer_id not in left | generator.dead
                and (not known or known in {generator.profiles.get(peer, "") for peer in left}))

    for candidate in generator.servers:
        if not left:
            break
        if not may_replay(candidate):
            continue
        third = next((s for s in generator.servers if s.peer_id != candidate.peer_id and may_replay(s)
                      and profile_of(s) in ("", profile_of(candidate))), None)
        try:
            check = await generator.spot_check_remote(index, candidate, third, same_profile=True)
        except (SpanUnavailable, RemoteError):
            continue
        compared = left - set(check.unchecked)
        if not compared:
            continue
        left -= compared
        entry = {"blocks": f"{start}:{end}", "ok": check.ok, "culprit": check.culprit,
                 "step": check.first_bad_step, "by": candidate.peer_id}
        if third is not None:
            entry["third"] = third.peer_id
        if not check.ok and check.culprit is None:
            entry["reason"] = (f"server {candidate.peer_id} replays other answers than {', '.join(sorted(compared))} "
                               f"at step {check.first_bad_step} and " + (
                                   f"{third.peer_id} agrees with neither" if third is not None else
                                   f"no third server of that profile holds blocks {start}:{end}")
                               + ": nobody named, nothing disputed")
            print(f"dekube-node: spot check: {entry['reason']}", file=sys.stderr)
        entries.append(entry)
        checks.append((check, generator.profiles.get(candidate.peer_id, "")))
    for peer in sorted(left):
        reason = (f"server {peer} computes in profile {generator.profiles.get(peer) or 'unknown'}, this client in "
                  f"{profile}, and no second server of that profile holds blocks {start}:{end}: not checked")
        print(f"dekube-node: spot check: {reason}", file=sys.stderr)
        entries.append({"blocks": f"{start}:{end}", "ok": None, "unchecked": peer, "reason": reason})
    return entries, checks


def _load_adapter(path: Path, config: DecoderConfig) -> ClientParams:
    from ml.serve.adapters import AdapterError, ClientParams

    try:
        return ClientParams.load(path, config)
    except AdapterError as exc:
        raise CliError(str(exc)) from None


async def _connect_servers(host: Host, servers: list[Named]) -> list[ServerInfo]:
    from ml.serve.client import ServerInfo

    infos = []
    for addr, (start, end) in servers:
        try:
            peer_id = await asyncio.wait_for(host.connect(addr), 15)
        except (OSError, ValueError, TimeoutError, ConnectionError) as exc:
            print(f"dekube-node: server {addr} unreachable: {exc}", file=sys.stderr)
            continue
        infos.append(ServerInfo(peer_id, start, end))
    return infos


async def _find_servers(host: Host, gateway: LedgerGateway | None, spec: ModelSpec, servers: list[Named]
                        ) -> tuple[list[ServerInfo], dict[str, float] | None]:
    """The named servers plus those the ledger announces, and (for ledger-found ones) the client's own
    measured tokens/s of each, which the chain is planned by."""
    from ml.serve.client import measure

    infos = await _connect_servers(host, servers)
    speed = None
    if gateway is not None:
        found = [a.server for a in await _ledger_servers(gateway, host, spec, exclude=host.peer_id)]
        infos += found
        speed = await measure(host, infos, spec.config.width)
    return infos, speed


@contextlib.asynccontextmanager
async def _client(args: argparse.Namespace) -> AsyncIterator[tuple[Host, LedgerGateway | None, Identity]]:
    """(host, gateway or None, identity) of a short-lived client node: its relay client dials the
    relayed addresses NAT'd servers announce, like ``task fetch`` does (cli/client_node.py)."""
    from cli.client_node import client_node

    identity = _identity(args)
    gateway = _gateway(args, identity)
    try:
        async with client_node(identity) as node:
            yield node.host, gateway, identity
    finally:
        if gateway is not None:
            await gateway.close()


async def _generate(spec: ModelSpec, servers: list[Named], prompt: list[int], args: argparse.Namespace,
                    tuned: ClientParams | None, device: str, profile: str) -> dict[str, Any]:
    from ml.serve.client import NoChain, RemoteGenerator, local_generate

    async with _client(args) as (host, gateway, identity):
        payer = await _payer(args, gateway, identity)
        infos, speed = await _find_servers(host, gateway, spec, servers)
        ends = await asyncio.to_thread(spec.load_part, (0, 0), True, device)
        generator = RemoteGenerator(host, ends, infos, codec=args.codec, tuned=tuned, speed=speed, payer=payer,
                                    push=args.push)
        began = time.perf_counter()
        try:
            tokens = await generator.generate(prompt, args.max_tokens)
        except NoChain as exc:
            raise CliError(str(exc)) from None
        result = {"text": spec.decode(tokens), "tokens": tokens, "replays": generator.stats.replays,
                  "tokens_per_s": round(len(tokens) / (time.perf_counter() - began), 2),
                  "servers": len(infos), "device": device,
                  "profiles": sorted(set(generator.profiles.values()))}   # the servers' (bit-exact within one)
        if args.push:
            result["pushed_steps"], result["push_fallbacks"] = generator.stats.pushed, generator.stats.push_fallbacks
        if payer is not None and gateway is not None:   # a payer needs the ledger; "paid" counts only receipts
            # the ledger will pay (ml/serve/claimable.py)
            result |= await _paid(gateway, [m.signed.receipt for m in generator.meters if m.signed])
        if args.check_local:
            whole = await asyncio.to_thread(spec.load_part, None, True, device)
            local = await asyncio.to_thread(local_generate, whole, prompt, args.max_tokens, tuned)
            result["identical_to_local"] = local == tokens
        if args.spot_check:
            result |= await _spot_check(spec, generator, gateway, host, args, device, profile)
        return result


async def _paid(gateway: LedgerGateway, receipts: list[dict[str, Any]]) -> dict[str, Any]:
    """{"paid"} over the co-signed receipts whose servers can claim them, plus {"unclaimable"} (each
    with why, also said on stderr) for the others."""
    from ml.serve.claimable import claimable_servers, paid_report
    from node.ledger.errors import LedgerUnavailable

    try:
        why = await claimable_servers(gateway, {r["server"] for r in receipts})
    except (LedgerUnavailable, OSError) as exc:
        raise CliError(f"cannot check the servers' stake on the ledger: {exc}") from None
    for server, reason in why.items():
        print(f"dekube-node: server {server} cannot claim its receipts ({reason}): you will not be charged for "
              "them", file=sys.stderr)
    return paid_report(receipts, why)


def run_tune(args: argparse.Namespace) -> int:
    spec = _spec(args.model, "tune")
    from ml.serve.catalog import ModelSpecError

    servers = _named_servers(args, spec)
    try:
        tokens = spec.encode(args.text.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ModelSpecError) as exc:
        raise CliError(f"cannot use {args.text}: {exc}") from None
    if not 1 <= args.length <= spec.config.context - args.prompt_length - 1 or len(tokens) < args.length + 2:
        raise CliError(f"need 1 <= length <= {spec.config.context - args.prompt_length - 1} and a text longer "
                       "than one example")
    if args.steps < 1 or not 1 <= args.batch <= 16 or args.lora_rank < 0 or args.prompt_length < 0 \
            or args.lora_rank + args.prompt_length == 0:
        raise CliError("need steps >= 1, batch 1..16, and lora-rank > 0 or prompt-length > 0")
    result = asyncio.run(_tune(spec, servers, tokens, args, _device(args)[0]))
    print(json.dumps(result))
    return 0


async def _tune(spec: ModelSpec, servers: list[Named], tokens: list[int], args: argparse.Namespace,
                device: str) -> dict[str, Any]:
    import torch

    from ml.serve.client import NoChain
    from ml.serve.tuner import RemoteTuner

    data = torch.tensor(tokens)
    gen = torch.Generator().manual_seed(0)

    def batch() -> torch.Tensor:
        offsets = torch.randint(0, len(tokens) - args.length - 1, (args.batch,), generator=gen)
        return torch.stack([data[o:o + args.length + 1] for o in offsets.tolist()])

    async with _client(args) as (host, gateway, identity):
        payer = await _payer(args, gateway, identity)
        infos, _ = await _find_servers(host, gateway, spec, servers)
        ends = await asyncio.to_thread(spec.load_part, (0, 0), True, device)
        try:
            tuner = RemoteTuner(host, ends, infos, prompt_length=args.prompt_length, lora_rank=args.lora_rank,
                                codec=args.codec, lr=args.lr, payer=payer)
            held_out = batch()
            before = await tuner.loss(held_out)
            began = time.perf_counter()
            for _ in range(args.steps):
                await tuner.step(batch())
            step_s = (time.perf_counter() - began) / args.steps
            after = await tuner.loss(held_out)
            await tuner.close()
        except NoChain as exc:
            raise CliError(str(exc)) from None
        await asyncio.to_thread(tuner.tuned.save, args.out, {"model": spec.model_id})
        return {"loss_before": round(before, 4), "loss_after": round(after, 4), "steps": args.steps,
                "step_s": round(step_s, 4), "failovers": tuner.failovers, "out": str(args.out)}
