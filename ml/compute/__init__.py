"""The compute role and the task flow on its side: train assigned tasks over the node's p2p Host,
commit results (Merkle root of segment hashes), audit others' results by replay, finalize.

`role.ComputeRole` is what `dekube-node start --role compute` runs; `task_spec` maps ledger tasks to
TrainSpecs; `commitment` builds commitments and picks audited segments; `replay` and `audit`
verify; `host_transport` adapts the Host to the all-reduce transport.
"""
