"""Replays where a worker left the real run at some round: the survivors' hashes are reproducible
(independent of timing), equal the full run's before the departure and differ after it."""
import asyncio

import pytest

from devtools.job_replay import replay_job
from ml.job.participation import InconsistentRecord, departure_step, departures
from ml.train.spec import TrainSpec

SPEC = TrainSpec(codec="int8", steps=12, segment_steps=4, batch_size=16)
WORKERS = ["peer-a", "peer-b", "peer-c"]


def test_departures_from_short_round_records():
    assert departures([], WORKERS) == {}
    assert departures([(7, ["peer-a", "peer-b"]), (5, ["peer-a", "peer-b"])], WORKERS) == {"peer-c": 5}
    assert departures([(5, ["peer-a", "peer-b"]), (6, ["peer-a"])], WORKERS) == {"peer-c": 5, "peer-b": 6}
    # left out of round 5 and back in 6 (docs/adr/0242): not gone; b leaves for good at 8
    assert departures([(5, ["peer-a", "peer-b"]), (6, WORKERS), (8, ["peer-a", "peer-c"])], WORKERS) == {"peer-b": 8}
    assert departures([(5, ["peer-a", "peer-b"]), (6, ["peer-a", "peer-c"])], WORKERS) == {"peer-b": 6}
    for bad in ([(5, ["peer-a", "intruder"])], [("x", [])], [(1,)]):
        with pytest.raises(InconsistentRecord):
            departures(bad, WORKERS)


def test_replay_with_a_departure_is_reproducible_and_diverges_only_after_it():
    full = asyncio.run(replay_job(SPEC, WORKERS, last_segment=2))
    first = asyncio.run(replay_job(SPEC, WORKERS, last_segment=2, left={"peer-c": 6}))
    second = asyncio.run(replay_job(SPEC, WORKERS, last_segment=2, left={"peer-c": 6}))
    assert set(first) == {"peer-a", "peer-b"} and first == second
    assert first["peer-a"] == first["peer-b"]
    assert first["peer-a"][0] == full["peer-a"][0]          # steps 0..3: everyone took part
    assert first["peer-a"][1:] != full["peer-a"][1:]        # from round 6 on: the mean of two


def test_diloco_replay_with_a_departure_keeps_the_segments_before_the_first_short_average():
    spec = TrainSpec(mode="diloco", codec="int8", steps=30, inner_steps=10, batch_size=16)
    full = asyncio.run(replay_job(spec, WORKERS, last_segment=2))
    left = asyncio.run(replay_job(spec, WORKERS, last_segment=2, left={"peer-c": 1}))
    assert set(left) == {"peer-a", "peer-b"}
    for peer in left:
        # segment k is the pseudo-gradient of outer step k, taken before its average: round 1 lacked
        # peer-c, so only segment 2 (trained from that average) differs
        assert left[peer][:2] == full[peer][:2] and left[peer][2] != full[peer][2]
    assert departure_step(spec, 1) == 20    # the survivors had done two outer steps of 10 then
