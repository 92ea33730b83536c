"""The validator node around the core and the ledger: its role, storage, chain store, mempool and RPC methods."""
