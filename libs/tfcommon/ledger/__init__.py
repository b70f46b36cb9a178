"""The Postgres ledger of GPU allocations: tables, migrations, reserve/release and the outbox."""
