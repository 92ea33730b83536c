"""Scoped admission that cheap identities cannot exhaust (docs/adr/0186), without I/O.

One policy for every pool a node hands out to strangers: pending inbound handshakes (node/p2p),
websockets (node/rpc), artifact upload streams (node/artifacts) and serving sessions (ml/serve).
Modelled on the libp2p resource manager: each holder of a slot is scoped by its peer (a peer ID,
or the source IP before one is known), its address prefix (/24 for IPv4, /48 for IPv6, configurable;
127.x.y.z loopback counts per /24 like any other address) and its class:

- ``COMMITTEE`` (validators of the current committee, bootstrap peers): never evicted by a lower
  class and never refused, even past ``total`` (the committee is small and known);
- ``BUSINESS`` (peers with open business: a task's crew or owner, a session the client paid for)
  and ``STAKED`` (nodes with stake bonded): use the capacity reserved above the unknown pool and
  evict the idlest holder of a lower class when the pool is full;
- ``UNKNOWN``: everyone else shares ``unknown_pool`` slots, at most ``per_prefix`` of them from
  one prefix.

Every holder is capped per peer (``per_peer``; a newcomer past it is refused: a peer competing with
itself gets nothing). Otherwise a full scope is made room in rather than refused. A holder can be
evicted when it is not marked busy and either ranks in a lower class than the newcomer or, for an
unknown newcomer, is unknown too and is *over-represented* (its prefix or its peer holds at least two
more slots than the newcomer's will) or *stale* (inactive for more than ``grace`` seconds: longer than
an honest holder waits between requests, or than an honest handshake takes). Of those the victim is
the lowest class, most-represented prefix (its own prefix when that prefix is at its cap), then
most-represented peer, then the one longest inactive.

A flood spread over more prefixes than the unknown share, reconnecting fast enough that every slot
stays younger than ``grace``, is neither over-represented nor stale (docs/adr/0197). So each pool also
counts its recent unknown *admissions* per prefix (each worth 1, halving every ``churn_half_life``;
refused tries do not count, so an honest peer's retries cost it nothing): an unknown holder whose
prefix has been admitted ``CHURN_MARGIN`` (1.5) more times than the newcomer's is evictable too, and of
equal prefixes the one admitted most goes first. A holder's own admission counts 1, so a young holder
from a quiet prefix is never evicted this way, while a prefix that keeps reconnecting loses its young
slots to newcomers from quiet prefixes. (Keeping every slot younger than a 2 s grace in a 56-slot
pool takes 28 admissions/s; staying under the margin then takes about 1,300 /24s.)

A newcomer is refused only when nothing can be evicted: idle slots held from a few addresses make room
for honest peers instead of keeping them out, and a young honest holder is not evicted by an attacker
reconnecting from as many addresses as it has (each eviction ends a stale, over-represented or churning
holder, so reconnecting cannot churn forever).

``Pool.admit`` returns a ``Decision``; the caller closes what ``Decision.evict`` names (the pool has
already forgotten them) and calls ``release`` when its holder ends, ``touch`` on activity and
``set_busy`` around work that must not be cut short.
"""
from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from enum import IntEnum

CHURN_MARGIN = 1.5           # recent admissions by which a holder's prefix must exceed the newcomer's (its own is 1)
MAX_CHURN_PREFIXES = 4096    # prefixes whose tries a pool remembers


class PeerClass(IntEnum):
    UNKNOWN = 0
    STAKED = 1
    BUSINESS = 2
    COMMITTEE = 3


def address_prefix(ip: str, ipv4_bits: int = 24, ipv6_bits: int = 48) -> str:
    """The network an address belongs to for admission (``"10.1.2.0/24"``); an unparsable address
    (e.g. a relayed or unix peer) is its own prefix."""
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return ip
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    bits = ipv4_bits if addr.version == 4 else ipv6_bits
    return str(ipaddress.ip_network(f"{addr}/{bits}", strict=False))


