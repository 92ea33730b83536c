"""The compute role and the task flow on its side: train assigned tasks over the node's p2p Host,
commit results (Merkle root of per-worker segment records, `segment_record`), audit others' results by
replay (`segment_replay`: one worker's one segment from its checkpoint), finalize.

`role.ComputeRole` is what `dekube-node start --role compute` runs, a composition of `membership`
(bond, node record, bandwidth), `training` (our share of an assigned task), `verifying` (audits,
disputes, referee votes), `results` (committed results served to verifiers, finalize), `peer_fetch`
(peers' addresses, task inputs) and `fault_seam` (the one seam of the test-only adversary modes);
tasks arrive as `consensus.task_info.TaskInfo`; `task_spec` maps ledger tasks to
TrainSpecs; `executor` builds a worker's group and trainer; `host_transport` adapts the Host to the
all-reduce transport; `ready_protocol` and `segments_protocol` are the workers' start barrier and
the verifiers' record requests (`/dekube/task-segments/2`); `commitment`, `segment_replay`,
`verification_flow` and `duties` verify (audit slots drawn by the ledger); the node's ledger
gateway (`node.ledger`) talks to validators; `local_job`/`local_worker` run local jobs of worker
processes (`dekube-node task run`; the local devnet of validators plus compute nodes lives in
`devtools.devnet`).
"""
