"""Wrong tuning passes slashed (ADR 0183): a server that lies in a backward (or forward) pass is named by
the tuner's spot check, disputed with a pass bundle, recomputed by two honest referees and slashed; an
honest pass recomputes to the signed answer and a forged pass bundle is refused."""
import asyncio
import dataclasses
import hashlib

import pytest
import torch

from ml.serve.billing import PassRecord, pass_evidence
from ml.serve.dispute import (
    BUNDLE_PROTOCOL,
    BundleStore,
    Claim,
    dispute_payload,
    file_dispute,
    make_bundle_handler,
    referee_duty,
    referee_verdict,
)
from ml.serve.pass_check import encode_pass_bundle
from ml.serve.transcript import ZERO
from ml.serve.tuner import RemoteTuner
from ml.serve.wire import encode_frame
from tests.serve.test_billing import PaidNetwork, payer
from tests.serve.test_generation import random_build
from tests.serve.test_serve_dispute import LIAR, RANGES, ChainGateway, filed, ident, ledger
from tests.serve.test_tune_transcript import LyingForwardServer, LyingTuneServer, tuning_batch


def claim_of(model: str, evidence: dict, bundle: bytes, start=3, end=6) -> Claim:
    payload = dispute_payload(evidence, bundle, "p", 200)
    return Claim(model, start, end, payload["prior"], payload["link"], payload["answer"], payload["inputs"])


@pytest.mark.parametrize("liar,wrong_pass,ids", [(LyingTuneServer, 5, None), (LyingForwardServer, 4, [0, 1])])
def test_a_server_lying_in_a_tuning_pass_is_disputed_refereed_and_slashed(liar, wrong_pass, ids):
    async def scenario():
        async with PaidNetwork(RANGES, server_classes={1: liar}) as net:
            tuner = RemoteTuner(net.client, random_build((0, 0), True), net.servers[:2], prompt_length=2,
                                lora_rank=2, codec="f16", payer=payer(), check_passes=frozenset(range(6)))
            for _ in range(3):
                await tuner.step(tuning_batch(), ids=ids)
            await tuner.close()
            await asyncio.sleep(0.05)
            check = tuner.spot_check(1, random_build((3, 6), False))
            assert (check.ok, check.wrong_pass, check.culprit) == (False, wrong_pass, LIAR.peer_id)
            evidence = check.evidence
            assert evidence is not None
            model = evidence["receipt"]["model"]
            store = BundleStore()
            net.client.set_handler(BUNDLE_PROTOCOL, make_bundle_handler(store))
            chain = ledger(model)
            chain.ok(LIAR, "serve_receipt", net.books[1].unclaimed()[0].payload())
            stake_before = chain.ledger.state.stakes[LIAR.peer_id].bonded
            filing = asyncio.create_task(file_dispute(ChainGateway(chain, ident(9)), net.client, store, evidence,
                                                      200, wait_s=60, poll_s=0.02))
            dispute, record = await filed(chain)
            for peer, _ in record.referees:
                index = next(i for i, host in enumerate(net.hosts) if host.peer_id == peer)
                assert await referee_duty(ChainGateway(chain, ident(index + 1)), net.hosts[index],
                                          random_build(RANGES[index], False)) == 1
            assert await filing == {"dispute": dispute.hex(), "status": "guilty"}
            votes = [vote for _, vote in record.referees]
            assert all(vote[0] and vote[1] != record.answer for vote in votes) and votes[0] == votes[1]
            assert chain.ledger.state.stakes[LIAR.peer_id].bonded == stake_before - stake_before * 2_000 // 10_000

            # an honest pass of the same stream recomputes to the answer the server signed, forward and backward
            meter = next(s.meter for s in tuner.streams if s.peer_id == LIAR.peer_id)
            for number in (wrong_pass - 2, wrong_pass - 3):
                honest = pass_evidence(meter, number)
                honest_bundle = encode_pass_bundle(model, honest["pass"])
                honest_claim = claim_of(model, honest, honest_bundle)
                assert referee_verdict(honest_bundle, honest_claim, random_build((0, 6), False)) == (
                    True, honest_claim.answer)
            # forged pass bundles are refused: other inputs than the link commits to, another kind, a base
            # that would make an honest answer look wrong, or a tampered frame
            bad = evidence["pass"]
            forgeries = [{**bad.sent, "h": bad.sent["h"] + 1}, {**bad.sent, "grad": bad.sent["h"]},
                         {**bad.sent, "base": torch.zeros_like(bad.sent["h"])}]
            for tensors in forgeries:
                header = {"type": "dispute-pass", "model": model, "kind": bad.kind, "start": 3, "end": 6,
                          "codec": bad.codec, "answer": bad.answer.hex()}
                forged = encode_frame(header, tensors, "f32")
                forged_claim = Claim(model, 3, 6, bytes.fromhex(evidence["prior"]), bad.link, bad.answer,
                                     hashlib.sha256(forged).digest())
                assert referee_verdict(forged, forged_claim, random_build((3, 6), False)) == (False, ZERO)
            bundle = encode_pass_bundle(model, bad)
            tampered = bundle[:-4] + bytes(4)
            claim = claim_of(model, evidence, bundle)
            tampered_claim = dataclasses.replace(claim, inputs=hashlib.sha256(tampered).digest())
            assert referee_verdict(tampered, tampered_claim, random_build((3, 6), False)) == (False, ZERO)
            assert referee_verdict(bundle, claim, random_build((3, 6), False))[0] is True

    asyncio.run(scenario())


def test_a_pass_not_kept_cannot_be_bundled():
    record = PassRecord("forward", 0, 3, "f32", ZERO, ZERO, ZERO, ZERO, ZERO)
    with pytest.raises(ValueError):
        encode_pass_bundle("m", record)
