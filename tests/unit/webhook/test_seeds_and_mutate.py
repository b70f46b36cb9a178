"""Every manifest of the seed "Migrate Existing Workload", exactly as written, through `tfctl mutate`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from tfctl.main import main

STEP_2_TEMPLATE = """\
spec:
  template:
    metadata:
      labels:
        tensor-fusion.ai/enabled: "true"       # added
      annotations:
        tensor-fusion.ai/isolation: "shared"    # added
        tensor-fusion.ai/enabled-replicas: "1"  # added, see step 3
    spec:
      containers:
        - name: app
          resources:
            limits:
              nvidia.com/gpu: 1                 # unchanged
"""
STEP_5_TEMPLATE = """\
spec:
  template:
    metadata:
      labels:
        tensor-fusion.ai/enabled: "true"
      annotations:
        tensor-fusion.ai/tflops-request: "30"
        tensor-fusion.ai/tflops-limit: "60"
        tensor-fusion.ai/vram-request: "8Gi"
        tensor-fusion.ai/vram-limit: "8Gi"
    spec:
      containers:
        - name: app
          resources: {}   # nvidia.com/gpu removed
"""
AUTO_MIGRATION_VALUES = """\
dynamicConfig:
  autoMigration:
    enable: true
    scope:
      includes:
        namespaceNames:
          - ml-team-a
      excludes:
        podSelector:
          matchLabels:
            gpu-migration: skip
"""
ROLLED_BACK_TEMPLATE = """\
spec:
  template:
    spec:
      containers:
        - name: app
          resources:
            limits:
              nvidia.com/gpu: 1
"""
DEPLOYMENT_HEAD = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: llm
  namespace: {namespace}
"""


def deployment(template: str, namespace: str = "ml-team-a") -> str:
    return DEPLOYMENT_HEAD.format(namespace=namespace) + template


def mutate(tmp_path: Path, manifest: str, *extra: str, config: str | None = None) -> int:
    source = tmp_path / "manifest.yaml"
    source.write_text(manifest)
    arguments = ["mutate", "-f", str(source), *extra]
    if config is not None:
        (tmp_path / "config.yaml").write_text(config)
        arguments += ["--config", str(tmp_path / "config.yaml")]
    return main(arguments)


def template_of(output: str) -> dict[str, Any]:
    document = yaml.safe_load(output)
    template: dict[str, Any] = document["spec"]["template"]
    return template


def test_step_2_hands_the_workload_over_as_a_whole_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert mutate(tmp_path, deployment(STEP_2_TEMPLATE)) == 0
    captured = capsys.readouterr()
    template = template_of(captured.out)
    annotations = template["metadata"]["annotations"]
    assert annotations["tensor-fusion.ai/gpu-count"] == "1"
    assert annotations["tensor-fusion.ai/isolation"] == "shared"
    assert template["metadata"]["labels"]["tensor-fusion.ai/component"] == "worker"
    assert template["metadata"]["labels"]["tensor-fusion.ai/workload"] == "llm"
    assert "nvidia.com/gpu" not in template["spec"]["containers"][0]["resources"]["limits"]
    assert template["spec"]["schedulerName"] == "tensor-fusion-scheduler"
    assert "enabled-replicas=1" in captured.err


def test_step_5_shrinks_to_a_fraction_in_soft_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert mutate(tmp_path, deployment(STEP_5_TEMPLATE)) == 0
    annotations = template_of(capsys.readouterr().out)["metadata"]["annotations"]
    assert annotations["tensor-fusion.ai/isolation"] == "soft"
    assert annotations["tensor-fusion.ai/tflops-request"] == "30"
    assert annotations["tensor-fusion.ai/tflops-limit"] == "60"
    assert annotations["tensor-fusion.ai/qos"] == "medium"


@pytest.mark.parametrize(
    ("namespace", "extra_labels", "migrated"),
    [
        pytest.param("ml-team-a", "", True, id="included namespace"),
        pytest.param("ml-team-b", "", False, id="other namespace"),
        pytest.param("ml-team-a", "        gpu-migration: skip\n", False, id="excluded pod"),
        pytest.param(
            "ml-team-a", '        tensor-fusion.ai/enabled: "false"\n', False, id="single pod kept out"
        ),
    ],
)
def test_automatic_migration_with_the_seed_helm_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], namespace: str, extra_labels: str, migrated: bool
) -> None:
    template = ROLLED_BACK_TEMPLATE.replace(
        "    spec:\n      containers",
        f"    metadata:\n      labels:\n{extra_labels}    spec:\n      containers",
    )
    assert mutate(tmp_path, deployment(template, namespace), config=AUTO_MIGRATION_VALUES) == 0
    result = template_of(capsys.readouterr().out)
    labels = (result.get("metadata") or {}).get("labels") or {}
    assert (labels.get("tensor-fusion.ai/enabled") == "true") == migrated
    assert ("nvidia.com/gpu" in result["spec"]["containers"][0]["resources"]["limits"]) != migrated
    if migrated:
        assert result["metadata"]["annotations"]["tensor-fusion.ai/isolation"] == "shared"


