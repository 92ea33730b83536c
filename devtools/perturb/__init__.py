"""Perturbation soak in the style of CometBFT's e2e runner: a TOML manifest names the network
(validators, relays, compute nodes), the wallet load and weighted perturbations (kill, pause,
restart, disconnect, disk full, and the attacks of ``attacks.py``: handshake flood, websocket flood,
artifact slot squatting); ``python -m devtools.perturb --manifest FILE`` runs them one at a time
within the fault budget and checks the chain invariants over RPC after each (docs/adr/0164, 0192).
"""
