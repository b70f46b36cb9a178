"""Every command in the operator guides (docs/guides/*.md) is exercised; their example manifests are valid.

Without a cluster, kubectl commands are checked against what kubectl itself accepts offline: `kustomize`
runs, `apply` files are rendered and validated for current Kubernetes, `label`/`annotate`/`patch` run
with `--local` on the object they name, and commands that need a server must use kubectl's real verbs,
flags and resource types. `tfctl` commands must parse here; tests/e2e/test_guides_local_stack.py runs
them on a real local stack.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from guide_commands import GUIDES, REPO_ROOT, GuideCommand, commands_in, guide_commands, of_rule, rule_for

sys.path.insert(0, str(REPO_ROOT / "tests" / "unit" / "deploy"))
from deploy_support import VENV_BIN, kubernetes_problem, render_kustomization, tfctl_rejection

KUBECTL = str(VENV_BIN / "kubectl")
CUSTOM_GROUPS = ("tensor-fusion.ai/", "monitoring.coreos.com/", "cert-manager.io/")
"""Custom resources kubernetes-validate has no schema for: checked for shape only."""
MODEL_CACHE = REPO_ROOT / "k8s" / "examples" / "model-cache"
CORE_TYPES = {
    ("v1", "Pod"): ("pod", "pods", "po"),
    ("v1", "Node"): ("node", "nodes", "no"),
    ("v1", "Namespace"): ("namespace", "namespaces", "ns"),
    ("v1", "Service"): ("service", "services", "svc"),
    ("v1", "Secret"): ("secret", "secrets"),
    ("v1", "ConfigMap"): ("configmap", "configmaps", "cm"),
    ("v1", "PersistentVolumeClaim"): ("persistentvolumeclaim", "persistentvolumeclaims", "pvc"),
    ("apps/v1", "Deployment"): ("deployment", "deployments", "deploy"),
    ("apps/v1", "StatefulSet"): ("statefulset", "statefulsets", "sts"),
    ("apps/v1", "DaemonSet"): ("daemonset", "daemonsets", "ds"),
    ("apps/v1", "ReplicaSet"): ("replicaset", "replicasets", "rs"),
    ("batch/v1", "Job"): ("job", "jobs"),
    ("policy/v1", "PodDisruptionBudget"): ("poddisruptionbudget", "poddisruptionbudgets", "pdb"),
}


def resource_types() -> dict[str, tuple[str, str]]:
    """Every resource type name kubectl accepts for our cluster -> (apiVersion, kind): core and our CRDs."""
    types = {name: key for key, names in CORE_TYPES.items() for name in names}
    for path in (REPO_ROOT / "k8s" / "base" / "crds").glob("*.yaml"):
        crd = yaml.safe_load(path.read_text(encoding="utf-8"))
        names = crd["spec"]["names"]
        version = next(v["name"] for v in crd["spec"]["versions"] if v.get("storage"))
        api = (f"{crd['spec']['group']}/{version}", names["kind"])
        for name in (names["plural"], names["singular"], *names.get("shortNames", [])):
            types[name] = api
    return types


def kubectl(*args: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """kubectl with an empty kubeconfig: nothing here may reach a server."""
    kubeconfig = folder / "kubeconfig"
    kubeconfig.touch()
    return subprocess.run(
        [KUBECTL, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO_ROOT,
        env={"KUBECONFIG": str(kubeconfig), "HOME": str(folder), "PATH": "/usr/bin:/bin"},
    )


@functools.cache
def kubectl_flags(*command: str) -> dict[str, bool]:
    """The flags `kubectl COMMAND --help` and `kubectl options` list -> whether each takes a value."""
    with tempfile.TemporaryDirectory() as folder:
        texts = []
        for args in ((*command, "--help"), ("options",)):
            result = kubectl(*args, folder=Path(folder))
            assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
            texts.append(result.stdout)
    flags: dict[str, bool] = {}
    for match in re.finditer(r"^\s+(?:(-\w), )?(--[\w-]+)=(\S*):", "\n".join(texts), re.MULTILINE):
        takes_value = match.group(3) not in ("false", "true")
        flags[match.group(2)] = takes_value
        if match.group(1):
            flags[match.group(1)] = takes_value
    return flags


def split_kubectl(argv: list[str]) -> tuple[list[str], list[tuple[str, str | None]]]:
    """`kubectl VERB ...` -> (positional arguments after the verb, [(flag, value)]); stops at `--`."""
    subcommand = argv[1:3] if argv[1] == "rollout" else argv[1:2]
    known = kubectl_flags(*subcommand)
    positional: list[str] = []
    flags: list[tuple[str, str | None]] = []
    rest = argv[1 + len(subcommand) :]
    index = 0
    while index < len(rest):
        token = rest[index]
        index += 1
        if token == "--":
            break
        if not token.startswith("-"):
            positional.append(token)
            continue
        name, has_value, value = token.partition("=")
        if name not in known:
            flags.append((name, None))
            continue
        if not has_value and known[name]:
            value, index = rest[index], index + 1
        flags.append((name, value))
    return positional, flags


def resource_problems(command: GuideCommand, positional: list[str]) -> list[str]:
    """The resource types a command names that neither Kubernetes nor our CRDs define."""
    verb = command.argv[1]
    if verb in ("cordon", "uncordon", "drain"):
        return []
    if verb in ("get", "describe", "delete"):
        names = [part.split("/")[0] for part in positional[0].split(",")] if positional else []
    else:
        names = [token.split("/")[0] for token in positional if "/" in token]
    return [
        f"{command.where}: unknown resource type {name!r}" for name in names if name not in resource_types()
    ]


def problems_of_objects(objects: list[dict[str, Any]], origin: str) -> list[str]:
    problems = []
    for obj in objects:
        if obj["apiVersion"].startswith(CUSTOM_GROUPS):
            if not obj.get("metadata", {}).get("name"):
                problems.append(f"{origin}: {obj['kind']} without a name")
        elif problem := kubernetes_problem(obj):
            problems.append(f"{origin}: {problem}")
    return problems


def load_objects(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]


def example_objects() -> list[dict[str, Any]]:
    """The objects the guides ship (their manifests and the model-cache example)."""
    paths = [*(GUIDES / "manifests").glob("*.yaml"), *MODEL_CACHE.glob("*.yaml")]
    return [obj for path in paths if path.name != "kustomization.yaml" for obj in load_objects(path)]


def test_the_guides_have_commands_of_every_kind() -> None:
    rules = {rule_for(command) for command in guide_commands()}
    assert {
        "tfctl up",
        "tfctl on the local stack",
        "kubectl kustomize",
        "kubectl apply",
        "kubectl offline",
        "kubectl parsed",
    } <= rules


def test_every_guide_command_is_covered_by_a_rule() -> None:
    uncovered = [command.where for command in guide_commands() if rule_for(command) is None]
    assert uncovered == [], "no test rule covers these guide commands"


def test_a_command_no_rule_covers_is_reported_with_its_guide_and_line() -> None:
    guide = (
        "Intro\n\n```console\n$ kubectl get pods\nNAME  READY\n$ helm upgrade tfpool . \\\n  --wait\n```\n"
    )
    commands = commands_in(guide, "example.md")

    assert [(c.line, c.text) for c in commands] == [
        (4, "kubectl get pods"),
        (6, "helm upgrade tfpool . --wait"),
    ]
    uncovered = [command.where for command in commands if rule_for(command) is None]
    assert uncovered == ["docs/guides/example.md:6: helm upgrade tfpool . --wait"]


def test_a_documented_exit_code_is_read_from_the_command() -> None:
    [command] = commands_in("```console\n$ tfctl submit -f pod.yaml  # exits 1\n```\n", "example.md")
    assert (command.text, command.expected_exit) == ("tfctl submit -f pod.yaml", 1)


def test_tfctl_commands_parse() -> None:
    commands = of_rule("tfctl on the local stack") + of_rule("tfctl up")
    assert len(commands) >= 10
    assert [problem for c in commands if (problem := tfctl_rejection(c.argv[1:]))] == []


def test_kubectl_kustomize_commands_render_valid_objects() -> None:
    problems = []
    for command in of_rule("kubectl kustomize"):
        [directory] = command.argv[2:]
        objects = render_kustomization(REPO_ROOT / directory)
        assert objects, command.where
        problems += problems_of_objects(objects, command.where)
    assert problems == []


def test_kubectl_apply_commands_apply_files_that_exist_and_are_valid() -> None:
    problems = []
    for command in of_rule("kubectl apply"):
        positional, flags = split_kubectl(command.argv)
        assert positional == [], command.where
        [(flag, target)] = flags
        assert target is not None, command.where
        assert (REPO_ROOT / target).exists(), f"{command.where}: {target} is missing"
        if flag in ("-f", "--filename"):
            objects = load_objects(REPO_ROOT / target)
        else:
            assert flag in ("-k", "--kustomize"), command.where
            objects = render_kustomization(REPO_ROOT / target)
        assert objects, command.where
        problems += problems_of_objects(objects, command.where)
    assert problems == []


def object_named(type_name: str, name: str, namespace: str | None) -> dict[str, Any]:
    """The guides' own object of that type and name, else the smallest object kubectl accepts."""
    api_version, kind = resource_types()[type_name]
    for obj in example_objects():
        same_name = (obj["kind"], obj["metadata"]["name"]) == (kind, name)
        if same_name and namespace in (None, obj["metadata"].get("namespace")):
            return obj
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata}


