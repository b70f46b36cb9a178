"""The migration guide's kubectl commands, verbatim, with the real kubectl on `tfctl up --kubernetes`.

`docs/guides/migrate-existing-workloads.md` is the runnable form of `seeds/migrate-existing-workload.en.txt`
(the seed's commands have placeholders such as `<pod-name>`; the guide names `ml-serving/llm` and
ships its manifests in `docs/guides/manifests/`). Its commands are read from its console blocks (as
the local-stack guide test does) and run from the repository root with `KUBECONFIG` set to the
stack's admin kubeconfig, against a real API server, controller manager, kube-scheduler and KWOK,
with the five services in Kubernetes mode under their own service accounts. The steps share one
stack and run in file order, like the guide: native pods on the device plugin, `enabled-replicas`
1, 2, 4, 8 (COMPONENT column), `gpu-ids` and `kubectl get gpu` AVAILABLE, `enabled-replicas` removed,
the fraction with several pods on one card, the roll back, and automatic migration with the guide's
scope plus a `namespaceSelector` on real Namespace labels and a pod template labelled
`tensor-fusion.ai/enabled: "false"`.

The seed's per-pod commands (step 1's `jsonpath` of each container's limits, step 4's `jsonpath` of
`tensor-fusion.ai/gpu-ids`) are in the guide as the seed writes them, with only its names filled in
(`<pod-name>` is `"$POD" -n ml-serving`; `SEED_*` below quote the seed and the test fails if the guide
drifts from them), and run here with `$POD` set to a real pod, their output compared with what the seed
says the user sees. `kubectl exec "$POD" ... -- nvidia-smi` is the one command not run: KWOK runs no
containers, so there is no process to exec into.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_stack_up import KUBECTL, KubeStack, create_namespace, eventually, running_kube_stack
from tfcommon.quantities import parse_bytes, parse_milli
from tfctl.kube_stack import local_manifests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "docs"))
from guide_commands import GUIDES, REPO_ROOT, GuideCommand, commands_in

pytestmark = pytest.mark.e2e

GUIDE = "migrate-existing-workloads.md"
COMMANDS = commands_in((GUIDES / GUIDE).read_text(encoding="utf-8"), GUIDE)
MANIFESTS = GUIDES / "manifests"
BASE_CONFIG = REPO_ROOT / "k8s" / "base" / "config" / "config.yaml"
NODES = ("--fake-gpus", "H100:8", "--fake-gpus", "H100:8")
"""Sixteen H100s: eight whole-GPU pods plus a rolling update's surge, and device-plugin room for the
automatic-migration workloads next to the rolled-back ones."""
WHOLE_H100 = (989_400, 80 * 2**30)
NAMESPACE = "ml-serving"
ENABLED = "tensor-fusion.ai/enabled"
ISOLATION = "tensor-fusion.ai/isolation"
NATIVE_GPU = "nvidia.com/gpu"
GPU_IDS = "tensor-fusion.ai/gpu-ids"
TF_SCHEDULER = "tensor-fusion-scheduler"
SELECTED_NAMESPACE_LABEL = {"tfpool.example/migrate": "yes"}
"""The label of the namespace that the scope's added `namespaceSelector` takes in."""
SEED_LIMITS = (
    "kubectl get pod <pod-name> -o jsonpath="
    r"""'{range .spec.containers[*]}{.name}{"\t"}{.resources.limits}{"\n"}{end}'"""
)
"""`seeds/migrate-existing-workload.en.txt`, step 1, as written there."""
SEED_GPU_IDS = (
    r"""kubectl get pod "$POD" -o jsonpath='{.metadata.annotations.tensor-fusion\.ai/gpu-ids}{"\n"}'"""
)
"""`seeds/migrate-existing-workload.en.txt`, step 4, as written there."""
SEED_POD = '"$POD" -n ml-serving'
"""What the guide writes for the seed's pod (`<pod-name>` and `"$POD"`): the shell variable, and the
namespace the seed leaves to the current context."""
REMOVE_ENABLED_REPLICAS = "kubectl patch deployment llm -n ml-serving --type json -p"


