"""The soak loop: start the manifest's network and wallet load, then one perturbation at a time (so
never more than the fault budget of validators is down), each followed by the victim's recovery
and the invariant checks (an attack also reports what its own watch saw while it ran: the chain
committing, the victim's /health, honest newcomers served); every ``checkpoint_every`` perturbations
the load is drained and balances and nonces are checked; at the end the full ``devtools.chaincheck``
scan. Returns the summary.
"""
from __future__ import annotations

import random
import sys
import threading
import time
from collections import Counter

from devtools.chaincheck import check_chain
from devtools.loadgen import WalletLoad
from devtools.perturb.attacks import ATTACKS, run_attack
from devtools.perturb.faults import FAULTS
from devtools.perturb.invariants import ChainWatcher
from devtools.perturb.manifest import KINDS, Manifest
from devtools.perturb.network import Member, PerturbNet
from node.ledger import jsonrpc
from node.ledger.errors import LedgerUnavailable, RpcAnswerError


def log(msg: str) -> None:
    print(f"[perturb {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def plan(manifest: Manifest, kinds: list[str], rng: random.Random) -> list[str]:
    """The kinds to run in order: ``min_each`` of every kind first (shuffled), then weighted draws."""
    first = [k for k in kinds for _ in range(manifest.min_each)][:manifest.perturbations]
    rng.shuffle(first)
    weights = [manifest.kinds[k].weight for k in kinds]
    return first + rng.choices(kinds, weights, k=manifest.perturbations - len(first))


class Soak:
    def __init__(self, manifest: Manifest, net: PerturbNet, accounts, seed: int, skipped: dict[str, str]):
        self.manifest = manifest
        self.net = net
        self.rng = random.Random(seed)
        self.skipped = skipped
        urls = [m.spec.rpc_url for m in net.validators]
        self.load = WalletLoad(urls, net.testnet.chain_id, accounts, [a.peer_id for a in accounts],
                               rate=manifest.rate, seed=seed)
        self.watcher = ChainWatcher(urls, net.testnet.genesis())
        self.by_kind: Counter = Counter()
        self.notes: Counter = Counter()
        self.violations: list[str] = []
        self.recovery: list[float] = []
        self._stop_load: threading.Event | None = None
        self._loader: threading.Thread | None = None

    # ---------------------------------------------------------------- load
    def start_load(self) -> None:
        self._stop_load = threading.Event()
        self._loader = threading.Thread(target=self.load.run, args=(self._stop_load,), daemon=True)
        self._loader.start()

    def stop_load(self) -> bool:
        """Stop generating, wait for every in-flight transaction's receipt; False if some never came."""
        assert self._stop_load is not None and self._loader is not None, "start_load first"
        self._stop_load.set()
        self._loader.join(30)
        return self.load.drain(90)

    # ---------------------------------------------------------------- recovery
    def top_of_others(self, victim: Member) -> int:
        return max((self.net.height(m) or 0) for m in self.net.validators if m is not victim)

    def recover(self, victim: Member, kind: str, end_height: int) -> str | None:
        """Wait until ``victim`` serves again; a violation text if not. A validator must reach the
        height the others reach after ``end_height`` (their height when the fault ended), so a
        process that is dying but still answers with its old height never passes."""
        timeout = self.manifest.recover_timeout
        deadline = time.monotonic() + timeout
        target: int | None = None   # the others' height once they passed end_height
        restarted = False
        while time.monotonic() < deadline:
            if victim.role == "validator":
                if target is None:
                    top = self.top_of_others(victim)
                    target = top if top > end_height else None
                if target is not None:
                    height = self.net.height(victim)
                    if height is not None and height >= target:
                        return None
            elif self.net.healthy(victim):
                return None
            if not self.net.running(victim):
                if kind == "disk_full" and not restarted:   # may notice the full disk only now
                    code = self.net.exit_code(victim)
                    self.notes[f"disk_full: exited with status {code} after the disk was freed"] += 1
                    self.net.start(victim)
                    restarted = True
                    continue
                code = self.net.exit_code(victim)
                return f"{victim.name} exited (status {code}) after {kind}; see {victim.spec.log_file}"
            time.sleep(0.2)
        self.net.dump_stacks(victim, "no-recovery")
        where = f"at height {self.net.height(victim)}, target {target}" if victim.role == "validator" else "not healthy"
        return f"{victim.name} did not recover within {timeout:g} s after {kind} ({where}); see {victim.spec.log_file}"

    def participates(self, victim: Member, seconds: float = 15.0) -> bool:
        """Wait until ``victim``'s vote is in a commit certificate of a block above its current
        height, so the next fault does not stack on a validator that caught up but is not voting yet."""
        start = self.net.height(victim) or 0
        url = self.net.validators[0].spec.rpc_url if victim is not self.net.validators[0] else \
            self.net.validators[1].spec.rpc_url
        deadline = time.monotonic() + seconds
        checked = start
        while time.monotonic() < deadline:
            try:
                top = jsonrpc.call(url, "dkb_blockNumber", timeout=5)
                for height in range(checked + 1, top + 1):
                    block = jsonrpc.call(url, "dkb_getBlockByNumber", height, False, timeout=5)
                    votes = (block or {}).get("commit", []) + (block or {}).get("last_commit", [])
                    if any(v.get("validator") == victim.spec.peer_id for v in votes):
                        return True
                checked = max(checked, top)
            except (LedgerUnavailable, RpcAnswerError):
                pass
            time.sleep(0.3)
        return False

    def live(self, before: int) -> str | None:
        """The chain must have made progress since ``before``."""
        deadline = time.monotonic() + self.manifest.recover_timeout
        while time.monotonic() < deadline:
            if max((self.net.height(m) or 0) for m in self.net.validators) > before:
                return None
            time.sleep(0.3)
        return f"no block committed after height {before} for {self.manifest.recover_timeout:g} s"

    def check(self) -> list[str]:
        try:
            return self.watcher.step(set(self.load.confirmed))
        except (LedgerUnavailable, RpcAnswerError) as exc:
            return [f"invariant check failed over RPC: {exc}"]

    def checkpoint(self) -> list[str]:
        """Drain the load, let every validator reach one height, check balances and nonces, resume."""
        if not self.stop_load():
            out = [f"{len(self.load.in_flight)} transactions never got a receipt"]
        else:
            out = []
        try:
            top = max(self.net.height(m) or 0 for m in self.net.validators)
            self.net.testnet.wait_height(top + 1, timeout=self.manifest.recover_timeout)
            out += self.watcher.step(set(self.load.confirmed))
            out += self.watcher.balances()
        except Exception as exc:  # noqa: BLE001 - any failure here is a finding, reported as such
            out.append(f"checkpoint failed: {exc}")
        out += [f"tx {h} failed: {status}" for h, status in self.load.failed.items()]
        self.load.failed.clear()
        self.start_load()
        return out

    # ---------------------------------------------------------------- main loop
    def run(self, keep_going: bool = False) -> dict:
        manifest = self.manifest
        kinds = [k for k in KINDS if k in manifest.kinds and k not in self.skipped]
        if not kinds:
            self.violations.append("every perturbation kind was skipped: " + str(self.skipped))
        schedule = plan(manifest, kinds, self.rng) if kinds else []
        started = time.monotonic()
        self.net.up(timeout=120)
        self.start_load()
        time.sleep(2)
        for index, kind in enumerate(schedule, 1):
            spec = manifest.kinds[kind]
            pool = [m for m in self.net.members if m.role in spec.targets and (kind != "disk_full" or m.disk)]
            victim = self.rng.choice(pool)
            seconds = self.rng.uniform(*spec.duration)
            before = max(self.net.height(m) or 0 for m in self.net.validators)
            t0 = time.monotonic()
            during: list[str] = []   # an attack's own invariant violations (the chain, /health, newcomers)
            try:
                if kind in ATTACKS:
                    note, during = None, run_attack(self.net, victim, seconds, ATTACKS[kind])
                else:
                    note = FAULTS[kind](self.net, victim, seconds)
            except Exception as exc:  # noqa: BLE001 - the perturbation itself failed: stop, it is a finding
                self.violations.append(f"{kind} of {victim.name} failed: {exc!r}")
                break
            self.by_kind[kind] += 1
            if note:
                self.notes[f"{kind}: {note}"] += 1
            end_height = self.top_of_others(victim)
            found = [f"{kind} of {victim.name}: {v}" for v in during]
            found += [v for v in (self.recover(victim, kind, end_height), self.live(before)) if v]
            if victim.role == "validator" and not found and not self.participates(victim):
                self.notes[f"{kind}: caught up but no vote in a certificate within 15 s"] += 1
            took = time.monotonic() - t0
            self.recovery.append(took - seconds)
            found += self.check()
            if index % manifest.checkpoint_every == 0 and index < len(schedule):
                found += self.checkpoint()
            self.violations += found
            log(f"{index}/{len(schedule)} {kind} {victim.name} {seconds:.1f}s -> back in {took - seconds:.1f}s"
                f"{' (' + note + ')' if note else ''}; height {self.watcher.checked}, "
                f"{len(self.load.confirmed)} confirmed{'; VIOLATIONS: ' + '; '.join(found) if found else ''}")
            if found and not keep_going:
                break
            time.sleep(self.rng.uniform(*manifest.quiet))
        return self.finish(started)

    def finish(self, started: float) -> dict:
        if not self.stop_load():
            self.violations.append(f"{len(self.load.in_flight)} transactions never got a receipt")
        self.violations += [f"tx {h} failed: {status}" for h, status in self.load.failed.items()]
        try:
            down = [m.name for m in self.net.members if not self.net.running(m)]
            if down:
                self.violations.append(f"not running at the end: {down}")
            top = max(self.net.height(m) or 0 for m in self.net.validators)
            self.net.testnet.wait_height(top + 1, timeout=self.manifest.recover_timeout)
            self.violations += self.watcher.step(set(self.load.confirmed))
            self.violations += self.watcher.balances()
            urls = [m.spec.rpc_url for m in self.net.validators]
            self.violations += check_chain(urls, self.net.testnet.genesis(), self.load.confirmed)
        except Exception as exc:  # noqa: BLE001
            self.violations.append(f"final check failed: {exc}")
        recovery = sorted(self.recovery)
        return {
            "perturbations": sum(self.by_kind.values()),
            "by_kind": dict(self.by_kind),
            "violations": self.violations[:50],
            "blocks": self.watcher.checked,
            "confirmed_txs": len(self.load.confirmed),
            "seconds": round(time.monotonic() - started, 1),
            "notes": dict(self.notes),
            "skipped": self.skipped,
            "recovery_s": {"median": round(recovery[len(recovery) // 2], 2), "max": round(recovery[-1], 2)}
            if recovery else {},
        }
