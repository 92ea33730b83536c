"""The scoped admission policy alone (node/admission.py, ADR 0186): prefixes, per-peer caps, the
unknown pool's fair eviction, reserved capacity for staked/business/committee peers."""
import pytest

from node.admission import PeerClass, PeerClasses, Pool, PoolLimits, address_prefix


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 1.0
        return self.t


def pool(**kw):
    limits = dict(total=8, per_peer=4, unknown_pool=6, per_prefix=4)
    limits.update(kw)
    return Pool(PoolLimits(**limits), Clock())


def test_prefixes():
    assert address_prefix("127.0.0.9") == address_prefix("127.0.0.1") == "127.0.0.0/24"
    assert address_prefix("127.0.1.1") != address_prefix("127.0.0.1")
    assert address_prefix("10.9.8.7", ipv4_bits=16) == "10.9.0.0/16"
    assert address_prefix("2001:db8:1:2::5") == address_prefix("2001:db8:1:ffff::1") == "2001:db8:1::/48"
    assert address_prefix("::ffff:192.168.1.7") == "192.168.1.0/24"
    assert address_prefix("relay-peer") == "relay-peer"
    with pytest.raises(ValueError):
        PoolLimits(total=4, per_peer=1, unknown_pool=5, per_prefix=1)


def test_per_peer_cap_refuses_the_peer_itself():
    p = pool()
    for i in range(4):
        assert p.admit(i, "a", "10.0.0.1").admitted
    d = p.admit(9, "a", "10.0.0.1")
    assert not d.admitted and "per peer" in d.reason and len(p) == 4


def test_full_prefix_evicts_its_own_most_represented_idlest():
    p = pool(per_peer=8)
    for i in range(3):
        p.admit(("x", i), "x", "10.0.0.2")
    p.admit("honest-old", "h", "10.0.0.1")
    p.touch(("x", 0))                                    # x0 active again: x1 is now idlest of x
    d = p.admit("new", "n", "10.0.0.3")                  # the /24 holds 4 = per_prefix
    assert d.admitted and d.evict == (("x", 1),)         # x (3 slots) before the honest one-slot peer
    assert "honest-old" in p and "new" in p and ("x", 1) not in p


def test_full_unknown_pool_evicts_from_most_represented_prefix_not_the_newcomers():
    p = pool(per_peer=8, per_prefix=6)
    for i in range(4):
        p.admit(("flood", i), f"f{i}", f"10.0.0.{i + 2}")   # 4 peers in one /24
    p.admit("b", "b", "10.0.1.1")
    p.admit("c", "c", "10.0.2.1")                           # unknown pool (6) full
    d = p.admit("d", "d", "10.0.2.2")
    assert d.admitted and d.evict == (("flood", 0),)        # the idlest of the crowded /24
    assert {"b", "c", "d"} <= {h.key for h in p.holders()}


def test_busy_holders_are_never_evicted_and_then_newcomers_are_refused():
    p = pool(total=2, unknown_pool=2, per_prefix=2)
    p.admit(1, "a", "10.0.0.1")
    p.admit(2, "b", "10.0.0.2")
    p.set_busy(1, True)
    p.set_busy(2, True)
    d = p.admit(3, "c", "10.0.0.3")
    assert not d.admitted and "evictable" in d.reason
    p.set_busy(2, False)
    assert p.admit(3, "c", "10.0.0.3").evict == (2,)


def test_reserved_capacity_for_staked_business_and_committee():
    p = pool(total=6, unknown_pool=3, per_prefix=3, per_peer=8)
    for i in range(3):
        assert p.admit(("u", i), f"u{i}", f"10.{i}.0.1").admitted
    # unknown pool full: a fourth unknown peer evicts an unknown, reserved slots stay free
    assert p.admit("u3", "u3", "10.9.0.1").evict == (("u", 0),)
    assert p.count(cls=PeerClass.UNKNOWN) == 3 and len(p) == 3
    assert p.admit("s", "s", "10.0.0.9", PeerClass.STAKED).evict == ()
    assert p.admit("b", "b", "10.0.0.8", PeerClass.BUSINESS).evict == ()
    assert p.admit("s2", "s2", "10.0.0.7", PeerClass.STAKED).evict == ()   # total reached
    d = p.admit("b2", "b2", "10.0.0.6", PeerClass.BUSINESS)               # evicts an unknown first
    assert d.admitted and p.count(cls=PeerClass.UNKNOWN) == 2
    for i in range(2):
        p.admit(f"bb{i}", f"bb{i}", "10.0.0.5", PeerClass.BUSINESS)
    assert p.count(cls=PeerClass.UNKNOWN) == 0
    d = p.admit("b9", "b9", "10.0.0.4", PeerClass.BUSINESS)               # then the idlest staked
    assert d.evict == ("s",)
    d = p.admit("late", "late", "10.0.0.3", PeerClass.UNKNOWN)            # unknown never evicts a higher class
    assert not d.admitted
    assert p.admit("b10", "b10", "10.0.0.3", PeerClass.BUSINESS).evict == ("s2",)
    assert not p.admit("b11", "b11", "10.0.0.3", PeerClass.BUSINESS).admitted  # all business: full
    p.release("b10")
    p.admit("s2", "s2", "10.0.0.7", PeerClass.STAKED)
    for i in range(3):                                                     # committee always gets through
        d = p.admit(("v", i), f"v{i}", "10.0.0.2", PeerClass.COMMITTEE)
        assert d.admitted
    assert len(p) == 6 and p.count(cls=PeerClass.COMMITTEE) == 3         # evicting lower classes
    for h in p.holders():
        p.set_busy(h.key, True)
    assert p.admit(("v", 3), "v3", "10.0.0.2", PeerClass.COMMITTEE).evict == ()   # past total
    assert len(p) == 7
    assert not p.admit("b11", "b11", "10.0.0.1", PeerClass.BUSINESS).admitted


