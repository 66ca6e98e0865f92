"""The egress tests' world: an egress network of the test's own, a fake upstream on it answering for
names under .test (HTTP, HTTPS with a test CA, UDP echo), and a gateway whose proxies trust that CA
and that upstream's address (which, being private, the global deny would refuse otherwise)."""

from __future__ import annotations

import datetime
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from corral import images
from corral.sdk import Sandbox

from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, RunningGateway, gateway

UPSTREAM_NAMES = ["allowed.test", "other.test", "api.allowed.test", "doh.test", "slow.test"]


@dataclass
class Upstream:
    name: str
    address: str
    network: str
    ca_path: Path

    def hits(self, runtime: DockerHarness) -> list[dict[str, object]]:
        lines = runtime.logs(self.name, 2000).splitlines()
        return [json.loads(line[4:]) for line in lines if line.startswith("HIT ")]

    def udp_hits(self, runtime: DockerHarness) -> list[str]:
        return [line for line in runtime.logs(self.name, 2000).splitlines() if line.startswith("UDP ")]


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def write_test_pki(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a leaf for the upstream's names; returns (ca.pem, leaf.pem, leaf.key)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("Corral test upstream CA"))
        .issuer_name(_name("Corral test upstream CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name("allowed.test"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in [*UPSTREAM_NAMES, "*.test"]]), False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    ca_path, leaf_path, key_path = directory / "ca.pem", directory / "leaf.pem", directory / "leaf.key"
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    leaf_path.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    for path in (directory, ca_path, leaf_path, key_path):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return ca_path, leaf_path, key_path


UPSTREAM_SCRIPTS = Path(__file__).parent / "upstream"


def start_upstream(
    runtime: DockerHarness, directory: Path, network: str, script: str = "server.py", name: str = "corral-upstream"
) -> Iterator[Upstream]:
    """The fake upstream (``script``, one of upstream/'s servers, run with server.py beside it) on ``network``."""
    runtime.ensure_egress_network(network)
    ca_path, leaf, _ = write_test_pki(directory / "pki")
    name = f"{name}-{os.getpid()}"
    address = runtime.start_service(
        name,
        images.DESKTOP_IMAGE,
        ["/opt/corral/bin/python", f"/srv/{script}", "/pki/leaf.pem", "/pki/leaf.key"],
        network,
        UPSTREAM_NAMES,
        {
            str(UPSTREAM_SCRIPTS / "server.py"): "/srv/server.py",
            str(UPSTREAM_SCRIPTS / script): f"/srv/{script}",
            str(leaf.parent): "/pki",
            str(UPSTREAM_SCRIPTS / "pages"): "/srv/pages",
        },
        labels={"corral.test": "1"},
    )
    deadline = time.monotonic() + 30
    while "READY" not in runtime.logs(name, 50):
        assert time.monotonic() < deadline, runtime.logs(name, 50)
        time.sleep(0.1)
    try:
        yield Upstream(name, address, network, ca_path)
    finally:
        runtime.remove(name)
        # Each module's network goes with its upstream: Docker's default address pools hold about 30
        # networks, fewer than a whole run's modules (the run's end removes what is left as well).
        runtime.remove_network(network)


@contextmanager
def gateway_to(upstream: Upstream, data_dir: Path, instance: str, **overrides: object) -> Iterator[RunningGateway]:
    """A gateway whose proxies reach the fake upstream: its network, its CA, and its (private) address
    as the one network the operator vouches for, nothing else."""
    with gateway(
        data_dir,
        instance,
        egress_network=upstream.network,
        egress_trusted_networks=f"{upstream.address}/32",
        egress_upstream_ca=upstream.ca_path,
        **overrides,
    ) as running:
        yield running


def session_fixtures(name: str, upstream_name: str = "corral-upstream") -> tuple[Any, Any, Any]:
    """A module's ``upstream`` (the fake upstream on a network of the module's own), ``gw`` (a gateway
    whose proxies reach it) and ``sb`` (a session allowed to ``allowed.test``), for the module to bind:
    ``upstream, gw, sb = session_fixtures("freeze")``."""

    @pytest.fixture(scope="module")
    def upstream(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[Upstream]:
        network = f"corral-{name}-it-{os.getpid()}"
        yield from start_upstream(runtime, tmp_path_factory.mktemp("upstream"), network, name=upstream_name)

    @pytest.fixture(scope="module")
    def gw(
        tmp_path_factory: pytest.TempPathFactory, upstream: Upstream, runtime: DockerHarness
    ) -> Iterator[RunningGateway]:
        instance = f"{name}-{os.getpid()}"
        with gateway_to(upstream, tmp_path_factory.mktemp(f"{name}-gw"), instance) as running:
            yield running
        runtime.remove_all({"corral.gateway": instance})

    @pytest.fixture()
    def sb(gw: RunningGateway) -> Iterator[Sandbox]:
        with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as box:
            yield box

    return upstream, gw, sb
