"""The workers' participation log: rounds that lacked a worker are recorded (a verifier replays those
departures); full rounds are not."""
import asyncio

import torch

from ml.job.participation import ParticipationLog
from ml.train.averaging import Averaged


class ScriptedAverager:
    def __init__(self, participants_by_round):
        self.participants_by_round = participants_by_round
        self.state = {"residual": 1}

    async def average(self, tensors, round_id):
        return Averaged(tensors, tuple(self.participants_by_round[round_id]), 10)

    def state_dict(self):
        return self.state


def test_short_rounds_are_recorded_and_the_wrapped_averager_stays_reachable():
    inner = ScriptedAverager({0: ["a", "b", "c"], 1: ["a", "c"], 2: ["a", "b", "c"], 3: ["a"]})
    log = ParticipationLog(inner, workers=3)

    async def rounds():
        return [await log.average([torch.ones(2)], r) for r in range(4)]

    results = asyncio.run(rounds())
    assert [len(r.participants) for r in results] == [3, 2, 3, 1]
    assert log.short_rounds == [(1, ["a", "c"]), (2, ["a", "b", "c"]), (3, ["a"])]   # b was back in round 2
    assert log.state_dict() == {"residual": 1}