def command(prefix: str) -> GuideCommand:
    """The guide's kubectl command that starts with `prefix` (written once, or the same each time it is
    written); the test fails if the guide changed."""
    found = [c for c in COMMANDS if c.text.startswith(prefix)]
    assert len({c.text for c in found}) == 1, f"{GUIDE}: commands starting with {prefix!r}: {found}"
    return found[0]


def seed_command(seed: str) -> GuideCommand:
    """The guide's command that is the seed's `seed`, with only the pod's name filled in."""
    written = seed.replace("<pod-name>", '"$POD"').replace('"$POD"', SEED_POD)
    found = command(written)
    assert found.text == written, f"{GUIDE}:{found.line} is not the seed's command:\n{found.text}\n{written}"
    return found


def manifest(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((MANIFESTS / name).read_text())
    return loaded


@dataclass
class Guide:
    """The stack, and the configuration file its services read (`TF_CONFIG_FILE`)."""

    stack: KubeStack
    config_file: Path

    def run(self, step: GuideCommand | str) -> str:
        """Run a guide command (or one shaped like it) from the repository root as a user's shell
        would, with the stack's kubeconfig; it must exit as the guide says."""
        text = step.text if isinstance(step, GuideCommand) else step
        expected = step.expected_exit if isinstance(step, GuideCommand) else 0
        argv = GuideCommand(GUIDE, 0, text, expected).argv
        assert argv[0] == "kubectl", text
        result = subprocess.run(
            [KUBECTL, *argv[1:]],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            env={"KUBECONFIG": self.stack.kubeconfig, "HOME": str(self.stack.state_dir)},
            timeout=120,
            check=False,
        )
        assert result.returncode == expected, f"{text}\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def table(self, step: GuideCommand | str) -> list[dict[str, str]]:
        return columns(self.run(step))

    def rolled_out(self, namespace: str = NAMESPACE, name: str = "llm") -> list[dict[str, Any]]:
        """`kubectl rollout status` (the guide's, for another workload with its names), then the
        workload's pods once the old ones are gone."""
        status = command("kubectl rollout status deployment/llm -n ml-serving").text
        self.run(status.replace("deployment/llm -n ml-serving", f"deployment/{name} -n {namespace}"))
        replicas = self.stack.kubectl_json("get", "deployment", name, "-n", namespace)["spec"]["replicas"]

        def settled() -> list[dict[str, Any]] | None:
            pods: list[dict[str, Any]] = self.stack.kubectl_json(
                "get", "pods", "-n", namespace, "-l", f"app={name}"
            )["items"]
            running = [pod for pod in pods if pod["status"].get("phase") == "Running"]
            return pods if len(pods) == len(running) == replicas else None

        return eventually(f"{namespace}/{name}'s {replicas} new pods, and only those, Running", settled)

    def for_pod(self, step: GuideCommand, pod: str) -> str:
        """Run a guide command written for `"$POD"` with `POD` set to `pod`, as the user's shell would."""
        assert '"$POD"' in step.text, step.text
        return self.run(step.text.replace('"$POD"', pod))

    def components(self) -> dict[str, str]:
        """Step 3's `-L tensor-fusion.ai/component`: pod name -> its COMPONENT cell."""
        rows = self.table(command("kubectl get pod -n ml-serving -l app=llm -L tensor-fusion.ai/component"))
        return {row["NAME"]: row["COMPONENT"] for row in rows}

    def gpus_of_pods(self) -> dict[str, list[str]]:
        """Pod name -> the GPUs in its `tensor-fusion.ai/gpu-ids` (from the pods' JSON)."""
        pods = self.stack.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", "app=llm")["items"]
        return {
            pod["metadata"]["name"]: [
                gpu for gpu in pod["metadata"].get("annotations", {}).get(GPU_IDS, "").split(",") if gpu
            ]
            for pod in pods
        }

    def seed_gpu_ids(self, pod: str) -> str:
        """Step 4's first command, the seed's, for `pod`: its `gpu-ids` and a newline."""
        return self.for_pod(seed_command(SEED_GPU_IDS), pod)

    def available(self) -> dict[str, str]:
        """Step 4's AVAILABLE column: GPU name -> what kubectl prints for `.status.available`."""
        rows = self.table(command("kubectl get gpu -o custom-columns='NAME:.metadata.name,AVAILABLE:"))
        return {row["NAME"]: row["AVAILABLE"] for row in rows}

    def available_amounts(self) -> dict[str, tuple[int, int]]:
        """Every GPU's available (milli-TFLOPS, VRAM bytes), from the GPU objects' status."""
        return {
            gpu["metadata"]["name"]: (
                parse_milli(gpu["status"]["available"]["tflops"]),
                parse_bytes(gpu["status"]["available"]["vram"]),
            )
            for gpu in self.stack.kubectl_json("get", "gpu")["items"]
        }


def columns(output: str) -> list[dict[str, str]]:
    """kubectl's table output as rows keyed by header, cut at the headers' offsets (empty cells stay
    empty; the last column keeps its spaces, as `map[tflops:0 vram:0]` has)."""
    header, *lines = output.rstrip("\n").splitlines()
    names = header.split()
    starts = [header.index(name) for name in names]
    ends = [*starts[1:], None]
    return [
        {name: line[start:end].strip() for name, start, end in zip(names, starts, ends, strict=True)}
        for line in lines
    ]


def assert_on_the_device_plugin(pod: dict[str, Any]) -> None:
    """A pod left untouched: no COMPONENT, its `nvidia.com/gpu` limit, placed by kube-scheduler."""
    labels = pod["metadata"].get("labels", {})
    assert "tensor-fusion.ai/component" not in labels, labels
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {NATIVE_GPU: "1"}
    assert "tensor-fusion.ai/gpu-ids" not in pod["metadata"].get("annotations", {})


def assert_whole_gpu(pod: dict[str, Any], gpus: set[str]) -> str:
    """A pod taken over as a whole GPU (step 2): ours to schedule, no device-plugin limit, one GPU."""
    metadata = pod["metadata"]
    assert metadata["labels"]["tensor-fusion.ai/component"] == "worker"
    assert metadata["labels"][ENABLED] == "true"
    assert metadata["annotations"][ISOLATION] == "shared"
    assert pod["spec"]["schedulerName"] == TF_SCHEDULER
    assert NATIVE_GPU not in pod["spec"]["containers"][0]["resources"].get("limits", {})
    gpu_ids: str = metadata["annotations"]["tensor-fusion.ai/gpu-ids"]
    [gpu] = gpu_ids.split(",")
    assert gpu in gpus
    return gpu


@pytest.fixture(scope="module")
def guide(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guide]:
    """One stack for the whole guide; its services read a configuration file that starts as the
    base install's (`k8s/base/config/config.yaml`, automatic migration off)."""
    config_file = tmp_path_factory.mktemp("tfpool-config") / "config.yaml"
    config_file.write_text(BASE_CONFIG.read_text())
    with running_kube_stack(NODES, TF_CONFIG_FILE=str(config_file)) as stack:
        yield Guide(stack, config_file)


@pytest.fixture(scope="module")
def gpus(guide: Guide) -> set[str]:
    """Before you start: `kubectl get gpupool,gpunode,gpu` lists the agents' GPUs."""
    eventually("the agents' 16 GPUs", lambda: len(guide.stack.kubectl_json("get", "gpu")["items"]) == 16)
    listed = guide.run(command("kubectl get gpupool,gpunode,gpu"))
    names = {row["NAME"].removeprefix("gpu.tensor-fusion.ai/") for row in columns(listed.split("\n\n")[-1])}
    assert len(names) == 16, listed
    return names


def test_step_1_native_pods_run_on_the_device_plugin_of_the_gpu_nodes(guide: Guide, gpus: set[str]) -> None:
    create_namespace(guide.stack, NAMESPACE)
    guide.run(command("kubectl apply -f docs/guides/manifests/llm-native.yaml"))

    pods = guide.rolled_out()

    assert len(pods) == manifest("llm-native.yaml")["spec"]["replicas"] == 8
    for pod in pods:
        assert_on_the_device_plugin(pod)
        assert pod["spec"]["nodeName"] in {"sim-node-1", "sim-node-2"}
    limits = seed_command(SEED_LIMITS)
    for pod in pods:
        # The seed: "Note the number of GPUs per Pod" (the container, a tab, its limits).
        assert guide.for_pod(limits, pod["metadata"]["name"]) == 'app\t{"nvidia.com/gpu":"1"}\n'
    capacity = guide.table(command("kubectl get gpu -o custom-columns='NAME:.metadata.name,MODEL:"))
    assert {(row["MODEL"], row["CAPACITY"]) for row in capacity} == {
        ("H100", "map[tflops:989400m vram:80Gi]")
    }
    assert set(guide.available().values()) == {"map[tflops:989400m vram:80Gi]"}, "nothing allocated yet"


def test_step_2_exactly_one_replica_is_taken_over_as_a_whole_gpu(guide: Guide, gpus: set[str]) -> None:
    guide.run(command("kubectl apply -f docs/guides/manifests/llm-whole-gpu.yaml"))

    pods = {pod["metadata"]["name"]: pod for pod in guide.rolled_out()}

    components = guide.components()
    assert sorted(components.values()) == [""] * 7 + ["worker"], components
    [migrated] = [name for name, component in components.items() if component == "worker"]
    gpu = assert_whole_gpu(pods[migrated], gpus)
    assert guide.gpus_of_pods() == {name: [gpu] if name == migrated else [] for name in pods}
    assert guide.seed_gpu_ids(migrated) == f"{gpu}\n", "the seed's step 4: its gpu-ids lists its GPU"
    for name, pod in pods.items():
        if name != migrated:
            assert_on_the_device_plugin(pod)
            assert guide.seed_gpu_ids(name) == "\n", "a pod left to the device plugin has no gpu-ids"
    eventually(f"{gpu} showing zero available", lambda: guide.available()[gpu] == "map[tflops:0 vram:0]")
    assert sum(value == "map[tflops:0 vram:0]" for value in guide.available().values()) == 1


@pytest.mark.parametrize("enabled", [2, 4, 8])
def test_step_3_raising_enabled_replicas_takes_over_that_many(
    guide: Guide, gpus: set[str], enabled: int
) -> None:
    patch = command("kubectl patch deployment llm -n ml-serving --type merge -p").text
    raised = patch.replace('enabled-replicas":"2"', f'enabled-replicas":"{enabled}"')
    assert raised != patch or enabled == 2, patch
    guide.run(raised)

    pods = {pod["metadata"]["name"]: pod for pod in guide.rolled_out()}

    components = guide.components()
    assert Counter(components.values()) == Counter({"worker": enabled, "": 8 - enabled}), components
    held = guide.gpus_of_pods()
    for name, component in components.items():
        if component:
            assert held[name] == [assert_whole_gpu(pods[name], gpus)]
        else:
            assert_on_the_device_plugin(pods[name])
            assert held[name] == []


def assert_each_pod_has_its_own_gpu_showing_zero_available(guide: Guide) -> None:
    """Step 4's checks on every pod: the seed's `gpu-ids` command prints one GPU per pod, a different
    one each, and exactly those GPUs show zero available."""
    held = guide.gpus_of_pods()

    assigned = [gpu for gpus in held.values() for gpu in gpus]
    assert len(held) == 8
    assert all(len(gpus) == 1 for gpus in held.values()), held
    assert len(set(assigned)) == 8, "a whole GPU each"
    for pod, gpus in held.items():
        assert guide.seed_gpu_ids(pod) == f"{gpus[0]}\n"

    def zero_on_exactly_the_assigned() -> bool:
        zero = {gpu for gpu, value in guide.available().items() if value == "map[tflops:0 vram:0]"}
        return zero == set(assigned)

    eventually("exactly the assigned GPUs showing zero available", zero_on_exactly_the_assigned)


def test_step_4_every_pod_has_its_own_gpu_and_those_gpus_show_zero_available(guide: Guide) -> None:
    assert_each_pod_has_its_own_gpu_showing_zero_available(guide)


def test_step_4_removing_enabled_replicas_rolls_out_with_every_pod_still_taken_over(
    guide: Guide, gpus: set[str]
) -> None:
    guide.run(command(REMOVE_ENABLED_REPLICAS))

    pods = guide.rolled_out()

    template = guide.stack.kubectl_json("get", "deployment", "llm", "-n", NAMESPACE)["spec"]["template"]
    assert "tensor-fusion.ai/enabled-replicas" not in template["metadata"]["annotations"]
    assert set(guide.components().values()) == {"worker"}
    for pod in pods:
        assert_whole_gpu(pod, gpus)
    assert_each_pod_has_its_own_gpu_showing_zero_available(guide)


def test_step_5_the_fraction_rolls_out_and_several_pods_share_one_card(guide: Guide) -> None:
    fraction = manifest("llm-fraction.yaml")
    annotations = fraction["spec"]["template"]["metadata"]["annotations"]
    assert fraction["spec"]["template"]["spec"]["containers"][0]["resources"] == {}, "native limit removed"
    guide.run(command("kubectl apply -f docs/guides/manifests/llm-fraction.yaml"))

    pods = guide.rolled_out()

    assert set(guide.components().values()) == {"worker"}
    for pod in pods:
        assert pod["metadata"]["annotations"][ISOLATION] == "soft"
        assert pod["spec"]["schedulerName"] == TF_SCHEDULER
        assert pod["spec"]["containers"][0]["resources"].get("limits", {}).get(NATIVE_GPU) is None
    per_gpu = Counter(gpu for gpus in guide.gpus_of_pods().values() for gpu in gpus)
    assert sum(per_gpu.values()) == 8
    assert max(per_gpu.values()) >= 2, f"several pods share a card: {per_gpu}"
    share = (
        parse_milli(annotations["tensor-fusion.ai/tflops-request"]),
        parse_bytes(annotations["tensor-fusion.ai/vram-request"]),
    )
    assert share == (30_000, 8 * 2**30)
    expected = {
        gpu: (WHOLE_H100[0] - per_gpu[gpu] * share[0], WHOLE_H100[1] - per_gpu[gpu] * share[1])
        for gpu in guide.available()
    }
    eventually(
        "each GPU's available TFLOPS and VRAM less its pods' shares (the whole GPUs released)",
        lambda: guide.available_amounts() == expected,
    )


def test_roll_back_returns_the_pods_to_the_device_plugin_and_frees_every_gpu(guide: Guide) -> None:
    guide.run(command("kubectl apply -f docs/guides/manifests/llm-native.yaml"))

    pods = guide.rolled_out()

    for pod in pods:
        assert_on_the_device_plugin(pod)
    assert set(guide.components().values()) == {""}
    assert all(gpus == [] for gpus in guide.gpus_of_pods().values())
    eventually(
        "every GPU fully available again",
        lambda: set(guide.available_amounts().values()) == {WHOLE_H100},
    )


def a_workload(
    namespace: str, name: str, replicas: int, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """The guide's native Deployment (`llm-native.yaml`) under another namespace and name."""
    deployment = copy.deepcopy(manifest("llm-native.yaml"))
    deployment["metadata"].update({"name": name, "namespace": namespace})
    deployment["spec"]["replicas"] = replicas
    deployment["spec"]["selector"]["matchLabels"] = {"app": name}
    deployment["spec"]["template"]["metadata"]["labels"] = {"app": name, **(labels or {})}
    return deployment


def install_auto_migration(guide: Guide, rendered: str, scope_addition: dict[str, Any]) -> None:
    """`kubectl apply -k docs/guides/manifests/auto-migration` as it lands on `tfctl up --kubernetes`:
    the overlay's configuration file (its ConfigMap `tfpool-config`, with `scope_addition` merged
    into `includes`) becomes the file the services read, and its webhook registration (the
    component's, without `objectSelector`) is applied as the stack applies the base's, with the
    loopback url. The overlay's workloads are not applied: the stack runs the services itself."""
    documents = [document for document in yaml.safe_load_all(rendered) if document]
    [config_map] = [
        d for d in documents if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("tfpool-config")
    ]
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    config["dynamicConfig"]["autoMigration"]["scope"]["includes"].update(scope_addition)
    webhook_url = next(s["url"] for s in guide.stack.summary["services"] if s["service"] == "webhook")
    ca_bundle = (guide.stack.state_dir / "certs" / "tls.crt").read_bytes()
    [registration] = [
        d
        for d in local_manifests(rendered, webhook_url, ca_bundle)
        if d["kind"] == "MutatingWebhookConfiguration"
    ]
    assert "objectSelector" not in registration["webhooks"][0], "the component lets unlabelled pods in"
    guide.config_file.write_text(yaml.safe_dump(config))
    guide.stack.kubectl(
        "apply", "--server-side", "--force-conflicts", "--field-manager=tfctl-up", "-f", "-",
        stdin=json.dumps(registration),
    )  # fmt: skip


def native_probe(namespace: str) -> str:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe", "namespace": namespace},
        "spec": {"containers": [{"name": "app", "image": "vllm", "resources": {"limits": {NATIVE_GPU: 1}}}]},
    }
    return json.dumps(pod)


def test_automatic_migration_converts_new_pods_in_scope_only(guide: Guide, gpus: set[str]) -> None:
    create_namespace(guide.stack, "ml-team-a")
    create_namespace(guide.stack, "ml-team-b")
    create_namespace(guide.stack, "ml-team-c", labels=SELECTED_NAMESPACE_LABEL)
    workloads = {
        ("ml-team-a", "llm"): a_workload("ml-team-a", "llm", 2),
        ("ml-team-a", "batch"): a_workload("ml-team-a", "batch", 1, {"gpu-migration": "skip"}),
        ("ml-team-a", "pinned"): a_workload("ml-team-a", "pinned", 1, {ENABLED: "false"}),
        ("ml-team-b", "llm"): a_workload("ml-team-b", "llm", 1),
        ("ml-team-c", "llm"): a_workload("ml-team-c", "llm", 1),
    }
    for deployment in workloads.values():
        guide.stack.apply(deployment)
    for namespace, name in workloads:
        for pod in guide.rolled_out(namespace, name):
            assert_on_the_device_plugin(pod)

    rendered = guide.run(command("kubectl kustomize docs/guides/manifests/auto-migration"))
    install_auto_migration(guide, rendered, {"namespaceSelector": {"matchLabels": SELECTED_NAMESPACE_LABEL}})

    def converting() -> bool:
        dry_run = guide.stack.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-", stdin=native_probe("ml-team-a")
        )
        labels: dict[str, str] = json.loads(dry_run)["metadata"].get("labels", {})
        return labels.get(ENABLED) == "true"

    eventually("the webhook converting new native pods in ml-team-a", converting)
    for pod in guide.stack.kubectl_json("get", "pods", "-n", "ml-team-a")["items"]:
        assert_on_the_device_plugin(pod)  # pods already running are left alone

    restart = command("kubectl rollout restart deployment/llm -n ml-team-a").text
    restarted = {}
    for namespace, name in workloads:
        guide.run(restart.replace("deployment/llm -n ml-team-a", f"deployment/{name} -n {namespace}"))
        restarted[namespace, name] = guide.rolled_out(namespace, name)

    converted = [pod for key in (("ml-team-a", "llm"), ("ml-team-c", "llm")) for pod in restarted[key]]
    assert len(converted) == 3
    held = [assert_whole_gpu(pod, gpus) for pod in converted]
    for key in (("ml-team-a", "batch"), ("ml-team-a", "pinned"), ("ml-team-b", "llm")):
        for pod in restarted[key]:
            assert_on_the_device_plugin(pod)
    eventually(
        "the converted pods' GPUs showing zero available",
        lambda: all(guide.available()[gpu] == "map[tflops:0 vram:0]" for gpu in held),
    )
