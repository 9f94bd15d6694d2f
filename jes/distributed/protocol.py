"""Wire format of distributed jes: authenticated msgpack messages, array and state encoding, run descriptions.

The messages travel over CURVE-encrypted ZeroMQ connections that only holders of the shared secret get
through (:mod:`jes.distributed.transport`); the checks below hold whatever the transport.

Every message is two ZeroMQ frames, ``[body, mac]``: ``body`` is a msgpack map
with a ``"type"`` string, ``mac`` is HMAC-SHA256 of ``body`` under the shared
secret. Receivers check the frame count, the size and the MAC *before* they
unpack anything, then unpack with msgpack's size limits and validate every
field they use; anything else is a :class:`ProtocolError` (dropped and logged
by the caller). Nothing is ever pickled: arrays travel as
``{"dtype", "shape", "data"}`` with a whitelist of dtypes, and a run is
described by plain data (class paths and fields) that the worker rebuilds.

Sessions and replay protection: a worker opens every connection with ``hello``
{name, nonce} (a fresh random nonce); the master answers ``welcome`` {nonce, sid}
with a fresh random session id. Every later message in either direction carries
``sid`` and ``seq`` (1, 2, 3, ... per direction) inside the MAC'd body; a
receiver drops a message of another session or whose ``seq`` is not above the
last one it accepted (:class:`Session`). A captured message sent again, to
the same or a new connection, or to a restarted master, is therefore rejected;
a ``welcome`` is accepted only for the nonce of the pending ``hello``. A master
that gets an authenticated message of a session it does not know (it restarted)
answers ``rehello`` {sid} and the worker opens a new session.

Messages (worker -> master), all but ``hello`` with ``sid`` and ``seq``:
    ``hello``     {name, nonce}: open a session.
    ``request``   {name, run, gen, hash, last_aid, abandon}: idle, give me work. ``last_aid``: the
                  newest assignment id received in this session (0: none).
    ``result``    {run, gen, hash, aid, start, stop, fitness, env_steps, obs_sum, obs_sumsq, centre_returns,
                  centre_steps, seconds}; ``centre_returns`` (float32) and ``centre_steps`` (int32) are
                  ``[stop - start, S]``: each chunk's centre slots (``S`` = ``Trainer.centre_slots``) when the work
                  asked for the centre, ``[stop - start, 0]`` otherwise.
    ``heartbeat`` {name}: still alive (sent by the worker's I/O thread while it builds or computes).
    ``refused``   {run, reason}: the run's description cannot be built here (e.g. outside the allowlist).
    ``diverged``  {run, gen, hash, mine}: my state after applying the update that leads to generation ``gen``
                  has hash ``mine``, not the master's ``hash``: I compute other bits (the master distrusts me).
    ``bye``       {aid}: leaving; my assignment goes back to the queue.

Messages (master -> worker), all but ``welcome``/``rehello`` with ``sid`` and ``seq``:
    ``welcome``   {nonce, sid}: the session is open.
    ``rehello``   {sid}: I do not know session ``sid`` (I restarted); say hello again.
    ``setup``     {run, description, heartbeat_interval}: the run to build (then the worker asks for work).
    ``snapshot``  {run, gen, hash, state}: the full training state.
    ``work``      {run, gen, hash, aid, start, stop, centre, update}: evaluate chunks ``[start, stop)`` of the
                  state with this generation and hash, with their centre slots live when ``centre`` (a bool: the
                  generation evaluates the centre in its chunks, chunk ``k`` running centre episodes
                  ``k*S .. k*S+S-1``, as the local step does), idle otherwise; ``update`` (or ``None``) holds the previous
                  generation's per-chunk results ``{gen, hash, fitness, env_steps, obs_sum, obs_sumsq}``
                  that turn the worker's previous state into this one.
    ``wait``      {}: no work right now.
    ``pong``      {}: answer to a heartbeat.
    ``distrusted`` {run, reason}: none of your results are used any more in this run (a jes-worker stops).
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import math
import os
import secrets
from typing import Any

import msgpack
import numpy as np

from jes import describe

PROTOCOL_VERSION = 3  # 2: sessions (hello/welcome, sid/seq), allowlisted descriptions; 3: centre slots in work/result
MAC_BYTES = 32
# Per-message ceilings. Master-bound messages are small (fitness and obs sums); worker-bound
# ones may carry a full state snapshot.
MAX_TO_MASTER_BYTES = 16 * 2**20
MAX_TO_WORKER_BYTES = 1024 * 2**20
ALLOWED_DTYPES = ("float32", "float64", "int32", "int64", "uint32", "uint8", "bool")
SECRET_ENV = "JES_SECRET"


class ProtocolError(ValueError):
    """A message that is unauthenticated, malformed, truncated, oversized or unexpected."""


DescriptionError = describe.DescriptionError  # re-exported: a run that cannot be described or built
RefusedError = describe.RefusedError          # a description naming code outside the worker's allowlist


# ------------------------------------------------------------------ secrets
def load_secret(secret: bytes | str | None = None, secret_file: str | None = None) -> bytes:
    """The HMAC key from ``secret``, else ``secret_file``, else the ``JES_SECRET`` environment variable.

    Raises:
        ValueError: no secret anywhere, or one shorter than 16 bytes.
    """
    if secret is None and secret_file is not None:
        try:
            with open(secret_file, "rb") as f:
                secret = f.read().strip()
        except OSError as err:
            raise ValueError(f"cannot read secret file {secret_file!r}: {err}") from err
    if secret is None:
        secret = os.environ.get(SECRET_ENV)
    if secret is None:
        raise ValueError(
            "distributed jes needs a shared secret: pass secret=..., --secret-file FILE, or set the "
            f"{SECRET_ENV} environment variable (e.g. `head -c 32 /dev/urandom | base64 > jes.secret`)"
        )
    key = secret.encode() if isinstance(secret, str) else bytes(secret)
    if len(key) < 16:
        raise ValueError(f"the shared secret is {len(key)} bytes; use at least 16 (32 random bytes recommended)")
    return key


# -------------------------------------------------------------------- CURVE
def curve_keypair() -> tuple[str, str]:
    """A new CURVE key pair ``(public, secret)`` as 40-character Z85 text (for ``jes keys``)."""
    import zmq

    public, secret = zmq.curve_keypair()
    return public.decode("ascii"), secret.decode("ascii")


def load_curve_key(value: str | bytes | None, what: str) -> bytes | None:
    """A Z85 CURVE key from ``value``: the key itself (40 characters) or a file holding it; ``None`` stays ``None``.

    Raises:
        ValueError: neither a readable key file nor a 40-character Z85 key.
    """
    if value is None:
        return None
    text = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
    if len(text.strip()) != 40 or os.path.exists(text):
        try:
            with open(text, "r", encoding="ascii") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"{what}: {value!r} is neither a 40-character Z85 CURVE key nor a readable key file "
                             f"(make one with `jes keys NAME`): {err}") from err
    key = text.strip().encode("ascii", "replace")
    if len(key) != 40:
        raise ValueError(f"{what}: a CURVE key is 40 Z85 characters, got {len(key)} (make one with `jes keys NAME`)")
    return key


# ------------------------------------------------------------------ framing
def encode(message: dict, key: bytes) -> list[bytes]:
    """``[body, mac]`` frames for ``message`` (a dict with a ``"type"``)."""
    body = msgpack.packb(message, use_bin_type=True)
    return [body, hmac.new(key, body, hashlib.sha256).digest()]


def decode(frames: list[bytes], key: bytes, max_bytes: int) -> dict:
    """Check and unpack ``[body, mac]``; raises :class:`ProtocolError` on anything wrong."""
    if len(frames) != 2:
        raise ProtocolError(f"expected 2 frames, got {len(frames)}")
    body, mac = frames
    if len(body) > max_bytes:
        raise ProtocolError(f"oversized message ({len(body)} bytes > {max_bytes})")
    if len(mac) != MAC_BYTES:
        raise ProtocolError(f"bad MAC frame length {len(mac)}")
    if not hmac.compare_digest(hmac.new(key, body, hashlib.sha256).digest(), mac):
        raise ProtocolError("bad MAC (wrong secret or corrupted message)")
    try:
        message = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as err:  # msgpack raises several types for malformed input
        raise ProtocolError(f"undecodable body: {type(err).__name__}: {err}") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("message is not a map with a 'type'")
    return message


def loggable(text: str, limit: int) -> str:
    """A peer's ``text`` (a worker's name, a refusal's reason) fit for one log line: control characters (newlines
    that would forge lines of their own, terminal escapes) written as escapes, at most ``limit`` characters."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])[:limit]


