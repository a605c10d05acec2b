"""Bytes of a secure aggregation round: what each party sends and receives, from the messages.

An analytic model of the traffic of the secure protocol (:mod:`ghofl.secure.messages`), flat
(:func:`round_bytes`, :func:`session_bytes`) and hierarchical (:func:`hierarchical_bytes`,
:mod:`ghofl.secure.hierarchy`), for planning a deployment. It counts message *content* the way
the transports do (:func:`~ghofl.secure.messages.message_nbytes`: raw bytes, array data,
UTF-8 text, 8 bytes per integer; a list of ids as their concatenated text), so it equals the
bytes an :class:`~ghofl.secure.InMemoryTransport` records when every participant id has the
same length; a wire format adds its own framing on top.

Symbols: n participants, k neighbours each on the graph (the Harary graph's degree:
k rounded up to even, n − 1 when complete), L masked words (8 bytes each), ι bytes per
participant id, ρ = 16 bytes of round id, P and M bytes of the public-parameter text and of
the metadata JSON, σ = 64 bytes per signature and φ = 32 bytes of roster fingerprint (both 0
in an unauthenticated round), δ clients that vanish at the mask stage (after sharing).
A server request starts with a header of 8 + ρ + |stage| bytes (version, round id, stage
name), a client reply with the same plus ι (its sender). Per stage, request / reply:

=========== ============================================ ====================================
stage       request (server → each client)               reply (client → server)
=========== ============================================ ====================================
advertise   P + M + φ                                    2·32 keys + 32 commitment + M + σ
reveal      n·(ι + 2·32 + 32 + σ): the signed roster     32: the nonce
share       n·(ι + 32): every nonce                      k·b + 32: share boxes, seed commit
mask        n·ι + k·b: sharers, the client's inbox       8·L: the masked vector
consistency n·ι: survivors and dropped                   σ
unmask      n·ι + (n − δ)·(ι + σ): sets, signatures      (k + 1)·(ι + 66): Shamir shares
=========== ============================================ ====================================

A share box is b = 2ι + (12 + 132 + 16) + 32 + σ: sender and recipient, the AES-GCM box
(nonce, one 66-byte Shamir share of the self-mask seed and one of the mask key, tag), the
pair-key commitment, the signature. A client that stays to the end sends and receives every
row; one that vanishes at the mask stage sends the first three replies and receives the
first four requests. The server sends every request to each client still in the round
(the last two to the n − δ survivors) and receives every reply: its totals are the clients'
summed. The threshold t does not change any size (every signer's signature is relayed, and a
holder returns k + 1 shares whichever neighbours dropped); the round aborts when n − δ < t.
Rounds with the dropout ladder of distributed-DP noise levels (``SecAggConfig(noise_levels=)``)
are not modelled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from ghofl.errors import ConfigError
from ghofl.secure._common import share_plaintext_bytes
from ghofl.secure.config import SecAggConfig, SessionParams, consistency_threshold
from ghofl.secure.graph_params import graph_degree
from ghofl.secure.identity import SIGNATURE_BYTES
from ghofl.secure.messages import SECURE_STAGES
from ghofl.secure.primitives import KEY_BYTES, NONCE_BYTES
from ghofl.secure.shamir import SHARE_BYTES
from ghofl.secure.vectors import VectorMeta
from ghofl.stats.meta import StatsMeta

__all__ = [
    "DEFAULT_META_BYTES",
    "DEFAULT_PARAMS_BYTES",
    "HierarchyBytes",
    "RoundBytes",
    "hierarchical_bytes",
    "metadata_bytes",
    "parameter_bytes",
    "round_bytes",
    "session_bytes",
]

#: Typical bytes of the public-parameter text (:meth:`SessionParams.items`).
DEFAULT_PARAMS_BYTES = 210
#: Typical bytes of the statistics metadata JSON (a few fields; grows with the encoder name).
DEFAULT_META_BYTES = 170
_INT_BYTES = 8  # an integer field (message_nbytes)
_DIGEST_BYTES = 32  # a SHA-256 commitment or fingerprint
_TAG_BYTES = 16  # the AES-GCM tag
_ROUND_ID_BYTES = 16  # the server's default round id
_WORD_BYTES = 8  # one masked uint64 word
_REGION_PREFIX = "region-"  # aggregator ids of the top round (hierarchy.partition_regions)


@dataclass(frozen=True)
class RoundBytes:
    """Bytes of one secure round, per party and stage.

    Attributes
    ----------
    clients : int
        n, participants invited.
    degree : int
        k, neighbours per participant on the graph actually built.
    words : int
        L, masked uint64 words per participant.
    dropped : int
        δ, participants that vanish at the mask stage.
    client_sent, client_received : dict of str to float
        Per stage (:data:`~ghofl.secure.messages.SECURE_STAGES`), one participant that stays
        to the end: the reply it sends, the request it receives.
    dropped_sent, dropped_received : float
        The whole round, one participant that vanishes at the mask stage.
    server_sent, server_received : float
        The whole round, the server: every request it sends, every reply it receives.
    """

    clients: int
    degree: int
    words: int
    dropped: int
    client_sent: dict[str, float]
    client_received: dict[str, float]
    dropped_sent: float
    dropped_received: float
    server_sent: float
    server_received: float

    @property
    def client_sent_total(self) -> float:
        """Bytes one participant that stays to the end sends over the round."""
        return sum(self.client_sent.values())

    @property
    def client_received_total(self) -> float:
        """Bytes one participant that stays to the end receives over the round."""
        return sum(self.client_received.values())

    @property
    def client_sent_mean(self) -> float:
        """Mean over the n participants (survivors and dropped) of the bytes each sends."""
        return self.server_received / self.clients

    @property
    def client_received_mean(self) -> float:
        """Mean over the n participants of the bytes each receives."""
        return self.server_sent / self.clients


def round_bytes(clients: int, neighbours: int, words: int, *, threshold: int | None = None,
                dropped: int = 0, id_bytes: float = 8.0,
                params_bytes: float = DEFAULT_PARAMS_BYTES,
                meta_bytes: float = DEFAULT_META_BYTES, authenticated: bool = True,
                round_id_bytes: int = _ROUND_ID_BYTES) -> RoundBytes:
    """Bytes of one flat secure round (see the module docstring for each term).

    Parameters
    ----------
    clients : int
        n, participants invited (at least 2).
    neighbours : int
        k of the graph, 1 to n − 1 (rounded up to even as the graph is; n − 1: complete).
    words : int
        L, uint64 words of the masked payload (``params.codec.length(meta)``).
    threshold : int, optional
        t, 2 to n (default :func:`~ghofl.secure.config.consistency_threshold` of n); checked
        only: the round aborts when fewer than t survive the mask stage.
    dropped : int, default 0
        δ, participants that vanish at the mask stage, after sending their shares.
    id_bytes : float, default 8
        ι, UTF-8 bytes of a participant id (their mean; exact when every id has this length).
    params_bytes, meta_bytes : float
        P and M: :func:`parameter_bytes` and :func:`metadata_bytes` of the round.
    authenticated : bool, default True
        A round over a roster (signatures and the roster fingerprint travel).
    round_id_bytes : int, default 16
        ρ, bytes of the round id.

    Returns
    -------
    RoundBytes

    Raises
    ------
    ConfigError
        A size out of its range (each error names the bound), or a threshold the survivors
        cannot reach.
    """
    n = _checked_round(clients, neighbours, words, threshold, dropped)
    if id_bytes < 1 or params_bytes < 0 or meta_bytes < 0 or round_id_bytes < 0:
        raise ConfigError(
            f"bytes per id must be at least 1 and the parameter, metadata and round-id bytes "
            f"non-negative; got id_bytes={id_bytes}, params_bytes={params_bytes}, "
            f"meta_bytes={meta_bytes}, round_id_bytes={round_id_bytes}")
    k, iota = graph_degree(n, int(neighbours)), float(id_bytes)
    sig = SIGNATURE_BYTES if authenticated else 0
    fingerprint = _DIGEST_BYTES if authenticated else 0
    box = (2 * iota + NONCE_BYTES + share_plaintext_bytes(0) + _TAG_BYTES + _DIGEST_BYTES
           + sig)
    entry = iota + 2 * KEY_BYTES + _DIGEST_BYTES + sig
    survivors = n - dropped
    request = {
        "advertise": params_bytes + meta_bytes + fingerprint,
        "reveal": n * entry,
        "share": n * (iota + KEY_BYTES),
        "mask": n * iota + k * box,
        "consistency": n * iota,
        "unmask": n * iota + survivors * (iota + sig),
    }
    reply = {
        "advertise": 2 * KEY_BYTES + _DIGEST_BYTES + meta_bytes + sig,
        "reveal": float(KEY_BYTES),
        "share": k * box + _DIGEST_BYTES,
        "mask": float(_WORD_BYTES * int(words)),
        "consistency": float(sig),
        "unmask": (k + 1) * (iota + SHARE_BYTES),
    }
    head = {s: _INT_BYTES + round_id_bytes + len(s) for s in SECURE_STAGES}
    received: dict[str, float] = {s: head[s] + request[s] for s in SECURE_STAGES}
    sent: dict[str, float] = {s: head[s] + iota + reply[s] for s in SECURE_STAGES}
    early, late = SECURE_STAGES[:3], SECURE_STAGES[3:]
    dropped_sent = sum(sent[s] for s in early)
    dropped_received = sum(received[s] for s in (*early, "mask"))
    server_sent = n * dropped_received + survivors * sum(received[s] for s in late[1:])
    server_received = n * dropped_sent + survivors * sum(sent[s] for s in late)
    return RoundBytes(n, k, int(words), int(dropped), sent, received, dropped_sent,
                      dropped_received, server_sent, server_received)


def _checked_round(clients: int, neighbours: int, words: int, threshold: int | None,
                   dropped: int) -> int:
    """n, after checking every size of :func:`round_bytes`."""
    n = int(clients)
    if n < 2:
        raise ConfigError(f"a secure round needs at least 2 clients; got clients={clients}")
    if not 1 <= int(neighbours) <= n - 1:
        raise ConfigError(
            f"neighbours k={neighbours} is outside 1 to n - 1 = {n - 1} for n={n} clients (a "
            f"client has at most n - 1 neighbours; k = {n - 1} is the complete graph)")
    if int(words) < 1:
        raise ConfigError(f"the masked payload needs at least 1 word; got words={words}")
    t = consistency_threshold(n) if threshold is None else int(threshold)
    if not 2 <= t <= n:
        raise ConfigError(f"threshold t={t} is outside 2 to n = {n}")
    if not 0 <= int(dropped) <= n - t:
        raise ConfigError(
            f"dropped={dropped} is outside 0 to n - t = {n - t}: with fewer than t={t} "
            "survivors the round aborts (no bytes model for an aborted round)")
    return n


def parameter_bytes(params: SessionParams) -> int:
    """Bytes of the public-parameter text a round's advertise request carries (P).

    Parameters
    ----------
    params : SessionParams
        The round's resolved parameters (``SecAggConfig.for_clients(n)``).

    Returns
    -------
    int
        Σ over :meth:`SessionParams.items` of the UTF-8 bytes of name and value.
    """
    return sum(len(name.encode()) + len(value.encode()) for name, value in params.items())


def metadata_bytes(meta: StatsMeta | VectorMeta) -> int:
    """Bytes of the canonical metadata JSON that the advertise request and reply carry (M)."""
    return len(json.dumps(meta.to_dict(), sort_keys=True).encode())


def session_bytes(params: SessionParams, meta: StatsMeta | VectorMeta, *, id_bytes: float = 8.0,
                  dropped: int = 0, authenticated: bool = True) -> RoundBytes:
    """:func:`round_bytes` of a round given its resolved parameters and metadata.

    n, k, t, L, P and M are read from ``params`` and ``meta``; the rest as in
    :func:`round_bytes`.

    Raises
    ------
    ConfigError
        The round has dropout levels (``params.release_points``: not modelled), or a size
        :func:`round_bytes` refuses.
    """
    if params.release_points:
        raise ConfigError(
            f"the bytes model leaves out the dropout ladder of noise levels; this round has "
            f"{len(params.release_points)} (SecAggConfig(noise_levels=0) rounds only)")
    return round_bytes(params.num_clients, params.neighbours, params.codec.length(meta),
                       threshold=params.threshold, dropped=dropped, id_bytes=id_bytes,
                       params_bytes=parameter_bytes(params), meta_bytes=metadata_bytes(meta),
                       authenticated=authenticated)


@dataclass(frozen=True)
class HierarchyBytes:
    """Bytes of a hierarchical run (:func:`~ghofl.secure.hierarchy.run_hierarchical`).

    Attributes
    ----------
    clients : int
        n, clients of the federation.
    regions : int
        R, regional aggregators.
    by_size : dict of int to RoundBytes
        The regional round of each region size present (R regions of n // R or n // R + 1
        clients).
    top : RoundBytes
        The top round among the R aggregators.
    client_sent, client_received : float
        Per client, the mean over every region's clients.
    region_server_sent, region_server_received : float
        Per aggregator, as its region's server (mean over the regions).
    """

    clients: int
    regions: int
    by_size: dict[int, RoundBytes]
    top: RoundBytes
    client_sent: float
    client_received: float
    region_server_sent: float
    region_server_received: float

    @property
    def aggregator_sent(self) -> float:
        """Per aggregator: its region's requests plus its replies in the top round."""
        return self.region_server_sent + self.top.client_sent_total

    @property
    def aggregator_received(self) -> float:
        """Per aggregator: its region's replies plus its requests of the top round."""
        return self.region_server_received + self.top.client_received_total

    @property
    def top_server_sent(self) -> float:
        """The top server, over the top round."""
        return self.top.server_sent

    @property
    def top_server_received(self) -> float:
        """The top server, over the top round."""
        return self.top.server_received


