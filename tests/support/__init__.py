"""Helpers the tests share: import them as `from support.<module> import ...`.

`polling.eventually` waits for a condition; `scratch_database.scratch_database` makes a throw-away
(migrated) ledger database; `clocks.SteppedClock` is a clock a test moves by hand. The root conftest's
fixtures (`migrated_database_url`, `own_nats`, `own_nats_bus`) are built on these.
"""
