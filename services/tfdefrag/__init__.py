"""Defrag planner: node compaction and scheduled defragmentation campaigns."""
