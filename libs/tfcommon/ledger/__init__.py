"""The Postgres ledger of GPU allocations: the source of truth for scheduling, QoS and billing.

- `tables`: the SQLAlchemy tables (and who writes each); `migrations/`: their Alembic revisions;
  `migrate`: `upgrade_head`, `downgrade_base`, `current_revision` (what `tfctl migrate` runs).
- `port.Ledger`: the contract the services use (`ServiceContext.ledger`); `sql.SqlLedger` satisfies it.
- `sql.SqlLedger`: registration, reads, the race-free `reserve()` / idempotent `release()`, and
  `transaction()` for a caller that records its own rows with a batch of reservations in one commit.
- `records`: the frozen dataclasses the ledger takes and returns.
- `outbox.OutboxRelay`: publishes committed events to JetStream exactly once.
- `testing`: builders for tests.

Nothing here decides placement; nothing is built at import time.
"""
