"""Scheduler: places pending GPU workloads, reserves them in the ledger and binds them."""
