"""Verification against adversaries (issue 11, docs/adr/0168-0169, 0175; issue 24, docs/adr/0208): tasks
with honest workers and one adversary each -- lazy, partial cheater at q, poisoners, copycat, false
accuser, rubber stamp, a withholder, two framing co-workers -- played through the real ledger, real
training with per-segment records and the node's own duty and judging code (devtools/verification_lab.py:
one process, the network replaced by in-memory lookups, so >= 50 runs fit in minutes); and the
adversaries of the ledger's rules -- a grinding proposer with a colluding verifier and referee,
unbonders, a profile-less task on a mixed crew, a copier verifier -- played on the real ledger
(devtools/trust_game.py). `--devnet` adds runs on a devnet of real `dekube-node` processes
(devtools/verification_devnet.py), including an honest verifier started with another kernel capability.

Prints one JSON object: per adversary runs, caught, honest_slashed (honest parties slashed, summed over
runs), cheater_paid (runs in which an adversary was paid for its work), and the audit compute as a
fraction of the job's compute at each `--overhead` size, measured (CPU seconds of the audit
replays over CPU seconds of the training, honest tasks), and in replayed worker-steps.

    python bench/verification.py --runs 10 --partial-runs 50
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import os  # noqa: E402
import subprocess  # noqa: E402

from ml.profiles import apply_portable_cpu_env  # noqa: E402

ORIGINAL_ENV = dict(os.environ)   # the devnet's nodes start from this: each applies its own profile
apply_portable_cpu_env()   # before torch loads: the profile compute nodes run (ADR 0166)

from consensus.genesis import Params  # noqa: E402
from devtools.trust_game import GAMES  # noqa: E402
from devtools.verification_lab import LAB_PARAMS, RunResult, Scenario, lab_spec, run_task  # noqa: E402

BIG = 20_000   # bonded stake of an adversarial verifier: drawn for most slots, so nearly every run tests it


def scenarios(partial: tuple[float, ...]) -> list[Scenario]:
    out = [Scenario("honest"), Scenario("lazy", {1: "lazy"}), Scenario("poison_zero", {0: "poison_zero"}),
           Scenario("poison_noise", {2: "poison_noise"}), Scenario("poison_stealth", {1: "poison_stealth"}),
           Scenario("copycat", {1: "copycat"}), Scenario("withholder", {1: "withhold"}),
           Scenario("framers", {0: "frame", 1: "frame"})]
    out += [Scenario(f"partial_q{q:g}", {1: f"partial:{q:g}"}) for q in partial]
    out += [Scenario("false_accuser", verifier_faults={0: "false_accuser"}, verifier_stakes={0: BIG}),
            Scenario("rubber_stamp", verifier_faults={0: "rubber_stamp"}, verifier_stakes={0: BIG})]
    return out


def summarize(name: str, results: list[RunResult], params: Params) -> dict:
    adversary_is_worker = not name.startswith(("false_accuser", "rubber_stamp"))
    caught = 0
    for r in results:
        if adversary_is_worker and name not in ("framers", "withholder"):
            caught += bool(r.adversaries) and set(r.adversaries) <= set(r.guilty)
        else:   # its cheat is against others: caught when slashed
            caught += bool(r.adversaries) and set(r.adversaries) <= set(r.slashed)
    doc: dict = {"runs": len(results), "caught": caught,
           "slashed": sum(bool(r.adversaries) and set(r.adversaries) <= set(r.slashed) for r in results),
           "honest_slashed": sum(len(r.honest_slashed) for r in results),
           "cheater_paid": sum(r.cheater_paid(adversary_is_worker) for r in results),
           "innocent_workers_unpaid": sum(_innocent_unpaid(r) for r in results)}
    if name.startswith("partial_q"):
        q, m = float(name[len("partial_q"):]), params.audits_per_worker
        doc["expected"] = round(1 - (1 - q) ** m, 4)
        doc["expected_given_faked"] = round(sum(1 - (1 - r.faked_fraction) ** m for r in results) / len(results), 4)
        doc["caught_rate"] = round(caught / len(results), 4)
    if not adversary_is_worker:
        doc["adversary_drawn"] = sum(r.drawn_adversary_verifier for r in results)
    return doc


def _innocent_unpaid(r: RunResult) -> int:
    return sum(1 for worker in r.workers if worker not in r.adversaries and not r.paid.get(worker))


def overhead(sizes: list[tuple[int, int]], runs: int, params: Params) -> dict:
    """Honest tasks at each (steps, segment_steps): the audit replays' CPU seconds over the training's,
    measured (time.process_time around each), and replayed worker-steps over trained worker-steps."""
    out = {}
    for steps, segment_steps in sizes:
        spec = lab_spec(steps, segment_steps)
        results = [run_task(Scenario("honest"), seed, spec, params) for seed in range(1, runs + 1)]
        out[f"{steps}:{segment_steps}"] = {
            "steps": steps, "segments": spec.segment_count, "runs": runs,
            "audit_cpu_s": round(sum(r.audit_cpu_s for r in results), 3),
            "train_cpu_s": round(sum(r.job_cpu_s for r in results), 3),
            "audit_overhead": round(sum(r.audit_cpu_s for r in results) / sum(r.job_cpu_s for r in results), 4),
            "audit_overhead_steps": round(sum(r.replayed_worker_steps for r in results)
                                          / sum(r.job_worker_steps for r in results), 4),
            "honest_slashed": sum(len(r.honest_slashed) for r in results)}
        print(f"overhead {steps}:{segment_steps}: {out[f'{steps}:{segment_steps}']}", file=sys.stderr, flush=True)
    return out


def games(names: list[str], runs: int) -> dict:
    """The ledger adversaries of devtools/trust_game.py, `runs` seeds each."""
    out = {}
    for name in names:
        outcomes = [GAMES[name](seed) for seed in range(1, runs + 1)]
        out[name] = {"runs": runs, "caught": sum(o.caught for o in outcomes),
                     "honest_slashed": sum(len(o.honest_slashed) for o in outcomes),
                     "cheater_paid": sum(o.cheater_paid for o in outcomes),
                     "engaged": sum(o.engaged for o in outcomes)}
        print(f"{name}: {out[name]}", file=sys.stderr, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs per adversary")
    parser.add_argument("--partial-runs", type=int, default=50, help="runs per partial cheater q")
    parser.add_argument("--partial", default="0.1,0.5", help="fractions q of faked segments")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--segment-steps", type=int, default=10)
    parser.add_argument("--only", default="", help="comma-separated scenario names")
    parser.add_argument("--overhead", default="120:3,600:10,120:10",
                        help="comma-separated steps:segment_steps sizes to measure the audit overhead at")
    parser.add_argument("--overhead-runs", type=int, default=3, help="honest tasks per overhead size")
    parser.add_argument("--devnet", action="store_true", help="also run each adversary once on a process devnet")
    args = parser.parse_args()
    spec = lab_spec(args.steps, args.segment_steps)
    params = Params(**LAB_PARAMS)
    partial = tuple(float(q) for q in args.partial.split(",") if q)
    wanted = {s for s in args.only.split(",") if s}
    out: dict = {"transport": "in-process lab (real ledger, training, replay; no network)",
                 "spec": {"model": spec.model, "steps": spec.steps, "segments": spec.segment_count,
                          "workers": 3, "codec": spec.codec},
                 "audits_per_worker": params.audits_per_worker, "audit_double_bps": params.audit_double_bps,
                 "adversaries": {}}
    all_results: list[RunResult] = []
    started = time.time()
    for scenario in scenarios(partial):
        if wanted and scenario.name not in wanted:
            continue
        runs = args.partial_runs if scenario.name.startswith("partial_q") else args.runs
        results = [run_task(scenario, seed, spec, params) for seed in range(1, runs + 1)]
        all_results += results
        out["adversaries"][scenario.name] = summarize(scenario.name, results, params)
        print(f"{scenario.name}: {out['adversaries'][scenario.name]}", file=sys.stderr, flush=True)
    out["adversaries"].update(games([n for n in GAMES if not wanted or n in wanted], args.runs))
    out["honest_slashed"] = sum(doc["honest_slashed"] for doc in out["adversaries"].values())
    out["cheater_paid"] = sum(doc["cheater_paid"] for doc in out["adversaries"].values())
    sizes = [tuple(int(x) for x in size.split(":")) for size in args.overhead.split(",") if size]
    out["audit_overhead"] = overhead(sizes, args.overhead_runs, params)   # type: ignore[arg-type]
    if args.devnet:   # in a process of its own: this one's portable environment must not leak into the nodes
        done = subprocess.run([sys.executable, "-m", "devtools.verification_devnet"], env=ORIGINAL_ENV,
                              cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, check=True)
        out["devnet"] = json.loads(done.stdout.strip().splitlines()[-1])
        out["honest_slashed_cross_capability"] = out["devnet"].get("honest_slashed_cross_capability")
    out["seconds"] = round(time.time() - started, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
