"""A worker SIGKILLed and replaced on a chain over NAT'd, shaped homes (bench/crew_change.py --netlab, issue 23
item 3): 2 validators and 2 relays on public hosts, 4 compute nodes each behind its own NAT (one symmetric),
25 Mbit/s links and 20-50 ms delays. The task is paid with the joiner in the dead worker's seat, the joiner
trains within 60 s of being named, and the dead worker keeps its bond. Before ADR 0238 the survivors' rounds
each waited out a dial to the dead member and no joiner was named in 300 s (slow: about 8 minutes)."""
from __future__ import annotations

import pytest

from bench import crew_change
from devtools.netlab.lab import unavailable

pytestmark = [pytest.mark.netlab, pytest.mark.slow, pytest.mark.timeout(1500)]


def test_a_killed_worker_is_replaced_and_the_task_paid_over_nated_homes():
    why = unavailable()
    if why:
        pytest.skip(why)
    result = crew_change.run_netlab(crew_change.netlab_args(25.0, [20.0, 30.0, 40.0, 50.0]))
    assert result["kill_recovered"] and result["status"] == "paid", result
    assert result["join_s"] < 60, result
    assert result["victim_bonded_after"] > 0 and result["joiner_paid"] > 0, result