def test_kubectl_label_annotate_and_patch_commands_run_offline(tmp_path: Path) -> None:
    commands = of_rule("kubectl offline")
    assert len(commands) >= 3
    changed: dict[tuple[str, str, str | None], dict[str, Any]] = {}
    for command in commands:
        argv = command.argv
        if argv[1] == "create":
            result = kubectl(*argv[1:], folder=tmp_path)
            assert result.returncode == 0, f"{command.where}: {result.stderr}"
            continue
        positional, flags = split_kubectl(argv)
        type_name, name, *changes = positional
        namespace = next((value for flag, value in flags if flag in ("-n", "--namespace")), None)
        identity = (resource_types()[type_name][1], name, namespace)
        before = changed.get(identity) or object_named(type_name, name, namespace)
        manifest = tmp_path / "object.yaml"
        manifest.write_text(yaml.safe_dump(before))
        other_flags = [
            f"{flag}={value}" if value else flag for flag, value in flags if flag not in ("-n", "--namespace")
        ]
        result = kubectl(
            argv[1], "--local", "-f", str(manifest), *changes, *other_flags, "-o", "yaml", folder=tmp_path
        )
        assert result.returncode == 0, f"{command.where}: {result.stderr}"
        after = yaml.safe_load(result.stdout)
        assert after != before, f"{command.where} changes nothing"
        changed[identity] = after
        field = {"label": "labels", "annotate": "annotations"}.get(argv[1])
        for change in changes if field else []:
            key, sets, value = change.partition("=")
            found = after["metadata"].get(field, {})
            assert (found.get(key) == value) if sets else (key.rstrip("-") not in found), command.where


