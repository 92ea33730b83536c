"""Netlab scenarios shared by the tests and bench/relay.py: each drives agents and returns figures.

``relayed_transfer`` sends through one relay and checks the data and the receipts; ``failover``
kills the relay under a running transfer and times the gap until bytes flow again; ``punch``
tries to upgrade a relayed connection to a direct one; ``rate_Mbps`` times a transfer on a
connection (``measure`` adds a CPU-bound figure). Every wait is bounded.
"""
from __future__ import annotations

import time

from .nodes import AgentError, Node

MIB = 1 << 20


def poll(predicate, timeout: float, interval: float = 0.02, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def wait_received(node: Node, transfer_id: str, timeout: float = 60.0) -> dict:
    return poll(lambda: (got := node.call("received", transfer=transfer_id))["done"] and got, timeout, 0.05,
                f"transfer {transfer_id} on {node.name}")


def circuits_via(addrs: list[str], relay: Node) -> list[str]:
    return [a for a in addrs if a.startswith(relay.addr + "/p2p-circuit")]


def relayed_transfer(sender: Node, receiver: Node, relay: Node, mib: int) -> dict:
    """Send ``mib`` MiB through ``relay``; returns the send result, the receiver's view and, once the
    relay's final receipt covers every byte, the receipts of that circuit and both endpoints' counts."""
    circuits = circuits_via(receiver.call("reserve", relay=relay.addr), relay)
    sent = sender.call("send", mib=mib, circuits=circuits, timeout=300)
    got = wait_received(receiver, sent["id"])

    def settled():
        mine = sender.call("status")["circuits"]
        receipts = [r for r in relay.call("status")["receipts"] if r["src"] == sender.peer_id and r["session"] in mine]
        if not receipts:
            return None
        session = receipts[-1]["session"]
        session_receipts = [r for r in receipts if r["session"] == session]
        final = max(r["bytes"] for r in session_receipts)
        if final != mine[session]["bytes"]:
            return None
        return {"session": session, "receipts": session_receipts, "relay_bytes": final,
                "sender_bytes": mine[session]["bytes"],
                "receiver_bytes": receiver.call("status")["circuits"][session]["bytes"]}

    return {"sent": sent, "received": got, "accounting": poll(settled, 20, 0.2, "the final receipt")}


def failover(sender: Node, receiver: Node, relays: list[Node], mib: int, kill_after_mib: int,
             kill=Node.kill, **send_args) -> dict:
    """Start a resumable transfer over ``relays`` (the receiver reserves on all), ``kill`` the relay
    carrying it once ``kill_after_mib`` arrived (default SIGKILL), and measure ``failover_s``: from
    the kill until bytes arrive over a new attempt (bytes still queued on the old path when it died
    do not count)."""
    circuits = []
    for relay in relays:
        circuits = receiver.call("reserve", relay=relay.addr)
    circuits = [c for relay in relays for c in circuits_via(circuits, relay)]
    before = set(receiver.call("incoming"))
    transfer = sender.call_async("send", mib=mib, circuits=circuits, **send_args)
    incoming = poll(lambda: {t: n for t, n in receiver.call("incoming").items()
                             if t not in before and n >= kill_after_mib * MIB}, 60, what="the transfer to start")
    (transfer_id,) = incoming
    live = [c["relay"] for c in sender.call("status")["circuits"].values()]
    victim = next(r for r in relays if r.peer_id == live[-1])
    attempts = receiver.call("attempts")
    kill(victim)
    killed_at = time.monotonic()
    at_kill = receiver.call("incoming")[transfer_id]
    poll(lambda: receiver.call("attempts") > attempts, 30, 0.01, "a new attempt after the relay died")
    resumed_at = receiver.call("incoming")[transfer_id]
    poll(lambda: receiver.call("incoming")[transfer_id] > resumed_at, 30, 0.01, "bytes over the new attempt")
    failover_s = time.monotonic() - killed_at
    result = transfer.result(300)
    return {"sent": result, "received": wait_received(receiver, transfer_id), "victim": victim.peer_id,
            "failover_s": failover_s, "bytes_at_kill": at_kill}


def punch(initiator: Node, responder: Node, relay: Node, *, quic: bool = False) -> dict:
    """Both peers learn their punch-port mapping from ``relay`` (with ``quic``, their QUIC listener's
    too, from the relay's QUIC address: ADR 0228; None for a peer whose QUIC dial fails, as behind a
    router that drops UDP); the initiator dials the responder through it and tries DCUtR. Returns the
    connect result, the observed addresses and the seconds from the relayed dial to the end of the
    punch."""
    observed = {n.name: n.call("connect_public", addr=relay.addr) for n in (initiator, responder)}
    if quic:
        relay_quic = next(a for a in relay.addrs if "/quic-v1" in a)
        for n in (initiator, responder):
            try:
                observed[f"{n.name}/quic"] = n.call("connect_public", addr=relay_quic)
            except AgentError:
                observed[f"{n.name}/quic"] = None
    circuits = circuits_via(responder.call("reserve", relay=relay.addr), relay)
    started = time.monotonic()
    conn = initiator.call("connect", circuits=circuits, punch=True, timeout=60)
    return {"conn": conn, "observed": observed, "seconds": time.monotonic() - started}


def rate_Mbps(sender: Node, receiver: Node, conn: str, mib: int) -> float:
    """Megabits per second of a ``mib`` MiB transfer on the sender's connection ``conn``, until the
    receiver acknowledged the last byte (data checked by digest)."""
    return measure(sender, receiver, conn, mib)["Mbps"]


def measure(sender: Node, receiver: Node, conn: str, mib: int, processes: tuple[Node, ...] = ()) -> dict:
    """``Mbps`` as in rate_Mbps, and ``cpu_bound_Mbps``: the bits over the CPU seconds the busiest
    of sender, receiver and ``processes`` spent on the transfer (the rate each would allow with a
    core of its own; generating and hashing the test data are left out)."""
    others = (receiver, *processes)
    before = [n.call("cpu") for n in others]
    sent = sender.call("send", mib=mib, conn=conn, timeout=300)
    busiest = max([sent["cpu_s"]] + [n.call("cpu") - b for n, b in zip(others, before)])
    got = wait_received(receiver, sent["id"])
    if got["sha256"] != sent["sha256"]:
        raise AssertionError("data corrupted in transit")
    bits = mib * MIB * 8
    # A transfer too short to register CPU time has no CPU-bound rate (None rather than a division by 0).
    cpu_bound = bits / busiest / 1e6 if busiest > 0 else None
    return {"Mbps": bits / sent["seconds"] / 1e6, "cpu_bound_Mbps": cpu_bound}
