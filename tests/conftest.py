"""Shared test fixtures and helpers live in tests/support (imported as `support.<module>`).

`support.fixtures`, registered here as a plugin, gives every test real NATS JetStream and Postgres
for the session (`nats_url`, `postgres_server_url`), a fresh migrated ledger database
(`migrated_database_url`), a NATS server of its own (`own_nats`, `own_nats_bus`) and a real Kubernetes
control plane (`local_kubernetes`). `support.polling`, `support.serving`, `support.scratch_database`,
`support.nats_servers` and `support.clocks` hold the helpers the suites share.
"""

pytest_plugins = ["support.fixtures"]
