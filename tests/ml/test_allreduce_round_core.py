"""The sans-I/O round core (ml/allreduce/round_core.py): attempts, VIEW agreement, adoption."""
import pytest

from ml.allreduce.round_core import (
    AllReduceError,
    AwaitResult,
    AwaitViews,
    CommitRound,
    Committed,
    CommittedRounds,
    ExcludedFromRound,
    FailRound,
    RoundCore,
    SendView,
    StartAttempt,
    next_rates,
)

PEERS = ["a", "b", "c", "d"]


def _core(me="a", **kw):
    core = RoundCore(me, PEERS, 7, "shape", **kw)
    assert core.start() == [StartAttempt(0, tuple(PEERS))]
    return core


def _view(alive, why=None, shape="shape"):
    return set(alive), dict(why or {}), shape


def test_a_successful_attempt_commits_over_its_members():
    core = _core()
    [commit] = core.attempt_succeeded("result", {"a": 5.0})
    assert isinstance(commit, CommitRound) and core.done
    assert commit.committed.participants == tuple(PEERS) and commit.committed.result == "result"
    assert commit.committed.attempt == 0 and commit.committed.rates == {"a": 5.0}
    with pytest.raises(RuntimeError):
        core.attempt_succeeded("again")


def test_failed_attempt_exchanges_views_then_retries_without_the_suspect():
    core = _core()
    actions = core.attempt_failed({"d": "stalled"})
    assert [a for a in actions if isinstance(a, SendView)] == [
        SendView(m, 0, ("a", "b", "c"), {"d": "stalled"}) for m in ("b", "c", "d")]
    assert actions[-1] == AwaitViews(0, ("b", "c", "d"))
    assert core.view_received("b", 0, _view("abcd")) == []
    assert core.view_received("b", 0, _view("abcd")) == []  # a duplicate changes nothing
    assert core.view_received("c", 1, _view("abc")) == []   # another attempt's view is ignored
    assert core.view_received("c", 0, _view("abc", {"d": "NaN"})) == []
    assert core.view_missing("d", 0, "stalled") == [StartAttempt(1, ("a", "b", "c"))]
    assert core.excluded == {"d": "stalled"}
    [commit] = core.attempt_succeeded("r")
    assert commit.committed.participants == ("a", "b", "c") and commit.committed.excluded == {"d": "stalled"}


def test_a_plan_mismatch_narrows_this_members_view_to_theirs():
    core = _core()
    actions = core.attempt_failed({}, their_members=["a", "b", "c"])
    assert actions[0].alive == ("a", "b", "c")


def _left_out(core):
    core.attempt_failed({"c": "stalled"})
    core.view_received("b", 0, _view("bcd", {"a": "link to a failed"}))
    core.view_received("c", 0, _view("bcd", {"a": "link to a failed"}))
    return core.view_received("d", 0, _view("bcd", {"a": "link to a failed"}))


def test_a_live_member_the_others_left_out_asks_them_for_their_result_with_its_view_again():
    """docs/adr/0242: a member with a contribution, dropped by the others (its link failed for a moment),
    is not done: it asks the members that go on for their result with the VIEW it sent."""
    core = _core()
    [wait] = _left_out(core)
    # to every other peer, as a VIEW of an attempt no round runs (never taken for its view of attempt 0)
    assert wait == AwaitResult(core.max_attempts, ("b", "c", "d"), ("a", "b", "d"), {"c": "stalled"})
    assert not core.done and isinstance(core.shut_out, ExcludedFromRound) and core.shut_out.reason == "link to a failed"
    with pytest.raises(RuntimeError):
        core.attempt_succeeded("its own")     # it runs no attempt of its own now
    assert core.view_received("b", 1, _view("bcd")) == []


def test_a_left_out_member_adopts_the_others_result_without_its_contribution():
    core = _core()
    _left_out(core)
    theirs = Committed(1, ("b", "c", "d"), {"a": "link to a failed"}, "mean of b, c, d")
    [commit] = core.adopted("b", theirs)
    assert isinstance(commit, CommitRound) and core.done and commit.committed.participants == ("b", "c", "d")


def test_a_left_out_member_that_gets_no_result_fails_with_the_others_reason():
    core = _core()
    _left_out(core)
    core.distrust("c")
    assert not core.may_adopt("c") and core.may_adopt("d")
    [fail] = core.gave_up()
    assert isinstance(fail, FailRound) and isinstance(fail.error, ExcludedFromRound)
    assert fail.error.reason == "link to a failed" and core.done
    with pytest.raises(RuntimeError):
        core.gave_up()


def test_a_member_still_in_the_round_cannot_give_up_on_a_result():
    with pytest.raises(RuntimeError):
        _core().gave_up()


def test_a_member_with_another_tensor_layout_has_no_use_for_the_others_result():
    core = _core()
    core.attempt_failed({})
    for m in "bcd":
        actions = core.view_received(m, 0, _view("bcd", {"a": "wrong-shape contribution"}, shape="theirs"))
    [fail] = actions
    assert isinstance(fail.error, ExcludedFromRound) and core.done


def test_a_local_fault_leaves_the_round():
    """A member left out for its own fault has nothing the others' result would be the mean without."""
    core = _core(fault="non-finite values")
    core.attempt_failed({"a": core.fault})
    for m in "bcd":
        actions = core.view_received(m, 0, _view("bcd", {"a": "non-finite values"}))
    assert isinstance(actions[0].error, ExcludedFromRound) and core.shut_out is None


