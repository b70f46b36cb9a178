"""The cluster's ProviderConfig GPU models for the node agent's model table, read once at start.

In Kubernetes mode (`TF_AGENT_KUBERNETES=true`) the agent lists the ProviderConfig objects before its
first discovery; their `hardwareMetadata` (`tfcommon.provider_config`) sits between `TF_GPU_MODELS`
(which wins) and the built-in table in `tfagent.core.inventory.ModelCatalog`. An edit takes effect when
the agent restarts. A list that fails (no CRD, no permission, API down) is logged and the agent goes on
with the settings and the built-in table.
"""

from __future__ import annotations

import logging

from tfcommon.cluster.model import ClusterError, CustomResource
from tfcommon.gpu_models import GpuModelSpec
from tfcommon.provider_config import hardware_models, provider_models

from tfagent.ports import CustomResourceWriter

log = logging.getLogger("tfagent.providers")


async def provider_model_table(cluster: CustomResourceWriter) -> tuple[GpuModelSpec, ...]:
    """The ProviderConfig entries of the model table (empty when they cannot be listed)."""
    try:
        objects = await cluster.list_custom_objects(CustomResource.PROVIDER_CONFIG)
    except (ClusterError, OSError) as error:
        log.warning(
            "ProviderConfig objects not read; the GPU model table is TF_GPU_MODELS and the built-ins",
            extra={"event": "agent.providers_unread", "outcome": "error", "reason": str(error)},
        )
        return ()
    models, problems = hardware_models((obj.name, obj.spec) for obj in objects)
    for problem in problems:
        log.warning(problem + "; entry skipped", extra={"event": "agent.provider_invalid"})
    return provider_models(models)
