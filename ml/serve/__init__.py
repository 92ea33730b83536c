"""Serving: a decoder's blocks spread over nodes, chained by clients for generation and fine-tuning
(Petals-style; ADRs 0171-0173). model: the block-split decoder; server/protocol/wire: a block
server and `/dekube/serve/1.0.0`; client: chains and generation; tuner, adapters, delta: fine-tuning
parameters the client owns; balance: which blocks to serve; catalog: model specs."""
