"""``dekube-node task submit|watch|fetch|cancel|show|list|wait|run``: training tasks on the ledger,
or a local job without it.

``submit`` (cli.task_submit) checks and dry-runs the task, serves its files (a .pt2 model, a dataset
file) from a client node, signs a submit_task with the key (``--key`` or the home's node key) and
with ``--wait`` follows it live until it ends (payouts; ``--out DIR`` fetches the weights).
``watch``/``wait`` follow an existing task (ledger events, the workers' progress over p2p);
``fetch`` downloads a task's trained weights and checks them against the ledger (cli.task_fetch);
``cancel`` sends cancel_task (a task not yet assigned; the escrow comes back).
``show``/``list`` read ``dkb_getTask``/``dkb_listTasks``. ``run`` trains among ``--workers`` local
compute processes that talk over the node's p2p stack (noise + yamux, bulk connections), without any
ledger.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from cli.errors import CliError
from cli.home import add_home_argument, key_path, resolve_home
from cli.passphrase import add_unlock_argument, unlock_passphrase
from cli.payout_lines import payout_lines
from cli.rpc_call import rpc_call
from cli.safe_text import echo
from cli.task_epochs import epoch_lines
from cli.task_report import FAILED, deadline_lines, decode_task, relay_lines, slot_lines
from consensus.state.retention import unknown_task_message
from consensus.tx import DEFAULT_FEE, MAX_EXPECTED_S
from ml.compute.task_spec import SYNC_MODES, model_name
from ml.train.spec import InvalidSpec, TrainSpec
from node.extras import require_compute
from node.keystore import load_identity

DEFAULT_RPC = "http://127.0.0.1:8645"
# what ``task show`` prints of the ledger's document, in this order (the document's own JSON form)
SHOWN_FIELDS = ("task_id", "status", "reason", "owner", "price", "escrow", "spec", "device", "profile", "sources",
                "segments", "workers", "rejections", "commits", "payouts", "result")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("task", help="submit and follow training tasks, or run one locally")
    actions = parser.add_subparsers(dest="task_command", required=True, metavar="ACTION")

    def ledger_action(name: str, help_text: str, handler) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, help=help_text)
        add_home_argument(sub)
        sub.add_argument("--rpc", default=DEFAULT_RPC, help=f"validator JSON-RPC URL (default {DEFAULT_RPC})")
        sub.add_argument("--json", action="store_true", help="print JSON")
        sub.set_defaults(handler=handler)
        return sub

    submit = ledger_action("submit", "submit a training task (price held in escrow)", _run_submit)
    submit.add_argument("--key", type=Path, help="key file to sign with instead of <home>/node_key.json")
    add_unlock_argument(submit)
    add_spec_arguments(submit)
    submit.add_argument("--eval", metavar="PATH", help="held-out data file (.safetensors, .npz, .txt) to evaluate on")
    submit.add_argument("--eval-every", type=int, metavar="STEPS",
                        help="steps between held-out evaluations shown as progress (default with --eval: steps/5)")
    submit.add_argument("--loss", help="loss: cross_entropy, mse or next_token_cross_entropy (default: the dataset's)")
    submit.add_argument("--optimizer", choices=("adamw", "sgd"), help="optimizer (default adamw)")
    submit.add_argument("--weight-decay", type=float, help="optimizer weight decay")
    submit.add_argument("--device", choices=("cpu", "cuda", "any"), help="where workers train (default cpu)")
    submit.add_argument("--profile", metavar="ID",
                        help="execution profile the workers and verifiers must run (default: the portable CPU "
                             "profile for cpu; for cuda/any the one the most compute nodes on the ledger run, "
                             "named before payment; docs/adr/0166)")
    submit.add_argument("--init", choices=("archive", "seed"),
                        help="initial weights: the .pt2 archive's (fine-tuning) or drawn from --seed")
    submit.add_argument("--tokenizer", choices=("byte", "char"),
                        help="a .txt dataset's tokens: its bytes (vocabulary 256, the default) or its characters "
                             "(vocabulary: the training text's distinct characters, sorted)")
    submit.add_argument("--price", type=int, required=True, help="tokens paid for the task (escrowed)")
    submit.add_argument("--fee", type=int, default=DEFAULT_FEE, help=f"transaction fee (default {DEFAULT_FEE})")
    submit.add_argument("--wait", action="store_true",
                        help="follow the task live until it ends; print payouts (and serve its files meanwhile)")
    submit.add_argument("--out", type=Path, metavar="DIR", help="with --wait: fetch the trained weights into DIR")
    submit.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits (default 600)")
    submit.add_argument("--skip-dry-run", action="store_true", help="do not run one step locally before paying")
    submit.add_argument("--expected-s", type=_positive_seconds, metavar="S",
                        help="the job's expected duration in seconds (default: steps x the dry run's step time); "
                             "the ledger's commit deadline is derived from it (docs/adr/0187)")
    submit.add_argument("--epochs", type=int, metavar="N",
                        help="cut the task into N epochs, each committed, audited and paid on its own (must divide "
                             "its segments; default: epochs of at least 3 minutes of the expected work, docs/adr/0203)")
    submit.add_argument("--max-workers", type=int, metavar="N",
                        help="let the crew grow to N workers: free compute nodes join at epoch boundaries; the price "
                             "pays N seats, and what seats nobody takes is refunded (docs/adr/0234)")
    add_p2p_arguments(submit)
    watch = ledger_action("watch", "follow a task live (progress from its workers) until it ends", _run_watch)
    watch.add_argument("task_id", help="task id (hex)")
    watch.add_argument("--timeout", type=float, default=600.0, help="seconds to wait (default 600)")
    add_follow_arguments(watch)
    wait = ledger_action("wait", "follow a task until it ends; print payouts (same as watch)", _run_watch)
    wait.add_argument("task_id", help="task id (hex)")
    wait.add_argument("--timeout", type=float, default=600.0, help="seconds to wait (default 600)")
    add_follow_arguments(wait)
    fetch = ledger_action("fetch", "download a task's trained weights, checked against the ledger", _run_fetch)
    fetch.add_argument("task_id", help="task id (hex)")
    fetch.add_argument("--out", type=Path, required=True, metavar="DIR",
                       help="writes DIR/weights.safetensors and DIR/metrics.json")
    fetch.add_argument("--epoch", type=int, metavar="N",
                       help="the weights of epoch N's state (a task cut into epochs: any closed epoch)")
    add_follow_arguments(fetch)
    cancel = ledger_action("cancel", "cancel a task not assigned yet (the escrow comes back)", _run_cancel)
    cancel.add_argument("task_id", help="task id (hex)")
    cancel.add_argument("--key", type=Path, help="key file to sign with instead of <home>/node_key.json")
    add_unlock_argument(cancel)
    cancel.add_argument("--fee", type=int, default=DEFAULT_FEE, help=f"transaction fee (default {DEFAULT_FEE})")
    stop = ledger_action("stop", "end a running task at its next epoch boundary (the closed epochs are paid, "
                                 "the rest refunded; fetch then gets their weights)", _run_stop)
    stop.add_argument("task_id", help="task id (hex)")
    stop.add_argument("--key", type=Path, help="key file to sign with instead of <home>/node_key.json")
    add_unlock_argument(stop)
    stop.add_argument("--fee", type=int, default=DEFAULT_FEE, help=f"transaction fee (default {DEFAULT_FEE})")
    show = ledger_action("show", "show one task", run_show)
    show.add_argument("task_id", help="task id (hex)")
    listing = ledger_action("list", "list tasks, newest first", run_list)
    listing.add_argument("--status", help="only tasks in this status (created, assigned, running, ...)")
    listing.add_argument("--owner", help="only tasks submitted by this peer ID")
    listing.add_argument("--limit", type=int, default=20, help="most tasks to show (default 20)")

    run = actions.add_parser("run", help="train among local compute processes over the p2p stack, no ledger")
    add_spec_arguments(run)
    run.add_argument("--mode", default="butterfly", choices=("butterfly", "ring"), help="all-reduce algorithm")
    run.add_argument("--timeout", type=float, default=900.0, help="seconds before the job is abandoned")
    run.add_argument("--json", action="store_true", help="print one JSON summary at the end")
    run.set_defaults(handler=run_local)


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="mlp",
                        help="model: a torch.export archive (FILE.pt2), or mlp (digits-mlp) or transformer "
                             "(char-transformer) from the registry")
    parser.add_argument("--dataset", default="digits",
                        help="dataset: a file (.safetensors, .npz, .txt), or digits or shakespeare from the registry")
    parser.add_argument("--workers", type=int, default=3, help="workers wanted (default 3)")
    parser.add_argument("--codec", default="int8",
                        help="codec: fp32, fp16, int8, int4, powersgd<r> (all-reduce), topk (1%%) or sign "
                             "(all-gather with error feedback)")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps per worker (default 100)")
    parser.add_argument("--sync", default="allreduce", choices=tuple(SYNC_MODES),
                        help="allreduce (data-parallel), diloco or streaming (streaming DiLoCo: fragments synced "
                             "in turn, overlapped with the inner steps)")
    parser.add_argument("--inner-steps", type=int, help="DiLoCo: local steps per outer step")
    parser.add_argument("--segment-steps", type=int, help="data-parallel: steps per committed segment")
    parser.add_argument("--batch-size", "--batch", dest="batch_size", type=int, help="per-worker batch size")
    parser.add_argument("--lr", type=float, help="peak learning rate")
    parser.add_argument("--seed", type=int, help="seed of weights and data order")


def add_follow_arguments(parser: argparse.ArgumentParser) -> None:
    """What ``watch``/``wait``/``fetch`` take besides the task: the client node's p2p options and the
    account key its identity derives from."""
    add_p2p_arguments(parser)
    parser.add_argument("--key", type=Path,
                        help="your account's key file: the client node then uses an identity derived from it, "
                             "which relays admit (to reach workers behind NAT)")
    add_unlock_argument(parser)


def add_p2p_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", action="append", metavar="MULTIADDR",
                        help="peer the client node dials at start (repeatable)")
    parser.add_argument("--relay", action="append", metavar="MULTIADDR",
                        help="relay the client node reserves a slot on, to be reachable behind NAT (repeatable)")
    parser.add_argument("--client-key", type=Path, metavar="FILE",
                        help="identity of the command's client node (default: one derived from the signing key, "
                             "topped up to a small balance so relays admit it; a fresh one without a key)")


def spec_from_args(args: argparse.Namespace) -> TrainSpec:
    """The registry-only spec of ``task run`` (no files, no ledger)."""
    if not 1 <= args.workers <= 64:
        raise CliError("--workers must be in 1..64")
    values = {"model": model_name(args.model), "dataset": args.dataset, "codec": args.codec, "steps": args.steps,
              "mode": SYNC_MODES[args.sync]}
    for name in ("inner_steps", "segment_steps", "batch_size", "lr", "seed"):
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    try:
        return TrainSpec(**values)
    except InvalidSpec as exc:
        raise CliError(f"bad task: {exc}") from None


def _positive_seconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of seconds: {text!r}") from None
    if not 1 <= value <= MAX_EXPECTED_S:
        raise argparse.ArgumentTypeError(f"must be in 1..{MAX_EXPECTED_S}")
    return value


def _rpc(url: str, method: str, *params):
    return rpc_call(url, method, *params)


def _run_submit(args: argparse.Namespace) -> int:
    from cli.task_submit import run_submit

    if args.out is not None and not args.wait:
        raise CliError("--out needs --wait (or fetch later with `dekube-node task fetch TASK_ID --out DIR`)")
    return run_submit(args)


def _run_watch(args: argparse.Namespace) -> int:
    from cli.task_watch import run_watch

    return run_watch(args)


def _run_fetch(args: argparse.Namespace) -> int:
    from cli.task_watch import run_fetch

    return run_fetch(args)


def _run_cancel(args: argparse.Namespace) -> int:
    from cli.task_watch import run_cancel

    identity = load_identity(args.key or key_path(resolve_home(args)), unlock_passphrase(args))
    return run_cancel(args, identity)


def _run_stop(args: argparse.Namespace) -> int:
    from cli.task_watch import run_stop

    identity = load_identity(args.key or key_path(resolve_home(args)), unlock_passphrase(args))
    return run_stop(args, identity)


def run_show(args: argparse.Namespace) -> int:
    doc = _rpc(args.rpc, "dkb_getTask", args.task_id)
    if doc is None:
        raise CliError(unknown_task_message(args.task_id))
    if args.json:
        print(json.dumps(doc))
        return 0
    task = decode_task(doc)
    for name in SHOWN_FIELDS:
        value = doc.get(name)
        if name not in doc or name == "reason" and not value:   # fields an older validator does not show
            continue
        echo(f"{name + ':':12}{json.dumps(value) if isinstance(value, (dict, list)) else value}")
    for line in deadline_lines(task) + epoch_lines(task) + slot_lines(task) + relay_lines(task):
        echo(line)
    if task.payouts:
        print("payouts by kind:")
        for line in payout_lines(task):
            echo(line)
    return 0


def run_list(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= 1000:
        raise CliError("--limit must be in 1..1000")
    docs = _rpc(args.rpc, "dkb_listTasks", args.status, args.owner, args.limit)
    if args.json:
        print(json.dumps(docs))
        return 0
    if not docs:
        print("no tasks")
    for task in map(decode_task, docs):
        spec = task.spec
        reason = f"  ({task.reason})" if task.reason and task.status in FAILED else ""
        echo(f"{task.task_id}  {task.status:9}  {spec.get('model')}/{spec.get('dataset')} {spec.get('codec')} "
             f"x{spec.get('workers')}  price {task.price}{reason}")
    return 0


def run_local(args: argparse.Namespace) -> int:
    require_compute("dekube-node task run")
    from ml.compute.local_job import JobFailed, run_local_job  # imports torch

    spec = spec_from_args(args)

    def show(event: dict) -> None:
        if not args.json and event.get("event") == "progress":
            print(f"  worker {event['rank']}  step {event['step']:5}  loss {event['loss']:.4f}  "
                  f"sent {event['bytes_sent'] / 1e6:8.3f} MB", flush=True)
        elif not args.json and event.get("event") == "departed":
            print(f"  worker {event.get('rank')} left the job after step {event.get('last_step')}: "
                  f"{event.get('reason')}", flush=True)

    started = time.monotonic()
    try:
        results = asyncio.run(run_local_job(spec, args.workers, mode=args.mode, timeout=args.timeout,
                                            on_event=show))
    except JobFailed as exc:
        raise CliError(str(exc)) from None
    summary = {"workers": args.workers, "spec": spec.to_dict(), "seconds": round(time.monotonic() - started, 2),
               "params_hashes": sorted({r["params_hash"] for r in results}),
               "metrics": results[0]["metrics"], "bytes_sent": [r["bytes_sent"] for r in results],
               "peer_ids": [r["peer"] for r in results],
               "departures": results[0].get("departures", [])}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"trained {spec.steps} steps with {args.workers} workers in {summary['seconds']} s: "
              f"{summary['metrics']}; every worker ends with params {summary['params_hashes'][0][:16]}.."
              if len(summary["params_hashes"]) == 1 else f"workers disagree: {summary['params_hashes']}")
        for gone in summary["departures"]:
            echo(f"  {gone['peer'][:16]}.. departed in round {gone['round']} (step {gone['step']}): {gone['reason']}")
    return 0 if len(summary["params_hashes"]) == 1 else 1
