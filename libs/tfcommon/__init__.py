"""Shared library of the tfpool control plane.

Holds only what two or more services share: the wire contract (events, subjects), value types and
quantities, the placement rules, the bus and consumer loop, the ledger and its migrations, settings,
logging, telemetry and the embedded infrastructure launchers. It never imports a service.
"""
