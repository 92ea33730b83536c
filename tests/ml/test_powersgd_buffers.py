"""PowerSGD reuses the error matrix of two rounds ago for M + E only when nothing else holds it: a
checkpoint's reference to an old error matrix stays intact, and the results are the same bits as
with fresh matrices every round."""
import torch

from ml.codecs import PowerSGD


def rounds(peer: PowerSGD, grads, keep_errors: bool):
    kept, outs = [], []
    for g in grads:
        p = peer.p_step(g)
        q = peer.q_step(p)
        outs.append(peer.finish(q))
        if keep_errors:
            kept.append((peer.error, peer.error.clone()))  # what a checkpoint holds, and its value then
    return outs, kept


def test_held_error_matrices_are_never_overwritten_and_results_do_not_change():
    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(64, 48, generator=gen) for _ in range(6)]
    outs_kept, kept = rounds(PowerSGD((64, 48), rank=2, seed=1), grads, keep_errors=True)
    for held, value_then in kept:
        assert torch.equal(held, value_then)
    outs_free, _ = rounds(PowerSGD((64, 48), rank=2, seed=1), grads, keep_errors=False)
    assert all(torch.equal(a, b) for a, b in zip(outs_kept, outs_free))


def test_the_spare_matrix_is_reused_when_nobody_holds_it():
    peer = PowerSGD((32, 32), rank=1, seed=0)
    gen = torch.Generator().manual_seed(0)
    storages = []
    for _ in range(4):
        p = peer.p_step(torch.randn(32, 32, generator=gen))
        peer.finish(peer.q_step(p))
        storages.append(peer.error.untyped_storage().data_ptr())
    assert storages[3] == storages[1]  # rounds alternate between two matrices