def test_too_few_members_fail_the_round_once_no_result_came_from_the_others():
    """Left with too few (its own links may be what failed), a live member asks the others for a result
    first (docs/adr/0242); the round fails when none came."""
    core = _core(min_participants=3)
    core.attempt_failed({"c": "x", "d": "y"})
    core.view_received("b", 0, _view("ab"))
    core.view_missing("c", 0, "gone")
    [wait] = core.view_missing("d", 0, "gone")
    assert isinstance(wait, AwaitResult) and wait.members == ("b", "c", "d")
    [fail] = core.gave_up()
    assert type(fail.error) is AllReduceError and "only 2 members left" in str(fail.error)


def test_a_member_whose_links_all_failed_adopts_what_the_others_committed_without_it():
    core = _core()
    core.attempt_failed({"b": "link failed", "c": "link failed", "d": "link failed"})
    for m in "bcd":
        actions = core.view_missing(m, 0, "link failed")
    [wait] = actions
    assert isinstance(wait, AwaitResult) and type(core.shut_out) is AllReduceError
    [commit] = core.adopted("c", Committed(1, ("b", "c", "d"), {"a": "link failed"}, "mean of b, c, d"))
    assert commit.committed.participants == ("b", "c", "d") and core.done


def test_attempts_are_bounded():
    core = RoundCore("a", ["a", "b"], 1, "shape")
    actions = core.start()
    for _ in range(10):
        if isinstance(actions[-1], FailRound):
            break
        core.attempt_failed({})
        actions = core.view_received("b", core.attempt, _view("ab"))
    assert isinstance(actions[-1], FailRound) and "no agreement after 4 attempts" in str(actions[-1].error)


def test_adoption_is_refused_from_distrusted_members_and_after_the_round_ends():
    core = _core()
    core.distrust("c")
    assert not core.may_adopt("c") and not core.may_adopt("a") and core.may_adopt("b")
    with pytest.raises(RuntimeError):
        core.adopted("c", Committed(0, ("a", "b"), {}, "x"))
    core.attempt_failed({"c": "bad data"})
    pushed = Committed(1, ("a", "b", "d"), {"c": "bad"}, "theirs")
    assert core.adopted("b", pushed) == [CommitRound(pushed)]
    assert core.done and not core.in_view_exchange and not core.may_adopt("d")
    assert core.view_received("b", 0, _view("abcd")) == []


def test_committed_rounds_push_once_per_peer_and_keep_the_last_two():
    rounds = CommittedRounds("a")
    committed = Committed(1, ("a", "b"), {}, "r")
    rounds.remember(5, committed)
    assert rounds.claim_push(5, "b") is committed
    assert rounds.claim_push(5, "b") is None and rounds.claim_push(5, "a") is None
    assert rounds.claim_push(4, "b") is None
    rounds.remember(6, committed)
    rounds.remember(7, committed)
    assert rounds.get(5) is None and rounds.get(6) is committed
    assert CommittedRounds.asks_for_result(committed, is_view=True, is_part=False, attempt=0)
    assert CommittedRounds.asks_for_result(committed, is_view=False, is_part=True, attempt=2)
    assert not CommittedRounds.asks_for_result(committed, is_view=False, is_part=True, attempt=1)


def test_next_rates():
    everyone = Committed(0, ("a", "b"), {}, None, {"a": 100.0, "b": 300.0})
    assert next_rates({"a": 200.0}, ["a", "b"], everyone) == {"a": 150, "b": 300.0}
    assert next_rates({"a": 200.0}, ["a", "b"], Committed(0, ("a", "b"), {}, None)) == {"a": 200.0}
    assert next_rates({"a": 200.0}, ["a", "b", "c"], everyone) == {}
    assert next_rates({"a": 200.0}, ["a", "b"], None) == {}


def test_group_ends_an_attempt_on_a_first_chunk_of_another_plan_in_any_slot():
    """ADR 0117: a PART under a shard this peer does not reduce still reveals a diverged plan."""
    import asyncio

    import torch

    from ml.allreduce.attempt import PlanMismatch
    from ml.allreduce.attempt_runner import Contribution
    from ml.allreduce.butterfly import run_butterfly
    from ml.allreduce.group import AllReduceGroup
    from ml.allreduce.wire import Frame, Kind, members_mask

    class NoTransport:
        def set_handler(self, protocol, handler):
            pass

        async def open_stream(self, peer, protocol):
            raise ConnectionError("not used")

    async def scenario():
        group = AllReduceGroup(NoTransport(), "a", PEERS, chunk_numel=256)
        contribution = Contribution(torch.zeros(1024), [(1024,)], run_butterfly, group._codec, "fp32")
        ctx = group._context(contribution, PEERS, "shape", 3, 1)
        group._runner.ctx = ctx
        group._runner.misplanned = asyncio.get_running_loop().create_future()
        theirs = {"plan": "another", "shape": "shape", "m": members_mask(["a", "b", "c"], PEERS)}
        group._on_frame("b", Frame(Kind.PART, 3, 1, 2, 1, {}, b"x"))   # not a first chunk: ignored
        group._on_frame("b", Frame(Kind.PART, 3, 0, 2, 0, theirs, b"x"))  # an earlier attempt: ignored
        assert not group._runner.misplanned.done()
        group._on_frame("b", Frame(Kind.PART, 3, 1, 2, 0, theirs, b"x"))  # slot 2: not a's shard
        error = group._runner.misplanned.result()
        assert isinstance(error, PlanMismatch) and error.peer == "b" and error.members == ["a", "b", "c"]
        group._io.pool.shutdown()

    asyncio.run(scenario())
