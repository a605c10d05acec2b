"""Certificates and SuperNode keys for a TLS + SuperNode-authentication trial on 127.0.0.1.

:func:`make_loopback_credentials` writes, into one folder, everything a local Flower 1.42
deployment needs to run without ``--insecure``:

* ``ca.crt`` / ``ca.key``: a self-signed certificate authority (ECDSA P-384);
* ``server.pem`` / ``server.key``: the SuperLink's certificate, signed by that CA, valid for
  ``127.0.0.1`` and ``localhost`` (subject alternative names), with its key;
* ``<node>.key`` / ``<node>.pub`` per SuperNode: an ECDSA P-384 key pair in OpenSSH format, the
  format ``flower-supernode --auth-supernode-private-key`` and ``flwr supernode register``
  read.

The keys are written unencrypted and readable by their owner only: they are for a trial on one
machine (tests, a first try of the flags), not for real sites, whose certificates come from the
sites' own CA. :class:`~ghofl.integrations.flower.runner.LocalFlower` takes the result as its
``tls`` argument.

Only the ``cryptography`` package (a core dependency of ghofl) is used; flwr is not imported.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ghofl.errors import ConfigError

__all__ = [
    "LOOPBACK_HOSTS",
    "LoopbackCredentials",
    "make_ca",
    "make_loopback_credentials",
    "make_node_keys",
    "make_server_certificate",
]

#: Subject alternative names of the loopback SuperLink certificate.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class LoopbackCredentials:
    """Paths of the files :func:`make_loopback_credentials` wrote.

    Attributes
    ----------
    folder : Path
    ca_cert : Path
        The CA certificate (PEM): the SuperLink's ``--ssl-ca-certfile``, the SuperNodes'
        ``--root-certificates`` and ``root-certificates`` in the ``flwr`` CLI's config.toml.
    server_cert, server_key : Path
        The SuperLink's ``--ssl-certfile`` and ``--ssl-keyfile`` (PEM).
    node_keys : dict of str to (Path, Path)
        SuperNode name → (private key, public key), both OpenSSH format.
    """

    folder: Path
    ca_cert: Path
    server_cert: Path
    server_key: Path
    node_keys: dict[str, tuple[Path, Path]] = field(default_factory=dict)


def _check_name(name: str) -> str:
    if not _NAME.fullmatch(name) or name in ("ca", "server"):
        raise ConfigError(
            f"credential name {name!r} is not usable as a file name: use letters, digits, "
            "'_', '.', '-' (not starting with '.' or '-'), other than 'ca' and 'server'"
        )
    return name


def _write(path: Path, data: bytes, private: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if private:
        os.chmod(path, 0o600)
    return path


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM,
                             serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _validity(days: int) -> tuple[dt.datetime, dt.datetime]:
    if days < 1:
        raise ConfigError(f"certificate validity must be at least 1 day; got {days}")
    now = dt.datetime.now(dt.UTC)
    return now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)


def make_ca(folder: Path, name: str = "ca", *, common_name: str = "ghofl loopback trial CA",
            days: int = 7) -> tuple[Path, Path]:
    """A self-signed CA: ``<name>.crt`` and ``<name>.key`` (PEM) in ``folder``.

    Returns
    -------
    (Path, Path)
        The certificate and its private key.
    """
    if name != "ca":
        _check_name(name)
    key = ec.generate_private_key(ec.SECP384R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    start, end = _validity(days)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA384()))
    folder = Path(folder)
    return (_write(folder / f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM),
                   private=False),
            _write(folder / f"{name}.key", _pem_key(key), private=True))


def make_server_certificate(folder: Path, ca_cert: Path, ca_key: Path,
                            hosts: Sequence[str] = LOOPBACK_HOSTS, *,
                            days: int = 7) -> tuple[Path, Path]:
    """``server.pem`` and ``server.key`` in ``folder``: a TLS server certificate signed by the CA.

    With ``hosts`` (IP addresses or DNS names) as subject alternative names.

    Raises
    ------
    ConfigError
        ``hosts`` is empty.
    """
    if not hosts:
        raise ConfigError("the server certificate needs at least one host name or IP address "
                          "(hosts); give e.g. ('127.0.0.1', 'localhost')")
    ca = x509.load_pem_x509_certificate(Path(ca_cert).read_bytes())
    signer = serialization.load_pem_private_key(Path(ca_key).read_bytes(), password=None)
    if not isinstance(signer, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"the CA key {ca_key} is not an EC private key; make the CA with "
                          "make_ca")
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    key = ec.generate_private_key(ec.SECP384R1())
    start, end = _validity(days)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                signer.public_key()), critical=False)
            .sign(signer, hashes.SHA384()))
    folder = Path(folder)
    return (_write(folder / "server.pem", cert.public_bytes(serialization.Encoding.PEM),
                   private=False),
            _write(folder / "server.key", _pem_key(key), private=True))


def make_node_keys(folder: Path, name: str) -> tuple[Path, Path]:
    """A SuperNode's authentication key pair in ``folder``.

    ``<name>.key`` (OpenSSH private key) and ``<name>.pub`` (OpenSSH public key,
    ``ecdsa-sha2-nistp384 ...``).

    Returns
    -------
    (Path, Path)
        The private key (``flower-supernode --auth-supernode-private-key``) and the public
        key (``flwr supernode register``).
    """
    _check_name(name)
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH)
    folder = Path(folder)
    return (_write(folder / f"{name}.key", private, private=True),
            _write(folder / f"{name}.pub", public + b"\n", private=False))


def make_loopback_credentials(folder: Path, nodes: Sequence[str] = (), *,
                              hosts: Sequence[str] = LOOPBACK_HOSTS,
                              days: int = 7) -> LoopbackCredentials:
    """A CA, a SuperLink certificate for ``hosts`` and one key pair per name in ``nodes``.

    All written into ``folder`` (created).

    Raises
    ------
    ConfigError
        A node name is repeated or unusable as a file name.

    Examples
    --------
    >>> creds = make_loopback_credentials(Path("creds"), ["site-a", "site-b"])  # doctest: +SKIP
    >>> creds.node_keys["site-a"]                                               # doctest: +SKIP
    (PosixPath('creds/site-a.key'), PosixPath('creds/site-a.pub'))
    """
    names = [_check_name(n) for n in nodes]
    if len(set(names)) != len(names):
        raise ConfigError(f"node names must be distinct; got {list(nodes)}")
    folder = Path(folder).resolve()
    ca_cert, ca_key = make_ca(folder, days=days)
    server_cert, server_key = make_server_certificate(folder, ca_cert, ca_key, hosts, days=days)
    keys = {name: make_node_keys(folder, name) for name in names}
    return LoopbackCredentials(folder, ca_cert, server_cert, server_key, keys)