def test_release_touch_and_idle_listing():
    p = pool()
    p.admit("a", "a", "10.0.0.1")
    p.admit("b", "b", "10.0.0.2")
    now = p.clock()                                      # 3.0: a at 1, b at 2
    assert p.idle_since(now, 1.5) == ["a"]
    p.touch("a")
    assert p.idle_since(p.clock(), 1.5) == ["b"]
    assert p.release("a") and not p.release("a")
    with pytest.raises(ValueError):
        p.admit("b", "b", "10.0.0.2")


def test_peer_classes_take_the_highest_tag():
    c = PeerClasses()
    c.set_tag("staked", PeerClass.STAKED, ["a", "b"])
    c.set_tag("crew:t1", PeerClass.BUSINESS, ["b"])
    assert (c.class_of("a"), c.class_of("b"), c.class_of("z")) == (PeerClass.STAKED, PeerClass.BUSINESS,
                                                                    PeerClass.UNKNOWN)
    c.set_tag("crew:t1", PeerClass.BUSINESS, [])
    assert c.class_of("b") == PeerClass.STAKED


def test_young_holders_are_evicted_only_when_over_represented():
    p = pool(total=4, unknown_pool=4, per_prefix=4, per_peer=4, grace=100.0)  # nothing goes stale here
    p.admit("a1", "a", "10.0.0.1")
    p.admit("a2", "a", "10.0.0.1")
    p.admit("b", "b", "10.0.1.1")
    p.admit("c", "c", "10.0.2.1")
    assert p.admit("h", "h", "10.0.3.1").evict == ("a1",)   # a holds 2 > 0 + 1
    # now every peer holds one; a's prefix was admitted twice recently (ADR 0197), so a newcomer from a
    # quiet prefix takes its slot, never the young honest holder's (its prefix only admitted itself)
    assert p.admit("x", "x", "10.0.4.1").evict == ("a2",)
    # every prefix has admitted just its holder: a reconnecting attacker cannot evict the young honest holder
    d = p.admit("y", "y", "10.0.5.1")
    assert not d.admitted and "h" in p


def test_stale_holders_make_room_and_reconnecting_cannot_churn_forever():
    now = [0.0]
    p = Pool(PoolLimits(total=4, per_peer=1, unknown_pool=4, per_prefix=4, grace=5.0), lambda: now[0])
    for i in range(4):
        now[0] += 1
        p.admit(i, f"f{i}", f"10.0.{i}.1")                 # one each from four prefixes
    now[0] += 10
    assert p.admit("h", "h", "10.9.0.1").evict == (0,)     # the stalest goes
    evicted = 1
    for rounds in range(10):                               # the evicted one comes back, and so on
        d = p.admit(("again", rounds), f"f{rounds}-again", f"10.1{rounds}.0.1")
        if not d.admitted:
            break
        evicted += 1
    assert evicted == 4 and "h" in p                       # only the three stale ones were left to take


def test_a_prefix_that_keeps_being_admitted_loses_its_young_slots_to_a_quiet_one():
    """ADR 0197: recent admissions per prefix, halving every ``churn_half_life``; bounded memory."""
    import node.admission as admission

    now = [0.0]
    p = Pool(PoolLimits(total=2, per_peer=1, unknown_pool=2, per_prefix=2, grace=100.0, churn_half_life=10.0),
             lambda: now[0])
    for i in range(3):                                   # 10.0.0.0/24 reconnects: admitted 3 times
        p.release(("f", i - 1))
        assert p.admit(("f", i), f"f{i}", "10.0.0.1").admitted
    assert p.admit("q", "q", "10.0.1.1").admitted        # a free slot
    assert p.admit("h", "h", "10.0.2.1").evict == (("f", 2),)   # 3 > 0 + 1.5: the churning prefix goes
    assert not p.admit("z", "z", "10.0.3.1").admitted    # the others admitted only their holder: kept
    now[0] = 30.0                                        # three half-lives: 3 admissions count as 0.375
    p.release("h")
    assert p.admit(("f", 3), "f3", "10.0.0.1").admitted
    assert not p.admit("w", "w", "10.0.4.1").admitted    # 1.375 is not 1.5 more than 0
    p.release("q")
    for i in range(admission.MAX_CHURN_PREFIXES + 10):     # one admission from each of many prefixes
        p.release(("m", i - 1))
        assert p.admit(("m", i), f"m{i}", f"11.{i // 256}.{i % 256}.1").admitted
    assert admission.MAX_CHURN_PREFIXES // 2 <= len(p._churn) <= admission.MAX_CHURN_PREFIXES
