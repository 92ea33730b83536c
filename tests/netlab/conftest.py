"""The netlab fixture: one emulated internet per test module (layout in net.py), always torn down.

Agents ``relay1``, ``relay2``, ``pub``, ``a`` (home 1, independent-mapping NAT), ``b`` (home 2,
the same) and ``c`` (home 3, symmetric NAT) and ``d`` (home 4, independent mapping, 25 ms each way) are started
once per module. Skips with the reason
when the machine cannot build namespaces.
"""
from __future__ import annotations

import pytest

from .lab import unavailable
from .net import Net


@pytest.fixture(scope="module")
def net():
    why = unavailable()
    if why:
        pytest.skip(why)
    network = Net.build()
    try:
        network.start_relay("relay1", "relay1")
        network.start_relay("relay2", "relay2")
        network.start_public("pub", "pub")
        for name, home in (("a", 1), ("b", 2), ("c", 3), ("d", 4)):
            network.start_home(name, home)
        yield network
    finally:
        network.close()
