"""``task submit``: check, dry-run, pay, and (``--wait``) follow a training task to its trained weights.

In order, each step failing with a one-line reason and exit status 1 before anything is paid: the
model/dataset arguments are checked (cli.task_inputs: missing files, pickles, unknown kinds), the
TrainSpec is built, and one training step runs locally (``ml.train.dry_run``: shape and dtype errors,
NaN loss, unsupported ops), whose step time gives the task's expected duration (``expected_s``: steps x
the measured step time, or ``--expected-s``), from which the ledger derives the workers' commit deadline
in block time (docs/adr/0187); the command says how long that is. Then, when the task has files, a
client node starts, serves them as artifacts and the submit_task names its addresses as the task's
``sources`` (where the workers fetch them). The transaction is confirmed through the ledger's ``txs``
topic.

With ``--wait`` the command follows the task (cli.task_follow: ledger events plus the workers'
progress over p2p), says when a worker holds the files (the owner could go offline from then on),
prints the payouts or the reason it failed, and with ``--out DIR`` fetches the trained weights.
Without ``--wait``, a task with files keeps being served until a worker holds them.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import socket
import sys
import urllib.parse
from pathlib import Path

from cli.errors import CliError
from cli.home import key_path, resolve_home
from cli.passphrase import unlock_passphrase
from cli.task_crew import ledger_profile
from cli.task_inputs import TaskInputs, task_inputs
from cli.task_ledger import client_identity, ledger_pool, task_id_of
from cli.task_report import report_final
from cli.task_view import TaskView, eval_text, short
from cli.tx_sender import send_tx
from consensus.genesis import Params
from consensus.state.audit_cost import audit_share_bps, audit_surcharge, min_segments, segment_steps_for
from consensus.task_info import TaskInfo, TaskStatus
from ml.compute.epoch_commits import epochs_for
from ml.compute.task_spec import SYNC_MODES, InvalidTask, submit_payload
from ml.profiles import ProfileError, check_profile_id, default_profile
from ml.train.spec import InvalidSpec, TrainSpec
from node.extras import require_compute
from node.keystore import load_identity

RELAY_WAIT_S = 10.0
MAX_SOURCES = 8   # the ledger's bound on a task's source addresses
SPEC_OPTIONS = ("inner_steps", "segment_steps", "batch_size", "lr", "seed", "loss", "optimizer", "init",
                "weight_decay", "eval_every", "tokenizer")
EVALS_PER_TASK = 5   # with --eval and no --eval-every: held-out metrics this many times during training


def build_spec(args: argparse.Namespace, inputs: TaskInputs) -> TrainSpec:
    if not 1 <= args.workers <= 64:
        raise CliError("--workers must be in 1..64")
    if getattr(args, "max_workers", None) is not None and not args.workers <= args.max_workers <= 64:
        raise CliError(f"--max-workers must be in {args.workers}..64 (at least --workers)")
    values = {**inputs.values, "codec": args.codec, "steps": args.steps,
              "mode": SYNC_MODES[args.sync]}
    for name in SPEC_OPTIONS:
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    if getattr(args, "eval", None) is not None and getattr(args, "eval_every", None) is None:
        values["eval_every"] = max(1, args.steps // EVALS_PER_TASK)
    if "segment_steps" not in values and values["mode"] == "data-parallel":   # audits within budget (ADR 0212)
        values["segment_steps"] = segment_steps_for(Params(), args.steps)
    if getattr(args, "device", None) == "cuda":   # "any": the ledger's scheduler picks the device class
        values["device"] = "cuda"
    try:
        return TrainSpec(**values)
    except InvalidSpec as exc:
        raise CliError(f"bad task: {exc}") from None
    except TypeError as exc:   # a field this installation's TrainSpec does not know
        raise CliError(f"bad task: this dekube-node cannot train {sorted(values)} ({exc})") from None


def artifact_id(path: Path) -> str:
    from node.artifacts import artifact_id_of_file

    return artifact_id_of_file(path)


def expected_seconds(step_seconds: float, steps: int) -> int:
    """The work's expected duration for the ledger (whole seconds, at least 1): ``steps`` steps of the
    dry run's measured step time (the chain's deadline factor covers slower workers and the syncs)."""
    return max(1, math.ceil(step_seconds * steps))


def audit_text(segments: int, price: int, epochs: int = 1) -> str:
    """What the task's audits cost under the default genesis (docs/adr/0212, each epoch audited: 0230): the
    share of the work they replay and, above the chain's budget, the surcharge paid on top of the price."""
    params = Params()
    share = audit_share_bps(params, segments, epochs)
    text = f"audits: {segments} segments, verifiers replay about {share / 100:.1f}% of the work"
    surcharge = audit_surcharge(params, price, segments, epochs)
    if surcharge:
        each = " per epoch" if epochs > 1 else ""
        text += (f"; above the chain's {params.max_audit_share_bps / 100:.0f}%, so an audit surcharge of "
                 f"{surcharge} is escrowed on top of the price (at least {min_segments(params)} segments{each} "
                 "avoid it)")
    return text


