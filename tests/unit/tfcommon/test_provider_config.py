"""ProviderConfig `hardwareMetadata` as the node agent's model table entries and billing's dedicated-GPU
prices, under the settings (`TF_GPU_MODELS`, `TF_GPU_COST_PER_HOUR`), over the built-in table. Uses
TensorFusion's sample NVIDIA ProviderConfig as it is."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml
from tfagent.core.inventory import ModelCatalog
from tfcommon.cluster.model import CustomObject, CustomResource
from tfcommon.gpu_models import GPU_MODELS_BY_NAME, GpuModelSpec
from tfcommon.provider_config import hardware_models, provider_models, provider_prices
from tfmetrics.prices import LivePrices

SAMPLES = Path(__file__).resolve().parents[2] / "integration/deploy/tensorfusion_samples"


def sample(name: str) -> tuple[str, dict[str, Any]]:
    document = yaml.safe_load((SAMPLES / name).read_text())
    return document["metadata"]["name"], document["spec"]


def test_the_nvidia_sample_names_models_as_our_table_does_with_its_figures_and_prices() -> None:
    models, problems = hardware_models([sample("provider-nvidia.yaml")])
    assert problems == []
    table = {spec.name: spec for spec in provider_models(models)}
    assert table["H100"].fp16_tflops_milli == 989_000  # "NVIDIA H100 80GB HBM3", fp16TFlops '989'
    assert table["H100"].vram_bytes == GPU_MODELS_BY_NAME["H100"].vram_bytes
    assert table["A100-80G"].fp16_tflops_milli == 312_000
    prices = provider_prices(models)
    assert prices["H100"] == Decimal("2.99")
    assert prices["A100-80G"] == Decimal("1.89")  # the first entry of that model (SXM4) wins


def test_a_model_unknown_to_our_table_keeps_its_own_name_and_product_name() -> None:
    models, problems = hardware_models([sample("provider-ascend.yaml")])
    assert problems == []
    (spec,) = provider_models(models)
    assert (spec.name, spec.fp16_tflops_milli, spec.nvml_names) == (
        "Ascend 310P3",
        22_000,
        ("Huawei Ascend 310P3",),
    )
    catalog = ModelCatalog(providers=provider_models(models))
    capacity = catalog.capacity_of("Huawei Ascend 310P3")
    assert (capacity.model, capacity.tflops_milli, capacity.warning) == ("Ascend 310P3", 22_000, None)
    assert "ProviderConfig ascend-provider" in capacity.source


def test_settings_win_over_provider_config_which_wins_over_the_built_ins() -> None:
    spec = {"hardwareMetadata": [{"model": "H100_SXM", "fullModelName": "NVIDIA H100 80GB HBM3",
                                  "fp16TFlops": "900", "costPerHour": "3.10"}]}  # fmt: skip
    models, _ = hardware_models([("nvidia", spec)])
    assert ModelCatalog().capacity_of("NVIDIA H100 80GB HBM3").tflops_milli == 989_400
    with_provider = ModelCatalog(providers=provider_models(models))
    assert with_provider.capacity_of("NVIDIA H100 80GB HBM3").tflops_milli == 900_000
    override = GpuModelSpec("H100", 950_000, 0, "operator configuration (TF_GPU_MODELS)")
    both = ModelCatalog(overrides=(override,), providers=provider_models(models))
    assert both.capacity_of("NVIDIA H100 80GB HBM3").tflops_milli == 950_000

    prices = LivePrices({"A100-80G": Decimal("1.60")})
    prices.observe({"nvidia": CustomObject(CustomResource.PROVIDER_CONFIG, "nvidia", spec=spec)})
    assert dict(prices) == {"H100": Decimal("3.10"), "A100-80G": Decimal("1.60")}
    configured = LivePrices({"H100": Decimal("2.49")})
    configured.observe({"nvidia": CustomObject(CustomResource.PROVIDER_CONFIG, "nvidia", spec=spec)})
    assert configured["H100"] == Decimal("2.49")
    configured.observe({})
    assert dict(configured) == {"H100": Decimal("2.49")}


def test_an_unreadable_entry_is_named_and_skipped_the_rest_counts() -> None:
    spec = {"hardwareMetadata": [
        {"model": "X1", "fullModelName": "Vendor X1", "fp16TFlops": "fast"},
        {"model": "X2", "fullModelName": "Vendor X2", "fp16TFlops": "100", "costPerHour": "cheap"},
        {"model": "X3", "fullModelName": "Vendor X3", "fp16TFlops": 50},
    ]}  # fmt: skip
    models, problems = hardware_models([("vendor-x", spec)])
    assert [m.spec.name for m in models] == ["X3"]
    assert problems[0].startswith("ProviderConfig vendor-x: spec.hardwareMetadata[0].fp16TFlops: 'fast'")
    assert problems[1].startswith("ProviderConfig vendor-x: spec.hardwareMetadata[1].costPerHour: 'cheap'")
