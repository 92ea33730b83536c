"""The perturbation manifest: a TOML file read into a ``Manifest`` (errors name the bad field).

    seed = 1                 # default seed; --seed overrides it
    perturbations = 1000     # how many to run
    min_each = 0             # the first min_each * kinds perturbations cover every kind that many times
    recover_timeout = 60     # seconds a victim has to recover before it counts as a violation
    checkpoint_every = 50    # drain the load and check balances and account nonces every N perturbations
    quiet = [0.5, 1.5]       # seconds of undisturbed load between perturbations

    [network]
    mode = "auto"            # netns (a namespace per node), loopback (127.0.0.1), auto: netns when possible
    validators = 4
    relays = 1
    compute = 0
    disk_mib = 128           # size of the tmpfs data dir of the nodes in disk_nodes
    disk_nodes = ["v3"]

    [load]
    accounts = 40
    rate = 8                 # wallet transfers per second

    [perturb.kill]           # one table per kind; weight 0 (or no table) disables it
    weight = 3
    duration = [0.0, 1.0]    # seconds the node stays down/paused/cut/full, drawn uniformly
    targets = ["validator", "relay", "compute"]
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("kill", "pause", "restart", "disconnect", "disk_full",   # then the attacks (devtools/perturb/attacks.py)
         "handshake_flood", "websocket_flood", "artifact_squat", "pt2_bomb")
ROLES = ("validator", "relay", "compute")
MODES = ("auto", "netns", "loopback")


class ManifestError(ValueError):
    """The manifest is missing, malformed or inconsistent; the message names the field."""


@dataclass(frozen=True)
class Perturbation:
    kind: str
    weight: float
    duration: tuple[float, float]
    targets: tuple[str, ...]


@dataclass(frozen=True)
class Manifest:
    name: str
    seed: int = 1
    perturbations: int = 10
    min_each: int = 0
    recover_timeout: float = 60.0
    checkpoint_every: int = 50
    quiet: tuple[float, float] = (0.5, 1.5)
    mode: str = "auto"
    validators: int = 4
    relays: int = 0
    compute: int = 0
    disk_mib: int = 128
    disk_nodes: tuple[str, ...] = ()
    accounts: int = 40
    rate: float = 8.0
    kinds: dict[str, Perturbation] = field(default_factory=dict)

    @property
    def fault_budget(self) -> int:
        """Validators that may be faulty at once under BFT: f < n/3."""
        return (self.validators - 1) // 3


def _pair(value: Any, where: str) -> tuple[float, float]:
    if (not isinstance(value, list) or len(value) != 2
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)):
        raise ManifestError(f"{where}: expected [low, high] seconds")
    low, high = float(value[0]), float(value[1])
    if not 0 <= low <= high:
        raise ManifestError(f"{where}: need 0 <= low <= high, got {value}")
    return low, high


def _number(table: dict, key: str, default: Any, kind: type, where: str, low: float = 0) -> Any:
    value = table.pop(key, default)
    ok = isinstance(value, int | float) if kind is float else isinstance(value, kind)
    if not ok or isinstance(value, bool) or value < low:
        raise ManifestError(f"{where}{key}: expected a {kind.__name__} >= {low}, got {value!r}")
    return kind(value)


def _no_extra(table: dict, where: str) -> None:
    if table:
        raise ManifestError(f"{where}: unknown key(s) {', '.join(sorted(table))}")


def parse_manifest(text: str, name: str = "manifest") -> Manifest:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"{name}: not TOML: {exc}") from None
    network = dict(doc.pop("network", {}))
    load = dict(doc.pop("load", {}))
    perturb = dict(doc.pop("perturb", {}))
    top = {
        "seed": _number(doc, "seed", 1, int, ""),
        "perturbations": _number(doc, "perturbations", 10, int, ""),
        "min_each": _number(doc, "min_each", 0, int, ""),
        "recover_timeout": _number(doc, "recover_timeout", 60.0, float, "", 1),
        "checkpoint_every": _number(doc, "checkpoint_every", 50, int, "", 1),
        "quiet": _pair(doc.pop("quiet", [0.5, 1.5]), "quiet"),
    }
    _no_extra(doc, name)
    mode = network.pop("mode", "auto")
    if mode not in MODES:
        raise ManifestError(f"network.mode: one of {', '.join(MODES)}, got {mode!r}")
    validators = _number(network, "validators", 4, int, "network.", 1)
    disk_nodes = network.pop("disk_nodes", [])
    if not isinstance(disk_nodes, list) or not all(
            isinstance(n, str) and n.startswith("v") and n[1:].isdigit() and int(n[1:]) < validators
            for n in disk_nodes):
        raise ManifestError(f"network.disk_nodes: validator names v0..v{validators - 1}, got {disk_nodes!r}")
    net = {"mode": mode, "validators": validators,
           "relays": _number(network, "relays", 0, int, "network."),
           "compute": _number(network, "compute", 0, int, "network."),
           "disk_mib": _number(network, "disk_mib", 128, int, "network.", 16),
           "disk_nodes": tuple(disk_nodes)}
    _no_extra(network, "network")
    wallets = {"accounts": _number(load, "accounts", 40, int, "load.", 1),
               "rate": _number(load, "rate", 8.0, float, "load.")}
    _no_extra(load, "load")
    kinds = {}
    for kind, table in perturb.items():
        if kind not in KINDS:
            raise ManifestError(f"perturb.{kind}: unknown kind (kinds: {', '.join(KINDS)})")
        table = dict(table)
        where = f"perturb.{kind}."
        weight = _number(table, "weight", 1.0, float, where)
        duration = _pair(table.pop("duration", [0.5, 2.0]), where + "duration")
        default_targets = ["validator"] if kind == "disk_full" else list(ROLES)
        targets = table.pop("targets", default_targets)
        if not isinstance(targets, list) or not targets or any(t not in ROLES for t in targets):
            raise ManifestError(f"{where}targets: a non-empty list of {', '.join(ROLES)}")
        if kind == "disk_full" and targets != ["validator"]:
            raise ManifestError(f"{where}targets: disk_full applies to validators in network.disk_nodes only")
        _no_extra(table, f"perturb.{kind}")
        if weight > 0:
            kinds[kind] = Perturbation(kind, weight, duration, tuple(targets))
    if not kinds:
        raise ManifestError(f"{name}: no perturbation kind with a weight > 0")
    if "disk_full" in kinds and not net["disk_nodes"]:
        raise ManifestError("perturb.disk_full needs network.disk_nodes (validators with a small data disk)")
    return Manifest(name, **top, **net, **wallets, kinds=kinds)


def load_manifest(path: Path | str) -> Manifest:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ManifestError(f"cannot read manifest {path}: {exc.strerror}") from None
    return parse_manifest(text, path.stem)
