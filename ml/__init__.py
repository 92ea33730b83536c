"""ML runtime: what a compute node trains and serves, above the node and the ledger (docs/ARCHITECTURE.md).

``codecs`` the gradient and activation quantizers (one family: the all-reduce and the serving wire
use it), ``allreduce`` the compressed all-reduce over any transport, ``train`` the trainers
(data-parallel, DiLoCo), specs, segment records and dry runs, ``registry`` the built-in models and
datasets, ``job`` a training job's worker processes and their participation record, ``compute`` the
compute role (train assigned tasks, commit, audit by replay, finalize), ``serve`` a decoder's blocks
spread over nodes (servers, clients, billing, disputes).
"""
