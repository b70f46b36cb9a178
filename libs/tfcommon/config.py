"""The schema of the one YAML configuration file every service reads, in TensorFusion's shapes; no I/O.

`parse_config` validates text into a frozen `TfConfig` (errors name the field path and the fix);
`ConfigProvider` is what services read the configuration in force through. Reading the file and
re-reading it when it changes is `tfcommon.config_source`. Reference: docs/configuration.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tfcommon.events import IsolationMode, QosLevel

DEFAULT_NATIVE_GPU_RESOURCES: tuple[str, ...] = ("nvidia.com/gpu", "amd.com/gpu")
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
_RESOURCE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")

QosName = QosLevel
IsolationName = IsolationMode


class ConfigError(ValueError):
    """The configuration file is unreadable or invalid; `str()` names the file, the field and the fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class _Open(BaseModel):
    """A GPUPool spec section whose fields other services model later; unknown keys are kept."""

    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)


class LabelSelectorRequirement(_Strict):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _values_match_operator(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs a non-empty values list, e.g. values: [a, b]")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values; remove the values list")
        return self


class LabelSelector(_Strict):
    """A Kubernetes label selector; an empty selector matches every object, as in Kubernetes."""

    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
    match_expressions: tuple[LabelSelectorRequirement, ...] = Field(default=(), alias="matchExpressions")

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether `labels` satisfy every matchLabels entry and every matchExpressions requirement."""
        if any(labels.get(key) != value for key, value in self.match_labels.items()):
            return False
        for requirement in self.match_expressions:
            present = requirement.key in labels
            value = labels.get(requirement.key)
            satisfied = {
                "In": present and value in requirement.values,
                "NotIn": not present or value not in requirement.values,
                "Exists": present,
                "DoesNotExist": not present,
            }[requirement.operator]
            if not satisfied:
                return False
        return True


class MigrationRules(_Strict):
    """One includes/excludes block; its three criteria are alternatives (any match counts)."""

    namespace_names: tuple[str, ...] = Field(default=(), alias="namespaceNames")
    namespace_selector: LabelSelector | None = Field(default=None, alias="namespaceSelector")
    pod_selector: LabelSelector | None = Field(default=None, alias="podSelector")

    def matches(
        self, namespace: str, namespace_labels: Mapping[str, str] | None, pod_labels: Mapping[str, str]
    ) -> bool:
        """Any criterion matching counts; unknown namespace labels never match a namespace selector."""
        if namespace in self.namespace_names:
            return True
        if (
            self.namespace_selector is not None
            and namespace_labels is not None
            and self.namespace_selector.matches(namespace_labels)
        ):
            return True
        return self.pod_selector is not None and self.pod_selector.matches(pod_labels)


class MigrationScope(_Strict):
    includes: MigrationRules | None = None
    excludes: MigrationRules | None = None


class AutoMigration(_Strict):
    """`dynamicConfig.autoMigration`: convert native-GPU pods that match the scope (all when no scope)."""

    enable: bool = False
    scope: MigrationScope | None = None


class DynamicConfig(_Open):
    auto_migration: AutoMigration = Field(default_factory=AutoMigration, alias="autoMigration")


class QosConfig(_Open):
    default_qos: QosName | None = Field(default=None, alias="defaultQoS")


class NodeManagerConfig(_Open):
    default_isolation_mode: IsolationName = Field(default="soft", alias="defaultIsolationMode")
    default_vendor: str | None = Field(default=None, alias="defaultVendor")


class GpuPoolSpec(_Open):
    """The parts of TensorFusion's GPUPool spec read so far; other sections are kept as given."""

    default_using_local_gpu: bool = Field(default=True, alias="defaultUsingLocalGPU")
    qos_config: QosConfig = Field(default_factory=QosConfig, alias="qosConfig")
    node_manager_config: NodeManagerConfig = Field(
        default_factory=NodeManagerConfig, alias="nodeManagerConfig"
    )


