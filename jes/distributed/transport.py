"""The ZeroMQ transport under the message protocol: CURVE on every connection, keys derived from the shared secret.

A peer without the secret never gets a message to the master: both ends derive CURVE key pairs from the
shared secret (HMAC-SHA256 of it under a fixed label, as X25519 secret keys), the master's socket is a CURVE
server, and a ZAP handler on the master (:class:`Gatekeeper`) admits only the client key the secret gives.
ZeroMQ runs the handshake before it delivers anything, so an unauthenticated peer's frames are never queued
for the master, whatever it sends. Before authentication a connection can still hold one handshake command
(capped by the socket's ``MAXMSGSIZE``) for :data:`HANDSHAKE_MS`: many connections at once hold as much as
their senders push in that time. Every connection is encrypted too.

The HMAC of each message (:mod:`jes.distributed.protocol`) stays: sessions, sequence numbers and replay
protection live there, and it checks every message whatever the transport.

A master started with a CURVE key pair of its own (``jes keys NAME``, ``--curve-secret-key NAME.secret``)
uses it as its server key, and its workers need the public half (``--curve-server-key NAME.public``): then a
worker, which holds the shared secret, still cannot pose as the master.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time

import zmq
from zmq.utils import z85

log = logging.getLogger("jes.distributed.master")  # the Gatekeeper logs as part of its master

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq asks a context's ZAP handler (RFC 27)
ZAP_DOMAIN = b"jes"
HANDSHAKE_MS = 5000  # the master's limit on a connection's handshake
_LABEL = b"jes transport key v1: "
DENIED_LOG_INTERVAL = 10.0  # seconds between log lines about refused connections


def _derived_secret_key(secret: bytes, role: bytes) -> bytes:
    return z85.encode(hmac.new(secret, _LABEL + role, hashlib.sha256).digest())


def client_keys(secret: bytes) -> tuple[bytes, bytes]:
    """``(public, secret)`` CURVE keys (Z85) every worker of the shared ``secret`` connects with."""
    key = _derived_secret_key(secret, b"worker")
    return zmq.curve_public(key), key


def server_keys(secret: bytes, curve_secret_key: bytes | None = None) -> tuple[bytes, bytes]:
    """``(public, secret)`` CURVE keys (Z85) of the master: its own secret key when given, else derived."""
    key = curve_secret_key if curve_secret_key is not None else _derived_secret_key(secret, b"master")
    return zmq.curve_public(key), key


def secure_client(sock: zmq.Socket, secret: bytes, curve_server_key: bytes | None = None) -> None:
    """Make ``sock`` (before it connects) a CURVE client of the master of ``secret``.

    ``curve_server_key``: the master's own public key (``NAME.public``), when it was started with one.
    """
    sock.curve_serverkey = curve_server_key if curve_server_key is not None else server_keys(secret)[0]
    sock.curve_publickey, sock.curve_secretkey = client_keys(secret)


def secure_server(sock: zmq.Socket, secret: bytes, curve_secret_key: bytes | None = None) -> bytes:
    """Make ``sock`` (before it binds) a CURVE server of ``secret``; clients are checked by its context's
    :class:`Gatekeeper`. Returns the server's public key (Z85)."""
    public, key = server_keys(secret, curve_secret_key)
    sock.curve_publickey, sock.curve_secretkey = public, key
    sock.curve_server = True
    # Fail closed: without a ZAP handler libzmq admits every CURVE client key; with a domain and enforcement it
    # admits none (a Gatekeeper gone for any reason stops every handshake rather than opening the door).
    sock.zap_domain = ZAP_DOMAIN
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    # A connection still in its handshake can hold one command up to the socket's MAXMSGSIZE: for a few seconds,
    # not ZeroMQ's default 30 (a worker's handshake takes milliseconds), so what outsiders can make the master
    # hold is bounded by what they can send in that time.
    sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
    return public


HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def handshake_failure(frames: list[bytes]) -> str | None:
    """The kind of failed handshake a socket monitor's event ``frames`` report, or ``None`` for another event:
    ``"key"`` (the ZAP handler refused the client's key), ``"server key"`` (a cryptographic check failed: the
    client encrypted to another server key), ``"no CURVE"`` (the peers' mechanisms differ), ``"ended"`` (the
    connection ended in the handshake: the peer left, or, seen by a client, the server could not decrypt it),
    or a description of another failure."""
    from zmq.utils.monitor import parse_monitor_message

    try:
        event = parse_monitor_message(frames)
    except Exception:  # noqa: BLE001 - not a monitor event
        return None
    if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return "key"
    if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        if event["value"] == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
            return "server key"
        if event["value"] == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            return "no CURVE"
    if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        return "ended"
    if event["event"] & HANDSHAKE_EVENTS:
        return f"ZeroMQ event {event['event']:#x}, value {event['value']:#x}"
    return None


