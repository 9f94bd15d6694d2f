"""jes.distributed.transport: CURVE keys from the shared secret, and the master's Gatekeeper on real sockets."""
import contextlib
import time

import pytest
import zmq
from zmq.utils import z85

from jes.distributed import protocol, transport

SECRET = b"transport-secret-0123456789abcdef"
pytestmark = pytest.mark.hard_timeout(120)


def test_keys_are_the_secrets_alone_and_differ_by_role_and_secret():
    assert transport.client_keys(SECRET) == transport.client_keys(bytes(SECRET))
    assert transport.server_keys(SECRET) == transport.server_keys(SECRET)
    keys = {transport.client_keys(SECRET)[0], transport.server_keys(SECRET)[0],
            transport.client_keys(b"another-secret-0123456789")[0], transport.server_keys(b"another-secret-0123456789")[0]}
    assert len(keys) == 4 and all(len(k) == 40 for k in keys)
    public, secret = protocol.curve_keypair()  # a master's own pair (jes keys) replaces the derived one
    assert transport.server_keys(SECRET, secret.encode()) == (public.encode(), secret.encode())


def test_the_gatekeeper_admits_the_secrets_client_key_alone():
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    gatekeeper = transport.Gatekeeper(context, SECRET)
    try:
        request = [b"1.0", b"7", b"", b"10.0.0.9", b"", b"CURVE"]
        admitted = gatekeeper.answer([*request, z85.decode(transport.client_keys(SECRET)[0])])
        assert admitted[:3] == [b"1.0", b"7", b"200"]
        for frames in ([*request, z85.decode(zmq.curve_keypair()[0])],                              # another key
                       [*request, z85.decode(transport.client_keys(b"another-secret-0123456789")[0])],
                       [*request[:5], b"PLAIN", b"user", b"password"],                                 # another mechanism
                       [*request[:5], b"NULL"],
                       [*request, z85.decode(transport.client_keys(SECRET)[0]), b"extra"]):             # two credentials
            assert gatekeeper.answer(frames)[:3] == [b"1.0", b"7", b"400"], frames
        for malformed in ([b"1.0", b"8"], [b"2.0", b"8", b"", b"", b"", b"CURVE", b"k"], []):
            assert gatekeeper.answer(malformed)[2] == b"500"
        assert gatekeeper.admitted == 1
    finally:
        router.close(0)
        gatekeeper.stop()
        context.term()


@pytest.mark.parametrize("own_server_key", [False, True])
def test_only_a_client_of_the_secret_gets_a_message_through(own_server_key):
    """Real sockets on loopback: a client with the secret's keys is heard; one with another secret's keys, or a
    key pair of its own sent to the right server key, is refused in the handshake and never heard."""
    public, secret = (k.encode() for k in protocol.curve_keypair())
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    transport.secure_server(router, SECRET, secret if own_server_key else None)
    gatekeeper = transport.Gatekeeper(context, SECRET)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    clients = []

    def client(secret_: bytes | None, server_key: bytes | None = None) -> zmq.Socket:
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if secret_ is None:
            sock.curve_serverkey = server_key
            sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
        else:
            transport.secure_client(sock, secret_, server_key)
        sock.connect(f"tcp://127.0.0.1:{port}")
        clients.append(sock)
        return sock

    try:
        server_public = public if own_server_key else transport.server_keys(SECRET)[0]
        for outsider in (client(b"another-secret-0123456789", public if own_server_key else None),
                         client(None, server_public)):
            _send_unless_refused(outsider, b"outsider")
        # ZAP refuses the key pair of its own, and another secret's keys where they reach it (sent to the master's
        # own server key; to the secret's server key they fail the handshake before ZAP is asked)
        expected = 2 if own_server_key else 1
        deadline = time.monotonic() + 60
        while gatekeeper.refused < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gatekeeper.refused >= expected and gatekeeper.admitted == 0
        insider = client(SECRET, public if own_server_key else None)
        insider.send(b"insider")
        assert router.poll(60_000), "a client holding the secret was not heard"
        assert router.recv_multipart()[1] == b"insider"
        assert router.poll(500) == 0  # and nothing else ever arrived
    finally:
        for sock in (*clients, router):
            sock.close(0)
        gatekeeper.stop()
        context.term()


def _router_and_gatekeeper(context):
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    transport.secure_server(router, SECRET)
    gatekeeper = transport.Gatekeeper(context, SECRET)
    return router, gatekeeper, router.bind_to_random_port("tcp://127.0.0.1")


def _send_unless_refused(sock, data: bytes) -> None:
    """Queue data on a client socket whose handshake may already have been refused: libzmq ends a refused
    connection's pipe, and a DEALER with no pipe answers a non-blocking send with zmq.Again. Under load the I/O thread
    can finish (and fail) the handshake between connect and send, so Again here means the door was already shut."""
    with contextlib.suppress(zmq.Again):
        sock.send(data, flags=zmq.NOBLOCK)


def _outsider(context, port):
    """A CURVE client with a key pair of its own, to the server key of SECRET (which a former worker knows)."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.curve_serverkey = transport.server_keys(SECRET)[0]
    sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
    sock.connect(f"tcp://127.0.0.1:{port}")
    return sock


def test_a_server_whose_gatekeeper_is_gone_admits_nobody():
    """libzmq admits every CURVE client key where no ZAP handler answers: a Gatekeeper gone (its thread ended) opened
    the door to any key. The socket's ZAP domain, enforced, makes it fail closed."""
    context = zmq.Context()
    router, gatekeeper, port = _router_and_gatekeeper(context)
    gatekeeper.stop()
    outsider = _outsider(context, port)
    insider = context.socket(zmq.DEALER)
    insider.setsockopt(zmq.LINGER, 0)
    transport.secure_client(insider, SECRET)
    insider.connect(f"tcp://127.0.0.1:{port}")
    try:
        _send_unless_refused(outsider, b"outsider")
        _send_unless_refused(insider, b"insider")
        assert router.poll(3000) == 0  # nobody: no handler, no handshake
    finally:
        for sock in (outsider, insider, router):
            sock.close(0)
        context.term()


def test_a_logging_handler_that_raises_does_not_end_the_gatekeeper():
    """A user's logging handler that raises (a remote log sink that is down) ended the Gatekeeper's thread at the
    first refused handshake, and the master's socket then admitted any client key."""
    import logging

    class Raising(logging.Handler):
        def emit(self, record):
            raise ConnectionError("log server unreachable")

    handler = Raising()
    logging.getLogger("jes.distributed").addHandler(handler)
    context = zmq.Context()
    router, gatekeeper, port = _router_and_gatekeeper(context)
    outsiders = []
    try:
        outsiders.append(_outsider(context, port))
        deadline = time.monotonic() + 60
        while gatekeeper.refused == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gatekeeper.refused >= 1 and gatekeeper.is_alive()
        outsiders.append(_outsider(context, port))
        _send_unless_refused(outsiders[-1], b"outsider")
        deadline = time.monotonic() + 60
        while gatekeeper.refused < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gatekeeper.refused >= 2 and gatekeeper.is_alive() and router.poll(500) == 0
    finally:
        logging.getLogger("jes.distributed").removeHandler(handler)
        for sock in (*outsiders, router):
            sock.close(0)
        gatekeeper.stop()
        context.term()
