"""Tiny gymnax-protocol environments used by the tests (real envs are used wherever behaviour allows)."""

import flax.linen as nn
import jax.numpy as jnp
from flax import struct
from gymnax.environments import environment, spaces


@struct.dataclass
class CountdownState(environment.EnvState):
    time: int


@struct.dataclass
class CountdownParams(environment.EnvParams):
    episode_length: int = 5
    reward_after_done: float = 1000.0
    nan_reward: bool = False
    max_steps_in_episode: int = 20


class Countdown(environment.Environment):
    """Reward 1 per step for ``episode_length`` steps, then terminated.

    If an implementation kept stepping a finished episode and counted its
    rewards, it would collect ``reward_after_done`` per extra step.
    With ``nan_reward`` the reward is NaN whenever the policy picks action 1.
    """

    @property
    def default_params(self):
        return CountdownParams()

    def step_env(self, key, state, action, params):
        time = state.time + 1
        finished_before = state.time >= params.episode_length
        reward = jnp.where(finished_before, params.reward_after_done, 1.0)
        reward = jnp.where(params.nan_reward & (action == 1), jnp.nan, reward)
        new_state = CountdownState(time=time)
        done = time >= params.episode_length
        return self.get_obs(new_state), new_state, reward, done, {}

    def reset_env(self, key, params):
        state = CountdownState(time=0)
        return self.get_obs(state), state

    def get_obs(self, state, params=None, key=None):
        return jnp.array([state.time / 10.0, 1.0], jnp.float32)

    def action_space(self, params=None):
        return spaces.Discrete(2)

    def observation_space(self, params):
        return spaces.Box(0.0, 10.0, (2,), jnp.float32)

    @property
    def name(self):
        return "Countdown"


class ScaledCountdown(Countdown):
    """Countdown whose rewards are multiplied by ``scale``, a constructor argument (not a dataclass field): workers,
    which build an env object's class without arguments, would step another env for another scale."""

    def __init__(self, scale=1.0):
        super().__init__()
        self.scale = scale

    def step_env(self, key, state, action, params):
        obs, state, reward, done, info = super().step_env(key, state, action, params)
        return obs, state, self.scale * reward, done, info


def make_countdown() -> Countdown:
    """A function, not a class (tests that a description naming it as a class is refused)."""
    return Countdown()


class UsersPolicy(nn.Module):
    """A policy class of a user's own module (not jes's registry): local workers must be allowed to build it."""

    hidden: int = 8
    num_outputs: int | None = None

    @nn.compact
    def __call__(self, obs):
        return nn.Dense(self.num_outputs)(nn.tanh(nn.Dense(self.hidden)(obs)))


def interrupt_second_batch(monkeypatch) -> None:
    """Make a sweep's second batch of configurations raise KeyboardInterrupt (Ctrl-C while it runs)."""
    from jes import sweep as jes_sweep

    real, calls = jes_sweep.run_batch, []

    def interrupted_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(jes_sweep, "run_batch", interrupted_second)
