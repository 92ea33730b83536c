"""libp2p-compatible transport on asyncio: multistream, noise, yamux, identify, ping, host."""
