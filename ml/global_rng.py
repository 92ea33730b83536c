"""The lock around torch's default generators (docs/adr/0196).

torch's default generators (the CPU one and one per CUDA device) are process-wide state, not
per-thread: a thread that seeds one and draws from it (a training step's dropout masks, a registry
model's initial weights) gets another thread's draws if that thread seeds or restores the generator
in between -- two workers, or a worker and a verifier's replay, computing in one process. Every
block of code that seeds and draws from the default generators holds `GENERATORS` for its whole
length, so the draws of each block are a function of its own seed.
"""
from __future__ import annotations

import threading

GENERATORS = threading.RLock()
