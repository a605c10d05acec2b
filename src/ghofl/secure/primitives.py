"""Cryptographic primitives of the secure sum, all from the vetted ``cryptography`` package.

Nothing here is hand-rolled: X25519 for key agreement, HKDF-SHA256 to turn a shared secret into
keys, AES-256-GCM for the authenticated, encrypted transport of secret shares between clients
(relayed by the server), and AES-256-CTR as the pseudo-random generator that expands a 32-byte
seed into a mask of 64-bit words. Every key derivation binds the protocol name, the purpose
and the round identifier, so keys of one round or purpose never serve another.
"""

from __future__ import annotations

import secrets

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from numpy.typing import NDArray

__all__ = [
    "KEY_BYTES",
    "NONCE_BYTES",
    "KeyPair",
    "aead_decrypt",
    "aead_encrypt",
    "agree",
    "derive_key",
    "mask_words",
    "public_from_private",
    "random_seed",
]

#: Bytes of every symmetric key, seed, and X25519 key.
KEY_BYTES = 32
#: Bytes of an AES-GCM nonce.
NONCE_BYTES = 12
_PROTOCOL = b"ghofl-secagg-v1"
_CTR_BLOCK_BYTES = 1 << 22  # keystream produced per call: bounded temporary memory


class KeyPair:
    """An X25519 key pair; the private half never leaves the client except as Shamir shares.

    Attributes
    ----------
    private : bytes
        32 raw bytes of the private key.
    public : bytes
        32 raw bytes of the public key.
    """

    __slots__ = ("_key", "private", "public")

    def __init__(self, private: bytes, public: bytes) -> None:
        self.private = private
        self.public = public
        self._key: X25519PrivateKey | None = None

    def agree(self, peer_public: bytes) -> bytes:
        """Raw X25519 shared secret with ``peer_public`` (as :func:`agree`).

        The private key object is built once per pair, not once per peer.

        Raises
        ------
        ValueError
            ``peer_public`` is not a valid X25519 public key.
        """
        if self._key is None:
            self._key = X25519PrivateKey.from_private_bytes(self.private)
        return self._key.exchange(X25519PublicKey.from_public_bytes(peer_public))

    @classmethod
    def generate(cls) -> KeyPair:
        """A fresh key pair from the operating system's CSPRNG."""
        from cryptography.hazmat.primitives.serialization import (
            Encoding,
            NoEncryption,
            PrivateFormat,
            PublicFormat,
        )

        sk = X25519PrivateKey.generate()
        return cls(
            sk.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()),
            sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw),
        )


def public_from_private(private: bytes) -> bytes:
    """The raw X25519 public key of a raw private key (used to verify a reconstructed key)."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    key = X25519PrivateKey.from_private_bytes(private).public_key()
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def random_seed() -> bytes:
    """32 bytes from the operating system's CSPRNG."""
    return secrets.token_bytes(KEY_BYTES)


def agree(private: bytes, peer_public: bytes) -> bytes:
    """Raw X25519 shared secret of ``private`` and ``peer_public`` (32 bytes).

    Raises
    ------
    ValueError
        ``peer_public`` is not a valid X25519 public key (wrong length, or a low-order point
        whose shared secret would be all zeros).
    """
    return X25519PrivateKey.from_private_bytes(private).exchange(
        X25519PublicKey.from_public_bytes(peer_public)
    )


def derive_key(shared: bytes, purpose: bytes, round_id: bytes) -> bytes:
    """HKDF-SHA256 of a shared secret into a 32-byte key bound to ``purpose`` and the round."""
    return HKDF(
        algorithm=hashes.SHA256(), length=KEY_BYTES, salt=round_id, info=_PROTOCOL + b"|" + purpose
    ).derive(shared)


def aead_encrypt(key: bytes, plaintext: bytes, associated: bytes) -> bytes:
    """AES-256-GCM: a random 12-byte nonce followed by ciphertext and tag."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, associated)


def aead_decrypt(key: bytes, sealed: bytes, associated: bytes) -> bytes | None:
    """Inverse of :func:`aead_encrypt`; ``None`` when authentication fails.

    Authentication fails on tampered data, a wrong key, or wrong associated data.
    """
    if len(sealed) < NONCE_BYTES + 16:
        return None
    try:
        return AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], associated)
    except InvalidTag:
        return None


def mask_words(seed: bytes, length: int) -> NDArray[np.uint64]:
    """Expand a 32-byte seed into ``length`` pseudo-random 64-bit words (AES-256-CTR keystream).

    Parameters
    ----------
    seed : bytes
        32-byte key; each seed is used for exactly one mask.
    length : int
        Number of uint64 words.

    Returns
    -------
    ndarray of uint64, shape (length,)
        Little-endian words of the keystream (counter block starting at zero).
    """
    nbytes = 8 * length
    out = np.empty(nbytes + 16, dtype=np.uint8)  # update_into needs a block of slack
    encryptor = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
    target = memoryview(out)  # type: ignore[arg-type]
    for start in range(0, nbytes, _CTR_BLOCK_BYTES):
        stop = min(start + _CTR_BLOCK_BYTES, nbytes)
        encryptor.update_into(_ZEROS[: stop - start], target[start : stop + 16])
    return out[:nbytes].view("<u8").view(np.uint64)


_ZEROS = memoryview(bytes(_CTR_BLOCK_BYTES))
