"""Verification against adversaries (issue 11, docs/adr/0168-0169, 0175): tasks with honest workers and
one adversary each -- lazy, partial cheater at q, poisoners, copycat, false accuser, rubber stamp --
played through the real ledger, real training with per-segment records and the node's own duty and
judging code (devtools/verification_lab.py: one process, the network replaced by in-memory lookups,
so >= 50 runs fit in minutes). `--devnet` adds runs on a devnet of real `dekube-node` processes
(devtools/verification_devnet.py), including an honest verifier started with another kernel capability.

Prints one JSON object: per adversary runs, caught, slashed, false slashes of honest parties, the
expected catch rate where there is one, and the audit compute as a fraction of the job's compute
(CPU seconds, and replayed worker-steps over trained worker-steps).

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
from devtools.verification_lab import LAB_PARAMS, RunResult, Scenario, lab_spec, run_task  # noqa: E402

BIG = 20_000   # bonded stake of an adversarial verifier: drawn for most slots, so nearly every run tests it


def scenarios(partial: tuple[float, ...]) -> list[Scenario]:
    out = [Scenario("honest"), Scenario("lazy", {1: "lazy"}), Scenario("poison_zero", {0: "poison_zero"}),
           Scenario("poison_noise", {2: "poison_noise"}), Scenario("poison_stealth", {1: "poison_stealth"}),
           Scenario("copycat", {1: "copycat"})]
    out += [Scenario(f"partial_q{q:g}", {1: f"partial:{q:g}"}) for q in partial]
    out += [Scenario("false_accuser", verifier_faults={0: "false_accuser"}, verifier_stakes={0: BIG}),
            Scenario("rubber_stamp", verifier_faults={0: "rubber_stamp"}, verifier_stakes={0: BIG})]
    return out


def summarize(name: str, results: list[RunResult], params: Params) -> dict:
    adversary_is_worker = not name.startswith(("false_accuser", "rubber_stamp"))
    caught = 0
    for r in results:
        if adversary_is_worker:
            caught += bool(r.adversaries) and set(r.adversaries) <= set(r.guilty)
        else:
            caught += bool(r.adversaries) and set(r.adversaries) <= set(r.slashed)
    doc = {"runs": len(results), "caught": caught,
           "slashed": sum(bool(r.adversaries) and set(r.adversaries) <= set(r.slashed) for r in results),
           "honest_slashed": sum(len(r.honest_slashed) for r in results),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs per adversary")
    parser.add_argument("--partial-runs", type=int, default=50, help="runs per partial cheater q")
    parser.add_argument("--partial", default="0.1,0.5", help="fractions q of faked segments")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--segment-steps", type=int, default=10)
    parser.add_argument("--only", default="", help="comma-separated scenario names")
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
    honest = [r for r in all_results if r.scenario == "honest"]
    out["honest_slashed"] = sum(len(r.honest_slashed) for r in all_results)
    base = honest or all_results
    out["audit_overhead"] = round(sum(r.audit_cpu_s for r in base) / sum(r.job_cpu_s for r in base), 4)
    out["audit_overhead_steps"] = round(sum(r.replayed_worker_steps for r in base)
                                        / sum(r.job_worker_steps for r in base), 4)
    if args.devnet:   # in a process of its own: this one's portable environment must not leak into the nodes
        done = subprocess.run([sys.executable, "-m", "devtools.verification_devnet"], env=ORIGINAL_ENV,
                              cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, check=True)
        out["devnet"] = json.loads(done.stdout.strip().splitlines()[-1])
        out["honest_slashed_cross_capability"] = out["devnet"].get("honest_slashed_cross_capability")
    out["seconds"] = round(time.time() - started, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
