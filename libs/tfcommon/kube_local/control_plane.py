"""`LocalKubernetes`: a real Kubernetes control plane as child processes on loopback, its state in a folder.

It runs the programs `tfcommon.kube_local.build` builds from the pinned Go modules: etcd (plain HTTP on
loopback; its gRPC gateway serves `/v3/...` too), kube-apiserver (TLS with its own CA, client
certificates, `Node,RBAC` authorization, the default admission plugins, a service-account issuer and
signing key, an audit log of every request a service account makes), kube-controller-manager (all
default controllers, each with its own service account), kube-scheduler, and KWOK, which plays the
kubelet of every node annotated `kwok.x-k8s.io/node: fake` (Ready nodes with leases, bound pods Running,
deleted pods removed) with KWOK's default stages. An admin kubeconfig is written to `kubeconfig`.

Everything lives under `state_dir` (certificates, etcd's data, ports, logs), so `start()` after `stop()`
finds the same cluster. As `EmbeddedNats` does, with `die_with_parent` each process gets a parent-death
signal, so a killed launcher leaves nothing behind: call `start()` from the main thread.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tfcommon.infra import InfrastructureError, die_with_parent, free_port, stop_process
from tfcommon.kube_local.build import ensure_binaries, kwok_stages_file
from tfcommon.kube_local.pki import (
    ADMIN,
    CONTROLLER_MANAGER,
    FRONT_PROXY_CLIENT,
    KWOK,
    SCHEDULER,
    SERVICE_CLUSTER_IP_RANGE,
    ClientIdentity,
    ControlPlanePki,
    ensure_pki,
)

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
"""Nodes carrying this annotation are KWOK's: it keeps them Ready and runs their pods."""
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
_PORT_NAMES = ("etcd", "etcd_peer", "apiserver", "controller_manager", "scheduler", "kwok")

AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "userGroups": ["system:serviceaccounts:kube-system"]},
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}
"""One `Metadata` record (user, verb, resource, response code) per request of a service account outside
kube-system (the controller manager's own controllers are left out), nothing else."""


def _quiet_tls_context(pki: ControlPlanePki | None) -> ssl.SSLContext:
    if pki is None:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    context = ssl.create_default_context(cafile=str(pki.ca.cert_file))
    admin = pki.client(ADMIN)
    context.load_cert_chain(str(admin.cert_file), str(admin.key_file))
    return context


@dataclass
class _Component:
    name: str
    command: list[str]
    health_url: str
    # What it gets when the launcher dies: the stateless components are killed outright (one that
    # shut down gracefully would wait for an etcd that is going away too); etcd closes its store.
    parent_death_signal: signal.Signals = signal.SIGKILL
    environment: dict[str, str] | None = None
    process: subprocess.Popen[bytes] | None = None


