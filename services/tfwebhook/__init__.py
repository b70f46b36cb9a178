"""Admission webhook: TensorFusion-compatible pod mutation and migration of native GPU workloads."""
