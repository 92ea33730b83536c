"""Deterministic simulation of N real validators (driver, core, ledger, storage) under seeded faults (ADR 0110)."""
