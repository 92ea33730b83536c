"""Tuning passes in the transcript (ADR 0183): every billed forward and backward extends the stream's
transcript with a pass link that both sides compute alike (delta-encoded activations resolved), so the
countersigned receipts commit to each pass's inputs, grad, setup and answer."""
import asyncio

import pytest
import torch

from ml.serve.billing import ClientMeter, PassRecord, max_flops_per_token
from ml.serve.protocol import SpanClient
from ml.serve.server import BlockServer
from ml.serve.transcript import ZERO, chain, extend, grads_digest, pass_link, tensor_digest
from ml.serve.tuner import RemoteTuner
from tests.serve.test_billing import PaidNetwork, payer
from tests.serve.test_generation import CONFIG, random_build


def tuning_batch() -> torch.Tensor:
    text = torch.tensor(list(range(40)) * 3) % CONFIG.vocab_size
    return torch.stack([text[i:i + 17] for i in range(0, 8, 4)])


@pytest.mark.parametrize("codec,ids", [("f32", None), ("f16", [0, 1]), ("int8", [0, 1])])
def test_paid_tuning_passes_extend_the_countersigned_transcript(codec, ids):
    batch = tuning_batch()

    async def scenario():
        async with PaidNetwork([(0, 3), (3, 6)]) as net:
            tuner = RemoteTuner(net.client, random_build((0, 0), True), net.servers, prompt_length=2, lora_rank=2,
                                codec=codec, lr=1e-2, payer=payer())
            for _ in range(3):
                await tuner.step(batch, ids=ids)
            await tuner.loss(batch)
            meters = [span.meter for span in tuner.chain]
            await tuner.close()
            await asyncio.sleep(0.05)
            return tuner, meters, [book.unclaimed() for book in net.books]

    tuner, meters, unclaimed = asyncio.run(scenario())
    assert tuner.failovers == 0   # a link the two sides computed differently would fail the countersignature
    for meter, claims in zip(meters, unclaimed):
        assert [p.kind for p in meter.passes] == ["forward", "backward"] * 3 + ["forward"]
        assert meter.transcript == chain([p.link for p in meter.passes]) != ZERO
        assert meter.signed is not None and meter.signed.receipt["transcript"] == meter.transcript
        assert [c.receipt["transcript"] for c in claims] == [meter.transcript]


def test_a_pass_link_commits_to_the_inputs_grad_setup_and_the_true_answer():
    server = BlockServer(random_build((0, 3), False))
    hidden, grad = torch.randn(1, 5, CONFIG.width), torch.randn(1, 5, CONFIG.width)

    async def scenario():
        async with PaidNetwork([(0, 3)]) as net:
            span = SpanClient(net.client, net.servers[0].peer_id, 0, 3, meter=tuner_meter())
            out = await span.forward(hidden, None, "f32")
            grads = await span.backward(hidden, grad, None, "f32")
            await span.close()
            return span.meter.passes, out, grads

    def tuner_meter():
        return ClientMeter(payer().identity, payer().chain_id, payer().max_price_per_gflop,
                           max_flops_per_token(CONFIG, 3))

    passes, out, grads = asyncio.run(scenario())
    expected_out = server.forward(hidden)
    expected_grads = server.backward(hidden, grad)
    assert torch.equal(out, expected_out)
    forward, backward = passes
    assert isinstance(forward, PassRecord)
    assert forward.link == pass_link("forward", 0, 3, "f32", tensor_digest(hidden), ZERO,
                                     tensor_digest(expected_out))
    assert backward.link == pass_link("backward", 0, 3, "f32", tensor_digest(hidden), tensor_digest(grad),
                                      grads_digest(expected_grads))
    wrong = expected_out.clone()
    wrong[0, -1, 0] += 0.5
    assert forward.answer != tensor_digest(wrong)
    assert forward.link != pass_link("backward", 0, 3, "f32", tensor_digest(hidden), ZERO,
                                     tensor_digest(expected_out))


def test_pass_link_refuses_an_unknown_kind():
    with pytest.raises(ValueError):
        pass_link("step", 0, 1, "f32", ZERO, ZERO, ZERO)


class LyingTuneServer(BlockServer):
    """Answers its 3rd backward (or forward) pass with one value nudged."""
    lie_kind = "backward"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.passes = {"forward": 0, "backward": 0}

    def _lies(self, kind: str) -> bool:
        self.passes[kind] += 1
        return kind == self.lie_kind and self.passes[kind] == 3

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        if self._lies("forward"):
            out = out.clone()
            out[0, -1, 0] += 0.5
        return out

    def backward(self, *args, **kwargs):
        grads = super().backward(*args, **kwargs)
        if self._lies("backward"):
            grads["grad_h"] = grads["grad_h"].clone()
            grads["grad_h"][0, 0, 0] += 0.5
        return grads


class LyingForwardServer(LyingTuneServer):
    lie_kind = "forward"


def checked_tuning(classes: dict, codec: str, ids, check_passes=frozenset(range(8))):
    """Three paid tuning steps over two servers, then a spot check of both spans."""
    batch = tuning_batch()

    async def scenario():
        async with PaidNetwork([(0, 3), (3, 6)], classes) as net:
            tuner = RemoteTuner(net.client, random_build((0, 0), True), net.servers, prompt_length=2, lora_rank=2,
                                codec=codec, lr=1e-2, payer=payer(), check_passes=check_passes)
            for _ in range(3):
                await tuner.step(batch, ids=ids)
            await tuner.close()
            checks = [tuner.spot_check(i, random_build(r, False)) for i, r in enumerate([(0, 3), (3, 6)])]
            return checks, net.servers

    return asyncio.run(scenario())


@pytest.mark.parametrize("codec,ids", [("f32", None), ("f16", [0, 1]), ("int8", [0, 1])])
def test_an_honest_tuning_run_spot_checks_clean(codec, ids):
    checks, _ = checked_tuning({}, codec, ids)
    assert [(c.ok, c.checked, c.culprit) for c in checks] == [(True, 6, None), (True, 6, None)]


@pytest.mark.parametrize("liar,wrong_pass,kind", [(LyingTuneServer, 5, "backward"), (LyingForwardServer, 4, "forward")])
@pytest.mark.parametrize("codec,ids", [("f32", None), ("f16", [0, 1])])
def test_a_server_lying_in_a_tuning_pass_is_named_with_its_countersigned_receipt(liar, wrong_pass, kind, codec, ids):
    checks, servers = checked_tuning({1: liar}, codec, ids)
    assert checks[0].ok and checks[0].checked == 6
    bad = checks[1]
    assert (bad.ok, bad.wrong_pass, bad.kind, bad.culprit) == (False, wrong_pass, kind, servers[1].peer_id)
    evidence = bad.evidence
    assert evidence is not None and evidence["wrong_pass"] == wrong_pass
    record = evidence["pass"]
    assert record.kind == kind and evidence["link"] == record.link.hex()
    assert bytes.fromhex(evidence["receipt"]["transcript"]) == extend(bytes.fromhex(evidence["prior"]), record.link)
    assert evidence["receipt"]["server"] == servers[1].peer_id


def test_only_the_chosen_passes_keep_tensors():
    checks, _ = checked_tuning({1: LyingTuneServer}, "f32", None, check_passes=frozenset({0, 1}))
    assert [(c.ok, c.checked) for c in checks] == [(True, 2), (True, 2)]   # the lie (pass 5) was not sampled
