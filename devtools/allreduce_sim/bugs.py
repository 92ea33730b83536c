"""Planted bugs: round cores with one rule broken, which the simulator must catch."""
from __future__ import annotations

import numpy as np

from ml.allreduce.round_core import Committed, RoundCore


class NeverAdopts(RoundCore):
    """Ignores results other members committed and pushed (breaks docs/adr/0033's adoption)."""

    def may_adopt(self, sender: str) -> bool:
        return False


class AdoptsADifferentResult(RoundCore):
    """Adopts a pushed result with its last bit flipped (a member ending with other bits)."""

    def adopted(self, sender: str, committed: Committed):
        result = committed.result.copy()
        result.view(np.uint32)[0] ^= 1
        return super().adopted(sender, Committed(committed.attempt, committed.participants,
                                                 dict(committed.excluded), result, dict(committed.rates)))


BUGS = {"never-adopts": NeverAdopts, "adopts-different-result": AdoptsADifferentResult}
