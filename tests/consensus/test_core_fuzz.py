"""Property test of the core: random delivery orders, timeouts and a byzantine validator sending
arbitrary signed votes never break agreement, and once the schedule turns fair everyone decides."""
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from consensus.committee import ValidatorSet
from consensus.messages import Vote, VoteType, sign_vote, value_id
from consensus.signer import SignerGuard
from consensus.tendermint import Broadcast, Commit, ScheduleTimeout, TendermintCore
from node.identity import Identity

CHAIN = "fuzz"

IDS = [Identity.from_seed(bytes([90 + i]) * 32) for i in range(4)]
VS = ValidatorSet({ident.peer_id: 10 for ident in IDS})
HONEST, BYZ = IDS[:3], IDS[3]
VALUES = [b"value-" + i.peer_id.encode() for i in IDS] + [b"evil"]


class Cluster:
    def __init__(self):
        self.cores = [TendermintCore(CHAIN, SignerGuard(i), get_value=lambda h, i=i: b"value-" + i.peer_id.encode(),
                                     is_valid=lambda h, v: v != b"evil") for i in HONEST]
        self.pending = []  # (dst, message)
        self.timers = [[] for _ in HONEST]  # (virtual fire time, ScheduleTimeout)
        self.now = 0.0
        self.commits = {}
        for n, core in enumerate(self.cores):
            self.handle(n, core.start_height(0, VS))

    def handle(self, n, outputs):
        for out in outputs:
            if isinstance(out, Broadcast):
                self.pending.extend((d, out.message) for d in range(len(self.cores)) if d != n)
            elif isinstance(out, ScheduleTimeout):
                self.timers[n].append((self.now + out.delay, out))
            elif isinstance(out, Commit):
                self.commits[n] = out.value

    def deliver(self, index):
        dst, message = self.pending.pop(index % len(self.pending))
        self.handle(dst, self.cores[dst].on_message(message))

    def fire(self, n, index):
        when, timer = self.timers[n].pop(index % len(self.timers[n]))
        self.now = max(self.now, when)
        self.handle(n, self.cores[n].on_timeout(timer.step, timer.height, timer.round))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])  # shrinking takes minutes
@given(st.data())
def test_random_schedules_keep_agreement_and_then_decide(data):
    cluster = Cluster()
    for _ in range(data.draw(st.integers(20, 200), label="steps")):
        action = data.draw(st.sampled_from(["deliver", "deliver", "timeout", "byzantine"]))
        if action == "deliver" and cluster.pending:
            cluster.deliver(data.draw(st.integers(0, 10_000)))
        elif action == "timeout":
            n = data.draw(st.integers(0, 2))
            if cluster.timers[n]:
                cluster.fire(n, data.draw(st.integers(0, 10_000)))
        elif action == "byzantine":
            vtype = data.draw(st.sampled_from([VoteType.PREVOTE, VoteType.PRECOMMIT]))
            round_ = data.draw(st.integers(0, 4))
            value = data.draw(st.sampled_from(VALUES + [None]))
            vote = sign_vote(BYZ, CHAIN, Vote(vtype, 0, round_, value_id(value) if value else b"",
                                              BYZ.peer_id))
            dst = data.draw(st.integers(0, 2))
            cluster.handle(dst, cluster.cores[dst].on_message(vote))
        assert len(set(cluster.commits.values())) <= 1
    # the schedule turns fair (after GST): the byzantine goes silent, messages arrive before any
    # timer, timers fire in virtual-time order (they grow each round), and nodes that stall
    # re-send their gossip (reliable gossip)
    gossiped = False
    for _ in range(20_000):
        if len(cluster.commits) == len(cluster.cores):
            break
        if cluster.pending:
            cluster.deliver(0)
        elif not gossiped:
            for n, core in enumerate(cluster.cores):
                cluster.handle(n, [Broadcast(m) for m in core.gossip_messages()])
            gossiped = True
        else:
            live = [(when, n, i) for n, timers in enumerate(cluster.timers)
                    for i, (when, t) in enumerate(timers)
                    if t.round == cluster.cores[n].round and not cluster.cores[n].decided]
            if not live:
                break
            _, n, i = min(live)
            cluster.fire(n, i)
            gossiped = False
    assert len(cluster.commits) == len(cluster.cores)
    assert len(set(cluster.commits.values())) == 1
    assert b"evil" not in cluster.commits.values()
