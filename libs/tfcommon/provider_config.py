"""ProviderConfig's `spec.hardwareMetadata` as GPU model figures and dedicated-GPU prices. Pure.

A ProviderConfig (tensor-fusion.ai/v1, cluster-scoped, one per vendor) lists GPU models: `model` (short
name, e.g. `A100_SXM_80G`), `fullModelName` (the product name NVML reports, e.g. `NVIDIA A100-SXM4-80GB`),
`fp16TFlops` and `costPerHour`. Each entry is named as our model table names it when its
`fullModelName` or `model` is a built-in model's (`tfcommon.gpu_models`: `NVIDIA H100 80GB HBM3` is
`H100`), else by its `model`. `provider_models` gives the node agent's model table entries (TFLOPS; VRAM
from the built-in entry, else 0: NVML reports it), `provider_prices` billing's price per model.

Precedence, decided here and documented in docs/kubernetes.md: the operator's settings win
(`TF_GPU_MODELS` on the node agent, `TF_GPU_COST_PER_HOUR` on the metrics service), then
ProviderConfig, then the built-in table; among ProviderConfigs the first by object name wins. An entry
that cannot be read is skipped and named in the problems (the rest of the object still counts).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from tfcommon.gpu_models import GPU_MODELS, GpuModelSpec, find_model_by_nvml_name
from tfcommon.quantities import QuantityError, parse_milli


@dataclass(frozen=True)
class HardwareModel:
    """One `hardwareMetadata` entry under our model name; `cost_per_hour` None: no price given."""

    spec: GpuModelSpec
    cost_per_hour: Decimal | None


def _entry(config: str, index: int, item: Any) -> HardwareModel:
    path = f"ProviderConfig {config}: spec.hardwareMetadata[{index}]"
    if not isinstance(item, Mapping):
        raise ValueError(f"{path}: must be a mapping with model, fullModelName and fp16TFlops")
    model, full = item.get("model"), item.get("fullModelName")
    if not isinstance(model, str) or not model or not isinstance(full, str) or not full:
        raise ValueError(f"{path}: model and fullModelName must be non-empty strings, e.g. H100")
    raw = item.get("fp16TFlops")
    try:
        tflops = parse_milli(raw if isinstance(raw, int) and not isinstance(raw, bool) else str(raw))
    except QuantityError as error:
        raise ValueError(
            f"{path}.fp16TFlops: {raw!r} is not a number of TFLOPS such as '312' ({error})"
        ) from None
    if tflops <= 0:
        raise ValueError(f"{path}.fp16TFlops: {raw!r}; use the card's dense FP16 TFLOPS, above 0")
    price: Decimal | None = None
    if item.get("costPerHour") not in (None, ""):
        try:
            price = Decimal(str(item["costPerHour"]))
        except InvalidOperation:
            price = None
        if price is None or not price.is_finite() or price < 0:
            raise ValueError(
                f"{path}.costPerHour: {item['costPerHour']!r}; use a price per hour such as '1.89'"
            )
    builtin = find_model_by_nvml_name(full, GPU_MODELS) or find_model_by_nvml_name(model, GPU_MODELS)
    name = builtin.name if builtin is not None else model
    spec = GpuModelSpec(
        name=name,
        fp16_tflops_milli=tflops,
        vram_bytes=builtin.vram_bytes if builtin is not None else 0,
        source=f"ProviderConfig {config} (hardwareMetadata {model})",
        nvml_names=tuple(dict.fromkeys(n for n in (full, model) if n != name)),
    )
    return HardwareModel(spec=spec, cost_per_hour=price)


def hardware_models(
    configs: Iterable[tuple[str, Mapping[str, Any]]],
) -> tuple[list[HardwareModel], list[str]]:
    """Every readable `hardwareMetadata` entry of `(name, spec)` pairs, first by object name, and what
    could not be read (one message per entry)."""
    models: list[HardwareModel] = []
    problems: list[str] = []
    for config, spec in sorted(configs, key=lambda pair: pair[0]):
        entries = spec.get("hardwareMetadata") or []
        if not isinstance(entries, list):
            problems.append(f"ProviderConfig {config}: spec.hardwareMetadata must be a list")
            continue
        for index, item in enumerate(entries):
            try:
                models.append(_entry(config, index, item))
            except ValueError as error:
                problems.append(str(error))
    return models, problems


def provider_models(models: Iterable[HardwareModel]) -> tuple[GpuModelSpec, ...]:
    """The model table entries, one per model name (the first wins)."""
    chosen: dict[str, GpuModelSpec] = {}
    for model in models:
        chosen.setdefault(model.spec.name, model.spec)
    return tuple(chosen.values())


def provider_prices(models: Iterable[HardwareModel]) -> dict[str, Decimal]:
    """Price per hour of a dedicated card by model name (the first priced entry of a name wins)."""
    prices: dict[str, Decimal] = {}
    for model in models:
        if model.cost_per_hour is not None:
            prices.setdefault(model.spec.name, model.cost_per_hour)
    return prices
