"""Who took part in which all-reduce round of a job: the record a worker keeps, and the departures
(worker -> first round it was missing from for good) that a job report and a replay derive from it.

A worker that crashes stops training for good, and the others go on over the survivors; a live worker
left out of one round (its link dropped for a moment) takes the others' result and is back in the next
(docs/adr/0242). Each worker records the rounds whose mean lacked someone and the first whole round
after them (`ParticipationLog`). `departures` turns such a record into {worker: round it left at} for
the workers that never came back; `departure_step` says how many optimizer steps the survivors had
done when they first averaged without it.
"""
from __future__ import annotations

from ml.train.averaging import Averaged, Averager
from ml.train.spec import TrainSpec


class InconsistentRecord(ValueError):
    """Reported round memberships that no real run produces (a participant that is not a worker)."""


class ParticipationLog:
    """An averager wrapper that records the rounds whose mean lacked some workers' contributions, and
    the first whole round after such rounds (the workers left out are back).

    The worker serves this record with its segment hashes, so a replay has the same workers leave at
    the same rounds and still gets the survivors' hashes bit for bit."""

    def __init__(self, inner: Averager, workers: int):
        self.inner = inner
        self.workers = workers
        self.short_rounds: list[tuple[int, list]] = []
        self._short = False

    async def average(self, tensors, round_id: int) -> Averaged:
        result = await self.inner.average(tensors, round_id)
        short = len(result.participants) != self.workers
        if short or self._short:
            self.short_rounds.append((round_id, list(result.participants)))
        self._short = short
        return result

    def __getattr__(self, name):  # state_dict/load_state_dict of the wrapped averager, if any
        return getattr(self.inner, name)


def departures(short_rounds: list, workers: list[str]) -> dict[str, int]:
    """{worker: first round it was missing from, never to come back} from [(round, participants), ...]
    records (a worker missing from some rounds and back in a later one was left out, not gone)."""
    left: dict[str, int] = {}
    try:
        for round_id, participants in sorted((int(r), list(p)) for r, p in short_rounds):
            if any(p not in workers for p in participants):
                raise InconsistentRecord(f"round {round_id} lists a participant that is not a worker")
            for worker in workers:
                if worker in participants:
                    left.pop(worker, None)
                else:
                    left.setdefault(worker, round_id)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, InconsistentRecord):
            raise
        raise InconsistentRecord(f"malformed round record: {exc}") from None
    return left


def departure_step(spec: TrainSpec, round_id: int) -> int:
    """Optimizer steps the survivors had done when round `round_id` averaged without the worker:
    data-parallel rounds are steps; a DiLoCo round follows its outer step's `inner_steps` steps; a
    streaming DiLoCo round is applied at its due step (ml.train.streaming_schedule)."""
    if spec.mode == "streaming-diloco":
        from ml.train.streaming_schedule import schedule
        rounds = schedule(spec)
        return rounds[round_id].due if 0 <= round_id < len(rounds) else spec.steps
    return (round_id + 1) * spec.inner_steps if spec.mode == "diloco" else round_id
