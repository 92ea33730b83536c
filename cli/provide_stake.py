"""The stake ``dekube-node provide`` proposes (docs/adr/0198): enough to be drawn for the network's
largest recent task, not only the chain's floor. A worker needs bonded stake covering its pay
(``stake_cover_bps``, ADR 0188: 10x the pay at the defaults), so a node bonded at ``min_worker_stake``
is never drawn for a task paying more than a tenth of it. Pure functions of ``dkb_getParams`` and
``dkb_listTasks`` answers."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from consensus.genesis import Params
from consensus.state.tasks import stake_for_pay, worker_share
from consensus.task_info import TaskDocError, TaskInfo


@dataclass(frozen=True)
class StakePlan:
    stake: int          # what to keep bonded
    floor: int          # the chain's least stake of a worker or verifier
    typical_pay: int    # median pay per worker of the recent tasks (0: none seen)
    max_pay: int        # the largest of them

    def covers(self, params: Params) -> int | None:
        """The largest pay per worker this stake may be drawn for (None: no limit from pay)."""
        m, sigma, cover = params.audits_per_worker, params.slash_mismatch_bps, params.stake_cover_bps
        if not (m and sigma and cover):
            return None
        return self.stake * m * sigma // cover


def params_from(answer: dict) -> Params:
    """``dkb_getParams``'s answer as Params (fields it lacks keep their defaults)."""
    return Params(**{f.name: int(answer[f.name]) for f in fields(Params) if f.name in answer})


def recent_pays(params: Params, docs: list[Any]) -> list[int]:
    """What each worker of each listed task (``dkb_listTasks`` entries; a malformed one is skipped) is (or
    was) paid."""
    pays = []
    for doc in docs:
        try:
            task = TaskInfo.from_json(doc)
        except TaskDocError:
            continue
        workers = task.spec_field("max_workers", task.spec_field("workers"))   # the seats its price pays
        if isinstance(workers, int) and workers > 0 and task.price > 0:
            pays.append(worker_share(params, task.price, workers))
    return sorted(pays)


def propose(params: Params, tasks: list[Any], configured: int | None, asked: int | None) -> StakePlan:
    """``asked`` (``--stake``) if given, else the largest of the chain's floor, the home's configured
    stake and the stake the largest recent task asks of its workers."""
    floor = max(params.min_worker_stake, params.min_verifier_stake)
    pays = recent_pays(params, tasks)
    typical = pays[len(pays) // 2] if pays else 0
    largest = pays[-1] if pays else 0
    stake = asked if asked is not None else max(floor, configured or 0, stake_for_pay(params, largest))
    return StakePlan(stake=stake, floor=floor, typical_pay=typical, max_pay=largest)


def describe(plan: StakePlan, params: Params, seen: int) -> str:
    """One sentence: what the stake allows against the tasks seen."""
    covered = plan.covers(params)
    if covered is None:
        allows = "tasks of any pay"
    else:
        times = params.stake_cover_bps / (params.audits_per_worker * params.slash_mismatch_bps)
        allows = f"tasks paying up to {covered} per worker (a worker's stake must cover {times:g}x its pay)"
    if not seen:
        market = "no recent task on the network to compare with"
    else:
        takes = "all of them" if covered is None or covered >= plan.max_pay else (
            "the typical one but not the largest" if covered >= plan.typical_pay else "not even the typical one")
        market = (f"the last {seen} task(s) pay {plan.typical_pay} per worker typically, {plan.max_pay} at most: "
                  f"this stake takes {takes}")
    return f"a stake of {plan.stake} (the chain's floor is {plan.floor}) is drawn for {allows}; {market}"
