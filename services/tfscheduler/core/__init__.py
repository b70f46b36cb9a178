"""The scheduler's pure decisions: the placement view, quotas, preemption and unschedulable reports.

No I/O, no clock (time arrives as an argument), no asyncio; import-linter enforces it.
"""