@dataclass(frozen=True)
class PoolLimits:
    total: int                 # slots in all (committee may go past it)
    per_peer: int              # slots one peer (or one source IP) may hold
    unknown_pool: int          # of ``total``, what unknown peers share; the rest is reserved
    per_prefix: int            # unknown slots from one address prefix
    grace: float = 0.0         # seconds inactive before an unknown holder is stale (evictable by anyone)
    churn_half_life: float = 30.0  # seconds over which a prefix's count of recent unknown admissions halves
    ipv4_prefix: int = 24
    ipv6_prefix: int = 48

    def __post_init__(self) -> None:
        if not 1 <= self.unknown_pool <= self.total or self.per_peer < 1 or self.per_prefix < 1:
            raise ValueError(f"admission limits need 1 <= unknown_pool <= total and positive caps: {self}")


@dataclass
class Holder:
    key: Hashable
    peer: str
    prefix: str
    cls: PeerClass
    last_active: float
    busy: bool = False


@dataclass(frozen=True)
class Decision:
    admitted: bool
    evict: tuple[Hashable, ...] = ()
    reason: str = ""


@dataclass
class Pool:
    """One bounded pool of slots (see the module docstring for the rules)."""

    limits: PoolLimits
    clock: Callable[[], float]
    _holders: dict[Hashable, Holder] = field(default_factory=dict)
    _churn: dict[str, tuple[float, float]] = field(default_factory=dict)   # prefix -> (tries, as of time)

    def __len__(self) -> int:
        return len(self._holders)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._holders

    def holders(self) -> list[Holder]:
        return list(self._holders.values())

    def count(self, *, peer: str | None = None, cls: PeerClass | None = None) -> int:
        return sum(1 for h in self._holders.values()
                   if (peer is None or h.peer == peer) and (cls is None or h.cls == cls))

    def prefix_of(self, ip: str) -> str:
        return address_prefix(ip, self.limits.ipv4_prefix, self.limits.ipv6_prefix)

    def admit(self, key: Hashable, peer: str, ip: str, cls: PeerClass = PeerClass.UNKNOWN) -> Decision:
        """Admit ``key`` held by ``peer`` from address ``ip``, evicting if need be (see module doc)."""
        if key in self._holders:
            raise ValueError(f"{key!r} already holds a slot")
        lim = self.limits
        if self.count(peer=peer) >= lim.per_peer:
            return Decision(False, reason=f"at most {lim.per_peer} per peer")
        prefix = self.prefix_of(ip)
        full = len(self._holders) >= lim.total
        candidates: list[Holder] | None = None
        if cls == PeerClass.UNKNOWN:
            unknown = [h for h in self._holders.values() if h.cls == PeerClass.UNKNOWN]
            same_prefix = [h for h in unknown if h.prefix == prefix]
            if len(same_prefix) >= lim.per_prefix:
                candidates = same_prefix
            elif full or len(unknown) >= lim.unknown_pool:
                candidates = unknown
        elif full:
            candidates = [h for h in self._holders.values() if h.cls < cls]
        victim = None if candidates is None else self._victim(candidates, peer, prefix, cls)
        if candidates is not None and victim is None and cls != PeerClass.COMMITTEE:  # the committee always enters
            return Decision(False, reason=f"full: {len(self._holders)} slots, none idle and evictable")
        if victim is not None:
            del self._holders[victim]
        if cls == PeerClass.UNKNOWN:
            self._count_admission(prefix)
        self._holders[key] = Holder(key, peer, prefix, cls, self.clock())
        return Decision(True, () if victim is None else (victim,))

    def _victim(self, candidates: list[Holder], peer: str, prefix: str, cls: PeerClass) -> Hashable | None:
        """The holder to evict for a newcomer (``peer``, ``prefix``, ``cls``), None if none may be."""
        by_prefix = Counter(h.prefix for h in self._holders.values() if h.cls == PeerClass.UNKNOWN)
        by_peer = Counter(h.peer for h in self._holders.values() if h.cls == PeerClass.UNKNOWN)
        now = self.clock()
        churn = {h.prefix: self._admissions(h.prefix, now) for h in candidates}
        mine = self._admissions(prefix, now)

        def evictable(h: Holder) -> bool:
            if h.busy:
                return False
            if h.cls < cls:
                return True
            return (by_prefix[h.prefix] > by_prefix[prefix] + 1 or by_peer[h.peer] > by_peer[peer] + 1
                    or churn[h.prefix] > mine + CHURN_MARGIN or now - h.last_active > self.limits.grace)

        eligible = [h for h in candidates if evictable(h)]
        if not eligible:
            return None
        return min(eligible, key=lambda h: (h.cls, -by_prefix[h.prefix], -round(churn[h.prefix]),
                                            -by_peer[h.peer], h.last_active)).key

    def _admissions(self, prefix: str, now: float) -> float:
        """``prefix``'s recent unknown admissions, each worth 1 when made and halving every ``churn_half_life``."""
        count, when = self._churn.get(prefix, (0.0, now))
        return count * 0.5 ** ((now - when) / self.limits.churn_half_life)

    def _count_admission(self, prefix: str) -> None:
        now = self.clock()
        self._churn[prefix] = (self._admissions(prefix, now) + 1.0, now)
        if len(self._churn) > MAX_CHURN_PREFIXES:   # forget the quietest half (bounded memory)
            ranked = sorted(self._churn, key=lambda p: self._admissions(p, now))
            for quiet in ranked[:len(ranked) // 2]:
                del self._churn[quiet]

    def release(self, key: Hashable) -> bool:
        """Forget ``key``; False if it held no slot (already evicted or released)."""
        return self._holders.pop(key, None) is not None

    def touch(self, key: Hashable) -> None:
        holder = self._holders.get(key)
        if holder is not None:
            holder.last_active = self.clock()

    def set_busy(self, key: Hashable, busy: bool) -> None:
        holder = self._holders.get(key)
        if holder is not None:
            holder.busy = busy
            holder.last_active = self.clock()

    def promote(self, key: Hashable, cls: PeerClass) -> None:
        """Raise a holder's class (a session its client has now paid for); never lowers it."""
        holder = self._holders.get(key)
        if holder is not None and cls > holder.cls:
            holder.cls = cls

    def idle_since(self, now: float, seconds: float) -> list[Hashable]:
        """Holders not busy and inactive for more than ``seconds`` (for an idle timeout)."""
        return [h.key for h in self._holders.values() if not h.busy and now - h.last_active > seconds]


@dataclass
class PeerClasses:
    """Which class each known peer is in, by tag (``"committee"``, ``"crew:<task>"``, ``"staked"``):
    a peer is in the highest class any of its tags gives."""

    _tags: dict[str, tuple[PeerClass, frozenset[str]]] = field(default_factory=dict)
    version: int = 0   # bumped by every change (for caches derived from the tags)

    def set_tag(self, tag: str, cls: PeerClass, peer_ids: Iterable[str]) -> None:
        """Make exactly ``peer_ids`` hold ``tag`` (class ``cls``); no peers drops the tag."""
        peers = frozenset(peer_ids)
        before = self._tags.get(tag)
        if peers:
            self._tags[tag] = (cls, peers)
        else:
            self._tags.pop(tag, None)
        if self._tags.get(tag) != before:
            self.version += 1

    def class_of(self, peer_id: str) -> PeerClass:
        return max((cls for cls, peers in self._tags.values() if peer_id in peers), default=PeerClass.UNKNOWN)

    def tagged(self) -> dict[str, PeerClass]:
        """Every tagged peer with its class (for matching sockets to known addresses)."""
        out: dict[str, PeerClass] = {}
        for cls, peers in self._tags.values():
            for peer_id in peers:
                out[peer_id] = max(cls, out.get(peer_id, PeerClass.UNKNOWN))
        return out