class GpuPoolConfig(_Strict):
    """One entry of `gpuPools`: a pool name, whether it is the default, and its GPUPool spec."""

    name: str
    is_default: bool = Field(default=False, alias="isDefault")
    spec_template: GpuPoolSpec = Field(default_factory=GpuPoolSpec, alias="specTemplate")

    @field_validator("name")
    @classmethod
    def _name_is_a_label_value(cls, name: str) -> str:
        if not _LABEL_VALUE.match(name):
            raise ValueError(
                f"{name!r} is not a valid pool name: use up to 63 letters, digits, '-', '_' or '.', "
                "starting and ending with a letter or digit, e.g. training-pool"
            )
        return name


class WebhookConfig(_Strict):
    """Settings of the admission webhook that have no TensorFusion equivalent."""

    takeover_full_cache_seconds: float = Field(default=2.0, ge=0, le=300, alias="takeoverFullCacheSeconds")


def _default_pools() -> tuple[GpuPoolConfig, ...]:
    return (GpuPoolConfig(name="default", is_default=True),)


class TfConfig(_Strict):
    """The whole configuration file. Omitted sections take the defaults documented in configuration.md."""

    dynamic_config: DynamicConfig = Field(default_factory=DynamicConfig, alias="dynamicConfig")
    gpu_pools: tuple[GpuPoolConfig, ...] = Field(default_factory=_default_pools, alias="gpuPools")
    native_gpu_resource_names: tuple[str, ...] = Field(
        default=DEFAULT_NATIVE_GPU_RESOURCES, alias="nativeGpuResourceNames"
    )
    webhook: WebhookConfig = Field(default_factory=WebhookConfig)

    @field_validator("native_gpu_resource_names")
    @classmethod
    def _resource_names_are_qualified(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if not _RESOURCE_NAME.match(name):
                raise ValueError(f"{name!r} is not a device-plugin resource name such as nvidia.com/gpu")
        return names

    @model_validator(mode="after")
    def _pools_are_consistent(self) -> TfConfig:
        names = [pool.name for pool in self.gpu_pools]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"gpuPools: pool names must be unique; {', '.join(duplicates)} appears twice")
        defaults = [pool.name for pool in self.gpu_pools if pool.is_default]
        if len(defaults) > 1:
            raise ValueError(f"gpuPools: only one pool may set isDefault: true, found {', '.join(defaults)}")
        return self

    def pool(self, name: str) -> GpuPoolConfig | None:
        return next((pool for pool in self.gpu_pools if pool.name == name), None)

    def default_pool(self) -> GpuPoolConfig | None:
        return next((pool for pool in self.gpu_pools if pool.is_default), None)


def _field_path(location: Sequence[int | str]) -> str:
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path or "(top level)"


def parse_config(text: str, *, source: str = "configuration") -> TfConfig:
    """Validate YAML text; raises `ConfigError` naming `source`, each bad field's path and the fix."""
    try:
        document: Any = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{source}: not valid YAML: {error}") from None
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise ConfigError(f"{source}: the top level must be a mapping such as 'gpuPools: [...]'")
    try:
        return TfConfig.model_validate(document)
    except ValidationError as error:
        raise ConfigError(f"{source}: " + "; ".join(validation_problems(error))) from None


def validation_problems(error: ValidationError, prefix: str = "") -> list[str]:
    """Each problem as `field.path: what is wrong and the fix`, the path starting with `prefix`."""
    problems = []
    for detail in error.errors():
        message = str(detail["msg"]).removeprefix("Value error, ").replace("a valid tuple", "a list")
        path = _field_path([*([prefix] if prefix else []), *detail["loc"]])
        problems.append(f"{path}: {message}")
    return problems


class ConfigProvider(Protocol):
    """What services read the configuration through: `tfcommon.config_source.ConfigSource` (the file),
    or in Kubernetes mode `tfcommon.pool_source.ClusterPoolSource` (pools from GPUPool objects)."""

    def current(self) -> TfConfig: ...