def test_rolled_back_workload_is_left_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert mutate(tmp_path, deployment(ROLLED_BACK_TEMPLATE), "--diff") == 0
    assert capsys.readouterr().out == ""


def test_diff_shows_the_changes_readably(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert mutate(tmp_path, deployment(STEP_2_TEMPLATE), "--diff") == 0
    out = capsys.readouterr().out
    assert "-            nvidia.com/gpu: 1" in out
    assert "+        tensor-fusion.ai/component: worker" in out


@pytest.mark.parametrize(
    ("kind", "path"),
    [
        ("StatefulSet", "spec.template"),
        ("Job", "spec.template"),
        ("CronJob", "spec.jobTemplate.spec.template"),
    ],
)
def test_other_workload_kinds_mutate_their_pod_template(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, path: str
) -> None:
    template = yaml.safe_load(STEP_2_TEMPLATE)["spec"]["template"]
    document: dict[str, Any] = {"apiVersion": "v1", "kind": kind, "metadata": {"name": "w"}}
    node = document
    for key in path.split("."):
        node = node.setdefault(key, {})
    node.update(template)
    assert mutate(tmp_path, yaml.safe_dump(document)) == 0
    result: Any = yaml.safe_load(capsys.readouterr().out)
    for key in path.split("."):
        result = result[key]
    assert result["metadata"]["labels"]["tensor-fusion.ai/workload"] == "w"


def test_a_pod_and_an_admission_review(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    metadata = {
        "name": "p",
        "labels": {"tensor-fusion.ai/enabled": "true"},
        "annotations": {"tensor-fusion.ai/isolation": "shared"},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": "app", "resources": {"limits": {"nvidia.com/gpu": 2}}}]},
    }
    assert mutate(tmp_path, json.dumps(pod)) == 0
    assert (
        yaml.safe_load(capsys.readouterr().out)["metadata"]["annotations"]["tensor-fusion.ai/gpu-count"]
        == "2"
    )
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "abc",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "object": pod,
        },
    }
    assert mutate(tmp_path, json.dumps(review)) == 0
    response = json.loads(capsys.readouterr().out)["response"]
    assert response["uid"] == "abc"
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"


def test_a_denied_pod_exits_1_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = deployment(STEP_5_TEMPLATE.replace('tflops-limit: "60"', 'tflops-limit: "6"'))
    assert mutate(tmp_path, manifest) == 1
    assert "tensor-fusion.ai/tflops-limit is below" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param("kind: [unclosed", "not valid YAML", id="yaml"),
        pytest.param("- a\n- b\n", "must be a mapping", id="list"),
        pytest.param("kind: Service\nmetadata: {name: s}\n", "kind: 'Service' is not supported", id="kind"),
        pytest.param(
            "kind: Deployment\nmetadata: {name: d}\nspec: {}\n", "spec.template is missing", id="template"
        ),
        pytest.param(
            "apiVersion: admission.k8s.io/v1\nkind: AdmissionReview\n", "request is missing", id="review"
        ),
        pytest.param("", "holds no manifest", id="empty"),
    ],
)
def test_a_malformed_file_exits_2_naming_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    assert mutate(tmp_path, content) == 2
    assert message in capsys.readouterr().err


def test_a_bad_configuration_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = "gpuPools:\n  - name: a\n    specTemplate: {qosConfig: {defaultQoS: urgent}}\n"
    assert mutate(tmp_path, deployment(STEP_5_TEMPLATE), config=config) == 2
    assert "gpuPools[0].specTemplate.qosConfig.defaultQoS" in capsys.readouterr().err


def test_a_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mutate", "-f", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


NAMESPACE_SCOPE = """\
dynamicConfig:
  autoMigration:
    enable: true
    scope: {includes: {namespaceSelector: {matchLabels: {team: ml}}}}
"""


@pytest.mark.parametrize(
    ("labels", "migrated"), [("team=ml,env=prod", True), ("team=web", False), (None, False)]
)
def test_namespace_selector_scopes_use_the_given_namespace_labels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], labels: str | None, migrated: bool
) -> None:
    extra = ["--namespace-labels", labels] if labels is not None else []
    assert mutate(tmp_path, deployment(ROLLED_BACK_TEMPLATE, "any"), *extra, config=NAMESPACE_SCOPE) == 0
    template = template_of(capsys.readouterr().out)
    assert ("nvidia.com/gpu" not in template["spec"]["containers"][0]["resources"]["limits"]) is migrated


def test_malformed_namespace_labels_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert mutate(tmp_path, deployment(ROLLED_BACK_TEMPLATE), "--namespace-labels", "team") == 2
    assert "KEY=VALUE" in capsys.readouterr().err
