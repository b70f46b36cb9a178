"""A local Kubernetes control plane from the pinned Go modules in `tools/kubernetes`.

`build.ensure_binaries()` builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK
once into a cache; `LocalKubernetes` runs them on loopback with their state in a folder (tests, and
`tfctl up --kubernetes`). See docs/kubernetes.md.
"""

from tfcommon.kube_local.build import BuildError, ensure_binaries
from tfcommon.kube_local.control_plane import KWOK_NODE_ANNOTATION, LocalKubernetes, running
from tfcommon.kube_local.pki import ADMIN, ControlPlanePki

__all__ = [
    "ADMIN",
    "KWOK_NODE_ANNOTATION",
    "BuildError",
    "ControlPlanePki",
    "LocalKubernetes",
    "ensure_binaries",
    "running",
]
