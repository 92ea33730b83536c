"""Keystore: 0600 atomic writes, strict loading (perms, corruption, format), no silent regeneration."""
import json
import os
import stat

import pytest

from node.identity import Identity
from node.key_encryption import ScryptParams
from node.keystore import (
    KeyFileExists,
    KeystoreError,
    PassphraseRequired,
    is_encrypted,
    load_identity,
    save_identity,
)


def test_round_trip_with_0600(tmp_path):
    ident = Identity.generate()
    path = save_identity(tmp_path / "home" / "node_key.json", ident)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_identity(path).peer_id == ident.peer_id
    assert not [p for p in path.parent.iterdir() if p.name != "node_key.json"], "temporary file left behind"


def test_mode_is_0600_even_with_permissive_umask(tmp_path):
    old = os.umask(0)
    try:
        path = save_identity(tmp_path / "k.json", Identity.generate())
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_refuses_to_overwrite_without_flag(tmp_path):
    path = save_identity(tmp_path / "k.json", Identity.generate())
    original = path.read_bytes()
    with pytest.raises(KeyFileExists, match="--force"):
        save_identity(path, Identity.generate())
    assert path.read_bytes() == original
    replacement = Identity.generate()
    save_identity(path, replacement, overwrite=True)
    assert load_identity(path).peer_id == replacement.peer_id


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o602])
def test_refuses_group_or_other_access(tmp_path, mode):
    path = save_identity(tmp_path / "k.json", Identity.generate())
    os.chmod(path, mode)
    with pytest.raises(KeystoreError) as err:
        load_identity(path)
    assert str(path) in str(err.value) and f"chmod 600 {path}" in str(err.value)


def test_missing_file_is_refused_not_regenerated(tmp_path):
    path = tmp_path / "k.json"
    with pytest.raises(KeystoreError, match="not found.*dekube-node init"):
        load_identity(path)
    assert not path.exists()


def _write(path, data: bytes):
    path.write_bytes(data)
    os.chmod(path, 0o600)
    return path


def _doc(ident=None, **changes):
    ident = ident or Identity.generate()
    doc = {"version": 1, "type": "ed25519", "seed": ident.seed.hex(), "peer_id": ident.peer_id}
    doc.update(changes)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "corrupt or truncated"),
        (_doc()[:40], "corrupt or truncated"),
        (b"\xff\xfe garbage", "corrupt or truncated"),
        (b"[1, 2]", "expected a JSON object"),
        (_doc(version=3), "unknown format version 3"),
        (_doc(version=2), r"missing fields \[.crypto.\]"),
        (_doc(version=True), "unknown format version"),
        (_doc(type="secp256k1"), "unsupported key type"),
        (_doc(seed="zz" * 32), "not hex"),
        (_doc(seed="00" * 31), "64 hex characters"),
        (_doc(peer_id=Identity.generate().peer_id), "records"),
        (_doc(extra=1), "unexpected fields"),
        (b" " * 5000, "too large"),
    ],
)
def test_corrupt_or_unknown_files_are_refused(tmp_path, data, message):
    path = _write(tmp_path / "k.json", data)
    with pytest.raises(KeystoreError, match=message) as err:
        load_identity(path)
    assert str(path) in str(err.value)


def test_flipped_seed_bit_is_detected(tmp_path):
    ident = Identity.generate()
    seed = bytearray(ident.seed)
    seed[5] ^= 0x10
    path = _write(tmp_path / "k.json", _doc(ident, seed=seed.hex()))
    with pytest.raises(KeystoreError, match="corrupt"):
        load_identity(path)


def test_symlink_is_refused(tmp_path):
    real = save_identity(tmp_path / "real.json", Identity.generate())
    link = tmp_path / "link.json"
    link.symlink_to(real)
    with pytest.raises(KeystoreError, match="cannot open"):
        load_identity(link)


# ---- encrypted key files (version 2, docs/adr/0161) -------------------------------------------

FAST = ScryptParams(log2_n=10)   # the stored parameters are what unlocking uses: cheap in tests


def _encrypted(tmp_path, passphrase=b"correct horse"):
    identity = Identity.generate()
    path = save_identity(tmp_path / "key.json", identity, passphrase=passphrase, params=FAST)
    return identity, path


def test_encrypted_key_round_trips_and_hides_the_seed(tmp_path):
    identity, path = _encrypted(tmp_path)
    text = path.read_text()
    assert identity.seed.hex() not in text and json.loads(text)["version"] == 2
    assert is_encrypted(path.read_bytes())
    assert load_identity(path, b"correct horse").peer_id == identity.peer_id
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_encrypted_key_needs_a_passphrase_and_the_right_one(tmp_path):
    _, path = _encrypted(tmp_path)
    with pytest.raises(PassphraseRequired, match="encrypted.*--passphrase-file"):
        load_identity(path)
    with pytest.raises(KeystoreError, match="wrong passphrase"):
        load_identity(path, b"wrong")


def test_passphrase_callable_is_asked_only_for_encrypted_keys(tmp_path):
    asked = []

    def prompt():
        asked.append(1)
        return b"correct horse"

    plain = save_identity(tmp_path / "plain.json", Identity.generate())
    load_identity(plain, prompt)
    assert asked == []
    _, path = _encrypted(tmp_path)
    load_identity(path, prompt)
    assert asked == [1]


@pytest.mark.parametrize("field,value", [("peer_id", Identity.generate().peer_id), ("r", 9), ("salt", "00" * 32)])
def test_tampered_header_or_parameters_fail_authentication(tmp_path, field, value):
    _, path = _encrypted(tmp_path)
    doc = json.loads(path.read_text())
    if field == "peer_id":
        doc["peer_id"] = value
    else:
        doc["crypto"]["kdf"][field] = value
    path.write_text(json.dumps(doc))
    with pytest.raises(KeystoreError, match="wrong passphrase, or the file was altered"):
        load_identity(path, b"correct horse")


@pytest.mark.parametrize("kdf", [{"log2_n": 40}, {"r": 10_000}, {"p": 0}, {"log2_n": "17"}, {"name": "pbkdf2"},
                                 {"salt": "zz"}])
def test_hostile_kdf_parameters_are_refused_before_any_work(tmp_path, kdf):
    _, path = _encrypted(tmp_path)
    doc = json.loads(path.read_text())
    doc["crypto"]["kdf"].update(kdf)
    path.write_text(json.dumps(doc))
    with pytest.raises(KeystoreError, match="corrupt"):
        load_identity(path, b"correct horse")


def test_empty_passphrase_is_refused(tmp_path):
    with pytest.raises(KeystoreError, match="empty passphrase"):
        save_identity(tmp_path / "k.json", Identity.generate(), passphrase=b"", params=FAST)
    assert not (tmp_path / "k.json").exists()