@dataclass
class LocalKubernetes:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler (optional) and KWOK (optional) with
    their state under `state_dir`. `start()` returns once the API server is ready and the controller
    manager has created the `default` service account."""

    state_dir: Path
    host: str = "127.0.0.1"
    bin_dir: Path | None = None
    with_scheduler: bool = True
    with_kwok: bool = True
    die_with_parent: bool = False
    scheduler_arguments: tuple[str, ...] = ()
    """Extra kube-scheduler flags (e.g. `--kube-api-qps=5000` for a benchmark)."""
    progress: Callable[[str], None] = field(default=lambda line: None, repr=False)
    ports: dict[str, int] = field(default_factory=dict)
    _components: list[_Component] = field(default_factory=list, repr=False)

    # -- where things are -------------------------------------------------------------------------

    @property
    def pki(self) -> ControlPlanePki:
        """The CA, certificates and keys under `state_dir/pki` (written by the first `start()`)."""
        return ControlPlanePki(self.state_dir / "pki")

    @property
    def kubeconfig(self) -> Path:
        """The admin's kubeconfig (user `kubernetes-admin` in `system:masters`), certificates embedded."""
        return self.state_dir / "kubeconfig"

    @property
    def api_url(self) -> str:
        """The API server's HTTPS URL on loopback (its CA: `pki.ca.cert_file`)."""
        return f"https://{self.host}:{self.ports['apiserver']}"

    @property
    def etcd_url(self) -> str:
        """etcd's client URL (plain HTTP on loopback; `etcd_call` uses its JSON gateway)."""
        return f"http://{self.host}:{self.ports['etcd']}"

    @property
    def audit_log(self) -> Path:
        """JSON lines, one `audit.k8s.io/v1` Event per service-account request (see `AUDIT_POLICY`)."""
        return self.state_dir / "logs" / "audit.log"

    @property
    def logs_dir(self) -> Path:
        """One `<component>.log` per program, appended to across restarts, and `audit.log`."""
        return self.state_dir / "logs"

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> Path:
        """Build what is missing, start every component and wait until the cluster serves; returns the
        admin kubeconfig. On failure everything started is stopped and `InfrastructureError` names the
        component and its log."""
        bin_dir = self.bin_dir or ensure_binaries(self.progress)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        pki = ensure_pki(self.state_dir / "pki")
        self._assign_ports()
        self._write_kubeconfigs(pki)
        (self.state_dir / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY, sort_keys=False))
        started = time.monotonic()
        try:
            for component in self._plan(bin_dir, pki):
                self._launch(component)
                self._wait_healthy(component, pki)
                self.progress(f"  {component.name} ready ({time.monotonic() - started:.1f}s)")
            self._wait_for_default_service_account(pki)
        except BaseException:
            self.stop()
            raise
        self.progress(f"Kubernetes control plane ready at {self.api_url} ({time.monotonic() - started:.1f}s)")
        return self.kubeconfig

    def stop(self) -> None:
        """Stop every component, newest first; each gets `STOP_TIMEOUT_S` before SIGKILL."""
        while self._components:
            component = self._components.pop()
            _stop(component)

    def restart_api_server(self) -> None:
        """Stop kube-apiserver and start it again on the same port and storage: its watch cache is
        rebuilt from a fresh list, as after a rolling restart. Other components reconnect by themselves."""
        [component] = [c for c in self._components if c.name == "kube-apiserver"]
        _stop(component)
        self._launch(component, register=False)
        self._wait_healthy(component, self.pki)

    # -- etcd -------------------------------------------------------------------------------------

    def etcd_call(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        """One call to etcd's v3 JSON gateway, e.g. `etcd_call("kv/range", {...})`."""
        request = urllib.request.Request(
            f"{self.etcd_url}/v3/{method}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            decoded: dict[str, Any] = json.load(response)
        return decoded

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (physically); returns that revision.
        Reads and watches from an older resource version then fail with `410 Gone` where etcd serves
        them (not from the API server's watch cache: see `restart_api_server`)."""
        key = base64.b64encode(b"compact_rev_key").decode()
        revision = int(self.etcd_call("kv/range", {"key": key})["header"]["revision"])
        self.etcd_call("kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    # -- internals --------------------------------------------------------------------------------

    def _assign_ports(self) -> None:
        """Reuse the ports of the last run (kept in `ports.json`) while they are free, else new ones."""
        saved_file = self.state_dir / "ports.json"
        saved: dict[str, int] = {}
        if saved_file.exists():
            with contextlib.suppress(ValueError):
                saved = {k: int(v) for k, v in json.loads(saved_file.read_text()).items()}
        for name in _PORT_NAMES:
            port = self.ports.get(name) or saved.get(name)
            if not port or not _port_free(self.host, port):
                port = free_port(self.host)
            self.ports[name] = port
        saved_file.write_text(json.dumps(self.ports, indent=2) + "\n")

    def _client_kubeconfig(self, pki: ControlPlanePki, identity: ClientIdentity, embed: bool) -> str:
        pair = pki.client(identity)
        user: dict[str, str]
        cluster: dict[str, str] = {"server": self.api_url}
        if embed:
            cluster["certificate-authority-data"] = base64.b64encode(pki.ca.cert_file.read_bytes()).decode()
            user = {
                "client-certificate-data": base64.b64encode(pair.cert_file.read_bytes()).decode(),
                "client-key-data": base64.b64encode(pair.key_file.read_bytes()).decode(),
            }
        else:
            cluster["certificate-authority"] = str(pki.ca.cert_file)
            user = {"client-certificate": str(pair.cert_file), "client-key": str(pair.key_file)}
        document = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "tfpool-local", "cluster": cluster}],
            "users": [{"name": identity.common_name, "user": user}],
            "contexts": [
                {
                    "name": "tfpool-local",
                    "context": {"cluster": "tfpool-local", "user": identity.common_name},
                }
            ],
            "current-context": "tfpool-local",
        }
        return yaml.safe_dump(document, sort_keys=False)

    def _component_kubeconfig(self, identity: ClientIdentity) -> Path:
        return self.state_dir / f"{identity.file_stem}.kubeconfig"

    def _write_kubeconfigs(self, pki: ControlPlanePki) -> None:
        for identity in (CONTROLLER_MANAGER, SCHEDULER, KWOK):
            _write_private_text(
                self._component_kubeconfig(identity), self._client_kubeconfig(pki, identity, False)
            )
        _write_private_text(self.kubeconfig, self._client_kubeconfig(pki, ADMIN, True))

    def _plan(self, bin_dir: Path, pki: ControlPlanePki) -> list[_Component]:
        host, ports, state = self.host, self.ports, self.state_dir
        peer = f"http://{host}:{ports['etcd_peer']}"
        components = [
            _Component(
                "etcd",
                [
                    str(bin_dir / "etcd"),
                    "--name=tfpool-local",
                    f"--data-dir={state / 'etcd'}",
                    f"--listen-client-urls={self.etcd_url}",
                    f"--advertise-client-urls={self.etcd_url}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=tfpool-local={peer}",
                    "--log-level=warn",
                ],
                f"{self.etcd_url}/health",
                parent_death_signal=signal.SIGTERM,
            ),
            _Component(
                "kube-apiserver",
                [
                    str(bin_dir / "kube-apiserver"),
                    f"--etcd-servers={self.etcd_url}",
                    f"--bind-address={host}",
                    f"--advertise-address={host}",
                    f"--secure-port={ports['apiserver']}",
                    f"--tls-cert-file={pki.api_server.cert_file}",
                    f"--tls-private-key-file={pki.api_server.key_file}",
                    f"--client-ca-file={pki.ca.cert_file}",
                    f"--requestheader-client-ca-file={pki.front_proxy_ca.cert_file}",
                    f"--requestheader-allowed-names={FRONT_PROXY_CLIENT.common_name}",
                    "--requestheader-username-headers=X-Remote-User",
                    "--requestheader-group-headers=X-Remote-Group",
                    "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                    f"--proxy-client-cert-file={pki.client(FRONT_PROXY_CLIENT).cert_file}",
                    f"--proxy-client-key-file={pki.client(FRONT_PROXY_CLIENT).key_file}",
                    "--authorization-mode=Node,RBAC",
                    f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                    f"--service-account-key-file={pki.service_account_public_key}",
                    f"--service-account-signing-key-file={pki.service_account_key}",
                    f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                    # The `kubernetes` Service cannot list a loopback endpoint (Endpoints validation).
                    "--endpoint-reconciler-type=none",
                    f"--audit-policy-file={state / 'audit-policy.yaml'}",
                    f"--audit-log-path={self.audit_log}",
                    "--audit-log-maxbackup=3",
                    "--allow-privileged=true",
                    # On SIGTERM, end the open watches too, so that it exits at once.
                    "--shutdown-watch-termination-grace-period=2s",
                    "--profiling=false",
                    f"--cert-dir={state / 'apiserver'}",
                ],
                f"{self.api_url}/readyz",
            ),
            self._kube_component(
                "kube-controller-manager",
                bin_dir,
                CONTROLLER_MANAGER,
                ports["controller_manager"],
                [
                    "--use-service-account-credentials=true",
                    f"--service-account-private-key-file={pki.service_account_key}",
                    f"--root-ca-file={pki.ca.cert_file}",
                    f"--cluster-signing-cert-file={pki.ca.cert_file}",
                    f"--cluster-signing-key-file={pki.ca.key_file}",
                    f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                ],
            ),
        ]
        if self.with_scheduler:
            components.append(
                self._kube_component(
                    "kube-scheduler", bin_dir, SCHEDULER, ports["scheduler"], list(self.scheduler_arguments)
                )
            )
        if self.with_kwok:
            key, value = KWOK_NODE_ANNOTATION
            kwok_home = state / "kwok"
            kwok_home.mkdir(exist_ok=True)
            components.append(
                _Component(
                    "kwok",
                    [
                        str(bin_dir / "kwok"),
                        f"--config={kwok_stages_file(bin_dir)}",
                        f"--kubeconfig={self._component_kubeconfig(KWOK)}",
                        "--manage-all-nodes=false",
                        f"--manage-nodes-with-annotation-selector={key}={value}",
                        "--node-lease-duration-seconds=40",
                        f"--server-address={host}:{ports['kwok']}",
                        "--cidr=10.244.0.0/16",
                    ],
                    f"http://{host}:{ports['kwok']}/healthz",
                    # KWOK reads ~/.kwok/kwok.yaml when it exists: give it a home of its own.
                    environment={**os.environ, "HOME": str(kwok_home)},
                )
            )
        return components

    def _kube_component(
        self, name: str, bin_dir: Path, identity: ClientIdentity, port: int, extra: list[str]
    ) -> _Component:
        kubeconfig = self._component_kubeconfig(identity)
        return _Component(
            name,
            [
                str(bin_dir / name),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--bind-address={self.host}",
                f"--secure-port={port}",
                f"--cert-dir={self.state_dir / name}",
                # One instance: no lease to wait for when it restarts.
                "--leader-elect=false",
                *extra,
            ],
            f"https://{self.host}:{port}/healthz",
        )

    def _launch(self, component: _Component, *, register: bool = True) -> None:
        log_path = self.logs_dir / f"{component.name}.log"
        with log_path.open("ab") as log:
            log.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(component.command)}\n".encode())
            log.flush()
            component.process = subprocess.Popen(
                component.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=component.environment,
                start_new_session=True,
                preexec_fn=die_with_parent(component.parent_death_signal) if self.die_with_parent else None,
            )
        if register:
            self._components.append(component)

    def _wait_healthy(self, component: _Component, pki: ControlPlanePki) -> None:
        assert component.process is not None
        log_path = self.logs_dir / f"{component.name}.log"
        context = _quiet_tls_context(pki if component.name == "kube-apiserver" else None)
        deadline = time.monotonic() + READY_TIMEOUT_S
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            if component.process.poll() is not None:
                raise InfrastructureError(
                    f"{component.name} exited with code {component.process.returncode} before it was ready; "
                    f"its log: {log_path}\n{_tail(log_path)}"
                )
            try:
                with urllib.request.urlopen(component.health_url, timeout=5, context=context) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError, ValueError) as error:
                last_error = str(error)
            time.sleep(0.25)
        raise InfrastructureError(
            f"{component.name} not ready within {READY_TIMEOUT_S:.0f}s ({component.health_url}: "
            f"{last_error}); its log: {log_path}\n{_tail(log_path)}"
        )

    def _wait_for_default_service_account(self, pki: ControlPlanePki) -> None:
        """Pods can only be created once the controller manager made the namespace's service account."""
        context = _quiet_tls_context(pki)
        url = f"{self.api_url}/api/v1/namespaces/default/serviceaccounts/default"
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(url, timeout=5, context=context) as reply,
            ):
                if reply.status == 200:
                    return
            time.sleep(0.25)
        raise InfrastructureError(
            "kube-controller-manager did not create the default service account within "
            f"{READY_TIMEOUT_S:.0f}s; its log: {self.logs_dir / 'kube-controller-manager.log'}"
        )


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _write_private_text(path: Path, text: str) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(text)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _stop(component: _Component) -> None:
    stop_process(component.process, signal.SIGTERM, STOP_TIMEOUT_S)


@contextlib.contextmanager
def running(control_plane: LocalKubernetes) -> Iterator[LocalKubernetes]:
    """`with running(LocalKubernetes(...)) as cluster:` start it, and stop it however the block ends."""
    control_plane.start()
    try:
        yield control_plane
    finally:
        control_plane.stop()
