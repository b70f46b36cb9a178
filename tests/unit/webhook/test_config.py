"""The configuration file: TensorFusion's shapes, errors that name the field, reload without a restart."""

from __future__ import annotations

from pathlib import Path

import pytest
from tfcommon.config import ConfigError, LabelSelector, TfConfig, parse_config
from tfcommon.config_source import ConfigSource, load_config

FULL = """
dynamicConfig:
  autoMigration:
    enable: true
    scope:
      includes:
        namespaceNames: [ml-team-a]
        namespaceSelector:
          matchExpressions:
            - {key: team, operator: In, values: [ml, research]}
      excludes:
        podSelector: {matchLabels: {gpu-migration: skip}}
gpuPools:
  - name: shared-pool
    isDefault: true
    specTemplate:
      defaultUsingLocalGPU: true
      qosConfig: {defaultQoS: low, pricing: [{qos: low, requests: {perFP16TFlopsPerHour: "0.002"}}]}
      nodeManagerConfig:
        defaultIsolationMode: soft
        nodeCompaction: {period: 5m}
      capacityConfig: {oversubscription: {tflopsOversellRatio: 500}}
nativeGpuResourceNames: [nvidia.com/gpu, amd.com/gpu, example.com/gpu]
webhook: {takeoverFullCacheSeconds: 1}
"""


def test_an_empty_file_means_the_documented_defaults() -> None:
    config = parse_config("")
    assert config == TfConfig()
    assert config.native_gpu_resource_names == ("nvidia.com/gpu", "amd.com/gpu")
    assert config.default_pool() is not None
    assert config.dynamic_config.auto_migration.enable is False


def test_tensorfusion_shapes_are_read_and_unknown_pool_spec_sections_kept() -> None:
    config = parse_config(FULL)
    pool = config.pool("shared-pool")
    assert pool is not None
    assert pool.spec_template.qos_config.default_qos == "low"
    assert pool.spec_template.node_manager_config.model_extra == {"nodeCompaction": {"period": "5m"}}
    scope = config.dynamic_config.auto_migration.scope
    assert scope is not None
    assert scope.includes is not None
    assert scope.includes.matches("elsewhere", {"team": "research"}, {})
    assert not scope.includes.matches("elsewhere", {"team": "web"}, {})
    assert "example.com/gpu" in config.native_gpu_resource_names


@pytest.mark.parametrize(
    ("text", "field", "hint"),
    [
        ("gpuPools: [{name: a, isDefault: true}, {name: b, isDefault: true}]", "gpuPools", "only one pool"),
        ("gpuPools: [{name: a}, {name: a}]", "gpuPools", "unique"),
        ("gpuPools: [{name: 'Bad Name!'}]", "gpuPools[0].name", "e.g. training-pool"),
        ("gpuPools: [{name: a, specTemplate: {qosConfig: {defaultQoS: urgent}}}]", "defaultQoS", "'low'"),
        ("dynamicConfig: {autoMigration: {enable: maybe}}", "dynamicConfig.autoMigration.enable", "bool"),
        ("dynamicConfig: {autoMigration: {enabled: true}}", "autoMigration.enabled", "not permitted"),
        ("nativeGpuResourceNames: [gpu]", "nativeGpuResourceNames", "nvidia.com/gpu"),
        (
            "dynamicConfig: {autoMigration: {scope: {includes: {podSelector: {matchExpressions: "
            "[{key: a, operator: In}]}}}}}",
            "matchExpressions[0]",
            "non-empty values",
        ),
        ("gpuPools: {name: a}", "gpuPools", "a list"),
        ("- just a list", "top level", "mapping"),
        ("key: [unclosed", "not valid YAML", ""),
    ],
)
def test_errors_name_the_field_and_the_fix(text: str, field: str, hint: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(text, source="config.yaml")
    assert str(raised.value).startswith("config.yaml: ")
    assert field in str(raised.value)
    assert hint in str(raised.value)


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ({}, {}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
    ],
)
def test_label_selectors_behave_as_in_kubernetes(
    selector: dict[str, object], labels: dict[str, str], matches: bool
) -> None:
    assert LabelSelector.model_validate(selector).matches(labels) is matches


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the configuration file"):
        load_config(tmp_path / "absent.yaml")


def test_changes_take_effect_without_a_restart_and_a_bad_edit_keeps_the_last_good_config(
    tmp_path: Path,
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("gpuPools: [{name: first, isDefault: true}]\n")
    source = ConfigSource(path, check_interval_s=0)
    assert source.current().pool("first") is not None

    path.write_text("gpuPools: [{name: second, isDefault: true}]\n")
    assert source.current().pool("second") is not None

    path.write_text("gpuPools: [{name: second, isDefault: maybe}]\n")
    assert source.current().pool("second") is not None
    assert source.last_error is not None
    assert "gpuPools[0].isDefault" in source.last_error

    path.write_text("gpuPools: [{name: third, isDefault: true}]\n")
    assert source.current().pool("third") is not None
    assert source.last_error is None


def test_a_configmap_style_symlink_swap_is_noticed(tmp_path: Path) -> None:
    first, second = tmp_path / "v1.yaml", tmp_path / "v2.yaml"
    first.write_text("gpuPools: [{name: one, isDefault: true}]\n")
    second.write_text("gpuPools: [{name: two, isDefault: true}]\n")
    link = tmp_path / "config.yaml"
    link.symlink_to(first)
    source = ConfigSource(link, check_interval_s=0)
    staged = tmp_path / "config.yaml.new"
    staged.symlink_to(second)
    staged.replace(link)
    assert source.current().pool("two") is not None


def test_checks_are_rate_limited(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("gpuPools: [{name: first, isDefault: true}]\n")
    source = ConfigSource(path, check_interval_s=3600)
    path.write_text("gpuPools: [{name: second, isDefault: true}]\n")
    assert source.current().pool("first") is not None
    assert source.reload_if_changed().pool("second") is not None
