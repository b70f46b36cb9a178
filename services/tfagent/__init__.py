"""Node agent: GPU discovery (NVML or simulated), heartbeats, usage sampling and the hypervisor API."""
