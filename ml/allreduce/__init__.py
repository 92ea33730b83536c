"""Compressed, fault-tolerant all-reduce (mean) of float32 tensors among an agreed group of peers.

    group = AllReduceGroup(transport, my_id, peers, mode="butterfly", codec="int8")
    await group.start()
    result = await group.allreduce(tensors, round_id)   # -> AllReduceResult
    result = await group.allgather_mean(encoded, codec, shapes, round_id)  # top-k/sign: caller encodes

`PowerSGDAllReduce(fp32_group, shapes, rank)` averages low-rank factors instead.
`transport` is anything with `open_stream(peer, protocol)` and `set_handler(protocol, handler)`
(see transport.py): `TcpTransport` for tests and benchmarks, `HostTransport(host)` over the
node's Host (dedicated bulk connections) in production.
"""
from .deadlines import DeadlinePolicy
from .group import PROTOCOL, AllReduceError, AllReduceGroup, AllReduceResult, ExcludedFromRound
from .host_transport import HostTransport
from .powersgd import PowerSGDAllReduce
from .transport import Stream, TcpTransport, Transport, TransportError

__all__ = [
    "PROTOCOL",
    "AllReduceError",
    "AllReduceGroup",
    "AllReduceResult",
    "DeadlinePolicy",
    "ExcludedFromRound",
    "HostTransport",
    "PowerSGDAllReduce",
    "Stream",
    "TcpTransport",
    "Transport",
    "TransportError",
]