def test_kubectl_commands_that_need_a_cluster_use_real_verbs_flags_and_resource_types() -> None:
    commands = of_rule("kubectl parsed")
    assert len(commands) >= 10
    problems = []
    for command in commands:
        positional, flags = split_kubectl(command.argv)
        subcommand = command.argv[1:3] if command.argv[1] == "rollout" else command.argv[1:2]
        known = kubectl_flags(*subcommand)
        problems += [f"{command.where}: kubectl has no flag {flag}" for flag, _ in flags if flag not in known]
        problems += resource_problems(command, positional)
    assert problems == []


def test_the_parser_rejects_a_flag_or_resource_type_kubectl_does_not_have() -> None:
    [command] = commands_in("```console\n$ kubectl get gpuz -n x --colour\n```\n", "example.md")
    positional, flags = split_kubectl(command.argv)
    assert [flag for flag, _ in flags if flag not in kubectl_flags("get")] == ["--colour"]
    assert resource_problems(command, positional) == [
        "docs/guides/example.md:2: kubectl get gpuz -n x --colour: unknown resource type 'gpuz'"
    ]


def test_pytest_commands_name_test_files_that_exist() -> None:
    commands = of_rule("pytest")
    paths = [arg for command in commands for arg in command.argv[1:] if not arg.startswith("-")]
    assert paths
    assert all((REPO_ROOT / path).is_file() and Path(path).name.startswith("test_") for path in paths)


