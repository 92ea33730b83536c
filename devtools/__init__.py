"""Dev and test tooling, not used by a production node.

Simulators of the production code (``consensus_sim``: validators on a simulated network, clock
and disk with faults drawn per seed), local testnets (``testnet``: validator processes on one
machine; ``devnet``: validators plus compute nodes, behind ``dekube-node testnet``), a closed-loop
transaction load (``loadgen``), chain invariant checks over JSON-RPC (``chaincheck``), and a
resumable bulk transfer with adaptive stall detection (``resumable``, ``stall``) that the relay
failover tests and the netlab bench drive over relayed circuits; ``netlab``, the network-namespace
labs (an emulated internet with NAT routers, a shaped star, link cuts) that benchmarks, devtools
and tests share; ``perturb``, fault runs over a devnet. Product packages (node, consensus,
relay, ml) never import from here; only the CLI, tests, benchmarks and scripts do (docs/adr/0130).
Every tool here builds or configures product nodes, so importing the package installs the product's
plugins (cli/assembly.py: roles, services, config sections, transaction encoding; ADR 0201), as the
CLI's entry does.
"""
from cli.assembly import install_product

install_product()
