"""A trained policy you can use: the normaliser and the output->action mapping of training, baked in.

``TrainResult.policy`` is the bare Flax module: applying it to raw observations skips the
observation normalisation training used and the mapping from outputs to actions. A
:class:`TrainedPolicy` does both, exactly as the rollouts did::

    trained = result.trained_policy()          # or: jes.load_policy("policy.jes")
    carry = trained.initial_carry()
    carry, action = trained.act(carry, obs)    # one observation -> one env action
    fn = trained.policy_fn()                   # self-contained and jittable: fn(carry, obs) -> (carry, action)
    trained.evaluate(num_episodes=64)          # returns on fresh episodes, through the same function
    trained.render("episode.gif")              # one episode drawn (brax envs: .html)

:func:`save_policy` / :func:`load_policy` write and read a small msgpack file (never pickle)
holding the flat parameters, the normaliser's statistics, the policy's description, the env name and the
action mapping; loading it needs only jes (and the policy's module, for a custom policy).
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import struct
import warnings
import weakref
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization
from jax.flatten_util import ravel_pytree

from jes import describe, host_rollout, schema
from jes.atomic import write_atomically
from jes.checkpoint import build_policy
from jes.cpu import compiler_options
from jes.envs import EnvSpec, make_env
from jes.envs import brax as brax_envs
from jes.envs import gymnax as gymnax_envs
from jes.envs.spec import box_action
from jes.envs.wrappers import nan_option
from jes.generation import as_key, host_unravel, int32_seed, positive_count
from jes.policies import PolicyFns
from jes.render import render_policy
from jes.rollout import normalise, obs_mean_std, obs_normaliser, run_episodes
from jes.strategies import noise

POLICY_MAGIC = b"JESPOLI1"
# 2: a Box with some bounds infinite maps each dimension by its own bounds (format 1 files keep the raw outputs they
# were trained with: ActionMap.raw_unless_bounded).
# 3: an action's "start" (a Gymnasium Discrete space's) and "integer" (an integer Box's): act / policy_fn return the
# env's own action. Written only by files that have them (the others stay 2, which older jes reads alike).
POLICY_FORMAT_VERSION = 3
ENV_ACTION_FORMAT_VERSION = 3
_HEADER = struct.Struct("<8sQ32s")
# How to evaluate a policy whose env its name does not rebuild (`jes eval`, which takes no env object, says otherwise)
ENV_HINT = "pass env=... (jes.make_env(your_env)) to evaluate or render"


class PolicyFileError(ValueError):
    """A policy file is unreadable, corrupt, or not a jes policy."""


@dataclasses.dataclass(frozen=True)
class ActionMap:
    """How one raw policy output ``[num_outputs]`` becomes an env action (as :meth:`jes.EnvSpec.action`).

    Attributes:
        discrete: argmax over the outputs (an int32 action) when True.
        num_outputs: size of the policy output.
        action_shape: shape of one continuous action.
        low, high: bounds of a continuous action (tuples), or ``None`` for an unbounded one.
    """

    discrete: bool
    num_outputs: int
    action_shape: tuple[int, ...] = ()
    low: tuple[float, ...] | None = None
    high: tuple[float, ...] | None = None
    # A policy file of format 1 with some bounds infinite: the raw output in every dimension, as it was trained (not
    # written to files; see jes.envs.spec.box_action)
    raw_unless_bounded: bool = False
    # What a Gymnasium env's own action adds (jes.envs.gymnasium.GymnasiumEnv.env_action), applied by act and
    # policy_fn, not by training's mapping (__call__): a Discrete space's start; an integer Box (rounded, clipped).
    start: int = 0
    integer: str = ""  # an integer Box's dtype name ("" for any other action)

    @classmethod
    def from_spec(cls, spec: EnvSpec) -> "ActionMap":
        def flat(x):
            return None if x is None else tuple(float(v) for v in np.asarray(x, np.float32).ravel())

        finish = getattr(spec.env, "action_finish", None)
        start, integer = finish() if callable(finish) else (0, "")
        return cls(discrete=spec.discrete, num_outputs=spec.num_outputs, action_shape=tuple(spec.action_shape),
                   low=flat(spec.action_low), high=flat(spec.action_high), start=int(start), integer=str(integer))

    def env_action(self, action: jax.Array) -> jax.Array:
        """An action of :meth:`__call__` as the env takes it (what the host rollout hands a Gymnasium env): a
        Discrete space's ``start`` added (int32); an integer Box's action rounded to the nearest integer within its
        bounds (which a Gymnasium env keeps within +-2**24), in the Box's dtype (a 64-bit one as its 32-bit kin
        unless JAX's x64 mode is on: :meth:`TrainedPolicy.act` casts it on the host); any other as it is."""
        if self.discrete:
            return action + jnp.int32(self.start) if self.start else action
        if not self.integer:
            return action
        low = np.asarray(self.low, np.float32).reshape(self.action_shape)
        high = np.asarray(self.high, np.float32).reshape(self.action_shape)
        return jnp.clip(jnp.rint(action), low, high).astype(self._jax_integer())

    def _jax_integer(self) -> np.dtype:
        dtype = np.dtype(self.integer)
        if dtype.itemsize == 8 and not jax.config.jax_enable_x64:
            return np.dtype(np.int32 if dtype.kind == "i" else np.uint32)
        return dtype

    def __call__(self, out: jax.Array) -> jax.Array:
        # Must stay op-for-op the same as EnvSpec.action: tests compare the two bit for bit.
        if self.discrete:
            return jnp.argmax(out).astype(jnp.int32)
        out = out.reshape(self.action_shape)
        if self.low is None:
            return out
        low = np.asarray(self.low, np.float32).reshape(self.action_shape)
        high = np.asarray(self.high, np.float32).reshape(self.action_shape)
        if self.raw_unless_bounded and not (np.isfinite(low).all() and np.isfinite(high).all()):
            return out
        return box_action(out, low, high)


