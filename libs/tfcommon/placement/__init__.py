"""Placement core: fragmentation-aware GPU placement. Pure: no I/O, no clock, no hidden randomness."""