def field(message: dict, name: str, kind: type | tuple, *, optional: bool = False) -> Any:
    """``message[name]`` checked to be of ``kind`` (``bool`` is never accepted as an int)."""
    if name not in message or message[name] is None:
        if optional:
            return None
        raise ProtocolError(f"{message.get('type')!r} message lacks field {name!r}")
    value = message[name]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ProtocolError(f"field {name!r} has type bool")
    if not isinstance(value, kind):
        raise ProtocolError(f"field {name!r} has type {type(value).__name__}")
    return value


class Session:
    """One side of a connection's session: stamps outgoing messages, rejects replayed or foreign incoming ones.

    Args:
        key: the shared secret.
        sid: the session id the master chose (random, so sessions never repeat).
    """

    def __init__(self, key: bytes, sid: str):
        self.key, self.sid = key, sid
        self.sent = 0
        self.received = 0

    def seal(self, message: dict) -> list[bytes]:
        """``[body, mac]`` of ``message`` with this session's ``sid`` and the next ``seq``."""
        self.sent += 1
        return encode(dict(message, sid=self.sid, seq=self.sent), self.key)

    def accept(self, message: dict) -> None:
        """Accept a decoded (authenticated) message, or raise :class:`ProtocolError` for a replay."""
        sid, seq = message.get("sid"), message.get("seq")
        if sid != self.sid:
            raise ProtocolError(f"{message.get('type')!r} message of another session (replayed or stale)")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq <= self.received:
            raise ProtocolError(f"replayed or reordered {message.get('type')!r} message (seq {seq!r}, "
                                f"last accepted {self.received})")
        self.received = seq


