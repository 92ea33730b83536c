"""``python -m devtools.perturb --manifest devtools/perturb/manifests/ci.toml [--seed N] [--home DIR]``

Prints the seed first (to replay a run), progress on stderr, and as the last line of stdout one JSON
object: perturbations, by_kind, violations, blocks, confirmed_txs, seconds (plus notes, skipped
kinds with the reason, recovery times). Exit status 1 on any violation, 2 on a bad manifest.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from devtools.netlab.isolation import probe_isolation
from devtools.perturb.manifest import ManifestError, load_manifest
from devtools.perturb.network import PerturbNet
from devtools.perturb.runner import Soak, log
from node.identity import Identity


def resolve_mode(requested: str, why: dict[str, str | None]) -> tuple[str, bool, str | None]:
    """(network mode, loopback firewall usable, why disconnect is skipped or None)."""
    if requested in ("auto", "netns") and why["netns"] is None:
        return "netns", False, None
    if requested == "netns":
        raise ManifestError(f"network.mode netns: namespaces unavailable ({why['netns']})")
    if why["nft"] is None:
        return "loopback", True, None
    return "loopback", False, f"no namespaces ({why['netns']}) and no nftables ({why['nft']})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.perturb", description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", required=True, help="TOML manifest (devtools/perturb/manifests/)")
    parser.add_argument("--seed", type=int, help="overrides the manifest's seed")
    parser.add_argument("--perturbations", type=int, help="overrides the manifest's count")
    parser.add_argument("--home", help="network directory, kept afterwards (default: a temporary one)")
    parser.add_argument("--keep-going", action="store_true", help="go on after a violation")
    parser.add_argument("--log-level", default="warning", help="the nodes' log level")
    args = parser.parse_args(argv)
    try:
        manifest = load_manifest(args.manifest)
        if args.perturbations is not None:
            manifest = dataclasses.replace(manifest, perturbations=args.perturbations)
        seed = manifest.seed if args.seed is None else args.seed
        prefix = f"pk{os.getpid() % 0xFFFF:04x}"
        why = probe_isolation(prefix)
        mode, nft, no_disconnect = resolve_mode(manifest.mode, why)
    except ManifestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    skipped = {}
    if no_disconnect and "disconnect" in manifest.kinds:
        skipped["disconnect"] = no_disconnect
    if "disk_full" in manifest.kinds and os.geteuid() != 0:
        skipped["disk_full"] = "not root (a tmpfs data dir needs mount)"
        manifest = dataclasses.replace(manifest, disk_nodes=())
    print(f"seed {seed} (replay: python -m devtools.perturb --manifest {args.manifest} --seed {seed})", flush=True)
    log(f"manifest {manifest.name}: {manifest.perturbations} perturbations, network mode {mode}"
        f"{', disconnect via nftables' if nft else ''}; skipped: {skipped or 'none'}")
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    root = Path(args.home) if args.home else Path(tempfile.mkdtemp(prefix="dekube-perturb-"))
    accounts = [Identity.from_seed((9 * 10**6 + i).to_bytes(32, "big")) for i in range(manifest.accounts)]
    net = None
    try:
        net = PerturbNet.create(root, manifest, mode, prefix, nft, accounts, args.log_level)
        result = Soak(manifest, net, accounts, seed, skipped).run(keep_going=args.keep_going)
    except KeyboardInterrupt:
        result = {"perturbations": 0, "violations": ["interrupted"]}
    except Exception as exc:  # noqa: BLE001 - report any setup failure in the result line
        result = {"perturbations": 0, "violations": [f"network failed: {exc!r}"]}
    finally:
        if net is not None:
            net.close()
    if not args.home and not result["violations"]:
        shutil.rmtree(root, ignore_errors=True)
    else:
        log(f"network directory (node logs) kept at {root}")
    result = {"seed": seed, "manifest": manifest.name, "mode": mode, **result}
    print(json.dumps(result), flush=True)
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