def test_every_link_in_the_guides_points_at_a_file_that_exists() -> None:
    broken = []
    for guide in GUIDES.glob("*.md"):
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", guide.read_text(encoding="utf-8")):
            if "://" not in target and not (guide.parent / target).exists():
                broken.append(f"{guide.name}: {target}")
    assert broken == []


@pytest.fixture(scope="module")
def model_cache() -> dict[str, dict[str, Any]]:
    objects = render_kustomization(MODEL_CACHE)
    assert problems_of_objects(objects, "k8s/examples/model-cache") == []
    return {obj["kind"]: obj for obj in objects}


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {variable["name"]: variable.get("value", "") for variable in container.get("env", [])}


def cache_mount(pod_spec: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    claim_volumes = {
        volume["name"]
        for volume in pod_spec["volumes"]
        if volume.get("persistentVolumeClaim", {}).get("claimName") == "model-cache"
    }
    [mount] = [mount for mount in container["volumeMounts"] if mount["name"] in claim_volumes]
    return dict(mount)


def test_model_cache_is_one_shared_volume(model_cache: dict[str, dict[str, Any]]) -> None:
    claim = model_cache["PersistentVolumeClaim"]
    assert claim["metadata"]["name"] == "model-cache"
    assert set(claim["spec"]["accessModes"]) <= {"ReadWriteMany", "ReadOnlyMany"}


def test_model_cache_job_writes_where_the_server_reads(model_cache: dict[str, dict[str, Any]]) -> None:
    job_spec = model_cache["Job"]["spec"]["template"]["spec"]
    [downloader] = job_spec["containers"]
    written = cache_mount(job_spec, downloader)
    assert not written.get("readOnly", False)
    assert env_of(downloader)["HF_HOME"].startswith(written["mountPath"] + "/")

    deployment = model_cache["Deployment"]
    pod_spec = deployment["spec"]["template"]["spec"]
    [server] = pod_spec["containers"]
    read = cache_mount(pod_spec, server)
    assert read.get("readOnly") is True, "serving pods mount the cache read-only"
    assert env_of(server)["HF_HOME"] == env_of(downloader)["HF_HOME"]
    assert env_of(server)["TRANSFORMERS_CACHE"].startswith(env_of(server)["HF_HOME"] + "/")
    for init in pod_spec["initContainers"]:
        assert cache_mount(pod_spec, init).get("readOnly") is True


def test_model_cache_server_runs_on_pooled_gpus_and_can_be_moved(
    model_cache: dict[str, dict[str, Any]],
) -> None:
    template = model_cache["Deployment"]["spec"]["template"]
    assert template["metadata"]["labels"]["tensor-fusion.ai/enabled"] == "true"
    assert {"tensor-fusion.ai/tflops-request", "tensor-fusion.ai/vram-request"} <= set(
        template["metadata"]["annotations"]
    )
    budget = model_cache["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"]
    assert budget.items() <= template["metadata"]["labels"].items()
