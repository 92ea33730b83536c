"""Genesis: chain id, initial balances, bonded validators, chain parameters, genesis hash.

A genesis is plain data; ``to_json``/``from_json`` give the file form the testnet writes,
``hash`` is sha256 of its canonical encoding (stored in every database's meta key so a
node never opens another chain's data). ``total_supply`` is what the supply invariant
checks against for the whole life of the chain.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields

from consensus.encoding import encode
from consensus.tx import DEFAULT_FEE
from node.identity import is_valid_peer_id


class GenesisError(ValueError):
    """A genesis document is malformed or inconsistent."""


@dataclass(frozen=True)
class Params:
    committee_size: int = 4              # K: top-K bonded validators form the committee
    epoch_length: int = 100              # blocks between committee re-elections
    unbonding_period: int = 1_200        # blocks before unbonded funds return: > every window (ADR 0188)
    min_validator_stake: int = 1_000
    min_worker_stake: int = 100
    min_verifier_stake: int = 100
    min_fee: int = DEFAULT_FEE           # fee floor; a sender also needs balance >= fee (and > 0), ADR 0135
    max_tx_bytes: int = 16 * 1024
    max_block_bytes: int = 4 * 1024 * 1024
    max_block_txs: int = 20_000
    task_timeout: int = 200              # legacy (ADR 0187: deadlines are in block time): unused, kept so a v1
    audit_window: int = 10               # genesis file keeps its hash; see the *_s params below
    max_tasks_per_worker: int = 1
    verifier_share_bps: int = 500        # of a task's price, split among its verifiers
    relay_share_bps: int = 1_000         # of a task's price, budget for relay receipts
    slash_double_sign_bps: int = 500     # of bonded+unbonding stake, per double-sign evidence
    slash_mismatch_bps: int = 1_000      # of bonded+unbonding stake, per proven mismatch
    evidence_max_age: int = 1_000        # blocks: older double-sign evidence is refused
    # Added after the first genesis files (ADR 0151): hashed only when they differ from their default,
    # so a genesis file written before them keeps its hash (POST_V1_PARAMS).
    task_assign_timeout: int = 300       # legacy (ADR 0187: task_assign_s): unused, kept so genesis files load
    reject_fee: int = 10                 # kept from a rejected task's escrow, split among the rejecting workers
    # Validator standing (ADR 0165): a committee member that misses this many of its proposer slots in a
    # row (its round was decided by a later round's proposer) is jailed and slashed; 0 turns it off.
    downtime_max_missed: int = 50
    slash_downtime_bps: int = 10         # of bonded+unbonding stake, when jailed for downtime
    jail_blocks: int = 500               # a jailed validator may send unjail this many blocks later
    min_relay_stake: int = 100           # a relay's own bonded stake needed for its receipts to be paid
    # Serving (ADR 0174): a server's own bonded stake needed for its receipts to be paid, and the blocks
    # between a client's serve_unlock and its serve_withdraw (servers claim their receipts meanwhile).
    min_serve_stake: int = 100
    serve_unlock_blocks: int = 100
    # Serving disputes (ADR 0176): the least bond a client posts with a fraud claim (lost if referees
    # reject it), the share of a lying server's stake slashed, and what each agreeing referee is paid.
    serve_dispute_bond: int = 100
    slash_serve_bps: int = 1_000
    serve_referee_fee: int = 10
    # A session may be disputed until serve_dispute_window blocks after its last paid receipt was claimed
    # (a session never claimed, which paid its server nothing, any time; ADR 0178).
    serve_dispute_window: int = 1_000
    # A served range announced (or refreshed) at height h counts for discovery and referee draws until
    # h + serve_announce_ttl (ADR 0177); register_node refuses a range already older than that.
    serve_announce_ttl: int = 600
    # Audit slots, disputes and referees (ADRs 0168, 0169).
    audits_per_worker: int = 2           # m: audit slots drawn per committed worker when the commit phase closes
    audit_double_bps: int = 5_000        # chance a slot gets a second verifier (the audit of the auditor)
    audit_answer_blocks: int = 50        # legacy (ADR 0241): unused, kept so genesis files keep loading
    dispute_blocks: int = 20             # legacy (ADR 0187): unused, kept so genesis files keep loading
    referees: int = 3                    # referees drawn for a disputed or split slot
    slash_false_audit_bps: int = 1_000   # of bonded+unbonding stake, per answer the resolved outcome contradicts
    # Task deadlines in block time (ADR 0187), derived from the work the task declares (its spec's
    # expected_s, from the submitter's dry run): seconds of the block header's clock, never block counts.
    deadline_factor_pct: int = 400      # a deadline allows this percentage of the expected work's duration,
    task_slack_s: int = 300             # plus this (fetching inputs, the start barrier, the commit itself)
    task_min_s: int = 600               # the least time workers get from assignment to commit
    task_max_s: int = 2_592_000         # the most (30 days): a task that would need longer is refused at submit
    audit_answer_s: int = 300           # a verifier or referee: its segment's replay (x the factor) plus this
    dispute_s: int = 120                # an audited worker: to dispute a mismatch its verifiers agreed on
    audit_window_s: int = 60            # from the commit phase's close until finalize may pay a task not verified
    task_assign_s: int = 300            # a task waiting this long for workers expires, refunded
    # Trust round 2 (ADR 0188): a slot whose verifiers stay silent is redrawn up to audit_redraws times; a
    # tied or short referee panel is followed by a larger one, up to referee_rounds panels in all; a worker
    # needs bonded stake >= stake_cover_bps/10^4 x its pay / (audits_per_worker x slash_mismatch_bps/10^4).
    audit_redraws: int = 3
    referee_rounds: int = 3
    stake_cover_bps: int = 20_000
    # Draws nobody can steer (ADR 0202): every draw (audit slots, redraws, referees) uses the random beacon of
    # the block beacon_delay blocks after the act that triggers it; verifiers commit to their answers, then
    # reveal them within audit_reveal_s once every verifier of the slot has committed.
    beacon_delay: int = 4                # >= committee_size: the blocks in between have every member as proposer
    audit_reveal_s: int = 120
    # A serving dispute's referees vote within serve_referee_s seconds of block time after their draw (ADR 0241:
    # recomputing a served step is work, and the chain's block rate follows its load).
    serve_referee_s: int = 300
    # Audit overhead (ADR 0212): a task's audits replay audits_per_worker x (1 + audit_double_bps/10^4) of
    # its segments per worker; above max_audit_share_bps of the work, the owner pays the excess on top of
    # the price (an audit surcharge, to the verifier pool): segments that scale with the job avoid it.
    max_audit_share_bps: int = 1_000
    # Bounded state (ADR 0215): a task that ended (consensus/state/records.py TaskStatus.FINAL) is dropped from
    # the ledger state this many seconds of block time after its end, once nothing still refers to it; its
    # id is then remembered as pruned for as long again. 0 keeps every task forever.
    ended_task_retention_s: int = 7 * 86_400
    # A crew that died (ADR 0232): a task whose open epoch's deadline passes with no commitment at all, after
    # at least one closed epoch, restarts that epoch on a new crew at most crew_restarts times (0: it stops).
    crew_restarts: int = 2

    def validate(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if type(value) is not int or value < 0:
                raise GenesisError(f"param {f.name} must be a non-negative integer")
        for name in ("committee_size", "epoch_length", "max_tx_bytes", "max_block_bytes", "max_block_txs",
                     "max_tasks_per_worker", "task_assign_timeout"):
            if getattr(self, name) == 0:
                raise GenesisError(f"param {name} must be positive")
        if self.verifier_share_bps + self.relay_share_bps > 10_000:
            raise GenesisError("verifier_share_bps + relay_share_bps must not exceed 10000")
        if max(self.slash_double_sign_bps, self.slash_mismatch_bps, self.slash_downtime_bps,
               self.slash_false_audit_bps, self.slash_serve_bps) > 10_000:
            raise GenesisError("slash fractions are at most 10000 bps")
        if self.audit_double_bps > 10_000:
            raise GenesisError("audit_double_bps is at most 10000")
        if not 1 <= self.max_audit_share_bps <= 10_000:
            raise GenesisError("max_audit_share_bps must be in 1..10000")
        if self.audits_per_worker > MAX_AUDITS_PER_WORKER:
            raise GenesisError(f"audits_per_worker is at most {MAX_AUDITS_PER_WORKER}")
        if not 1 <= self.referees <= MAX_REFEREES:
            raise GenesisError(f"referees must be in 1..{MAX_REFEREES}")
        for name in ("audit_answer_blocks", "dispute_blocks", "serve_unlock_blocks", "serve_announce_ttl",
                     "serve_dispute_window", "task_min_s", "audit_answer_s", "dispute_s", "task_assign_s",
                     "referee_rounds", "beacon_delay", "audit_reveal_s", "serve_referee_s"):
            if getattr(self, name) == 0:
                raise GenesisError(f"param {name} must be positive")
        if self.deadline_factor_pct < 100:
            raise GenesisError("deadline_factor_pct must be at least 100 (a deadline shorter than the work)")
        if not self.task_min_s <= self.task_max_s <= MAX_DEADLINE_S:
            raise GenesisError(f"task_min_s <= task_max_s <= {MAX_DEADLINE_S} must hold")
        if self.audit_redraws > MAX_AUDIT_REDRAWS or self.referee_rounds > MAX_REFEREE_ROUNDS:
            raise GenesisError(f"audit_redraws is at most {MAX_AUDIT_REDRAWS}, referee_rounds at most "
                               f"{MAX_REFEREE_ROUNDS}")
        if self.ended_task_retention_s > MAX_RETENTION_S:
            raise GenesisError(f"ended_task_retention_s is at most {MAX_RETENTION_S} (0 keeps ended tasks forever)")
        if self.crew_restarts > MAX_CREW_RESTARTS:
            raise GenesisError(f"crew_restarts is at most {MAX_CREW_RESTARTS}")
        if self.beacon_delay > MAX_BEACON_DELAY:
            raise GenesisError(f"beacon_delay is at most {MAX_BEACON_DELAY}")
        window, name = longest_window(self)
        if self.unbonding_period <= window:
            raise GenesisError(f"unbonding_period ({self.unbonding_period}) must exceed the longest window a "
                               f"slash can come in: {name} ({window} blocks; ADR 0188)")


def longest_window(params: Params) -> tuple[int, str]:
    """The longest span counted in blocks between an act and the slash it can bring, with its name:
    double-sign evidence (``evidence_max_age``) and a serving dispute after the last claim
    (``serve_dispute_window``). Unbonded stake must outlast each (ADR 0188). A task's audit windows and a
    serving dispute's referee vote are block times (ADRs 0187, 0241), not block counts: the parties named
    in a task that is not final, or in an open dispute, are held until it ends
    (consensus/state/obligations.py), however long its windows run."""
    windows = {"evidence_max_age": params.evidence_max_age,
               "serve_dispute_window": params.serve_dispute_window}
    name = max(windows, key=lambda key: windows[key])
    return windows[name], name


POST_V1_PARAMS = ("task_assign_timeout", "reject_fee", "downtime_max_missed", "slash_downtime_bps", "jail_blocks",
                  "min_relay_stake", "audits_per_worker", "audit_double_bps", "audit_answer_blocks", "dispute_blocks",
                  "referees", "slash_false_audit_bps", "min_serve_stake", "serve_unlock_blocks", "serve_dispute_bond",
                  "slash_serve_bps", "serve_referee_fee", "serve_announce_ttl", "serve_dispute_window",
                  "deadline_factor_pct", "task_slack_s", "task_min_s", "task_max_s", "audit_answer_s", "dispute_s",
                  "audit_window_s", "task_assign_s", "audit_redraws", "referee_rounds", "stake_cover_bps",
                  "beacon_delay", "audit_reveal_s", "max_audit_share_bps", "ended_task_retention_s",
                  "crew_restarts", "serve_referee_s")
MAX_AUDITS_PER_WORKER = 16
MAX_DEADLINE_S = 366 * 86_400   # no task deadline beyond a year
MAX_AUDIT_REDRAWS = 8
MAX_REFEREE_ROUNDS = 4
MAX_BEACON_DELAY = 16
MAX_RETENTION_S = 100 * 366 * 86_400   # a retention beyond a century is "forever": say 0
MAX_REFEREES = 15
MAX_CREW_RESTARTS = 8   # each restart may hold a task open one more epoch span


def hashed_params(params: Params) -> dict[str, int]:
    """The params as the genesis hash covers them: every v1 param, and each later one only when it
    differs from its default (an old genesis file and the same file with the defaults written out
    are the same chain)."""
    defaults = Params()
    return {name: value for name, value in asdict(params).items()
            if name not in POST_V1_PARAMS or value != getattr(defaults, name)}


@dataclass(frozen=True)
class GenesisValidator:
    peer_id: str
    stake: int
    listen_addrs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Genesis:
    chain_id: str
    genesis_time_ms: int
    balances: dict[str, int] = field(default_factory=dict)
    validators: tuple[GenesisValidator, ...] = ()
    params: Params = field(default_factory=Params)

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        if not isinstance(self.chain_id, str) or not 1 <= len(self.chain_id) <= 64:
            raise GenesisError("chain_id must be 1..64 characters")
        if type(self.genesis_time_ms) is not int or self.genesis_time_ms < 0:
            raise GenesisError("genesis_time_ms must be a non-negative integer")
        for peer_id, amount in self.balances.items():
            if not is_valid_peer_id(peer_id):
                raise GenesisError(f"balance for invalid peer ID {peer_id!r}")
            if type(amount) is not int or amount < 0:
                raise GenesisError(f"balance of {peer_id} must be a non-negative integer")
        seen = set()
        for v in self.validators:
            if not is_valid_peer_id(v.peer_id) or v.peer_id in seen:
                raise GenesisError(f"invalid or duplicate validator {v.peer_id!r}")
            seen.add(v.peer_id)
            if type(v.stake) is not int or v.stake < self.params.min_validator_stake:
                raise GenesisError(f"validator {v.peer_id} stake below min_validator_stake")
        self.params.validate()

    @property
    def total_supply(self) -> int:
        return sum(self.balances.values()) + sum(v.stake for v in self.validators)

    def to_obj(self) -> dict:
        return {
            "chain_id": self.chain_id,
            "genesis_time_ms": self.genesis_time_ms,
            "balances": dict(self.balances),
            "validators": [
                {"peer_id": v.peer_id, "stake": v.stake, "listen_addrs": list(v.listen_addrs)}
                for v in self.validators
            ],
            "params": asdict(self.params),
        }

    @property
    def hash(self) -> bytes:
        hashed = {**self.to_obj(), "params": hashed_params(self.params)}
        return hashlib.sha256(b"dekube/genesis/v1\x00" + encode(hashed)).digest()

    def to_json(self) -> str:
        return json.dumps(self.to_obj(), indent=2, sort_keys=True)

    @classmethod
    def from_obj(cls, obj: dict) -> Genesis:
        try:
            known = {f.name for f in fields(Params)}
            unknown = set(obj.get("params", {})) - known
            if unknown:
                raise GenesisError(f"unknown params {sorted(unknown)}")
            return cls(
                chain_id=obj["chain_id"],
                genesis_time_ms=obj["genesis_time_ms"],
                balances=dict(obj.get("balances", {})),
                validators=tuple(
                    GenesisValidator(v["peer_id"], v["stake"], tuple(v.get("listen_addrs", ())))
                    for v in obj.get("validators", ())
                ),
                params=Params(**obj.get("params", {})),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise GenesisError(f"malformed genesis: {exc}") from None

    @classmethod
    def from_json(cls, text: str) -> Genesis:
        try:
            return cls.from_obj(json.loads(text))
        except json.JSONDecodeError as exc:
            raise GenesisError(f"genesis is not JSON: {exc}") from None
