"""dekube node runtime: identity, config, transport (node.p2p), RPC server and role wiring."""
