"""ECVRF-EDWARDS25519-SHA512-TAI (consensus/vrf.py) against RFC 9381 Appendix B.3, and the chain's beacon
(consensus/beacon.py): unique per key and input, refused when forged or from another key."""
import pytest
from test_ledger_kit import Chain, ident

from consensus import beacon, vrf
from consensus.block import BlockError, build_block

# RFC 9381 Appendix B.3, examples 16-18 (keys: RFC 8032 section 7.1 tests 1-3)
VECTORS = [
    ("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
     "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "",
     "8657106690b5526245a92b003bb079ccd1a92130477671f6fc01ad16f26f723f26f8a57ccaed74ee1b190bed1f479d97"
     "27d2d0f9b005a6e456a35d4fb0daab1268a1b0db10836d9826a528ca76567805",
     "90cf1df3b703cce59e2a35b925d411164068269d7b2d29f3301c03dd757876ff66b71dda49d2de59d03450451af02679"
     "8e8f81cd2e333de5cdf4f3e140fdd8ae"),
    ("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
     "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", "72",
     "f3141cd382dc42909d19ec5110469e4feae18300e94f304590abdced48aed5933bf0864a62558b3ed7f2fea45c92a465"
     "301b3bbf5e3e54ddf2d935be3b67926da3ef39226bbc355bdc9850112c8f4b02",
     "eb4440665d3891d668e7e0fcaf587f1b4bd7fbfe99d0eb2211ccec90496310eb5e33821bc613efb94db5e5b54c70a848"
     "a0bef4553a41befc57663b56373a5031"),
    ("c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
     "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025", "af82",
     "9bc0f79119cc5604bf02d23b4caede71393cedfbb191434dd016d30177ccbf8096bb474e53895c362d8628ee9f9ea3c0"
     "e52c7a5c691b6c18c9979866568add7a2d41b00b05081ed0f58ee5e31b3a970e",
     "645427e5d00c62a23fb703732fa5d892940935942101e456ecca7bb217c61c452118fec1219202a0edcf038bb6373241"
     "578be7217ba85a2687f7a0310b2df19f"),
]


@pytest.mark.parametrize("sk, pk, alpha, pi, beta", VECTORS)
def test_rfc9381_vectors(sk, pk, alpha, pi, beta):
    sk, pk, alpha = bytes.fromhex(sk), bytes.fromhex(pk), bytes.fromhex(alpha)
    assert vrf.public_key(sk) == pk
    proof = vrf.prove(sk, alpha)
    assert proof.hex() == pi
    assert vrf.verify(pk, alpha, proof).hex() == beta == vrf.proof_to_hash(proof).hex()


@pytest.mark.parametrize("sk, pk, alpha, pi, beta", VECTORS[:1])
def test_tampered_proofs_inputs_and_keys_are_refused(sk, pk, alpha, pi, beta):
    pk, alpha, proof = bytes.fromhex(pk), bytes.fromhex(alpha), bytes.fromhex(pi)
    for index in (0, 31, 32, 47, 48, 79):
        bad = bytearray(proof)
        bad[index] ^= 1
        with pytest.raises(vrf.VrfError):
            vrf.verify(pk, alpha, bytes(bad))
    with pytest.raises(vrf.VrfError):
        vrf.verify(pk, b"other", proof)
    with pytest.raises(vrf.VrfError):
        vrf.verify(bytes.fromhex(VECTORS[1][1]), alpha, proof)
    for junk in (b"", proof[:79], proof + b"\x00", b"\xff" * 80):
        with pytest.raises(vrf.VrfError):
            vrf.verify(pk, alpha, junk)
    with pytest.raises(vrf.VrfError):
        vrf.verify(b"\x00" * 32, alpha, proof)          # not a valid key (small order)


def test_the_ledger_refuses_a_beacon_proof_by_anyone_but_the_proposer():
    chain = Chain()
    led = chain.ledger
    honest = build_block("dekube-test", 1, 1000, b"", led.app_hash, chain.proposer_identity, led.beacon, [])
    forged_header = honest.header.__class__(*honest.header.to_obj()[:9], beacon.prove(ident(7), "dekube-test", 1,
                                                                                      led.beacon))
    with pytest.raises(BlockError, match="beacon proof"):
        led.apply_block(honest.__class__(forged_header, honest.txs, honest.evidence, honest.last_commit))
    before = led.beacon
    led.apply_block(honest)
    assert led.beacon != before and len(led.beacon) == 32
    again = Chain()                                            # another replica: the same beacon, any time
    again.block_ms = 7777
    again.block()
    assert again.ledger.beacon == led.beacon
