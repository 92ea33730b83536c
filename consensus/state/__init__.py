"""The ledger state machine: records, handlers by concern, app hash, supply invariant."""
