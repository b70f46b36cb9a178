"""A node agent on Kubernetes proves its node with its pod's service-account token, reviewed by a real
API server: the auth callout (`python -m tfcommon.nats_auth`, on deploy/nats/nats.conf) grants
`node:<node>` only to a token of the node agent's service account bound to a pod on that node.
Nothing per node is handed out, and a token taken from one node is good for that node only.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from support.nats_servers import SecuredNats, secured_nats_server
from tfcommon import subjects
from tfcommon.bus import NatsEventBus
from tfcommon.kube_local import LocalKubernetes
from tfcommon.settings import NatsSettings

pytestmark = pytest.mark.integration

AGENT_ACCOUNT = "tfpool-node-agent"


@dataclass(frozen=True)
class Cluster:
    namespace: str
    kubectl: list[str]

    def run(self, *arguments: str, stdin: str | None = None) -> str:
        done = subprocess.run(
            [*self.kubectl, *arguments], input=stdin, capture_output=True, text=True, check=False, timeout=60
        )
        assert done.returncode == 0, f"kubectl {' '.join(arguments)}: {done.stderr}"
        return done.stdout

    def token(self, account: str, pod: str | None, audience: str = "tfpool-nats") -> str:
        bound = ["--bound-object-kind", "Pod", "--bound-object-name", pod] if pod else []
        return self.run(
            "create", "token", account, "-n", self.namespace, "--audience", audience, *bound
        ).strip()


@pytest.fixture(scope="module")
def cluster(local_kubernetes: LocalKubernetes) -> Iterator[Cluster]:
    kubectl = [str(Path(sys.executable).parent / "kubectl"), f"--kubeconfig={local_kubernetes.kubeconfig}"]
    suffix = uuid.uuid4().hex[:6]
    found = Cluster(f"callout-{suffix}", kubectl)
    nodes = [f"gpu-a-{suffix}", f"gpu-b-{suffix}"]
    found.run("create", "namespace", found.namespace)
    found.run("create", "serviceaccount", AGENT_ACCOUNT, "-n", found.namespace)
    found.run("create", "serviceaccount", "someone-else", "-n", found.namespace)
    for node in nodes:
        found.run(
            "apply",
            "-f",
            "-",
            stdin=f"""
apiVersion: v1
kind: Node
metadata: {{name: {node}, labels: {{kubernetes.io/hostname: {node}}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: agent-{node}, namespace: {found.namespace}}}
spec:
  nodeName: {node}
  serviceAccountName: {AGENT_ACCOUNT}
  containers: [{{name: agent, image: tfpool:test}}]
""",
        )
    yield found
    found.run("delete", "namespace", found.namespace, "--wait=false")
    found.run("delete", "node", *nodes, "--wait=false")


@pytest.fixture(scope="module")
def callout_nats(
    tmp_path_factory: pytest.TempPathFactory, cluster: Cluster, local_kubernetes: LocalKubernetes
) -> Iterator[SecuredNats]:
    environment = {
        "TF_NATS_CALLOUT_SERVICE_ACCOUNTS": f"{cluster.namespace}:{AGENT_ACCOUNT}",
        "TF_KUBECONFIG": str(local_kubernetes.kubeconfig),
    }
    with secured_nats_server(
        tmp_path_factory.mktemp("callout-nats"), callout_environment=environment
    ) as server:
        yield server


def node_of(cluster: Cluster, which: str) -> str:
    return f"gpu-{which}-{cluster.namespace.removeprefix('callout-')}"


async def test_the_agents_pod_token_connects_it_as_its_own_node(
    callout_nats: SecuredNats, cluster: Cluster
) -> None:
    node = node_of(cluster, "a")
    token_file = Path(callout_nats.callout_log.parent / "agent-token")
    await asyncio.to_thread(token_file.write_text, cluster.token(AGENT_ACCOUNT, f"agent-{node}"))
    settings = NatsSettings(url=callout_nats.url, user=f"node:{node}", password_file=token_file)
    bus = await NatsEventBus.connect(
        callout_nats.url, service="node-agent", user=settings.user, password=settings.password_source()
    )
    try:
        await subjects.provision(bus.js, consumers=subjects.consumers_of("node-agent", node))
    finally:
        await bus.close()
    assert f"node {node} connected" in callout_nats.callout_log.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("claimed", "account", "bound_to", "audience", "reason"),
    [
        ("b", AGENT_ACCOUNT, "a", "tfpool-nats", "runs on"),
        ("a", AGENT_ACCOUNT, None, "tfpool-nats", "no node"),
        ("a", "someone-else", "a", "tfpool-nats", "not a node agent's"),
        ("a", AGENT_ACCOUNT, "a", "https://kubernetes.default.svc", "did not accept"),
    ],
    ids=[
        "a-token-from-another-node",
        "a-token-bound-to-no-pod",
        "another-service-account",
        "another-audience",
    ],
)
async def test_a_token_that_does_not_prove_the_node_is_refused(
    callout_nats: SecuredNats,
    cluster: Cluster,
    claimed: str,
    account: str,
    bound_to: str | None,
    audience: str,
    reason: str,
) -> None:
    pod: str | None
    if bound_to is not None and account != AGENT_ACCOUNT:
        pod = f"other-{node_of(cluster, bound_to)}"
        cluster.run(
            "run",
            pod,
            "-n",
            cluster.namespace,
            "--image=tfpool:test",
            f"--overrides={_pod_on(cluster, bound_to, account)}",
        )
    else:
        pod = None if bound_to is None else f"agent-{node_of(cluster, bound_to)}"
    token = cluster.token(account, pod, audience)
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(
            callout_nats.url,
            user=f"node:{node_of(cluster, claimed)}",
            password=token,
            allow_reconnect=False,
            connect_timeout=10,
        )
    log = callout_nats.callout_log.read_text(encoding="utf-8")
    assert reason in log.splitlines()[-1]
    assert token not in log, "the callout logged a token"


def _pod_on(cluster: Cluster, which: str, account: str) -> str:
    return (
        '{"spec": {"nodeName": "%s", "serviceAccountName": "%s"}}'  # noqa: UP031 - JSON braces
        % (node_of(cluster, which), account)
    )
