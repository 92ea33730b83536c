"""The compute role and the task flow on its side: train assigned tasks over the node's p2p Host,
commit results (Merkle root of segment hashes), audit others' results by replay, finalize.

`role.ComputeRole` is what `dekube-node start --role compute` runs; `task_spec` maps ledger tasks to
TrainSpecs; `executor` builds a worker's group and trainer; `host_transport` adapts the Host to the
all-reduce transport; `ready_protocol` and `segments_protocol` are the workers' start barrier and
the verifiers' hash requests; `commitment`, `replay` and `audit` verify; `node.ledger` (the node's gateway) talks to a
validator; `local_job`/`local_worker` run `dekube-node task run`; `devnet` starts validators plus
compute nodes for the end-to-end flow and the demo.
"""
