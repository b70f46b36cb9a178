"""`tfctl doctor`: what in the cluster's tensor-fusion.ai objects tfpool accepts but does not act on.

Reads every GPUPool, GPUNode and GPUResourceQuota through the Kubernetes API (in a pod its service
account, elsewhere `--kubeconfig` / `$KUBECONFIG`) and prints, per object, the spec fields no tfpool
service reads (`tfcommon.unsupported_fields`, the same rule behind the objects' `UnsupportedFields`
condition), and whether that condition is written yet; and each GPUPool spec a service refused (a
`<Service>SpecValid` condition False: it keeps the last good spec). It changes nothing.
Exit codes: 0 the report was printed, 1 the cluster could not be read.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tfcommon.cluster import Cluster, CustomObject, CustomResource

EXIT_FAILED = 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="list the fields of the cluster's GPUPool, GPUNode and quota objects tfpool does not act on",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file (default $KUBECONFIG, ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context")
    parser.set_defaults(handler=handler)


def handler(args: argparse.Namespace) -> int:
    import asyncio

    from tfcommon.cluster import ClusterError, CustomResource
    from tfcommon.cluster.kubernetes import KubernetesCluster
    from tfcommon.unsupported_fields import CONDITION, find_condition, unsupported_fields

    kinds = (CustomResource.GPU_POOL, CustomResource.GPU_NODE, CustomResource.GPU_RESOURCE_QUOTA)
    try:
        cluster = KubernetesCluster.from_environment(kubeconfig=args.kubeconfig, context=args.context)
    except Exception as error:  # the kubernetes client raises several types for a missing config
        print(f"tfctl doctor: cannot reach the cluster: {error}", file=sys.stderr)
        return EXIT_FAILED
    try:
        objects = asyncio.run(_list_all(cluster, kinds))
    except ClusterError as error:
        print(f"tfctl doctor: cannot list tensor-fusion.ai objects: {error}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        cluster.close()
    findings = 0
    for obj in objects:
        name = f"{obj.namespace}/{obj.name}" if obj.namespace else obj.name
        for refused in _refused_specs(obj.status):
            findings += 1
            print(f"{obj.kind.plural}/{name}: {refused['type']} False: {refused.get('message', '')}")
        fields = unsupported_fields(obj.kind, obj.spec)
        if not fields:
            continue
        findings += 1
        written = find_condition(obj.status, CONDITION)
        note = (
            ""
            if written is not None and written.get("status") == "True"
            else f" ({CONDITION} not written yet)"
        )
        print(f"{obj.kind.plural}/{name}: accepted but not acted on{note}:")
        for field in fields:
            print(f"  {field}")
    if findings == 0:
        print(
            f"tfpool acts on every field set in {len(objects)} GPUPool, GPUNode and GPUResourceQuota objects"
        )
    return 0


def _refused_specs(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The `<Service>SpecValid` conditions that say a service refused the spec (it keeps the last good)."""
    conditions = status.get("conditions")
    return [
        c
        for c in (conditions if isinstance(conditions, list) else [])
        if isinstance(c, Mapping)
        and str(c.get("type", "")).endswith("SpecValid")
        and c.get("status") == "False"
    ]


async def _list_all(cluster: Cluster, kinds: tuple[CustomResource, ...]) -> list[CustomObject]:
    return [obj for kind in kinds for obj in await cluster.list_custom_objects(kind)]