def new_nonce() -> str:
    """A fresh random hex string for a hello nonce or a session id."""
    return secrets.token_hex(16)


# ------------------------------------------------------------------- arrays
def pack_array(array: Any) -> dict:
    """``{"dtype", "shape", "data"}`` of a numpy/JAX array (C order, little endian)."""
    arr = np.asarray(array)  # tobytes() is C order; ascontiguousarray would turn scalars into [1]
    if arr.dtype.name not in ALLOWED_DTYPES:
        raise TypeError(f"cannot send arrays of dtype {arr.dtype}")
    return {"dtype": arr.dtype.name, "shape": list(arr.shape), "data": arr.astype(arr.dtype.newbyteorder("<")).tobytes()}


def unpack_array(value: Any, dtype: str | None = None, shape: tuple | None = None) -> np.ndarray:
    """Inverse of :func:`pack_array`, checking dtype, shape and byte count."""
    if not isinstance(value, dict):
        raise ProtocolError("array field is not a map")
    name, dims, data = value.get("dtype"), value.get("shape"), value.get("data")
    if name not in ALLOWED_DTYPES or not isinstance(dims, list) or not isinstance(data, bytes):
        raise ProtocolError("malformed array")
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**31 for d in dims) or len(dims) > 8:
        raise ProtocolError("malformed array shape")
    dt = np.dtype(name).newbyteorder("<")
    if len(data) != math.prod(dims) * dt.itemsize:  # Python ints: np.prod would wrap around to a small count
        raise ProtocolError(f"array data has {len(data)} bytes, shape {dims} of {name} needs more or fewer")
    if dtype is not None and name != dtype:
        raise ProtocolError(f"array dtype {name}, expected {dtype}")
    if shape is not None and tuple(dims) != tuple(shape):
        raise ProtocolError(f"array shape {tuple(dims)}, expected {tuple(shape)}")
    return np.frombuffer(data, dt).astype(np.dtype(name)).reshape(dims)