def commit_window_text(expected_s: int | None, epochs: int = 1) -> str:
    """What the workers get to commit under the default genesis limits (consensus/genesis.py)."""
    from consensus.state.deadlines import commit_span_ms

    basis = f"expected {expected_s} s of work" if expected_s else "no expected duration declared: the chain's minimum"
    if epochs > 1:
        span = commit_span_ms(Params(), (expected_s or 0) // epochs) // 1000
        return (f"cut into {epochs} epochs: workers must commit each epoch within about {span} s of the previous "
                f"one ({basis}; the chain's limits apply); each epoch is audited and paid to who worked it")
    span = commit_span_ms(Params(), expected_s or 0) // 1000
    return f"workers must commit within about {span} s of assignment ({basis}; the chain's limits apply)"


def prepare(args: argparse.Namespace) -> tuple[TrainSpec, TaskInputs]:
    """The checked spec and its files, dry-run locally: CliError (exit 1) on anything untrainable. Sets
    ``args.expected_s`` from the dry run's step time unless ``--expected-s`` gave it."""
    if args.price <= 0:
        raise CliError("--price must be positive")
    inputs = task_inputs(args.model, args.dataset, args.eval, artifact_id)
    if getattr(args, "tokenizer", None) is not None and not str(args.dataset).lower().endswith(".txt"):
        raise CliError(f"--tokenizer applies to a text dataset (.txt), not {args.dataset}")
    spec = build_spec(args, inputs)
    if inputs.has_files:
        require_compute("a task with model or data files (its dry run)")
    try:
        from ml.train.dry_run import Untrainable, dry_run
    except ImportError:   # no compute extra: a registry task is submitted unchecked
        if not args.json:
            print("no local dry run (the compute extra is not installed); submitting unchecked")
        return spec, inputs
    if args.skip_dry_run:
        return spec, inputs
    try:
        result = dry_run(dataclasses.replace(spec, device="cpu") if spec.device != "cpu" else spec,
                         dict(inputs.files), getattr(args, "max_workers", None) or args.workers)   # as many shards
    except Untrainable as exc:
        raise CliError(f"dry run: the task cannot be trained: {exc}") from None
    except Exception as exc:   # anything else one local step raises: the workers would fail the same way
        raise CliError(f"dry run: the task cannot be trained: {type(exc).__name__}: {exc}") from None
    if args.expected_s is None:
        args.expected_s = expected_seconds(result["step_seconds"], spec.steps)
    if not args.json:
        untrained = eval_text(result.get("metrics"))
        print(f"dry run: one step ran locally: loss {result['loss']:.4f}, {result['params']:,} parameters, "
              f"{result['step_seconds'] * 1000:.0f} ms a step" + (f"; untrained: {untrained}" if untrained else ""))
    return spec, inputs


def task_profile(args: argparse.Namespace) -> str:
    """The execution profile the task names (docs/adr/0166, 0188): ``--profile``, else the portable CPU
    profile for a CPU task, and for a cuda or any task the profile the most compute nodes on the ledger
    run (cli.task_crew), said before anything is paid."""
    device = getattr(args, "device", None) or "cpu"
    chosen = getattr(args, "profile", None)
    if chosen is None:
        profile = default_profile(device)
        if not profile:
            profile, found = ledger_profile(args.rpc, device, args.workers)
            if not args.json:
                print(f"profile {profile}: run by {found} compute node(s) on the ledger, the most for --device "
                      f"{device} (--profile ID names another)")
        return profile
    try:
        check_profile_id(chosen)
    except ProfileError as exc:
        raise CliError(f"--profile: {exc}") from None
    if device != "any" and not chosen.startswith(f"{device}-"):
        raise CliError(f"--profile {chosen} is not a {device} profile (--device {device})")
    return chosen


def run_submit(args: argparse.Namespace) -> int:
    spec, inputs = prepare(args)
    profile = task_profile(args)
    try:
        payload = submit_payload(spec, args.workers, args.price, profile)
    except InvalidTask as exc:
        raise CliError(str(exc)) from None
    if args.device is not None:
        payload["device"] = args.device
    if args.expected_s is not None:
        payload["expected_s"] = args.expected_s
    epochs = args.epochs if getattr(args, "epochs", None) else epochs_for(args.expected_s, payload["segments"],
                                                                          min_segments=min_segments(Params()))
    if epochs > 1:
        payload["epochs"] = epochs
    if getattr(args, "max_workers", None) and args.max_workers > args.workers:
        if epochs <= 1:
            raise CliError("--max-workers: workers join at epoch boundaries, and this task is one epoch "
                           "(give --epochs N, or a longer --expected-s)")
        payload["max_workers"] = args.max_workers
    if not args.json:
        print(commit_window_text(args.expected_s, epochs))
        print(audit_text(payload["segments"], args.price, epochs))
        if "max_workers" in payload:
            print(f"the crew may grow from {args.workers} to {payload['max_workers']} workers at epoch boundaries; "
                  f"the price pays {payload['max_workers']} seats and what nobody trains is refunded")
    identity = load_identity(args.key or key_path(resolve_home(args)), unlock_passphrase(args))
    args.submitted_task = None
    try:
        return asyncio.run(submit(args, identity, payload, inputs))
    except KeyboardInterrupt:
        if args.submitted_task is not None:
            print(f"\nstopped following; task {args.submitted_task} goes on on the ledger: "
                  f"`dekube-node task watch {args.submitted_task}`, `dekube-node task fetch {args.submitted_task} "
                  "--out DIR`", file=sys.stderr)
        raise


async def submit(args: argparse.Namespace, identity, payload: dict, inputs: TaskInputs) -> int:
    async with ledger_pool(args.rpc) as pool:
        if not inputs.has_files and not args.wait:
            sent = await send_tx(pool.urls, identity, "submit_task", payload, fee=args.fee)
            return announce(args, identity, task_id_of(identity.peer_id, sent.nonce), done=True)
        from cli.client_node import client_node

        client = await client_identity(args, pool, identity)
        async with client_node(client, bootstrap=args.bootstrap or (), relays=args.relay or ()) as node:
            if inputs.has_files:
                await wait_relayed(node, bool(args.relay))
                payload = {**payload, "sources": await serve_files(node, inputs, args.rpc)}
            sent = await send_tx(pool.urls, identity, "submit_task", payload, fee=args.fee)
            task_id = args.submitted_task = task_id_of(identity.peer_id, sent.nonce)
            announce(args, identity, task_id, done=False)
            return await follow(args, pool, node, task_id, inputs)


def announce(args: argparse.Namespace, identity, task_id: str, *, done: bool) -> int:
    if args.json and done:
        print(json.dumps({"task_id": task_id, "owner": identity.peer_id}))
    elif not args.json:
        print(f"task {task_id} submitted by {identity.peer_id}")
    return 0


async def serve_files(node, inputs: TaskInputs, rpc_url: str) -> list[str]:
    """Adds the task's files to the client node's artifact store; returns the addresses serving them."""
    for ident, path in inputs.files.items():
        added = await node.artifacts.add_file(path)
        if added != ident:
            raise CliError(f"{path} changed while being submitted (artifact {added}, expected {ident})")
    sources = node_addresses(node, rpc_url)
    if not sources:
        raise CliError("the client node has no address to serve the task's files from")
    return sources[:MAX_SOURCES]


def local_ip_towards(url: str) -> str:
    """The local IP address this machine uses to reach ``url``'s host (no packet is sent)."""
    host = urllib.parse.urlsplit(url).hostname or "127.0.0.1"
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))
            return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def node_addresses(node, rpc_url: str) -> list[str]:
    """Where workers can reach the client node: its listen addresses (a wildcard one as the local IP
    towards the validator), then relayed ones (reachable behind NAT)."""
    addrs = []
    for addr in node.host.listen_addrs:
        for wildcard, family in (("/ip4/0.0.0.0/", "ip4"), ("/ip6/::/", "ip6")):
            if addr.startswith(wildcard):
                local = local_ip_towards(rpc_url)
                if (family == "ip6") == (":" in local):
                    addrs.append(f"/{family}/{local}/" + addr[len(wildcard):])
                break
        else:
            addrs.append(addr)
    relay = getattr(node, "relay_client", None)
    addrs += list(getattr(getattr(relay, "client", None), "relayed_addrs", None) or [])
    return list(dict.fromkeys(addrs))


