"""A worker joins a running crew at an epoch boundary (docs/adr/0226) over the real all-reduce (loopback
TCP, the averager stack a compute node trains through): two members of a three-seat DiLoCo task train the
first epochs, a joiner takes the empty seat from epoch 2 starting from a member's committed state, the
members' gate makes it a member from that epoch's first round, and everyone ends with the same weights;
the joiner's records start at its first segment, from exactly the committed state, and replay."""
import asyncio
import hashlib
from dataclasses import dataclass

from ml.allreduce import TcpTransport
from ml.compute.crew_changes import CrewGate, start_from
from ml.compute.executor import make_group, prepare_trainer
from ml.compute.segment_record import leaves, proof, root, verify_proof
from ml.compute.segment_replay import replay_segment_blobs
from ml.train.segments import MemorySink
from ml.train.spec import TrainSpec
from ml.train.state_file import load_state
from node.identity import Identity

TASK = bytes(range(32))
IDENTITIES = {i.peer_id: i for i in (Identity.from_seed(bytes([n + 1]) * 32) for n in range(3))}
A, B, D = sorted(IDENTITIES)   # seats 0 and 1 train from the start; D takes seat 2 at epoch 2
SPEC = TrainSpec(mode="diloco", steps=30, inner_steps=5, seed=4, codec="int8")   # 6 segments
PER_EPOCH, JOIN_EPOCH = 2, 2


class Committed:
    """The members' commitments are on the ledger at once (the ledger's side has its own tests)."""

    async def wait_committed(self, epoch: int) -> None:
        return None


@dataclass
class LedgerView:
    workers: tuple
    epochs: None = None   # no epoch progress to read: nobody left (test_a_leaver_leaves_the_group has some)
    status: str = "running"

    def first_epoch(self, worker: str) -> int:
        return JOIN_EPOCH if worker == D else 0


async def run_crew():
    transports = {p: TcpTransport(p) for p in (A, B, D)}
    sink, groups = MemorySink(), {}
    joiner_ready = asyncio.Event()
    try:
        addresses = {p: await t.start() for p, t in transports.items()}
        for t in transports.values():
            t.addresses.update(addresses)
        for p in (A, B):
            groups[p] = make_group(SPEC, transports[p], p, [A, B], TASK, identity=IDENTITIES[p])
            await groups[p].start()
        members = {p: prepare_trainer(SPEC, groups[p], seat, 3, sink=sink) for seat, p in enumerate((A, B))}

        async def ready_among(peers, timeout):
            await asyncio.wait_for(joiner_ready.wait(), timeout)
            return list(peers)

        async def read_task():
            return LedgerView((A, B, D))

        gates = {}
        for p, trainer in members.items():
            gates[p] = trainer.recorder.before_segment = CrewGate(p, 0, PER_EPOCH, Committed(), read_task,
                                                                  groups[p], ready_among)

        async def joiner():
            first_segment = JOIN_EPOCH * PER_EPOCH
            while len(members[A].recorder.records) < first_segment:   # until A committed epoch 1's end state
                await asyncio.sleep(0.05)
            digest = members[A].recorder.records[first_segment - 1].state_out
            data = sink.blobs[members[A].recorder.state_artifacts[digest]]
            assert hashlib.sha256(data).hexdigest() == digest
            groups[D] = make_group(SPEC, transports[D], D, [A, B, D], TASK, identity=IDENTITIES[D])
            await groups[D].start()
            trainer = prepare_trainer(SPEC, groups[D], 2, 3, sink=sink)
            start_from(trainer, load_state(data), SPEC.first_step_of_segment(first_segment), first_segment)
            joiner_ready.set()
            await trainer.run()
            return trainer, digest

        *_, (joined, digest) = await asyncio.gather(*(t.run() for t in members.values()), joiner())
        return members, joined, digest, sink, gates
    finally:
        for g in groups.values():
            await g.close()
        for t in transports.values():
            await t.close()


def test_a_joiner_enters_at_an_epoch_boundary_from_the_committed_state_and_the_crew_ends_agreed():
    members, joined, digest, sink, gates = asyncio.run(run_crew())
    assert [r.index for r in joined.recorder.records] == [4, 5]
    assert joined.recorder.records[0].state_in == digest          # exactly the state a member committed
    assert all(gate.joined == {JOIN_EPOCH: [D]} for gate in gates.values())
    assert members[A].params_hash() == members[B].params_hash() == joined.params_hash()
    assert len(members[A].last_participants) == 3                  # the last round had the whole crew
    for record in joined.recorder.records:
        got = replay_segment_blobs(SPEC, 2, 3, record, sink.blobs, None, bytes(32))
        assert got.match, got.first_divergence
    got = replay_segment_blobs(SPEC, 0, 3, members[A].recorder.records[4], sink.blobs, None, bytes(32))
    assert got.match, got.first_divergence
    # the joiner's Merkle leaves start at its first segment: its proofs verify against its root
    leaf_list = leaves(TASK, D, joined.recorder.records)
    record = joined.recorder.records[1]
    assert verify_proof(root(leaf_list), leaf_list[1], record.index - 4, len(leaf_list), proof(leaf_list, 1))


