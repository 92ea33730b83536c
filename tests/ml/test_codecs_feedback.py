"""ErrorFeedback carries residuals; PowerSGD recovers low-rank matrices, is bit-identical across
peers, keeps its error and warm start, and gates tensors that would not compress."""
import pytest
import torch

from ml.codecs import (
    CodecError,
    ErrorFeedback,
    PowerSGD,
    compression_ratio,
    from_matrix,
    get_codec,
    matrix_shape,
    to_matrix,
    worthwhile,
)
from ml.codecs.powersgd import orthonormalize, outer_sum


def gradient_stream(steps: int, n: int, seed: int = 0):
    """A fixed 'true gradient' plus fresh noise each step, like minibatch gradients."""
    gen = torch.Generator().manual_seed(seed)
    mean = torch.randn(n, generator=gen)
    for _ in range(steps):
        yield mean + torch.randn(n, generator=gen)


def tracking_error(codec, steps: int, n: int, with_feedback: bool) -> float:
    ef = ErrorFeedback(codec, n)
    sent = torch.zeros(n, dtype=torch.float64)
    total = torch.zeros(n, dtype=torch.float64)
    for x in gradient_stream(steps, n):
        data = ef.encode(x) if with_feedback else codec.encode(x)
        sent += codec.decode(data, n).double()
        total += x.double()
        if with_feedback:  # the identity error feedback keeps: sent + residual == total
            assert torch.allclose(sent + ef.residual.double(), total, atol=1e-3)
    return float((sent - total).norm() / total.norm())


@pytest.mark.parametrize("name,opts", [("topk", {"ratio": 0.01}), ("sign", {}), ("int4", {})])
def test_error_feedback_makes_the_sum_of_decoded_values_track_the_sum_of_inputs(name, opts):
    codec = get_codec(name, **opts)
    with_ef = tracking_error(codec, steps=300, n=4000, with_feedback=True)
    assert with_ef < 0.2
    # the residual stays bounded, so the relative gap shrinks as the sums grow
    assert tracking_error(codec, steps=1200, n=4000, with_feedback=True) < with_ef / 2.5
    if name != "int4":  # round-to-nearest int4 is nearly unbiased; top-k and sign lose mass for good
        assert tracking_error(codec, steps=300, n=4000, with_feedback=False) > 3 * with_ef


def test_error_feedback_leaves_the_residual_alone_when_encode_fails():
    ef = ErrorFeedback(get_codec("topk", ratio=0.1), 100)
    ef.encode(torch.randn(100))
    before = ef.residual.clone()
    bad = torch.randn(100)
    bad[5] = float("nan")
    with pytest.raises(CodecError):
        ef.encode(bad)
    assert torch.equal(ef.residual, before)
    with pytest.raises(CodecError):
        ef.encode(torch.randn(99))
    ef.reset()
    assert not ef.residual.any()


def run_round(peers, grads):
    """One PowerSGD round with exact means standing in for the all-reduce."""
    p_mean = torch.stack([peer.p_step(g) for peer, g in zip(peers, grads)]).mean(0)
    q_mean = torch.stack([peer.q_step(p_mean) for peer in peers]).mean(0)
    return [peer.finish(q_mean) for peer in peers]


def test_powersgd_recovers_a_low_rank_mean_identically_on_every_peer():
    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(300, 3, generator=gen) @ torch.randn(3, 200, generator=gen) for _ in range(3)]
    target = torch.stack(grads).mean(0)  # rank <= 9; rank-12 PowerSGD captures it
    peers = [PowerSGD((300, 200), rank=12, seed=42) for _ in grads]
    approx = run_round(peers, grads)
    assert all(torch.equal(a, approx[0]) for a in approx)
    assert float((approx[0] - target).norm() / target.norm()) < 1e-4


