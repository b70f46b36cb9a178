"""The kubelet device plugin (v1beta1 gRPC): gives each pod container exactly its scheduled GPUs."""
