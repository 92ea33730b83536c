"""The validity check of a proposed block, shared by the validator role and the consensus simulator.

``check_proposed_block`` decodes a proposal value and accepts it only if the ledger would apply it,
its proposer is a committee member, its time is not too far ahead of ``now_ms``, and its
``last_commit`` certifies the previous block (block 1 carries none). It raises BlockError or
CertificateError with the reason; it never touches storage or the network.
"""
from __future__ import annotations

from collections.abc import Callable

from consensus.block import Block, BlockError
from consensus.committee import ValidatorSet
from consensus.messages import MAX_PROPOSAL_VALUE_BYTES, Vote
from consensus.state.ledger import Ledger
from consensus.validator.chainstore import decode_certificate

MAX_FUTURE_BLOCK_MS = 10_000


def check_proposed_block(value: bytes, height: int, *, ledger: Ledger, committee: ValidatorSet,
                         prev_committee: ValidatorSet | None, chain_id: str, last_value_id: bytes,
                         now_ms: int, verifier: Callable[[Vote], bool] | None = None) -> Block:
    """The decoded block of ``value`` if it is a valid proposal for ``height``, else raise."""
    block = Block.decode(value, MAX_PROPOSAL_VALUE_BYTES)
    ledger.validate_block(block)
    if block.header.proposer not in committee:
        raise BlockError("proposer is not in the committee")
    if block.header.time_ms > now_ms + MAX_FUTURE_BLOCK_MS:
        raise BlockError("block time is too far in the future")
    if height > 1:
        votes = decode_certificate(block.last_commit)
        certifiers = prev_committee or committee
        if not certifiers.verify_commit(chain_id, height - 1, last_value_id, votes, verifier):
            raise BlockError("last_commit is not a valid certificate of the previous block")
    elif block.last_commit:
        raise BlockError("block 1 has no previous block to certify")
    return block