# -------------------------------------------------------------------- state
def state_leaves(state: Any) -> dict:
    """The training state as a nested dict of numpy arrays (the PRNG key as raw ``uint32`` data)."""
    import jax
    from flax import serialization

    raw = state.replace(es_key=jax.random.key_data(state.es_key))
    return jax.tree.map(np.asarray, serialization.to_state_dict(jax.device_get(raw)))


def state_hash(state: Any) -> str:
    """SHA-256 (hex, 32 chars) over every leaf's path, dtype, shape and bytes: equal iff bit-identical."""
    import jax

    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(state_leaves(state))[0]:
        digest.update(jax.tree_util.keystr(path).encode())
        digest.update(f"{leaf.dtype.name}{leaf.shape}".encode())
        digest.update(np.ascontiguousarray(leaf).tobytes())
    return digest.hexdigest()[:32]


def pack_state(state: Any) -> dict:
    """A :class:`jes.TrainState` as nested msgpack-able maps of packed arrays."""
    import jax

    return jax.tree.map(pack_array, state_leaves(state))


def unpack_state(trainer: Any, packed: Any) -> Any:
    """Rebuild a state for ``trainer`` from :func:`pack_state` output, checking every leaf against the template."""
    import jax
    from flax import serialization

    template = trainer.init_state(0)
    template_leaves = state_leaves(template)

    def restore(tmpl: dict | np.ndarray, value: Any, where: str):
        if isinstance(tmpl, dict):
            if not isinstance(value, dict) or set(value) != set(tmpl):
                raise ProtocolError(f"state snapshot structure differs at {where or 'top'}")
            return {k: restore(tmpl[k], value[k], f"{where}/{k}") for k in tmpl}
        return unpack_array(value, tmpl.dtype.name, tmpl.shape)

    leaves = restore(template_leaves, packed, "")
    raw_template = template.replace(es_key=jax.random.key_data(template.es_key))
    state = serialization.from_state_dict(raw_template, leaves)
    state = state.replace(es_key=jax.random.wrap_key_data(np.asarray(state.es_key, np.uint32)))
    return trainer.place(state)


# --------------------------------------------------------- run descriptions
def describe_run(trainer: Any, env: Any, optimizer: Any, env_params: Any = None, **extra: Any) -> dict:
    """Plain data from which a worker rebuilds an identical :class:`jes.Trainer` (see :mod:`jes.describe`).

    ``extra`` parts (e.g. a ``strategy`` dataclass) are described generically and passed to the
    worker's ``Trainer`` as keyword arguments of the same name.

    Raises:
        DescriptionError: a part that cannot travel as data (an optax transformation you built,
            a schedule, a lambda, a class defined in ``__main__`` or a notebook...).
    """
    extra.setdefault("strategy", trainer.strategy)  # a frozen dataclass from jes.strategies
    if isinstance(env, tuple) and len(env) == 2 and env_params is None:
        env, env_params = env  # gymnax's (env, params): the env object checked below as any other, then its params
    if not isinstance(env, (str, tuple)):
        from jes.envs import resolvable_name  # JAX is loaded anyway: describe_run takes a built trainer
        from jes.envs.brax import INSTANCE_SUFFIX as BRAX_INSTANCE_SUFFIX

        name = resolvable_name(env)
        if name is not None:  # brax / masked env objects travel by name (it carries the backend)
            if BRAX_INSTANCE_SUFFIX in name:
                raise DescriptionError(f"env {name!r} is a brax env object that no name rebuilds (a changed sys, "
                                       f"attributes set after construction, or a class of your own), so it cannot "
                                       f"travel to workers: pass a brax name ('brax/<name>?backend=...&<argument>="
                                       f"...') or an env that one rebuilds, or run it without workers")
            env = trainer.spec.name
        else:
            _check_env_rebuilds(env)
    config = trainer.config
    if config.chunk_size is None:  # the chunk the master runs, whatever a worker's jes would take for its default
        config = config.replace(chunk_size=trainer.chunk_size)
    description = describe.describe_run(trainer.policy, config, env, optimizer, env_params, **extra)
    return {"version": PROTOCOL_VERSION, **description}


