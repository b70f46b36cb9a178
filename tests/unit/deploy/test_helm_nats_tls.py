"""charts/tfpool with `nats.tls.enabled`: the bundled NATS serves TLS with a certificate the chart
generates for the name the services connect by, and every service checks it against the CA it mounts.

A real nats-server started with the chart's own TLS arguments and certificate takes our TLS context:
tests/integration/deploy/test_nats_tls.py.
"""

from __future__ import annotations

import base64
from typing import Any
from urllib.parse import urlsplit

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from deploy_support import kubernetes_problem
from test_helm_chart import AGENT_NAMESPACE, CHART, EXTERNAL, NAMESPACE, run_helm, set_flags, template

TLS = {"nats.tls.enabled": "true"}
NATS_STATEFULSET = ("StatefulSet", "tfpool-nats")
OWN_NATS_TLS = {**EXTERNAL, **TLS, "nats.tls.caSecret": "my-nats-ca"}
SERVICES = {"Deployment": ("webhook", "scheduler", "defrag-planner", "metrics"), "DaemonSet": ("node-agent",)}


def secret(objects: tuple[dict[str, Any], ...], name: str, namespace: str) -> dict[str, bytes]:
    (found,) = [
        obj
        for obj in objects
        if obj["kind"] == "Secret"
        and (obj["metadata"]["name"], obj["metadata"]["namespace"]) == (name, namespace)
    ]
    return {key: base64.b64decode(value) for key, value in found["data"].items()}


def service_pods(objects: tuple[dict[str, Any], ...]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each tfpool service: its namespace and its pod spec."""
    pods = {}
    for obj in objects:
        name = obj["metadata"]["name"].removeprefix("tfpool-")
        if name in SERVICES.get(obj["kind"], ()):
            pods[name] = (obj["metadata"]["namespace"], obj["spec"]["template"]["spec"])
    return pods


def nats_statefulset(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    (statefulset,) = [obj for obj in objects if (obj["kind"], obj["metadata"]["name"]) == NATS_STATEFULSET]
    return statefulset


def nats_container(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    (container,) = nats_statefulset(objects)["spec"]["template"]["spec"]["containers"]
    return container


def test_tls_is_off_by_default() -> None:
    objects = template()
    assert "--tls" not in nats_container(objects)["args"]
    for name, (_, pod) in service_pods(objects).items():
        (container,) = pod["containers"]
        assert "TF_NATS_TLS_CA_FILE" not in {env["name"] for env in container["env"]}, name


def test_every_rendered_object_is_valid_with_tls() -> None:
    problems = [problem for obj in template(TLS) if (problem := kubernetes_problem(obj))]
    assert problems == []


def test_bundled_nats_serves_tls_with_the_generated_certificate() -> None:
    objects = template(TLS)
    container = nats_container(objects)
    args = container["args"]
    assert args[args.index("--tls") :][:5] == [
        "--tls",
        "--tlscert",
        "/etc/nats/tls/tls.crt",
        "--tlskey",
        "/etc/nats/tls/tls.key",
    ]
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    assert mounts["tls"] == "/etc/nats/tls"
    volumes = {
        volume["name"]: volume for volume in nats_statefulset(objects)["spec"]["template"]["spec"]["volumes"]
    }
    assert volumes["tls"]["secret"]["secretName"] == "tfpool-nats-tls"


def test_the_certificate_lists_the_host_the_services_connect_to_and_chains_to_the_mounted_ca() -> None:
    objects = template(TLS)
    tls = secret(objects, "tfpool-nats-tls", NAMESPACE)
    certificate = x509.load_pem_x509_certificate(tls["tls.crt"])
    host = urlsplit(secret(objects, "tfpool-nats", NAMESPACE)["url"].decode()).hostname
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert host in names.get_values_for_type(x509.DNSName)
    for namespace in (NAMESPACE, AGENT_NAMESPACE):
        ca = x509.load_pem_x509_certificate(secret(objects, "tfpool-nats-ca", namespace)["ca.crt"])
        assert set(secret(objects, "tfpool-nats-ca", namespace)) == {"ca.crt"}, "the CA only, no key"
        public_key = ca.public_key()
        assert isinstance(public_key, rsa.RSAPublicKey)
        assert certificate.signature_hash_algorithm is not None
        public_key.verify(
            certificate.signature,
            certificate.tbs_certificate_bytes,
            padding.PKCS1v15(),
            certificate.signature_hash_algorithm,
        )


@pytest.mark.parametrize(
    ("values", "ca_secret"),
    [(TLS, "tfpool-nats-ca"), (OWN_NATS_TLS, "my-nats-ca")],
    ids=["bundled", "own-nats"],
)
def test_every_service_checks_nats_against_the_ca_it_mounts(values: dict[str, str], ca_secret: str) -> None:
    pods = service_pods(template(values))
    assert set(pods) == {"webhook", "scheduler", "defrag-planner", "metrics", "node-agent"}
    for name, (namespace, pod) in pods.items():
        (container,) = pod["containers"]
        env = {entry["name"]: entry.get("value") for entry in container["env"]}
        assert env["TF_NATS_TLS_CA_FILE"] == "/etc/tfpool/nats-ca/ca.crt", name
        mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
        assert mounts["nats-ca"] == "/etc/tfpool/nats-ca", name
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        assert volumes["nats-ca"]["secret"] == {
            "secretName": ca_secret,
            "items": [{"key": "ca.crt", "path": "ca.crt"}],
        }, name
        assert namespace in (NAMESPACE, AGENT_NAMESPACE)


def test_own_nats_generates_no_certificate() -> None:
    kinds = {(obj["kind"], obj["metadata"]["name"]) for obj in template(OWN_NATS_TLS)}
    assert ("Secret", "tfpool-nats-tls") not in kinds
    assert ("Secret", "tfpool-nats-ca") not in kinds


def test_own_nats_with_tls_needs_its_ca_secret() -> None:
    flags = set_flags({**EXTERNAL, **TLS})
    result = run_helm("template", "tfpool", str(CHART), "--namespace", NAMESPACE, *flags)
    assert result.returncode != 0
    assert "nats.tls.caSecret is required" in result.stderr
