"""Loopback TLS certificates and SuperNode keys (ghofl.integrations.flower.tls): the chain
verifies, the names are right, the keys are in the formats Flower reads."""

from __future__ import annotations

import ipaddress
import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ghofl.errors import ConfigError
from ghofl.integrations.flower.tls import (
    LoopbackCredentials,
    make_ca,
    make_loopback_credentials,
    make_node_keys,
    make_server_certificate,
)


@pytest.fixture(scope="module")
def creds(tmp_path_factory: pytest.TempPathFactory) -> LoopbackCredentials:
    return make_loopback_credentials(tmp_path_factory.mktemp("creds"), ["site-a", "site-b"])


def _handshake(creds: LoopbackCredentials, cafile: Path, host: str) -> None:
    """A TLS handshake on 127.0.0.1 against the server certificate, verified with ``cafile``
    for server name ``host``."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(creds.server_cert, creds.server_key)
    client_ctx = ssl.create_default_context(cafile=str(cafile))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        errors: list[BaseException] = []

        def serve() -> None:
            conn, _ = listener.accept()
            try:
                with server_ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except (ssl.SSLError, OSError) as err:
                errors.append(err)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                    client_ctx.wrap_socket(raw, server_hostname=host) as tls:
                tls.sendall(b"x")
        finally:
            thread.join(timeout=10)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_server_certificate_verifies_against_the_ca_for_loopback(creds: LoopbackCredentials,
                                                               host: str) -> None:
    _handshake(creds, creds.ca_cert, host)


def test_server_certificate_is_refused_by_another_ca(creds: LoopbackCredentials,
                                                    tmp_path: Path) -> None:
    other, _ = make_ca(tmp_path, "other-ca")
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        _handshake(creds, other, "127.0.0.1")


def test_server_certificate_is_refused_for_another_name(creds: LoopbackCredentials) -> None:
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        _handshake(creds, creds.ca_cert, "example.org")


def test_server_certificate_names_and_ca_flags(creds: LoopbackCredentials) -> None:
    cert = x509.load_pem_x509_certificate(creds.server_cert.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    ca = x509.load_pem_x509_certificate(creds.ca_cert.read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.issuer == ca.subject


def test_node_keys_are_openssh_ecdsa_p384_pairs(creds: LoopbackCredentials) -> None:
    assert set(creds.node_keys) == {"site-a", "site-b"}
    publics = set()
    for private_path, public_path in creds.node_keys.values():
        private = serialization.load_ssh_private_key(private_path.read_bytes(), None)
        public = serialization.load_ssh_public_key(public_path.read_bytes())
        assert isinstance(private, ec.EllipticCurvePrivateKey)
        assert isinstance(public, ec.EllipticCurvePublicKey)
        assert public.curve.name == "secp384r1"
        assert private.public_key().public_numbers() == public.public_numbers()
        assert public_path.read_text().startswith("ecdsa-sha2-nistp384 ")
        publics.add(public_path.read_bytes())
    assert len(publics) == 2


def test_private_keys_are_readable_by_their_owner_only(creds: LoopbackCredentials) -> None:
    private = [creds.server_key, creds.folder / "ca.key",
               *(k for k, _ in creds.node_keys.values())]
    for path in private:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(creds.ca_cert.stat().st_mode) & 0o044


@pytest.mark.parametrize("name", ["", "-x", "a/b", "ca", "server", ".hidden"])
def test_unusable_node_name_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="not usable as a file name"):
        make_node_keys(tmp_path, name)


def test_repeated_node_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="node names must be distinct"):
        make_loopback_credentials(tmp_path, ["a", "a"])


def test_server_certificate_needs_a_host(tmp_path: Path) -> None:
    ca_cert, ca_key = make_ca(tmp_path)
    with pytest.raises(ConfigError, match="at least one host name"):
        make_server_certificate(tmp_path, ca_cert, ca_key, hosts=())


def test_validity_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="at least 1 day"):
        make_ca(tmp_path, days=0)
