"""The one Merkle tree (node.merkle) keeps every root its three former homes produced (ADR 0190).

The vectors below were computed BEFORE the merge, from consensus.block.merkle_root, the tree in
node/artifacts/merkle.py and ml/compute/segment_record.py's root and proof; a change of any root,
artifact id or audit path fails here.
"""
import hashlib

import pytest

from consensus.block import merkle_root as block_root
from ml.compute import segment_record
from node import merkle
from node.artifacts import merkle as artifact_merkle


def items(n):
    return [hashlib.sha256(b"item%d" % i).digest()[: (i % 5) * 7] for i in range(n)]


def data(size):
    return (hashlib.sha256(b"data").digest() * (size // 32 + 1))[:size]


ROOTS = {
    0: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    1: "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    2: "f47b9dfe1bd61f40201341f8eb4a5539ba2a37b4c05715eac642e9924a1ef0e6",
    3: "2d1777e46daab824ee58fc9220f8a53f0dece02e8821cda3d67cd03fc2cad97d",
    4: "693300efa2caa50b808ccafcf0426c8f2f9f86838a9fe927963a820e49d16ad0",
    5: "4435c914b17d5d832746a167afed74a4fe489e341d4d77ea8d228d4d8088c1e9",
    6: "db3410a02417f08c523787a8c04b875f65366281fa77004e188fb06aef8f44d0",
    7: "0fb7ad1ab340a8ce7edfe63099dbfc09815afbbfa996f72640ac93a77f2b585a",
    8: "cb057a2c9a56104e917f06b6b1e2ed8880ef76bfa126bcdb0cc4635eba59ae45",
    9: "ae02d9b1ffa76cda7047f38fa60ca348b1167bae2b4b9f9caff755f05948199b",
}
ARTIFACT_IDS = {
    0: "c0e50f0d90d6e2fea1e6f53d4f758ed5fc9035a399a8eb215c29c6ff3ea05425",
    1: "ffec17512682cc5f967b69a87c5d88714548441e0da294bdd27ab757a3f6ef8b",
    1000: "6f1162a41d228db0a413a517d50eb102936a8d0d920b29828993b8d081300a26",
    1048576: "748a1e47616892786d475deb4c6b6034e0264e73de5230a9201d090a95cfa521",
    1048577: "5edafa05acd415ebc2cba85108478c320fb2501fa347eacc7884d6bc917901fe",
    3145723: "661d898d4f1f7708078182fe327f1943a7dbcfe4418ab87ee213c6f532e917c4",
}
# sha256 of every audit path of an n-leaf tree, concatenated in leaf order
PROOFS = {
    1: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    2: "ce97938c52178a4378ae85997ea9492c540bf2944de67208882c3c24b51d1847",
    3: "64320ec758cddc9cd1d29c57d875df6a9057eecb39fcee28914960978013ba9c",
    4: "46df5d2eac29ef15017168af13bb1374b38cc77310c0484ed5cdec80428a0bc7",
    5: "112534f2457d2d7f57835db6d1ad4de48ddd0a865fe9b8974edf43ac7699e0c5",
    6: "3fc49cd4ee40f9191d12141b9e17b464bd73e91483290cdb16c7759980ead398",
    7: "6200861294ca2d3a45600f2b6759615050a40e95797752c0874fcbd7c160b600",
    8: "f03770636e36d9dbcf7de09586ac2780792d42796eec9d05d8d729d470b1f3e5",
    9: "9edaaee4574aaec0e82bf397b1d8af453369691c85c1879367e65ec54ea3866e",
}


@pytest.mark.parametrize("n", sorted(ROOTS))
def test_block_roots_unchanged(n):
    assert block_root(items(n)).hex() == ROOTS[n] == merkle.merkle_root(items(n)).hex()


@pytest.mark.parametrize("n", [n for n in sorted(ROOTS) if n])
def test_artifact_and_segment_roots_unchanged(n):
    hashed = [artifact_merkle.leaf_hash(item) for item in items(n)]
    assert merkle.root_of_leaf_hashes(hashed).hex() == ROOTS[n]
    assert segment_record.root(items(n)).hex() == ROOTS[n]


@pytest.mark.parametrize("size", sorted(ARTIFACT_IDS))
def test_artifact_ids_unchanged(size):
    assert artifact_merkle.artifact_id_of_bytes(data(size)) == ARTIFACT_IDS[size]


@pytest.mark.parametrize("n", sorted(PROOFS))
def test_audit_paths_unchanged_and_verify(n):
    leaves = items(n)
    paths = [segment_record.proof(leaves, i) for i in range(n)]
    assert hashlib.sha256(b"".join(b"".join(p) for p in paths)).hexdigest() == PROOFS[n]
    root = bytes.fromhex(ROOTS[n])
    for i, path in enumerate(paths):
        assert segment_record.verify_proof(root, leaves[i], i, n, path)
        assert merkle.root_from_path(leaves[i], i, n, path) == root
        assert not segment_record.verify_proof(root, leaves[i] + b"x", i, n, path)
        if path:
            assert not segment_record.verify_proof(root, leaves[i], i, n, path[:-1])
        assert not segment_record.verify_proof(root, leaves[i], i, n, path + [bytes(32)])


def test_empty_tree_rules_kept():
    with pytest.raises(ValueError):
        merkle.root_of_leaf_hashes([])
    with pytest.raises(ValueError):
        merkle.audit_path([], 0)
    with pytest.raises(segment_record.BadRecord):
        segment_record.root([])
