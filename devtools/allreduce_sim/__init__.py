"""Seeded simulator of the all-reduce round protocol: members running the real round core over an
in-memory network with simulated time and randomised kills, stalls, delays and garbage senders
(docs/adr/0116). `python -m devtools.allreduce_sim --seeds 200`."""
from .run import Report, run_seed

__all__ = ["Report", "run_seed"]