def hierarchical_bytes(clients: int, region_size: int, words: int, config: SecAggConfig, *,
                       id_bytes: float = 8.0, meta_bytes: float = DEFAULT_META_BYTES,
                       authenticated: bool = True) -> HierarchyBytes:
    """Bytes of a hierarchical run: n clients in R = ⌊n / S⌋ regions, then the top round.

    Each region is a round of its size s (n // R or n // R + 1: the partition of
    :func:`~ghofl.secure.hierarchy.partition_regions`) with ``config.for_clients(s)``; the top
    round is a round of the R aggregators (ids ``region-`` and ⌊log10(R − 1)⌋ + 1 digits) with
    the config's default threshold and degree for R, as
    :func:`~ghofl.secure.hierarchy.run_hierarchical` runs it. No participant drops.

    Parameters
    ----------
    clients : int
        n, clients of the federation.
    region_size : int
        S, the least clients per region (2 to n // 2).
    words : int
        L, uint64 words of the payload (the federation codec's ``length(meta)``).
    config : SecAggConfig
        The secure rounds' settings (threshold and neighbours apply to each region).
    id_bytes : float, default 8
        ι of the clients' ids.
    meta_bytes : float
        M (:func:`metadata_bytes`).
    authenticated : bool, default True
        Regional rounds over rosters (the top round always is).

    Returns
    -------
    HierarchyBytes

    Raises
    ------
    ConfigError
        A region size outside 2 to n // 2, or a size :func:`round_bytes` refuses.
    """
    n, s_min = int(clients), int(region_size)
    if not 2 <= s_min <= n // 2:
        raise ConfigError(
            f"region_size S={region_size} is outside 2 to n // 2 = {n // 2} for n={n} clients "
            "(at least 2 regions of at least 2 clients)")
    r = n // s_min
    base, extra = divmod(n, r)
    counts = {base + 1: extra, base: r - extra} if extra else {base: r}
    by_size = {s: _region_round(s, words, config, id_bytes, meta_bytes, authenticated)
               for s in counts}
    top_params = replace(config, threshold=None, neighbours=None).for_clients(r)
    top = round_bytes(r, top_params.neighbours, words, threshold=top_params.threshold,
                      id_bytes=len(_REGION_PREFIX) + len(str(r - 1)),
                      params_bytes=parameter_bytes(top_params), meta_bytes=meta_bytes)
    return HierarchyBytes(
        n, r, by_size, top,
        client_sent=sum(c * s * by_size[s].client_sent_mean for s, c in counts.items()) / n,
        client_received=sum(c * s * by_size[s].client_received_mean
                            for s, c in counts.items()) / n,
        region_server_sent=sum(c * by_size[s].server_sent for s, c in counts.items()) / r,
        region_server_received=sum(c * by_size[s].server_received
                                   for s, c in counts.items()) / r)


def _region_round(size: int, words: int, config: SecAggConfig, id_bytes: float,
                  meta_bytes: float, authenticated: bool) -> RoundBytes:
    params = config.for_clients(size)
    return round_bytes(size, params.neighbours, words, threshold=params.threshold,
                       id_bytes=id_bytes, params_bytes=parameter_bytes(params),
                       meta_bytes=meta_bytes, authenticated=authenticated)
