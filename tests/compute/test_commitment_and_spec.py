"""Commitments (the root of the segment records) and the ledger <-> TrainSpec mapping."""
import hashlib

import pytest

from consensus.encoding import encode
from consensus.tx import build_tx, decode_tx
from ml.compute.commitment import BadCommitment, Commitment
from ml.compute.segment_record import SegmentRecord, StepHashes, leaves, root
from ml.compute.task_spec import InvalidTask, model_name, submit_payload, train_spec_for_task
from ml.train.spec import TrainSpec
from node.identity import Identity


def h(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def test_commitment_payload_is_a_valid_commit_result_tx():
    record = SegmentRecord(0, h(1), h(2), h(3), (StepHashes(h(4), h(5), h(6)),), h(7))
    commitment = Commitment.of_records(bytes(32), "w", [record], h(9))
    assert commitment.segments == 1 and commitment.result_hash == bytes.fromhex(h(9))
    tx = build_tx(Identity.generate(), "c", 0, "commit_result", commitment.payload(bytes(32)))
    assert decode_tx(tx.raw).payload["segments_root"] == root(leaves(bytes(32), "w", [record]))
    with pytest.raises(BadCommitment):
        Commitment.of_records(bytes(32), "w", [record], "ab" * 31)


def test_task_spec_round_trip_through_the_ledger_payload():
    spec = TrainSpec(model=model_name("mlp"), codec="int8", steps=40, lr=0.01, segment_steps=5, seed=3,
                     codec_options={"ratio": 0.25})
    payload = submit_payload(spec, workers=3, price=1000, profile="cpu-x86-64-avx2/torch-2.13.0")
    encode(payload)  # the canonical ledger encoding accepts it (no floats)
    tx = build_tx(Identity.generate(), "c", 0, "submit_task", payload)
    task_spec = {k: decode_tx(tx.raw).payload[k] for k in ("model", "dataset", "hyperparams", "workers",
                                                            "sync_mode", "codec")}
    assert train_spec_for_task(task_spec) == spec
    diloco = TrainSpec(mode="diloco", steps=40, inner_steps=10)
    assert train_spec_for_task(submit_payload(diloco, 2, 5)) == diloco
    assert submit_payload(diloco, 2, 5)["sync_mode"] == "diloco"


def test_task_spec_with_artifacts_round_trips_through_the_ledger_payload():
    spec = TrainSpec(model="pt2", dataset="file", model_artifact="ab" * 32, dataset_artifact="cd" * 32,
                     eval_artifact="ef" * 32, loss="cross_entropy", device="cuda", init="seed",
                     tokenizer="char", optimizer="sgd", lr=0.05, steps=30, segment_steps=10, eval_every=10)
    payload = submit_payload(spec, workers=3, price=10, profile="cuda-nvidia-h100-cc9.0-cuda12.8/torch-2.13.0")
    encode(payload)
    tx = build_tx(Identity.generate(), "c", 0, "submit_task", payload)
    task_spec = {k: decode_tx(tx.raw).payload[k] for k in ("model", "dataset", "hyperparams", "workers",
                                                            "sync_mode", "codec")}
    assert task_spec["hyperparams"]["model_artifact"] == "ab" * 32
    assert train_spec_for_task(task_spec) == spec


@pytest.mark.parametrize("hyperparams", [
    {"model_artifact": "ab" * 32},                                   # a registry model with an archive
    {"device": "tpu"}, {"loss": "hinge"}, {"init": 1}, {"device": 3},
])
def test_tasks_with_bad_new_fields_raise_invalid_task(hyperparams):
    with pytest.raises(InvalidTask):
        train_spec_for_task({"model": "mlp", "dataset": "digits", "codec": "int8", "sync_mode": "allreduce",
                             "hyperparams": hyperparams})


def test_archive_model_needs_its_artifact_id():
    with pytest.raises(InvalidTask):
        train_spec_for_task({"model": "pt2", "dataset": "digits", "codec": "int8", "sync_mode": "allreduce",
                             "hyperparams": {"model_artifact": "not-hex"}})
    with pytest.raises(InvalidTask):
        train_spec_for_task({"model": "pt2", "dataset": "digits", "codec": "int8", "sync_mode": "allreduce",
                             "hyperparams": {}})


@pytest.mark.parametrize("task_spec", [
    {},
    {"model": "mlp", "dataset": "digits", "codec": "int8", "sync_mode": "gossip", "hyperparams": {}},
    {"model": "nope", "dataset": "digits", "codec": "int8", "sync_mode": "allreduce", "hyperparams": {}},
    {"model": "mlp", "dataset": "digits", "codec": "int8", "sync_mode": "allreduce", "hyperparams": {"evil": 1}},
    {"model": "mlp", "dataset": "digits", "codec": "int8", "sync_mode": "allreduce", "hyperparams": {"lr": "x"}},
    {"model": "mlp", "dataset": "digits", "codec": "int8", "sync_mode": "allreduce", "hyperparams": {"steps": -1}},
    {"model": "mlp", "dataset": "digits", "codec": "int8", "sync_mode": "allreduce", "hyperparams": []},
])
def test_malformed_tasks_raise_invalid_task(task_spec):
    with pytest.raises(InvalidTask):
        train_spec_for_task(task_spec)
