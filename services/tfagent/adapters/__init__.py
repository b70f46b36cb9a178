"""Adapters of the agent's ports: NVML, simulated GPUs and process attribution."""