def test_powersgd_error_feedback_and_warm_start_track_a_full_rank_gradient():
    gen = torch.Generator().manual_seed(2)
    true_grad = torch.randn(120, 80, generator=gen)
    peers = [PowerSGD((120, 80), rank=2, seed=7) for _ in range(2)]
    total = torch.zeros(120, 80, dtype=torch.float64)
    for step in range(200):
        grads = [true_grad + 0.1 * torch.randn(120, 80, generator=gen) for _ in peers]
        if step == 1:
            assert torch.equal(peers[0].q, peers[1].q)  # warm start: Q_mean kept
        total += run_round(peers, grads)[0].double()
    # each step sends rank 2 of 80, yet the accumulated update follows the gradient direction
    rel = float((total / 200 - true_grad.double()).norm() / true_grad.norm())
    assert rel < 0.25
    one_shot = PowerSGD((120, 80), rank=2, seed=7)
    single = run_round([one_shot], [true_grad])[0]
    assert float((single - true_grad).norm() / true_grad.norm()) > 0.5


def test_powersgd_shared_steps_are_bit_identical_across_thread_counts():
    gen = torch.Generator().manual_seed(3)
    p = torch.randn(5000, 4, generator=gen)
    q = torch.randn(3000, 4, generator=gen)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = (orthonormalize(p), outer_sum(p, q))
        torch.set_num_threads(2)
        two = (orthonormalize(p), outer_sum(p, q))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])
    ortho = one[0].double()
    assert torch.allclose(ortho.T @ ortho, torch.eye(4, dtype=torch.float64), atol=1e-6)


def test_orthonormalize_zeroes_a_vanishing_column():
    p = torch.zeros(10, 2)
    p[:, 0] = 1.0
    out = orthonormalize(p)
    assert torch.isfinite(out).all() and not out[:, 1].any()


def test_powersgd_rejects_bad_inputs_and_phase_order():
    peer = PowerSGD((50, 40), rank=2, seed=0)
    with pytest.raises(RuntimeError):
        peer.q_step(torch.zeros(50, 2))
    with pytest.raises(CodecError):
        peer.p_step(torch.zeros(40, 50))
    bad = torch.zeros(50, 40)
    bad[0, 0] = float("inf")
    with pytest.raises(CodecError):
        peer.p_step(bad)
    peer.p_step(torch.randn(50, 40))
    with pytest.raises(CodecError):
        peer.q_step(torch.full((50, 2), float("nan")))
    with pytest.raises(ValueError):
        PowerSGD((50, 40), rank=41, seed=0)


def test_gate_and_matrix_views():
    assert matrix_shape((64, 3, 3, 3)) == (64, 27)
    assert matrix_shape((25_000_000,)) == (5000, 5000)
    assert matrix_shape((10,)) == (4, 3)
    assert compression_ratio((1000, 1000), 4) == 125.0
    assert worthwhile((1000, 1000), 4)
    assert not worthwhile((64, 27), 8)  # 64*27 / (8*91) < 4: send fp16 instead
    assert not worthwhile((100, 4), 4)
    assert PowerSGD((1000, 1000), rank=4, seed=0).worthwhile
    x = torch.arange(10, dtype=torch.float32)
    mat = to_matrix(x, matrix_shape(x.shape))
    assert mat.shape == (4, 3) and mat.view(-1)[10:].eq(0).all()
    assert torch.equal(from_matrix(mat, 10), x)


def test_state_handed_out_is_never_mutated_later():
    ef = ErrorFeedback(get_codec("sign"), 1000)
    ef.encode(torch.randn(1000))
    kept = ef.residual
    snapshot = kept.clone()
    ef.encode(torch.randn(1000))
    ef.reset()
    assert torch.equal(kept, snapshot)
    peer = PowerSGD((60, 50), rank=2, seed=1)
    run_round([peer], [torch.randn(60, 50)])
    kept_error, kept_q = peer.error, peer.q
    snapshot = (kept_error.clone(), kept_q.clone())
    run_round([peer], [torch.randn(60, 50)])
    assert torch.equal(kept_error, snapshot[0]) and torch.equal(kept_q, snapshot[1])