class TrainedPolicy:
    """A policy with its parameters, observation normaliser and action mapping.

    Step it in your own loop (:meth:`act`, :meth:`policy_fn`), measure it (:meth:`evaluate`), draw one episode
    (:meth:`render`) or write it to a file (:meth:`save`); :func:`load_policy` reads one back.

    Args:
        policy: the Flax module (with ``num_outputs`` filled in).
        flat_params: ``[num_params]`` float32 parameters (the centre, or a member).
        obs_shape: shape of one observation.
        action_map: the :class:`ActionMap`.
        obs_stats: ``(count, sum, sumsq)`` running observation statistics of training (count a scalar,
            the others ``obs_shape``), or ``None`` when training did not normalise.
        env_name: the env's name (a gymnax id lets :meth:`evaluate` rebuild it).
        max_steps: episode length limit used for :meth:`evaluate`.
        env: an :class:`EnvSpec` to evaluate on (built from ``env_name`` when ``None``).

    It pickles (a worker process's return) as its policy file's bytes, read back as :func:`load_policy` reads them:
    parameters and normaliser bit for bit, the module rebuilt from its class and fields (a policy class of your own:
    its module imported first, as for ``load_policy``); ``env`` is not kept, and :meth:`evaluate` rebuilds the env
    from ``env_name`` (pass ``env=`` for one of your own). A policy that no file can name (a class a notebook
    defined) pickles its module as pickle does. ``copy.deepcopy`` copies it and shares ``env``.
    """

    def __init__(self, policy: nn.Module, flat_params: Any, obs_shape: tuple[int, ...], action_map: ActionMap,
                 obs_stats: tuple[Any, Any, Any] | None = None, env_name: str = "", max_steps: int | None = None,
                 env: EnvSpec | None = None):
        self.policy = policy
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.action_map = action_map
        self.env_name = env_name
        self.max_steps = max_steps
        self._spec = env
        self.fns = PolicyFns(policy, self.obs_shape)
        unravel = []

        def flat_template():
            flat, fn = ravel_pytree(self.fns.init(jax.random.key(0)))
            unravel.append(fn)  # static (shapes and sizes only), so usable outside this trace
            return flat

        # Shapes only, as in Trainer: running init and ravel here was a dozen tiny programs per policy built.
        flat = jax.eval_shape(flat_template)
        self._unravel = unravel[0]
        self._host_unravel = host_unravel(self._unravel, int(flat.shape[0]))
        self.flat_params = np.asarray(flat_params, np.float32)
        if self.flat_params.shape != tuple(flat.shape):
            raise ValueError(f"flat_params has shape {list(self.flat_params.shape)}; {type(policy).__name__} on "
                             f"observations {list(self.obs_shape)} has {flat.shape[0]} parameters")
        self._check_action_map(flat)
        if obs_stats is not None:
            count, total, sumsq = obs_stats
            obs_stats = (np.asarray(count, np.float32).reshape(()), np.asarray(total, np.float32).reshape(self.obs_shape),
                         np.asarray(sumsq, np.float32).reshape(self.obs_shape))
        self.obs_stats = obs_stats
        self._act = jax.jit(self._env_apply)
        self._evaluators: dict = {}  # EnvSpec -> jitted evaluation

    def _check_action_map(self, flat: Any) -> None:
        """The action map fits the policy's output and itself (a file's fields are checked one by one by the schema;
        this checks that they fit together, before an episode would fail deep inside a program)."""
        action = self.action_map
        out = jax.eval_shape(lambda p: self.fns.apply(p, self.fns.initial_carry(),
                                                      jnp.zeros(self.obs_shape, jnp.float32))[1],
                             jax.eval_shape(lambda: self._unravel(jnp.zeros(flat.shape, flat.dtype))))
        if out.shape != (action.num_outputs,):
            raise ValueError(f"{type(self.policy).__name__} outputs shape {list(out.shape)}; the action map expects "
                             f"[{action.num_outputs}] (num_outputs)")
        if not action.discrete:
            size = int(np.prod(action.action_shape))
            if size != action.num_outputs:
                raise ValueError(f"a continuous action of shape {list(action.action_shape)} needs {size} outputs; "
                                 f"the action map has num_outputs={action.num_outputs}")
            if (action.low is None) != (action.high is None):
                raise ValueError("the action map has one bound without the other (low and high are both given or "
                                 "both None)")
            for name, bound in (("low", action.low), ("high", action.high)):
                if bound is not None and len(bound) != size:
                    raise ValueError(f"the action bound {name} has {len(bound)} values; the action has {size}")
                if bound is not None and np.isnan(np.asarray(bound, np.float64)).any():
                    raise ValueError(f"the action bound {name} holds NaN")
            if action.low is not None and (np.asarray(action.low) > np.asarray(action.high)).any():
                raise ValueError("the action bounds have low > high")

    def _check_env(self, spec: EnvSpec) -> None:
        """The env's observations and actions are the ones this policy was made for."""
        action, found = self.action_map, []
        if tuple(spec.obs_shape) != self.obs_shape:
            found.append(f"observations of shape {list(spec.obs_shape)}, the policy takes {list(self.obs_shape)}")
        if spec.discrete != action.discrete:
            kind = lambda discrete: "discrete" if discrete else "continuous"
            found.append(f"{kind(spec.discrete)} actions, the policy's are {kind(action.discrete)}")
        elif spec.num_outputs != action.num_outputs or (not spec.discrete
                                                        and tuple(spec.action_shape) != action.action_shape):
            found.append(f"actions from {spec.num_outputs} outputs (shape {list(spec.action_shape)}), the policy's "
                         f"from {action.num_outputs} (shape {list(action.action_shape)})")
        if found:
            recorded = f" (the env its file names)" if spec.name == self.env_name else ""
            raise ValueError(f"env {spec.name!r}{recorded} does not fit this policy: the env has {'; '.join(found)}. "
                             f"Evaluate or render it on the env it was trained on (TrainedPolicy.evaluate(env=...), "
                             f"render(env=...))")

    @property
    def params(self) -> Any:
        """The Flax variables of the policy."""
        return self._host_unravel(self.flat_params)

    @property
    def variables(self) -> dict:
        """Everything :meth:`apply` needs besides carry and observation: params and observation statistics."""
        stats = None if self.obs_stats is None else tuple(jax.device_put(x) for x in self.obs_stats)
        return {"params": self.params, "obs_stats": stats}

    @property
    def obs_norm(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(mean, std)`` the policy normalises observations with, or ``None``.

        :meth:`apply` computes ``(obs - mean) * rsqrt(var)``, as training's rollout does; that can
        differ from ``(obs - mean) / std`` in the last bit."""
        if self.obs_stats is None:
            return None
        return tuple(np.asarray(x) for x in obs_mean_std(*(jnp.asarray(x) for x in self.obs_stats)))

    def apply(self, variables: dict, carry: Any, obs: jax.Array) -> tuple[Any, jax.Array]:
        """``(carry, action)`` for one observation, given :attr:`variables` (pure; vmap/jit it freely): training's
        action, before what a Gymnasium env adds to it (a ``Discrete`` space's ``start``, an integer ``Box``'s
        rounding), which :meth:`act` and :meth:`policy_fn` apply."""
        return self._apply_normed(variables["params"], _obs_scale(variables["obs_stats"]), carry, obs)

    def _env_apply(self, variables: dict, carry: Any, obs: jax.Array) -> tuple[Any, jax.Array]:
        """:meth:`apply` with the action as the env takes it (:meth:`ActionMap.env_action`): what act and policy_fn
        return."""
        carry, action = self.apply(variables, carry, obs)
        return carry, self.action_map.env_action(action)

    def _apply_normed(self, params: Any, obs_scale: Any, carry: Any, obs: jax.Array) -> tuple[Any, jax.Array]:
        # The same operations as the rollout's (jes.rollout.run_episodes): tests compare them bit for bit.
        carry, out = self.fns.apply(params, carry, normalise(obs, obs_scale))
        return carry, self.action_map(out)

    def initial_carry(self) -> Any:
        """The carry at an episode's start (``()`` for a feed-forward policy)."""
        return self.fns.initial_carry()

    def act(self, carry: Any, obs: Any) -> tuple[Any, jax.Array]:
        """One step: normalise ``obs`` (shape ``obs_shape``), apply the policy, map its output to an action.

        A Gymnasium env's observation of a Dict, Tuple, Discrete, MultiDiscrete or MultiBinary space, as its
        ``reset()`` and ``step()`` return it, is flattened first as training flattened it
        (``gymnasium.spaces.flatten`` with the space the policy was trained on); one flattened already is taken as it
        is. A policy loaded from a file knows that space once its env is rebuilt from its id (or given:
        ``jes.load_policy(path, env=...)``); where it cannot be, ``act`` says to pass the flattened observation.

        Returns:
            ``(carry, action)``, the action as the env takes it (what training handed the env): an int32 scalar for
            discrete envs (a Gymnasium ``Discrete`` space's ``start`` added), else an ``action_shape`` float32 array
            in the env's bounds (an integer ``Box``'s: the nearest integers within them, in the Box's dtype).
        """
        obs = jnp.asarray(self._flat_observation(obs), jnp.float32)
        if tuple(obs.shape) != tuple(self.obs_shape):
            batch = (tuple(obs.shape[1:]) == tuple(self.obs_shape) and
                     "; for a batch of envs use jax.vmap(policy.policy_fn())(carries, observations)")
            raise ValueError(f"act takes one observation of shape {tuple(self.obs_shape)}, got shape "
                             f"{tuple(obs.shape)}" + (batch or f" (the env {self.env_name!r} gives "
                                                               f"{tuple(self.obs_shape)})"))
        self._check_carry(carry)
        carry, action = self._act(self.variables, carry, obs)
        if self.action_map.integer and np.dtype(self.action_map.integer) != action.dtype:  # int64 without x64
            action = np.asarray(action).astype(self.action_map.integer)  # exact: within +-2**24
        return carry, action

    def _check_carry(self, carry: Any) -> None:
        """Refuse what is not this policy's carry (``None`` for a recurrent one, as Stable-Baselines3's
        ``predict(obs, state=None)`` starts an episode: a raw "'NoneType' object is not subscriptable" before)."""
        initial = self.__dict__.get("_initial_carry_shapes")
        if initial is None:
            initial = self.__dict__["_initial_carry_shapes"] = jax.eval_shape(self.initial_carry)
        expected = jax.tree.structure(initial)
        if expected.num_leaves == 0:
            return  # a feed-forward policy reads no carry: (), None, {} alike
        shapes = lambda tree: [(tuple(np.shape(x)), jnp.result_type(x)) for x in jax.tree.leaves(tree)]
        if jax.tree.structure(carry) == expected and shapes(carry) == shapes(initial):
            return
        got = (f"{jax.tree.structure(carry)}" if jax.tree.structure(carry) != expected else
               ", ".join(f"{d}{list(sh)}" for sh, d in shapes(carry)))
        want = (f"{expected}" if jax.tree.structure(carry) != expected else
                ", ".join(f"{d}{list(sh)}" for sh, d in shapes(initial)))
        raise ValueError(f"act(carry, obs) takes this policy's carry, shaped as initial_carry()'s "
                         f"({type(self.policy).__name__}: {want}), got {got}: start each episode with carry = "
                         f"policy.initial_carry(), then pass the carry act returned (for a batch of envs: "
                         f"jax.vmap(policy.policy_fn())(carries, observations))")

    def _flat_observation(self, obs: Any) -> Any:
        """``obs`` as training gave it to the policy: a raw observation of a space Gymnasium flattens, flattened by its
        env (:meth:`jes.envs.gymnasium.GymnasiumEnv.observation`, what the host rollout calls); anything else as is."""
        if isinstance(obs, jax.Array):  # a device array (or a trace): the policy's input already
            return obs
        fits = _has_shape(obs, self.obs_shape)
        if self._spec is None:
            if fits:  # the common case needs no env: a Box's observation (or one flattened already)
                return obs
            try:  # is it the raw observation of an env that flattens them? Only its space can tell
                self.env_spec()
            except Exception as err:  # noqa: BLE001 - an env that cannot be rebuilt here (its own error is beside it)
                if isinstance(obs, (dict, tuple, list)) or np.ndim(obs) == 0:
                    raise ValueError(f"act takes one observation of shape {tuple(self.obs_shape)}, as training gave it "
                                     f"to the policy; got a {type(obs).__name__}, and this policy's env "
                                     f"{self.env_name!r} cannot be rebuilt here to flatten it ({err}). Pass "
                                     f"gymnasium.spaces.flatten(env.observation_space, obs), or load the policy with "
                                     f"jes.load_policy(path, env=your_env) so that act flattens it") from err
                return obs
        env = self._spec.env
        if not getattr(env, "flattens", False):
            return obs
        space = env.observation_space
        if fits and not _contains(space, obs):  # flattened already (a raw one is in the space)
            return obs
        try:
            return env.observation(obs)
        except Exception as err:  # noqa: BLE001 - gymnasium's flatten of something that is not of the space
            raise ValueError(f"act takes one observation of the env's observation space {space}, as env.reset() and "
                             f"env.step() return it (flattened here as training flattened it), or one flattened "
                             f"already, of shape {tuple(self.obs_shape)}; flattening this {type(obs).__name__} "
                             f"failed: {type(err).__name__}: {err}") from err

    def policy_fn(self) -> Callable[[Any, jax.Array], tuple[Any, jax.Array]]:
        """A self-contained ``fn(carry, obs) -> (carry, action)`` with params, normaliser and action mapping
        baked in, the action as :meth:`act` returns it; jit or vmap it as you like (``jax.vmap(fn)`` over a batch of
        envs)."""
        variables = self.variables
        apply = self._env_apply
        obs_shape = tuple(self.obs_shape)

        def fn(carry, obs):
            # Shapes are static: a batch given to fn was one observation to a policy that flattens it (CartPole's
            # [8, 4] as one input: action 15 of 2, silently, a trial) or failed inside Flax
            if tuple(jnp.shape(obs)) != obs_shape:
                raise ValueError(f"policy_fn's function takes one observation of shape {obs_shape}, got shape "
                                 f"{tuple(jnp.shape(obs))}; for a batch of envs use jax.vmap(fn)(carries, "
                                 f"observations)")
            return apply(variables, carry, obs)

        return fn

    # ------------------------------------------------------------------ evaluation
    def env_spec(self) -> EnvSpec:
        """The env to evaluate on (rebuilt from ``env_name`` unless given)."""
        if self._spec is None:
            try:
                self._spec = make_env(self.env_name, max_steps=self.max_steps)
            except ValueError as err:
                raise ValueError(f"cannot rebuild env {self.env_name!r} for evaluation ({err}); {ENV_HINT}") from err
            except ImportError as err:  # the env's package is not installed here (brax, shimmy, a user's)
                raise ImportError(f"cannot rebuild env {self.env_name!r} for evaluation: {err}. Or {ENV_HINT}",
                                  name=err.name) from err
        return self._spec

    def evaluate(self, num_episodes: int = 64, key: Any = 12345, env: Any = None) -> np.ndarray:
        """Returns ``[num_episodes]`` on fresh episodes drawn from ``key``, stepping through :meth:`apply`.

        With the same key and episode count these are exactly the returns of training's centre
        evaluation (``Trainer.evaluate_centre``) of the same parameters and normaliser, bit for bit.
        A policy output that is not finite makes that episode's return NaN.

        Args:
            num_episodes: episodes to run.
            key: int seed or ``jax.random`` key.
            env: an env (id, gymnax object or :class:`EnvSpec`) instead of the recorded one. For a policy of a
                brax env instance, an instance of other physics or the registered env of its class (brax's
                default physics) is warned of, as :func:`load_policy` warns of it.
        """
        num_episodes = positive_count(num_episodes, "num_episodes")
        spec = self._env_for(env)
        if spec.host:  # a Python simulator (Gymnasium): the same host episodes as training's centre evaluation
            key = as_key(key)
        else:
            seed = int32_seed(key)  # seeded inside the program when it is one (no eager compile)
            key = as_key(key) if seed is None else seed
        if spec not in self._evaluators:
            self._evaluators[spec] = (_host_evaluate if spec.host else _evaluate)(self.fns, spec, self.action_map)
        returns = self._evaluators[spec](self.variables, key, int(num_episodes))
        return np.asarray(returns)

    def render(self, path: str, key: Any = 0, max_steps: int | None = None, env: Any = None) -> str:
        """Draw one episode of this policy to ``path`` (``.gif`` for gymnax CartPole/Pendulum and Gymnasium envs,
        ``.html`` for brax), through :meth:`apply`'s normaliser and action mapping.

        With the same key these are the frames :func:`jes.render.render` draws of the training state the policy
        came from (a run's centre, or a checkpoint's), byte for byte. GIFs need the ``viz`` extra (Pillow).

        Args:
            path: output file; its suffix picks the format.
            key: an int seed or a PRNG key: the episode's own key. (:meth:`evaluate` draws its episodes' keys from
                its key, so ``render(key=k)`` is not the episode ``evaluate(1, key=k)`` scores.)
            max_steps: steps to show at most (default: the env's episode limit).
            env: an env (id, gymnax object or :class:`EnvSpec`) instead of the recorded one, as :meth:`evaluate`.

        Returns:
            ``path``.

        Raises:
            ValueError: a format the env cannot be rendered to (the message names the one that works), or an env
                that does not fit the policy.
            OSError: ``path`` cannot be written, found before the episode.
            ImportError: Pillow missing (the message names the extra to install), or what the env draws with.
        """
        spec = self._env_for(env)
        return render_policy(spec, self.fns, self.params, _obs_scale(self.obs_stats), path, key, max_steps,
                             action_fn=self.action_map)

    def _env_for(self, env: Any) -> EnvSpec:
        """The env ``evaluate`` and ``render`` step: the recorded one, or ``env`` (checked to fit the policy)."""
        spec = self.env_spec() if env is None else (
            env if isinstance(env, EnvSpec) else make_env(env, max_steps=self.max_steps))
        self._check_env(spec)
        if env is not None:  # a brax instance's policy on other physics: said, as load_policy(path, env=) says it
            notice = (brax_envs.instance_warning(self.env_name, spec.name, "this policy", resuming=False)
                      or gymnax_envs.instance_warning(self.env_name, spec.name, "this policy", resuming=False)
                      or brax_envs.registered_instead_warning(self.env_name, spec.name, "this policy",
                                                              how="env=instance"))
            if notice is not None:
                warnings.warn(notice, stacklevel=3)
        return spec

    def save(self, path: str) -> str:
        """Write this policy to ``path`` (see :func:`save_policy`)."""
        return save_policy(self, path)

    def __reduce__(self) -> tuple:
        # pickle (multiprocessing, joblib) and copy: as its policy file's bytes, read back by policy_from_bytes, so
        # unpickling one builds what load_policy admits, checked alike (the Flax module's fields, jnp.tanh say, are
        # named, which pickle cannot do). The modules of the user's own that the file names (a policy class, an
        # activation of theirs) are allowed there: pickle itself imports a class's module by name, so this admits
        # nothing pickle would not. A policy no file can name (a class of a notebook's own), or one whose module
        # could not be rebuilt from its file here, pickles its module as pickle does. The env an object gave is not
        # kept: evaluate rebuilds it from env_name, as after load_policy
        try:
            data, description = _policy_file(self)
            own = describe.own_modules(description)
            build_policy(description, "<pickled TrainedPolicy>", own, checkpoint=False)  # what unpickling builds
        except (describe.DescriptionError, ValueError):
            return (TrainedPolicy, (self.policy, self.flat_params, self.obs_shape, self.action_map, self.obs_stats,
                                    self.env_name, self.max_steps))
        return (_unpickled_policy, (data, self.action_map.raw_unless_bounded, own))

    def __deepcopy__(self, memo: dict) -> "TrainedPolicy":
        rebuild, args = self.__reduce__()
        copied = rebuild(*copy.deepcopy(args, memo))
        copied._spec = self._spec  # shared: the env (a simulator object, a brax system) is not data to copy
        memo[id(self)] = copied
        return copied

    def __copy__(self) -> "TrainedPolicy":
        # shallow: the same module, arrays and env, nothing rebuilt (no file read back, none of its warnings)
        copied = object.__new__(type(self))
        copied.__dict__.update(self.__dict__)
        copied._evaluators = dict(self._evaluators)
        return copied

    def __repr__(self) -> str:
        norm = "normalised obs" if self.obs_stats is not None else "raw obs"
        return (f"TrainedPolicy({type(self.policy).__name__}, {self.flat_params.size} params, {self.env_name}, "
                f"{'discrete' if self.action_map.discrete else 'continuous'} actions, {norm})")


def _unpickled_policy(data: bytes, raw_unless_bounded: bool = False, allow_modules: Any = ()) -> TrainedPolicy:
    """A pickled :class:`TrainedPolicy`: its policy file's bytes read back (and a format-1 file's action mapping), the
    user's own modules it names allowed. Quietly: what a loaded file would warn of (parameters that are not finite)
    was so in the policy pickled, which said nothing."""
    trained = policy_from_bytes(data, "<pickled TrainedPolicy>", allow_modules=allow_modules, warn=False)
    if raw_unless_bounded:  # read from a format-1 file, whose mapping a file of today's format cannot say
        trained.action_map = dataclasses.replace(trained.action_map, raw_unless_bounded=True)
    return trained


def _has_shape(obs: Any, shape: tuple[int, ...]) -> bool:
    """Whether ``obs`` is a numeric array (or nested list or tuple) of ``shape``."""
    if isinstance(obs, dict):
        return False
    try:
        array = np.asarray(obs)
    except Exception:  # noqa: BLE001 - ragged, or not array-like at all
        return False
    return array.dtype.kind in "biuf" and tuple(array.shape) == tuple(shape)


def _contains(space: Any, obs: Any) -> bool:
    """``space.contains(obs)``, False where the space cannot even compare it."""
    try:
        return bool(space.contains(obs))
    except Exception:  # noqa: BLE001 - gymnasium's spaces raise on some foreign values
        return False


def _evaluate(fns: PolicyFns, spec: EnvSpec, action_map: ActionMap) -> Callable:
    """A jitted ``(variables, key or int32 seed, E) -> returns[E]``: the rollout training's centre evaluation runs.

    The episode keys are derived inside the program (integer ops only, so the same bits as eager ``jax.random``),
    which spares a fresh process the handful of small eager compiles that deriving them on the host cost.

    The normaliser and the action mapping are the ones :meth:`TrainedPolicy.apply` uses, so ``act``,
    ``policy_fn`` and ``evaluate`` share them; running the very program the centre evaluation runs
    makes the returns bit-identical to training's (a differently fused episode loop can differ in
    the last bits of continuous actions).
    """
    def run(variables, key, num_episodes):
        if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            key = jax.random.key(key)
        keys = noise.centre_episode_keys(key, num_episodes)[None]
        params = jax.tree.map(lambda x: x[None], variables["params"])
        out = run_episodes(fns, spec, params, keys, jnp.ones((1,), bool), obs_scale=_obs_scale(variables["obs_stats"]),
                           action_fn=action_map)
        return out.returns[0]

    return jax.jit(run, static_argnums=2, compiler_options=compiler_options())


def _host_evaluate(fns: PolicyFns, spec: EnvSpec, action_map: ActionMap) -> Callable:
    """:func:`_evaluate` for a host env: ``(variables, key, E) -> returns[E]`` over host episodes seeded as training's
    centre evaluation, through the same normaliser and policy step programs (:class:`jes.host_rollout.CentreEvaluator`,
    as :class:`jes.host_step.HostGeneration` runs it), one jitted policy step per env step."""
    pool = host_rollout.HostEnvPool(spec.env)
    seeds_of = jax.jit(lambda key, n: host_rollout.episode_seeds(noise.centre_episode_keys(key, n)), static_argnums=1)
    centre = host_rollout.CentreEvaluator(fns.apply, spec, compiler_options(), action_map)

    def run(variables, key, num_episodes):
        params = jax.tree.map(lambda x: jnp.broadcast_to(x, (num_episodes,) + x.shape), variables["params"])
        returns, _ = centre(pool, params, variables["obs_stats"], fns.initial_carry(),
                            np.asarray(seeds_of(key, num_episodes)), lambda slot: f"evaluation episode {slot}")
        return returns

    # The instances are kept for the next evaluation, and closed with the policy that holds this (a notebook's
    # results kept every evaluation's open: MuJoCo renderers, an env's own threads)
    weakref.finalize(run, pool.close)
    return run


def _obs_scale(obs_stats: Any) -> tuple[jax.Array, jax.Array] | None:
    """``(mean, 1 / std)`` from running statistics ``(count, sum, sum of squares)``, as training's rollout has them."""
    return None if obs_stats is None else obs_normaliser(*obs_stats)


# ------------------------------------------------------------------ file format
def save_policy(trained: TrainedPolicy, path: str) -> str:
    """Write ``trained`` to ``path``: a header (magic, length, sha256) and msgpack, atomically.

    Returns:
        ``path``.

    Raises:
        DescriptionError: the policy cannot be rebuilt by name from a file (its class defined in ``__main__`` or a
            notebook, a lambda or closure in a field); nothing is written.
        OSError: ``path`` cannot be written (the message names it and why: its folder is a file, ...).
    """
    data = policy_bytes(trained)

    # A file to carry anywhere: the permissions a plain open gives (mkstemp's 0600 kept it from the folder's other
    # readers), and an error naming path, not the temporary file beside it
    write_atomically(path, lambda f: f.write(data))
    return path


def policy_bytes(trained: TrainedPolicy) -> bytes:
    """The bytes of ``trained``'s policy file (:func:`save_policy` writes them; :func:`policy_from_bytes` reads them).

    Raises:
        DescriptionError: the policy cannot be rebuilt by name (see :func:`save_policy`).
    """
    return _policy_file(trained)[0]


def _policy_file(trained: TrainedPolicy) -> tuple[bytes, dict]:
    """:func:`policy_bytes` and the description of the policy module they hold."""
    try:  # strict, unlike a checkpoint's description: a file whose policy no program can rebuild is of no use
        description = describe.describe_object(trained.policy, "policy")
    except describe.DescriptionError as err:
        raise describe.DescriptionError(f"cannot save this policy to a file: {err} (a .policy file names its class and "
                                        f"fields for the program that loads it)") from err
    meta = {
        "format": "jes-policy", "version": 2,
        "policy": description, "env_name": trained.env_name,
        "obs_shape": list(trained.obs_shape), "max_steps": trained.max_steps,
        "action": {k: v for k, v in dataclasses.asdict(trained.action_map).items()
                   if k != "raw_unless_bounded" and (k not in ("start", "integer") or v)},
    }
    if trained.action_map.start or trained.action_map.integer:  # read right only by a jes that applies them
        meta["version"] = ENV_ACTION_FORMAT_VERSION
    content = {"meta": json.dumps(meta), "params": trained.flat_params}
    if trained.obs_stats is not None:
        content["obs_count"], content["obs_sum"], content["obs_sumsq"] = trained.obs_stats
    payload = serialization.msgpack_serialize(content)
    return _HEADER.pack(POLICY_MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload, description


_BOUND = (None, [schema.NUMBER])
_INTEGER_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
POLICY_CONTENT_SCHEMA = {"meta": str, "params": schema.Array("f", 1), "obs_count?": schema.Array("fiu", 0),
                         "obs_sum?": schema.Array("f"), "obs_sumsq?": schema.Array("f")}
POLICY_META_SCHEMA = {
    "version": schema.non_negative_int(), "policy": schema.OBJECT, "env_name": str, "obs_shape": schema.shape(),
    "max_steps": (None, schema.Check(schema.INT, lambda v: 0 < v < schema.MAX_DIM, "a positive int")),
    "action": {"discrete": bool, "num_outputs": schema.Check(schema.INT, lambda v: 0 < v < schema.MAX_DIM, "a positive int"),
               "action_shape": schema.shape(), "low": _BOUND, "high": _BOUND, "start?": schema.INT,
               "integer?": schema.Check(str, lambda v: v in _INTEGER_DTYPES, "an integer dtype name")},
}


def load_policy(path: str, env: Any = None, allow_modules: Any = ()) -> TrainedPolicy:
    """Read a policy written by ``TrainResult.save_policy`` / :func:`save_policy`.

    Loading a file is as safe as loading a ``.npz``: the file names only registered classes and
    functions (:mod:`jes.describe`), and every field is validated before it is used.

    Args:
        path: the file.
        env: the env to evaluate on when it is not a gymnax id (an env object or ``(env, params)``). For a file of a
            brax env instance, the instance again: one of another ``sys`` (physics) is warned about.
        allow_modules: modules of your own the policy may come from (e.g. ``["mypkg.policies"]``);
            a policy class whose module your program imported already is admitted without it.

    Raises:
        FileNotFoundError: no file at ``path`` (or a directory).
        PolicyFileError: not a jes policy file, truncated, corrupt, malformed (naming the field),
            naming code outside the registry, or from a newer jes; a count of observations that is not positive
            and finite, or an env name setting a parameter to NaN.

    Warns:
        UserWarning: parameters or sums of observations that are not finite (a diverged run's file loads, for a
            look at it); a brax env instance given whose ``sys`` (physics) differs from the one the file's policy was
            trained on (another fingerprint: other physics, or the same built by another brax or MuJoCo version, or
            edited with 64-bit JAX switched), or given for a file written before jes recorded an instance's physics
            (it cannot be checked); the registered env of the class (brax's default physics) given for a file of
            an instance of it.
    """
    data = schema.read_file(path, "policy file", ".policy")
    return policy_from_bytes(data, path, env, allow_modules, warn_at=3)


def policy_from_bytes(data: bytes, path: str = "<policy bytes>", env: Any = None, allow_modules: Any = (),
                      warn_at: int = 2, warn: bool = True) -> TrainedPolicy:
    """The :class:`TrainedPolicy` of a policy file's bytes (:func:`load_policy` of ``data``, checked alike; ``path``
    names them in errors and warnings; ``warn=False``: what is only warned of is not)."""
    if len(data) < _HEADER.size:
        raise PolicyFileError(f"{path} is truncated ({len(data)} bytes): not a complete jes policy file")
    magic, length, digest = _HEADER.unpack_from(data)
    if magic != POLICY_MAGIC:
        hint = " (it is a training checkpoint: use jes.checkpoint.load)" if magic.startswith(b"JESCKPT") else ""
        raise PolicyFileError(f"{path} is not a jes policy file{hint}")
    payload = data[_HEADER.size:]
    if len(payload) != length or hashlib.sha256(payload).digest() != digest:
        raise PolicyFileError(f"{path} is truncated or corrupt (length or sha256 checksum does not match)")
    try:
        content, meta = schema.decode(payload, POLICY_CONTENT_SCHEMA, POLICY_META_SCHEMA, f"policy file {path}")
    except schema.SchemaError as err:
        raise PolicyFileError(str(err)) from err
    if meta["version"] > POLICY_FORMAT_VERSION:
        raise PolicyFileError(f"{path} has policy format version {meta['version']}; this jes reads up to "
                              f"{POLICY_FORMAT_VERSION}; upgrade jes")
    if nan_option(meta["env_name"]) is not None:
        raise PolicyFileError(f"policy file {path} is malformed: its env name {meta['env_name']!r} sets "
                              f"{nan_option(meta['env_name'])}: an env parameter cannot be NaN (not a number)")
    try:
        policy = build_policy(meta["policy"], path, allow_modules, checkpoint=False)
    except ValueError as err:  # CheckpointError: the description names code outside the registry, or is malformed
        raise PolicyFileError(str(err)) from err
    action = meta["action"]
    spec = None
    if env is not None:
        spec = env if isinstance(env, EnvSpec) else make_env(env, max_steps=meta["max_steps"])
        notice = (brax_envs.instance_warning(meta["env_name"], spec.name, f"policy file {path}", resuming=False)
                  or gymnax_envs.instance_warning(meta["env_name"], spec.name, f"policy file {path}", resuming=False)
                  or brax_envs.registered_instead_warning(meta["env_name"], spec.name, f"policy file {path}"))
        if notice is not None and warn:   # another sys, or one that cannot be checked: said, not refused
            warnings.warn(notice, stacklevel=warn_at)
    obs_stats = None
    if "obs_sum" in content:
        if "obs_count" not in content or "obs_sumsq" not in content:
            raise PolicyFileError(f"policy file {path} is malformed: obs_sum without obs_count and obs_sumsq")
        obs_stats = (content["obs_count"], content["obs_sum"], content["obs_sumsq"])
        problem = schema.obs_stats_problem(("obs_count", content["obs_count"]))
        if problem is not None:
            raise PolicyFileError(f"policy file {path} holds observation statistics no normaliser can use: {problem}")
        warning = schema.obs_sums_warning(*((name, content[name]) for name in ("obs_sum", "obs_sumsq")))
        if warning is not None and warn:
            warnings.warn(f"policy file {path}: {warning}", stacklevel=warn_at)

    start, integer = int(action.get("start", 0)), action.get("integer", "")
    finish = getattr(getattr(spec, "env", None), "action_finish", None)
    if meta["version"] < ENV_ACTION_FORMAT_VERSION and callable(finish) and spec.discrete == action["discrete"]:
        start, integer = finish()  # a file from before jes recorded them: what the given env adds, as training did
    try:
        action_map = ActionMap(discrete=action["discrete"], num_outputs=action["num_outputs"],
                               action_shape=tuple(action["action_shape"]),
                               low=None if action["low"] is None else tuple(float(v) for v in action["low"]),
                               high=None if action["high"] is None else tuple(float(v) for v in action["high"]),
                               raw_unless_bounded=meta["version"] < 2, start=int(start), integer=str(integer))
        trained = TrainedPolicy(policy, content["params"], tuple(meta["obs_shape"]), action_map, obs_stats=obs_stats,
                                env_name=meta["env_name"], max_steps=meta["max_steps"], env=spec)
    except Exception as err:  # noqa: BLE001 - fields that are well-typed but do not fit together
        raise PolicyFileError(f"policy file {path} does not describe a usable policy: {type(err).__name__}: {err}") from err
    bad = schema.non_finite(trained.flat_params)
    if bad and warn:  # a diverged run's parameters are still data to look at: said, not refused
        warnings.warn(f"policy file {path}: {bad} of {trained.flat_params.size} parameters are not finite (NaN or "
                      f"infinite); its outputs, actions and returns may be NaN", stacklevel=warn_at)
    return trained