def test_members_wait_longer_for_a_joiner_of_a_bigger_state():
    from ml.compute.crew_changes import JOIN_WAIT_S, join_wait_s
    assert join_wait_s(0) == JOIN_WAIT_S
    assert join_wait_s(1 << 30) == JOIN_WAIT_S + 1024   # a GiB at the least fetch rate the wait allows


def test_a_joiner_that_brings_a_state_of_its_own_is_judged_a_mismatch():
    from types import SimpleNamespace

    from consensus.task_info import TaskInfo
    from ml.compute.verification_flow import _starts_from_crew_state
    committed = ["11" * 32, "ab" * 32, 4, 9]   # A's epoch-1 commitment: state digest ab..
    task = TaskInfo.from_json({"task_id": "22" * 32, "status": "running", "workers": [A, B, "12D3KooWLeft", D],
                               "segments": 6, "spec": {"epochs": 3, "workers": 3},
                               "epochs": {"current": 2, "joined": {D: [2, 2]},
                                          "commits": {A: [["11" * 32, "cd" * 32, 2, 5], committed]}}})
    assert task.first_segment(D) == 4
    assert _starts_from_crew_state(task, D, 4, SimpleNamespace(state_in="ab" * 32))
    assert not _starts_from_crew_state(task, D, 4, SimpleNamespace(state_in="ee" * 32))   # its own state
    assert not _starts_from_crew_state(task, D, 4, SimpleNamespace(state_in="cd" * 32))   # an older epoch's
    assert _starts_from_crew_state(task, D, 5, SimpleNamespace(state_in="ee" * 32))       # later: replayed
    assert _starts_from_crew_state(task, A, 4, SimpleNamespace(state_in="ee" * 32))       # not a joiner


def _task(current, commits, joined=None):
    from consensus.task_info import TaskInfo
    entry = ["11" * 32, "ab" * 32, 1, 1]
    return TaskInfo.from_json({"task_id": TASK.hex(), "status": "running", "spec": {"epochs": 6, "workers": 3},
                               "workers": [A, B, D, *(joined or {})], "segments": 6,
                               "epochs": {"current": current, "joined": joined or {},
                                          "commits": {w: [entry] * n for w, n in commits.items()}}})


def test_a_worker_that_left_by_the_close_of_two_epochs_before_is_out_of_the_group():
    """The group of epoch e drops the workers that had left when epoch e - 2 closed (a fact every member reads
    alike); one that left later stays listed (rounds leave it out) until the next boundary (docs/adr/0230
    review: a dead member no longer costs every round an attempt)."""
    from ml.compute.crew_changes import group_of, group_readable
    task = _task(current=3, commits={A: 3, B: 3, D: 1})   # D committed epoch 0 only: it left at epoch 1's close
    assert group_of(task, 2) == sorted([A, B, D])          # epoch 0 closed with D: still listed at epoch 2
    assert group_of(task, 3) == sorted([A, B])             # epoch 1 closed without it
    assert not group_readable(_task(current=1, commits={A: 2, B: 2, D: 1}), 3)   # epoch 1 not closed yet
    assert group_readable(task, 4) and not group_readable(task, 5)
    spare = "12D3KooWSpare" + "e" * 20
    restarted = _task(current=2, commits={A: 2, B: 2, D: 2}, joined={spare: [2, 2]})   # D's seat restarted at 2
    assert group_of(restarted, 2) == sorted([A, B, spare]) and group_of(restarted, 1) == sorted([A, B, D])


def test_a_member_drops_a_leaver_from_its_group_at_an_epoch_boundary(monkeypatch):
    reads = [_task(current=1, commits={A: 2, B: 2, D: 1}), _task(current=2, commits={A: 2, B: 2, D: 1})]

    class Group:
        peers = sorted([A, B, D])

        def set_peers(self, peers):
            self.peers = sorted(peers)

    async def read_task():
        return reads.pop(0) if len(reads) > 1 else reads[0]

    async def ready_among(peers, timeout):
        return list(peers)

    group = Group()
    gate = CrewGate(A, 0, PER_EPOCH, Committed(), read_task, group, ready_among)
    import ml.compute.crew_changes as crew_changes
    monkeypatch.setattr(crew_changes, "CLOSE_POLL_S", 0.01)
    asyncio.run(gate(3 * PER_EPOCH))   # epoch 3: read once epoch 1 closed (the second read)
    assert group.peers == sorted([A, B]) and gate.left == {3: [D]} and not reads[1:]