class Gatekeeper(threading.Thread):
    """The master's doorkeeper: its context's ZAP handler, admitting CURVE clients holding ``secret``'s client key.

    Start it before the master's socket binds (libzmq asks it during each handshake); :meth:`stop` it before the
    context terminates. :attr:`refused` counts the handshakes it refused: peers that encrypted to this master's
    server key with a key pair that is not the secret's (logged at most once every :data:`DENIED_LOG_INTERVAL`
    seconds, with the last one's address). Peers without the server key (another secret, a plaintext or older
    jes) fail the CURVE handshake before ZAP asks: the master never hears of them (their worker says why).

    Failed handshakes are not watched with a socket monitor here: libzmq's I/O thread blocks sending monitor events
    to a reader that falls behind, so a flood of connections from outside would stall every worker's connection.
    """

    def __init__(self, context: zmq.Context, secret: bytes):
        super().__init__(name="jes-zap", daemon=True)
        self._allowed = z85.decode(client_keys(secret)[0])
        self._zap = context.socket(zmq.REP)
        self._zap.setsockopt(zmq.LINGER, 0)
        try:
            self._zap.bind(ZAP_ENDPOINT)
        except zmq.ZMQError:
            self._zap.close(0)
            raise
        self._stopping = threading.Event()
        self.admitted = 0
        self.refused = 0
        self._last_logged = -float("inf")
        self._unlogged = 0
        self.start()

    def stop(self) -> None:
        self._stopping.set()
        self.join()
        self._log_refused(force=True)  # refusals since the last log line: said before the master goes

    def _log_refused(self, address: str = "", force: bool = False) -> None:
        """Log the refusals not yet logged, if any, once :data:`DENIED_LOG_INTERVAL` has passed (or ``force``)."""
        now = time.monotonic()
        if not self._unlogged or (not force and now - self._last_logged < DENIED_LOG_INTERVAL):
            return
        self._last_logged, count, self._unlogged = now, self._unlogged, 0
        try:
            log.warning("refused %d connection(s) in the CURVE handshake, before any of their messages%s: a key pair "
                        "that is not the shared secret's (a worker with another secret, or not a jes worker)", count,
                        f", the last from {address}" if address else "")
        except Exception:  # noqa: BLE001 - a user's logging handler that raises must not end the doorkeeper
            pass

    def run(self) -> None:
        try:
            while not self._stopping.is_set():
                if self._zap.poll(100):
                    frames = self._zap.recv_multipart()
                    try:
                        reply = self.answer(frames)
                    except Exception:  # noqa: BLE001 - never leave a request unanswered, nor this thread dead
                        reply = [b"1.0", frames[1] if len(frames) > 1 else b"", b"500", b"internal error", b"", b""]
                    self._zap.send_multipart(reply)
                self._log_refused()  # a burst's rest, said once the interval has passed
        finally:
            self._zap.close(0)

    def answer(self, frames: list[bytes]) -> list[bytes]:
        """The ZAP reply to a request's ``frames`` (RFC 27: version, request id, domain, address, identity,
        mechanism, credentials)."""
        request_id = frames[1] if len(frames) > 1 else b""
        if len(frames) < 6 or frames[0] != b"1.0":
            return [b"1.0", request_id, b"500", b"malformed ZAP request", b"", b""]
        address, mechanism, credentials = frames[3], frames[5], frames[6:]
        if mechanism == b"CURVE" and len(credentials) == 1 and hmac.compare_digest(credentials[0], self._allowed):
            self.admitted += 1
            return [b"1.0", request_id, b"200", b"OK", b"jes-worker", b""]
        self.refused += 1
        self._unlogged += 1
        shown = address.decode("ascii", "backslashreplace")[:64]
        # (an IPv4 peer of a socket that takes IPv6 too comes as ::ffff:a.b.c.d: shown as the IPv4 address it is)
        self._log_refused(shown[len("::ffff:"):] if shown.startswith("::ffff:") and "." in shown else shown)
        return [b"1.0", request_id, b"400", b"not a worker of this run", b"", b""]
