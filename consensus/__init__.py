"""SDBFT: Tendermint consensus core, its driver, mempool, block store and the ledger state machine."""
