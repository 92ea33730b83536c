"""The netlab fixture: one emulated internet per test module (layout in net.py), always torn down.

Agents ``relay1``, ``relay2``, ``pub``, ``a`` (home 1, independent-mapping NAT), ``b`` (home 2,
the same) and ``c`` (home 3, symmetric NAT) and ``d`` (home 4, independent mapping, 25 ms each way) are started
once per module. Skips with the reason
when the machine cannot build namespaces.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from devtools.netlab.lab import unavailable
from devtools.netlab.net import Net


@pytest.fixture(scope="module")
def net():
    why = unavailable()
    if why:
        pytest.skip(why)
    network = Net.build()
    try:
        starts = [lambda: network.start_relay("relay1", "relay1"), lambda: network.start_relay("relay2", "relay2"),
                  lambda: network.start_public("pub", "pub")]
        starts += [lambda n=name, h=home: network.start_home(n, h)
                   for name, home in (("a", 1), ("b", 2), ("c", 3), ("d", 4))]
        with ThreadPoolExecutor(len(starts)) as pool:  # agents import in parallel
            for future in [pool.submit(start) for start in starts]:
                future.result()
        yield network
    finally:
        network.close()