def _check_env_rebuilds(env: Any) -> None:
    """Raise :class:`DescriptionError` where a JAX env object, which travels to workers by its class (they build it
    again: without arguments, or from its dataclass fields), would be built there otherwise than the master's: other
    attribute values (constructor arguments) would make workers step another env, their returns mixed with the
    master's without a word."""
    from jes.envs.gymnax import differing_attributes

    cls = type(env)
    try:
        rebuilt = dataclasses.replace(env) if dataclasses.is_dataclass(env) else cls()
    except Exception as err:  # noqa: BLE001 - workers would fail alike, each with its own message
        raise DescriptionError(f"env {cls.__qualname__} travels to workers by its class, which they build without "
                               f"arguments, and {cls.__qualname__}() fails ({type(err).__name__}: {err}): give its "
                               f"arguments defaults, make it a dataclass whose fields hold them, or run it without "
                               f"workers") from err
    differing = differing_attributes(env, rebuilt)
    if differing:
        raise DescriptionError(f"env {cls.__qualname__} travels to workers by its class, which they build without "
                               f"arguments, and this one's {', '.join(differing)} "
                               f"{'differs' if len(differing) == 1 else 'differ'} from "
                               f"{cls.__qualname__}()'s (constructor arguments, or attributes set after): workers would "
                               f"step another env; make those the defaults, make it a dataclass whose fields hold "
                               f"them, or run it without workers")


def build_run(description: Any, devices: Any = None, allow: describe.Allowlist | None = None) -> Any:
    """A :class:`jes.Trainer` from :func:`describe_run` output, building only what ``allow`` admits.

    Raises:
        RefusedError: the description names code outside ``allow`` (default: :func:`jes.describe.allowlist`);
            nothing was built.
        DescriptionError: a malformed description, or one this worker cannot build (any error of the
            trainer's constructor, e.g. env_params that are not the env's parameters, ends up here).
    """
    from jes.generation import Trainer  # imported here so that importing the protocol does not import JAX

    if not isinstance(description, dict) or description.get("version") != PROTOCOL_VERSION:
        version = description.get("version") if isinstance(description, dict) else None
        raise DescriptionError(f"run description of protocol version {version!r}, but this jes speaks version "
                               f"{PROTOCOL_VERSION}: run the same jes version on the master and its workers")
    parts = describe.build_run_parts(description, allow or describe.allowlist())
    policy, env, optimizer, config = (parts.pop(k) for k in ("policy", "env", "optimizer", "config"))
    try:
        return Trainer(policy, env, optimizer, config, devices=devices, **parts)
    except Exception as err:  # noqa: BLE001 - an allowed but inconsistent description must not kill a worker
        raise DescriptionError(f"cannot build the described run: {type(err).__name__}: {err}") from err


def run_id(description: dict, state_key_data: bytes) -> str:
    """Identity of a run: its description and its PRNG key."""
    digest = hashlib.sha256(msgpack.packb(description, use_bin_type=True))
    digest.update(state_key_data)
    return digest.hexdigest()[:16]
