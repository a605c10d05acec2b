"""Long-term client identities and the federation's roster.

Each client holds a long-term Ed25519 identity key (:class:`IdentityKey`). The federation's
:class:`Roster` (client id → identity public key) is fixed out of band, before any round: the
operator collects the public keys (``ghofl keys new`` writes them), builds the roster
(``ghofl roster build``) and gives every client the same roster file, or at least its
fingerprint. Every message that a relay could alter to its advantage is signed with the
sender's identity key and bound to the protocol version, the round, the roster fingerprint and
the sender (:func:`transcript`), so neither the server nor a relay can add, drop, swap or
replay an entry unseen.

The private key file is PEM (PKCS#8, unencrypted) with mode 0600; a private key file that
others can read is refused.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
)

from ghofl.errors import ConfigError, ProtocolError
from ghofl.files import atomic_write

__all__ = [
    "IDENTITY_KEY_BYTES",
    "SIGNATURE_BYTES",
    "IdentityKey",
    "Roster",
    "transcript",
    "verify_signature",
]

#: Bytes of a raw Ed25519 public key.
IDENTITY_KEY_BYTES = 32
#: Bytes of an Ed25519 signature.
SIGNATURE_BYTES = 64
_ROSTER_FORMAT = "ghofl-roster"
_ROSTER_VERSION = 1
_PUBLIC_FORMAT = "ghofl-identity-public"


def transcript(purpose: str, *parts: bytes | str | int) -> bytes:
    """Canonical, unambiguous byte string of a signed statement.

    Every part is length-prefixed (4 bytes, big-endian) after a one-byte type tag, so no two
    different sequences of parts give the same transcript.

    Parameters
    ----------
    purpose : str
        What is signed (e.g. ``"advertise"``); a signature for one purpose never verifies
        for another.
    *parts : bytes, str or int
        The signed fields, in a fixed order.
    """
    out = [b"ghofl-secagg|", purpose.encode(), b"|"]
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, bytes | str | int):
            raise TypeError(f"cannot sign a {type(part).__name__}")
        if isinstance(part, int):
            tag, data = b"i", str(part).encode()
        elif isinstance(part, str):
            tag, data = b"s", part.encode()
        else:
            tag, data = b"b", part
        out += [tag, struct.pack(">I", len(data)), data]
    return b"".join(out)


def verify_signature(public: bytes, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is a valid Ed25519 signature of ``message`` under ``public``.

    Malformed keys or signatures verify as ``False`` (never an exception).
    """
    if not (isinstance(public, bytes) and len(public) == IDENTITY_KEY_BYTES
            and isinstance(signature, bytes) and len(signature) == SIGNATURE_BYTES
            and isinstance(message, bytes)):
        return False
    return _verify(public, signature, message)


@functools.lru_cache(maxsize=1 << 14)
def _verify(public: bytes, signature: bytes, message: bytes) -> bool:
    """Ed25519 verification, memoised on the exact bytes.

    Verification is a pure function of (key, signature, message), so the memo cannot change an
    answer. It spares a simulation, where every client of one process checks the same
    advertisements and survivor statements, n - 1 repeats of each check.
    """
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


class IdentityKey:
    """A client's long-term Ed25519 identity key.

    Parameters
    ----------
    private : bytes
        32 raw bytes of the private key.

    Attributes
    ----------
    public : bytes
        32 raw bytes of the public key (what the roster lists).
    """

    __slots__ = ("_key", "public")

    def __init__(self, private: bytes) -> None:
        if not isinstance(private, bytes) or len(private) != IDENTITY_KEY_BYTES:
            raise ConfigError("an Ed25519 identity key is 32 raw bytes")
        self._key = Ed25519PrivateKey.from_private_bytes(private)
        self.public = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    @classmethod
    def generate(cls) -> IdentityKey:
        """A fresh identity key from the operating system's CSPRNG."""
        key = Ed25519PrivateKey.generate()
        return cls(key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()))

    def sign(self, message: bytes) -> bytes:
        """Ed25519 signature (64 bytes) of ``message``."""
        return self._key.sign(message)

    def fingerprint(self) -> str:
        """Hex SHA-256 of the public key, shortened to 16 characters (for display)."""
        return hashlib.sha256(self.public).hexdigest()[:16]

    # ------------------------------------------------------------------ files
    def save(self, path: str | os.PathLike[str], client_id: str) -> Path:
        """Write the private key to ``path`` and the public key beside it, never overwriting.

        The private key as PEM, mode 0600; the public key as ``PATH.pub``, JSON with the client id.

        Returns
        -------
        Path
            The public key file.
        """
        target = Path(path)
        public = target.with_name(target.name + ".pub")
        for existing in (target, public):
            if existing.exists():
                raise ConfigError(
                    f"{existing} already exists; an identity key is never overwritten (move "
                    "it away or choose another path)"
                )
        pem = self._key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())

        def write_private(tmp: str) -> None:
            os.chmod(tmp, 0o600)
            Path(tmp).write_bytes(pem)

        atomic_write(target, write_private)
        os.chmod(target, 0o600)
        body = {"format": _PUBLIC_FORMAT, "client": str(client_id), "ed25519": self.public.hex()}
        atomic_write(public, lambda tmp: Path(tmp).write_text(json.dumps(body, indent=1) + "\n"))
        return public

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> IdentityKey:
        """Read a private key written by :meth:`save`.

        Raises
        ------
        ConfigError
            The file is missing, readable by others than its owner, or not an Ed25519 key.
        """
        p = Path(path)
        try:
            mode = p.stat().st_mode
            data = p.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read the identity key {p}: {exc.strerror or exc}") from exc
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                f"the identity key {p} can be read by other users (mode {stat.S_IMODE(mode):o}); "
                f"run chmod 600 {p}"
            )
        try:
            key = load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                f"{p} is not an unencrypted PEM private key ({exc}); make one with "
                "`ghofl keys new`"
            ) from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(f"{p} holds a {type(key).__name__}, not an Ed25519 identity key")
        return cls(key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()))


