"""Committee hops: how a node that trusts only the genesis committee learns every later committee.

One block before an epoch ends (height ``S - 1``, ``S`` a multiple of ``epoch_length``) the ledger
elects the committee for heights from ``S + 1`` and wraps that block's app hash around it
(``apphash.committee_app_hash``); block ``S``, which the outgoing committee certifies, carries that
app hash in its header. Where the elected committee differs from the sitting one, the node keeps a
hop record (docs/adr/0216)::

    encode([S, block S, certificate of block S, chain_part, committee, state_root])

(``chain_part`` the ``next_app_hash`` of block ``S - 1``; ``state_root`` empty, or the state root
where ``S - 1`` is itself a snapshot height, i.e. ``epoch_length`` 1). ``verify_hop`` accepts a record
when the block's precommits carry more than a third of the power of the committee the joiner trusts
at that height (at least one honest member signed it, so it is the chain's block: the same trust
rule as a snapshot's anchor) and the header's app hash is the one the record's parts rebuild; the
committee it names then decides from ``S + 1``. Between hops the committee does not change, so a
chain of hops from genesis gives the committee of any height. Everything here is pure and bounded.
"""
from __future__ import annotations

from consensus.block import Block, BlockError
from consensus.certificate import MAX_CERTIFICATE_BYTES, CertificateError, decode_certificate
from consensus.committee import ValidatorSet
from consensus.encoding import EncodingError, decode, encode
from consensus.messages import MAX_PROPOSAL_VALUE_BYTES, Vote, VoteType, value_id, verify_vote
from consensus.state.apphash import committee_app_hash
from consensus.state.snapshot import snapshot_app_hash

MAX_COMMITTEE_BYTES = 256 * 1024
MAX_HOP_BYTES = MAX_PROPOSAL_VALUE_BYTES + MAX_CERTIFICATE_BYTES + MAX_COMMITTEE_BYTES + 1024
MAX_HOPS = 1 << 16          # hops a joiner follows at most (a committee change every epoch for years)
HOP_LIST_PAGE = 1024        # hop heights in one answer


class HopError(ValueError):
    """A hop record is malformed, or not certified by the trusted committee, or does not rebuild the
    app hash its block carries."""


def trusted_power(trusted: ValidatorSet, chain_id: str, height: int, vid: bytes, votes) -> int:
    """The power of ``trusted`` members with a valid precommit for ``vid`` at ``height`` in ``votes``."""
    seen: set[str] = set()
    power = 0
    for vote in votes:
        if not isinstance(vote, Vote) or vote.type is not VoteType.PRECOMMIT or vote.height != height \
                or vote.value_id != vid or vote.validator in seen or vote.validator not in trusted:
            continue
        if verify_vote(vote, chain_id):
            seen.add(vote.validator)
            power += trusted.power(vote.validator)
    return power


def encode_hop(height: int, block: bytes, certificate: bytes, proof: list) -> bytes:
    """A hop record from block ``height``, its certificate and the ledger's proof of block ``height - 1``
    (``BlockResult.committee_proof``: ``[chain_part, committee, state_root]``)."""
    chain_part, committee, root = proof
    return encode([height, block, certificate, chain_part, committee, root])


def verify_hop(chain_id: str, epoch_length: int, trusted: ValidatorSet, height: int, raw: bytes) -> ValidatorSet:
    """The committee (from ``height + 1``) the hop record ``raw`` of ``height`` proves, given the
    committee ``trusted`` at ``height``; raise HopError saying what is wrong."""
    if len(raw) > MAX_HOP_BYTES:
        raise HopError(f"hop record of {len(raw)} bytes exceeds {MAX_HOP_BYTES}")
    try:
        obj = decode(raw, max_size=MAX_HOP_BYTES)
    except EncodingError as exc:
        raise HopError(f"malformed hop record: {exc}") from None
    if type(obj) is not list or len(obj) != 6:
        raise HopError("a hop record is a list of 6 fields")
    got_height, block_raw, cert_raw, chain_part, members, root = obj
    if got_height != height or type(height) is not int or height < 1 or height % epoch_length:
        raise HopError(f"hop record of height {got_height!r} when asked for {height} (an epoch's last block)")
    if type(block_raw) is not bytes or type(cert_raw) is not bytes or type(chain_part) is not bytes \
            or type(root) is not bytes or len(chain_part) != 32 or len(root) not in (0, 32):
        raise HopError("hop record fields have the wrong types")
    try:
        block = Block.decode(block_raw, MAX_PROPOSAL_VALUE_BYTES)
        votes = decode_certificate(cert_raw)
        committee = ValidatorSet.of(members, height + 1)
    except (BlockError, CertificateError, ValueError, TypeError) as exc:
        raise HopError(f"hop record of height {height} unreadable: {exc}") from None
    if block.header.height != height or block.header.chain_id != chain_id:
        raise HopError(f"hop record carries block {block.header.height} of chain {block.header.chain_id!r}")
    power = trusted_power(trusted, chain_id, height, value_id(block_raw), votes)
    if not trusted.is_one_third(power):
        raise HopError(f"block {height} of the hop is not signed by a third of the trusted committee's power "
                       f"({power} of {trusted.total_power})")
    app_hash = committee_app_hash(chain_part, members, height + 1)
    if root:
        app_hash = snapshot_app_hash(app_hash, root)
    if app_hash != block.header.app_hash:
        raise HopError(f"the committee of hop {height} does not rebuild the app hash block {height} carries")
    return committee
