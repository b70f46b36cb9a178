"""Helpers the tests share: import them as `from support.<module> import ...`.

`fixtures` is the pytest plugin the root conftest registers (session NATS and Postgres,
`migrated_database_url`, `own_nats`, `own_nats_bus`, `local_kubernetes`). `polling.eventually` /
`polling.wait_for` wait for a condition; `serving.serving` runs a service in the test's event loop until
`/readyz` answers; `scratch_database.scratch_database` makes a throw-away (migrated) ledger database;
`nats_servers` starts a second NATS server (plain, or with deploy/nats/nats.conf); `clocks.SteppedClock`
is a clock a test moves by hand.
"""
