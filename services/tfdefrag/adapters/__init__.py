"""Adapters of the defrag planner's ports: the scheduler's HTTP API as the `Cluster` port in local mode."""
