"""dekube node runtime, the lowest layer: identity, keystore, config, transport (node.p2p), RPC/HTTP
server, the ledger gateway (node.ledger), content-addressed artifacts (node.artifacts), the one
Merkle tree (node.merkle) and role wiring."""
