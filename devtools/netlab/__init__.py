"""The network-namespace labs, the one home for benchmarks, devtools and tests (ADR 0190).

``lab`` builds an emulated internet (a backbone bridge, public hosts, homes behind NAT routers, tbf
caps, userspace delay lines) and ``star`` a shaped star of peers on it for the benchmarks;
``isolation`` cuts one node's network for the perturbation runs; ``nodes`` starts agents
(``agent``, ``node_agent``, ``artifact_agent``, ``progress_agent``: run as modules inside a
namespace, driven by ``commands``' JSON lines) and calls them; ``net``, ``artifact_net`` and
``task_net`` are the standard layouts; ``scenarios`` the relay measurements; ``demo_nat`` the main
job across NAT (``python -m devtools.netlab.demo_nat``). Everything needs root, iproute2, nftables
and tc; ``lab.unavailable()`` says why not.
"""