def read_public_key(path: str | os.PathLike[str]) -> tuple[str, bytes]:
    """(client id, raw public key) from a ``PATH.pub`` file written by :meth:`IdentityKey.save`."""
    p = Path(path)
    try:
        body = json.loads(p.read_text())
        if body.get("format") != _PUBLIC_FORMAT:
            raise ValueError(f"format {body.get('format')!r}")
        client, key = str(body["client"]), bytes.fromhex(body["ed25519"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"{p} is not an identity public key file ({exc}); give the .pub files that "
            "`ghofl keys new` writes"
        ) from exc
    _check_public(client, key, str(p))
    return client, key


@dataclass(frozen=True)
class Roster:
    """The federation's clients and their identity public keys, fixed out of band.

    Parameters
    ----------
    keys : mapping of str to bytes
        Client id → raw Ed25519 public key (32 bytes). Ids and keys must be unique.
    """

    keys: Mapping[str, bytes]

    def __post_init__(self) -> None:
        if not self.keys:
            raise ConfigError("a roster needs at least one client")
        seen: dict[bytes, str] = {}
        for client, key in self.keys.items():
            _check_public(client, key, "the roster")
            if key in seen:
                raise ConfigError(
                    f"the roster gives clients {seen[key]!r} and {client!r} the same identity "
                    "key; every client needs its own (`ghofl keys new`)"
                )
            seen[key] = client
        object.__setattr__(self, "keys", dict(sorted(self.keys.items())))

    def __len__(self) -> int:
        return len(self.keys)

    def __contains__(self, client: object) -> bool:
        return client in self.keys

    @property
    def clients(self) -> tuple[str, ...]:
        """Client ids in canonical (sorted) order."""
        return tuple(self.keys)

    def public(self, client: str) -> bytes:
        """The identity public key of ``client``; :class:`ProtocolError` when not listed."""
        try:
            return self.keys[client]
        except KeyError:
            raise ProtocolError(f"client {client!r} is not on the federation's roster") from None

    def fingerprint(self) -> bytes:
        """SHA-256 of the canonical roster (32 bytes): what every advertisement is bound to."""
        return hashlib.sha256(self.canonical().encode()).digest()

    def canonical(self) -> str:
        """Canonical JSON of the roster (sorted ids, hex keys)."""
        return json.dumps({"format": _ROSTER_FORMAT, "version": _ROSTER_VERSION,
                           "clients": {c: k.hex() for c, k in self.keys.items()}},
                          sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_identities(cls, identities: Mapping[str, IdentityKey]) -> Roster:
        """The roster of ``{client id: identity key}`` (simulations and tests)."""
        return cls({c: k.public for c, k in identities.items()})

    @classmethod
    def from_public_files(cls, paths: Iterable[str | os.PathLike[str]]) -> Roster:
        """The roster of the ``.pub`` files written by :meth:`IdentityKey.save`."""
        keys: dict[str, bytes] = {}
        for path in paths:
            client, key = read_public_key(path)
            if client in keys:
                raise ConfigError(f"client {client!r} appears twice in the public key files")
            keys[client] = key
        return cls(keys)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the roster as JSON (atomically)."""
        text = json.dumps(json.loads(self.canonical()), indent=1, sort_keys=True) + "\n"
        atomic_write(path, lambda tmp: Path(tmp).write_text(text))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Roster:
        """Read a roster written by :meth:`save`.

        Raises
        ------
        ConfigError
            The file is missing or not a roster.
        """
        p = Path(path)
        try:
            body = json.loads(p.read_text())
            if body.get("format") != _ROSTER_FORMAT or body.get("version") != _ROSTER_VERSION:
                raise ValueError(f"format {body.get('format')!r} version {body.get('version')!r}")
            keys = {str(c): bytes.fromhex(k) for c, k in body["clients"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(
                f"{p} is not a ghofl roster ({exc}); build one with `ghofl roster build`"
            ) from exc
        return cls(keys)


def _check_public(client: str, key: bytes, where: str) -> None:
    if not isinstance(client, str) or not client:
        raise ConfigError(f"{where} has an empty or non-text client id")
    if not isinstance(key, bytes) or len(key) != IDENTITY_KEY_BYTES:
        raise ConfigError(
            f"{where} gives client {client!r} a malformed identity key (not "
            f"{IDENTITY_KEY_BYTES} bytes)"
        )
    try:
        Ed25519PublicKey.from_public_bytes(key)
    except ValueError as exc:
        raise ConfigError(f"{where} gives client {client!r} an invalid Ed25519 key") from exc
