"""Double-sign guard: refusals, identical re-signs, persistence round trip, corrupt state."""
import pytest

from consensus.signer import DoubleSignRefused, SignerGuard, SignerStateError, Step
from node.identity import Identity, verify

ME = Identity.from_seed(b"m" * 32)


def test_refuses_conflicting_and_lower_steps():
    guard = SignerGuard(ME)
    sig = guard.sign(5, 1, Step.PREVOTE, b"prevote A")
    assert verify(ME.public_key, b"prevote A", sig)
    assert guard.sign(5, 1, Step.PREVOTE, b"prevote A") == sig  # identical re-sign is fine
    with pytest.raises(DoubleSignRefused):
        guard.sign(5, 1, Step.PREVOTE, b"prevote B")
    with pytest.raises(DoubleSignRefused):
        guard.sign(5, 1, Step.PROPOSE, b"proposal")
    with pytest.raises(DoubleSignRefused):
        guard.sign(5, 0, Step.PRECOMMIT, b"old round")
    with pytest.raises(DoubleSignRefused):
        guard.sign(4, 9, Step.PRECOMMIT, b"old height")
    guard.sign(5, 1, Step.PRECOMMIT, b"precommit A", lock_value_id=b"A" * 32, lock_proof=b"proof")
    assert [e.step for e in guard.signed_at(5)] == [Step.PREVOTE, Step.PRECOMMIT]
    guard.sign(5, 2, Step.PREVOTE, b"next round")
    assert [e.round for e in guard.signed_at(5)] == [2]
    assert guard.lock_for(5).round == 1 and guard.lock_for(5).proof == b"proof"
    assert guard.lock_for(6) is None


def test_restored_guard_keeps_refusing_and_keeps_the_lock():
    guard = SignerGuard(ME)
    guard.sign(7, 0, Step.PREVOTE, b"pv")
    guard.sign(7, 0, Step.PRECOMMIT, b"pc", lock_value_id=b"L" * 32, lock_proof=b"xyz")
    restored = SignerGuard.restore(ME, guard.to_bytes())
    assert restored.last_hrs == (7, 0, Step.PRECOMMIT)
    assert restored.to_bytes() == guard.to_bytes()
    with pytest.raises(DoubleSignRefused):
        restored.sign(7, 0, Step.PRECOMMIT, b"other")
    with pytest.raises(DoubleSignRefused):
        restored.sign(7, 0, Step.PREVOTE, b"pv")  # lower than the last step, even if identical
    assert restored.sign(7, 0, Step.PRECOMMIT, b"pc") == guard.entries[-1].signature
    assert restored.lock_for(7).value_id == b"L" * 32 and restored.lock_for(7).proof == b"xyz"
    assert SignerGuard.restore(ME, b"").last_hrs is None
    assert SignerGuard.restore(ME, None).lock is None


def test_corrupt_truncated_or_foreign_state_is_a_clear_error():
    guard = SignerGuard(ME)
    guard.sign(1, 0, Step.PREVOTE, b"pv")
    data = guard.to_bytes()
    for bad in (b"junk", data[:-1], data + b"\0", b"DKSG2\x01" + b"\0" * 10):
        with pytest.raises(SignerStateError):
            SignerGuard.restore(ME, bad)
    flipped = bytearray(data)
    flipped[30] ^= 0xFF  # inside the signature
    with pytest.raises(SignerStateError):
        SignerGuard.restore(ME, bytes(flipped))
    with pytest.raises(SignerStateError, match="not signed by this identity"):
        SignerGuard.restore(Identity.from_seed(b"o" * 32), data)
