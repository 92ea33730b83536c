"""Spot checks of what a serving client's chain answered (ADR 0178, 0179): rerun a span's recorded
chunks locally or on another server and compare every recorded answer bit for bit.

`SpotChecker(generator)` reads a `RemoteGenerator`'s record (the spans, the chunks sent to each, the
answers and which server gave them, the servers' profiles and the billed streams) and returns a
`SpotCheck`: the first differing step, the culprit when it can be named, and its countersigned
receipt covering the wrong answer as evidence. `RemoteGenerator.spot_check` and
`spot_check_remote` are its entry points.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ml.serve.billing import spot_evidence
from ml.serve.model import ServeDecoder
from ml.serve.transcript import tensor_digest
from ml.serve.wire import roundtrip as wire_roundtrip

if TYPE_CHECKING:
    from ml.serve.client import RemoteGenerator, ServerInfo


@dataclass(frozen=True)
class SpotCheck:
    span: int
    blocks: tuple[int, int]
    ok: bool
    first_bad_step: int | None     # the first chunk whose answer differs
    culprit: str | None            # the server that gave it
    evidence: dict[str, Any] | None = None   # the culprit's countersigned receipt covering the wrong answer
    unchecked: tuple[str, ...] = ()   # servers in another profile than the checker's: not compared


class SpotChecker:
    def __init__(self, generator: RemoteGenerator):
        self._gen = generator

    def local(self, index: int, part: ServeDecoder, profile: str | None = None) -> SpotCheck:
        """Rerun span `index`'s recorded chunks through `part` (the client's own copy of those blocks,
        on its device) and compare every answer the servers gave, bit for bit after the wire codec: an
        honest server in the same profile matches exactly in every codec. With `profile` (the one
        `part` computes in), only the answers of servers in that profile are compared (the others are
        listed in `unchecked`); without it, every server is taken to be in the checker's profile."""
        start, end = self._gen.spans[index]
        foreign = self._foreign(index, profile)
        expected_answers = self.local_answers(index, part)
        for step, (expected, (peer_id, answer)) in enumerate(zip(expected_answers, self._gen.outputs[index])):
            if answer is not None and peer_id not in foreign and not torch.equal(expected, answer):
                return SpotCheck(index, (start, end), False, step, peer_id, self._evidence(peer_id, answer), foreign)
        return SpotCheck(index, (start, end), True, None, None, unchecked=foreign)

    async def remote(self, index: int, referee: ServerInfo, third: ServerInfo | ServeDecoder | None = None,
                     same_profile: bool = False) -> SpotCheck:
        """Ask `referee` (another server with span `index`'s blocks, in the same profile) to replay the
        span's recorded chunks in a fresh session and compare each of its answers with the recorded
        ones, bit for bit. Two answers that differ do not say who lied: `third` does (ADR 0178), the
        client's own copy of the blocks (a local recompute) or a third server with them (another
        replay). At the first differing step, the one of the two it agrees with is honest and the
        other is the culprit, with evidence (its countersigned receipt covering the wrong answer: the
        original step's, or the referee's replay) to dispute. Without a third opinion, or when it
        agrees with neither, the check fails naming no culprit: there is nobody to dispute. With
        `same_profile`, only the answers of servers in the referee's profile are compared (ADR 0179)."""
        gen = self._gen
        start, end = gen.spans[index]
        for other in (referee, third):
            if other is not None and not isinstance(other, ServeDecoder) and (other.start, other.end) != (start, end):
                raise ValueError(f"span {index} is blocks {start}:{end}, {other.peer_id[:12]} holds "
                                 f"{other.start}:{other.end}")
        answers, referee_meter = await gen.replay_span(index, referee)
        foreign = self._foreign(index, gen.profiles.get(referee.peer_id, "") if same_profile else None)
        step = next((i for i, ((peer, recorded), replayed) in enumerate(zip(gen.outputs[index], answers))
                     if recorded is not None and peer not in foreign and not torch.equal(recorded, replayed)), None)
        if step is None:
            return SpotCheck(index, (start, end), True, None, None, unchecked=foreign)
        server, recorded = gen.outputs[index][step]
        assert recorded is not None
        if isinstance(third, ServeDecoder):
            opinion = (await asyncio.to_thread(self.local_answers, index, third))[step]
        elif third is not None:
            opinion = (await gen.replay_span(index, third))[0][step]
        else:
            return SpotCheck(index, (start, end), False, step, None, unchecked=foreign)
        if torch.equal(opinion, answers[step]):       # the referee was right: the span's server lied
            return SpotCheck(index, (start, end), False, step, server, self._evidence(server, recorded), foreign)
        if torch.equal(opinion, recorded):            # the span's server was right: the referee lied
            evidence = spot_evidence(referee_meter, 0) if referee_meter is not None else None
            return SpotCheck(index, (start, end), False, step, referee.peer_id, evidence, foreign)
        return SpotCheck(index, (start, end), False, step, None, unchecked=foreign)

    def local_answers(self, index: int, part: ServeDecoder) -> list[torch.Tensor]:
        """`part`'s answers to span `index`'s recorded chunks, after the wire codec, on the CPU
        (blocking: torch)."""
        gen = self._gen
        start, end = gen.spans[index]
        if (part.start, part.end) != (start, end):
            raise ValueError(f"span {index} is blocks {start}:{end}, the part holds {part.start}:{part.end}")
        caches = part.new_caches(1, gen.max_length)
        deep, lora = gen.tuned.for_span(start, end)
        if deep is not None:
            deep = wire_roundtrip(deep, gen.codec).to(part.device)
        if lora is not None:
            lora = (wire_roundtrip(lora[0], gen.codec).to(part.device),
                    wire_roundtrip(lora[1], gen.codec).to(part.device))
        answers = []
        with torch.no_grad():
            for step, chunk in enumerate(gen.history[index]):
                received = wire_roundtrip(chunk, gen.codec).to(part.device)      # what the server decoded
                out = part.run_blocks(received, caches, prompts=deep if step == 0 else None, lora=lora)
                answers.append(wire_roundtrip(out.cpu(), gen.codec))
        return answers

    def _foreign(self, index: int, profile: str | None) -> tuple[str, ...]:
        """The servers that answered span `index` in another profile than `profile` (None: all alike)."""
        if profile is None:
            return ()
        return tuple(sorted({peer for peer, answer in self._gen.outputs[index]
                             if answer is not None and self._gen.profiles.get(peer, "") != profile}))

    def _evidence(self, peer_id: str, answer: torch.Tensor) -> dict[str, Any] | None:
        """The culprit's countersigned receipt covering `answer`, if it signed one."""
        digest = tensor_digest(answer)
        for meter in self._gen.meters:
            if meter.offer is None or meter.offer["server"] != peer_id:
                continue
            for index, step in enumerate(meter.steps):
                if step.answer == digest:
                    return spot_evidence(meter, index)
        return None
