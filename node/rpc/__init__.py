"""The node's HTTP face: JSON-RPC 2.0 dispatcher, websocket pub/sub, status board, aiohttp server."""
