"""Artifact ids, manifests and the on-disk store: chunking, resume, corrupt files."""
import os

import pytest

from node.artifacts import CHUNK_SIZE, ArtifactError, ArtifactStore, Manifest, ManifestError
from node.artifacts.manifest import max_manifest_bytes
from node.artifacts.merkle import (
    artifact_id,
    artifact_id_of_bytes,
    artifact_id_of_file,
    check_id,
    chunk_count,
    leaf_hash,
)
from node.merkle import inner_hash
from node.merkle import root_of_leaf_hashes as merkle_root

MB = CHUNK_SIZE


def blob(size, seed=1):
    return (seed.to_bytes(4, "big") * (size // 4 + 1))[:size] if size < 64 else os.urandom(size)


def test_chunk_counts_and_empty_artifact():
    assert chunk_count(0) == 1 and chunk_count(1) == 1 and chunk_count(MB) == 1 and chunk_count(MB + 1) == 2
    empty = artifact_id_of_bytes(b"")
    assert check_id(empty) == empty and empty == artifact_id(0, [leaf_hash(b"")])


def test_root_uses_distinct_leaf_and_inner_prefixes_and_promotes_odd_node():
    a, b, c = leaf_hash(b"a"), leaf_hash(b"b"), leaf_hash(b"c")
    assert merkle_root([a, b, c]) == inner_hash(inner_hash(a, b), c)
    # an inner node presented as a leaf's data does not give the same root
    assert leaf_hash(a + b) != inner_hash(a, b)
    assert merkle_root([a]) == a


def test_id_binds_size_and_content(tmp_path):
    data = os.urandom(2 * MB + 123)
    path = tmp_path / "f"
    path.write_bytes(data)
    ident = artifact_id_of_file(path)
    assert ident == artifact_id_of_bytes(data) and len(ident) == 64
    assert artifact_id_of_bytes(data[:-1]) != ident
    flipped = bytearray(data)
    flipped[MB + 5] ^= 1
    assert artifact_id_of_bytes(bytes(flipped)) != ident
    # same leaves, different claimed size: different id
    size, leaf_list = len(data), [leaf_hash(data[i:i + MB]) for i in range(0, len(data), MB)]
    assert artifact_id(size + 1, leaf_list) != artifact_id(size, leaf_list)


@pytest.mark.parametrize("bad", ["", "xyz", "A" * 64, "0" * 63, "0" * 65, None])
def test_check_id_refuses_malformed(bad):
    with pytest.raises(ValueError):
        check_id(bad)


def test_manifest_round_trip_and_refusals():
    data = os.urandom(3 * MB + 7)
    ident = artifact_id_of_bytes(data)
    leaves = tuple(leaf_hash(data[i:i + MB]) for i in range(0, len(data), MB))
    manifest = Manifest(len(data), leaves)
    assert manifest.id == ident and manifest.chunks == 4 and manifest.chunk_length(3) == 7
    encoded = manifest.encode()
    assert Manifest.decode(encoded, ident, 10 * MB) == manifest
    with pytest.raises(ManifestError, match="does not hash"):
        Manifest.decode(encoded, "0" * 64, 10 * MB)
    with pytest.raises(ManifestError, match="exceeds the limit"):
        Manifest.decode(encoded, ident, 2 * MB)
    with pytest.raises(ManifestError):
        Manifest.decode(encoded[:-1], ident, 10 * MB)
    with pytest.raises(ManifestError):
        Manifest.decode(b"junk" + encoded[4:], ident, 10 * MB)
    with pytest.raises(ManifestError):
        Manifest.decode(encoded[:10], ident, 10 * MB)
    tampered = bytearray(encoded)
    tampered[-1] ^= 1
    with pytest.raises(ManifestError):
        Manifest.decode(bytes(tampered), ident, 10 * MB)
    assert len(encoded) <= max_manifest_bytes(4 * MB)


def test_store_add_has_path_list(tmp_path):
    store = ArtifactStore(tmp_path / "s", 8 * MB)
    data = os.urandom(2 * MB + 5)
    src = tmp_path / "src"
    src.write_bytes(data)
    ident = store.add_file(src)
    assert ident == artifact_id_of_bytes(data) == store.add_bytes(data)
    assert store.has(ident) and store.path(ident).read_bytes() == data
    assert store.list() == [{"id": ident, "size": len(data), "complete": True, "chunks": 3, "have": 3}]
    assert store.read_chunk(ident, 2) == data[2 * MB:]
    assert store.read_chunk(ident, 3) is None
    assert not store.has("0" * 64) and not store.has("nonsense")
    with pytest.raises(KeyError):
        store.path("0" * 64)
    # a second store on the same directory (another process: the CLI) sees it
    assert ArtifactStore(tmp_path / "s", 8 * MB).has(ident)


def test_store_limits_and_bad_paths(tmp_path):
    store = ArtifactStore(tmp_path / "s", MB)
    with pytest.raises(ArtifactError, match="limit"):
        store.add_bytes(b"x" * (MB + 1))
    big = tmp_path / "big"
    big.write_bytes(b"x" * (MB + 1))
    with pytest.raises(ArtifactError, match="limit"):
        store.add_file(big)
    with pytest.raises(ArtifactError, match="cannot read"):
        store.add_file(tmp_path / "missing")
    with pytest.raises(ArtifactError, match="not a regular file"):
        store.add_file(tmp_path)
    assert not list((tmp_path / "s" / "tmp").iterdir())  # no staging files left behind
    data = os.urandom(2 * MB)
    manifest = Manifest(len(data), (leaf_hash(data[:MB]), leaf_hash(data[MB:])))
    with pytest.raises(ArtifactError, match="over the limit"):
        store.open_partial(manifest)


def manifest_of(data):
    return Manifest(len(data), tuple(leaf_hash(data[i:i + MB]) for i in range(0, max(len(data), 1), MB)))


def test_partial_resumes_after_restart_and_completes_atomically(tmp_path):
    data = os.urandom(4 * MB + 1)
    manifest = manifest_of(data)
    store = ArtifactStore(tmp_path, 16 * MB)
    partial = store.open_partial(manifest)
    with pytest.raises(ArtifactError, match="already being downloaded"):
        store.open_partial(manifest)
    for index in (0, 2, 4):
        partial.write_chunk(index, data[index * MB:(index + 1) * MB])
    with pytest.raises(ArtifactError):
        partial.write_chunk(1, b"x" * MB)   # hashed unless the caller says it checked
    assert not store.has(manifest.id)
    assert store.read_chunk(manifest.id, 2) == data[2 * MB:3 * MB]   # partial chunks are served
    assert store.read_chunk(manifest.id, 1) is None
    store.release_partial(partial)
    # "restart": a new store object on the same directory
    store = ArtifactStore(tmp_path, 16 * MB)
    assert store.list() == [{"id": manifest.id, "size": len(data), "complete": False, "chunks": 5, "have": 3}]
    partial = store.open_partial(store.manifest(manifest.id))
    assert partial.missing() == [1, 3] and partial.done_bytes == 2 * MB + 1
    with pytest.raises(ArtifactError, match="misses"):
        partial.complete()
    for index in (1, 3):
        partial.write_chunk(index, data[index * MB:(index + 1) * MB])
    path = partial.complete()
    assert path.read_bytes() == data and store.has(manifest.id) and store.verify(manifest.id)
    assert not list((tmp_path / "partial").iterdir())


def test_partial_rehashes_claimed_chunks_and_survives_a_damaged_bitmap(tmp_path):
    data = os.urandom(3 * MB)
    manifest = manifest_of(data)
    store = ArtifactStore(tmp_path, 16 * MB)
    partial = store.open_partial(manifest)
    partial.write_chunk(0, data[:MB])
    partial.write_chunk(1, data[MB:2 * MB])
    store.release_partial(partial)
    with open(partial.data_path, "r+b") as f:   # a crash left chunk 1 half written
        f.seek(MB + 10)
        f.write(b"\0" * 100)
    partial = store.open_partial(manifest)
    assert partial.missing() == [1, 2]
    store.release_partial(partial)
    partial.have_path.write_bytes(b"\x07garbage-of-the-wrong-length")
    partial = store.open_partial(manifest)
    assert partial.missing() == [0, 1, 2]
    store.release_partial(partial)
    partial.data_path.unlink()  # data file gone: starts again, no crash
    partial = store.open_partial(manifest)
    assert partial.missing() == [0, 1, 2]
    store.release_partial(partial)


def test_corrupt_complete_file_is_detected_and_demoted_to_partial(tmp_path):
    store = ArtifactStore(tmp_path, 16 * MB)
    data = os.urandom(3 * MB)
    ident = store.add_bytes(data)
    with open(store.object_path(ident), "r+b") as f:
        f.seek(MB + 1)
        f.write(b"\xff\xfe")
    assert store.read_chunk(ident, 0) == data[:MB]
    assert store.read_chunk(ident, 1) is None   # detected when served
    assert not store.has(ident)
    (item,) = store.list()
    assert item["complete"] is False
    partial = store.open_partial(store.manifest(ident))
    assert partial.missing() == [1]
    partial.write_chunk(1, data[MB:2 * MB])
    partial.complete()
    assert store.has(ident) and store.verify(ident)


def test_verify_finds_corruption_and_truncation(tmp_path):
    store = ArtifactStore(tmp_path, 16 * MB)
    ident = store.add_bytes(os.urandom(2 * MB))
    with open(store.object_path(ident), "r+b") as f:
        f.seek(5)
        f.write(b"!")
    assert store.has(ident) and not store.verify(ident) and not store.has(ident)
    other = store.add_bytes(os.urandom(MB + 3))
    with open(store.object_path(other), "r+b") as f:
        f.truncate(MB)
    assert not store.has(other)   # wrong size: not complete


def test_corrupt_manifest_file_is_discarded(tmp_path):
    store = ArtifactStore(tmp_path, 16 * MB)
    ident = store.add_bytes(os.urandom(MB + 1))
    (tmp_path / "manifests" / ident).write_bytes(b"not a manifest")
    fresh = ArtifactStore(tmp_path, 16 * MB)
    assert fresh.manifest(ident) is None and not fresh.has(ident)
    assert not (tmp_path / "manifests" / ident).exists()
    assert fresh.list() == []


def test_artifacts_config_section_sets_the_limits():
    from node.artifacts import ArtifactLimits
    from node.config import ConfigError, load_config

    config = load_config(None, env={"DEKUBE_ARTIFACTS_MAX_SIZE_MB": "16"},
                         overrides={("artifacts", "max_uploads_per_peer"): "2", ("artifacts", "window_chunks"): "6"})
    limits = ArtifactLimits.from_config(config["artifacts"])
    assert (limits.max_size, limits.max_uploads_per_peer, limits.window_chunks) == (16 << 20, 2, 6)
    assert ArtifactLimits.from_config(load_config(None, env={})["artifacts"]) == ArtifactLimits()
    with pytest.raises(ConfigError, match="max_uploads"):
        load_config(None, env={}, overrides={("artifacts", "max_uploads"): "0"})


def test_stale_staging_files_are_cleared_fresh_ones_kept(tmp_path):
    store = ArtifactStore(tmp_path, MB)
    old, fresh = tmp_path / "tmp" / "old", tmp_path / "tmp" / "fresh"
    old.write_bytes(b"x")
    fresh.write_bytes(b"y")
    os.utime(old, (1, 1))
    store.clear_stale_tmp()
    assert not old.exists() and fresh.exists()