async def wait_relayed(node, wanted: bool, timeout: float = RELAY_WAIT_S) -> None:
    """With ``--relay``: give the relay reservation a moment, so the sources include the relayed address."""
    if not wanted:
        return
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if getattr(getattr(node.relay_client, "client", None), "relayed_addrs", None):
            return
        await asyncio.sleep(0.2)


def spec_value(task: TaskInfo, name: str) -> str:
    hyperparams = task.spec_field("hyperparams")
    return str(hyperparams.get(name, "")) if isinstance(hyperparams, dict) else ""


async def follow(args: argparse.Namespace, pool, node, task_id: str, inputs: TaskInputs) -> int:
    from cli.task_fetch import fetch_result
    from cli.task_follow import follow_task

    view = TaskView(task_id, quiet=args.json)
    held = asyncio.Event()

    def on_held(peer: str) -> None:
        held.set()
        if inputs.has_files:
            view.note(f"worker {short(peer)} holds the task's files: this computer may go offline now "
                      f"(the task goes on; `dekube-node task fetch {task_id} --out DIR` gets the weights later)")

    following = asyncio.create_task(follow_task(pool, task_id, view, node=node, timeout=args.timeout,
                                                on_held=on_held))
    if not args.wait:   # serve the files until a worker holds them, then leave
        waiter = asyncio.create_task(held.wait())
        await asyncio.wait({following, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if not following.done():
            following.cancel()
            if args.json:
                print(json.dumps({"task_id": task_id, "held_by_worker": True}))
            return 0
    task = await following
    extra = {}
    if args.out is not None and task.status in (TaskStatus.PAID, TaskStatus.STOPPED):
        model_path = inputs.files.get(spec_value(task, "model_artifact"))
        fetched = await fetch_result(pool, node, task_id, Path(args.out), say=view.note, model_path=model_path)
        extra["fetched"] = fetched
    code = report_final(task, as_json=args.json, extra=extra)
    if extra and not args.json:
        print(f"weights: {extra['fetched']['weights']} (checked against the ledger's result)")
        print(f"metrics: {extra['fetched']['metrics']}  final {extra['fetched']['final_metrics']}")
        print(f"load them: {extra['fetched']['load']}")
    return code
