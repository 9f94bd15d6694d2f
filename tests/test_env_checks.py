"""jes.env_checks: an env class or a Gym/Gymnasium env gets an error saying what is supported and how to adapt."""
import gymnax
import pytest

import jes
from jes.envs import make_env
from envs_for_tests import Countdown


class FakeGymnasiumEnv:
    """Looks like gymnasium.Env from the outside (module, reset/step, an action_space attribute)."""

    __module__ = "gymnasium.envs.classic_control.cartpole"
    action_space = object()

    def reset(self, seed=None):
        return None, {}

    def step(self, action):
        return None, 0.0, False, False, {}


def test_env_class_instead_of_instance():
    with pytest.raises(TypeError, match=r"class .*CartPole.* pass CartPole\(\) instead"):
        make_env(gymnax.environments.CartPole)
    with pytest.raises(TypeError, match=r"Countdown\(\)"):
        make_env((Countdown, None))

    class Plain:  # neither kind of env: "pass an instance of Plain" was advised, and the instance then refused
        pass

    with pytest.raises(TypeError, match=r"Plain, which is neither a JAX env .* nor a gymnasium.Env subclass"):
        make_env(Plain)

    def factory():
        return None

    with pytest.raises(TypeError, match=r"the function .*factory.*jes.envs.gymnasium.make\(factory\)"):
        make_env(factory)


def test_gymnasium_env_says_to_use_a_jax_env():
    with pytest.raises(TypeError, match=r"Gym/Gymnasium environment.*gymnax env id.*AskTell"):
        make_env(FakeGymnasiumEnv())


def test_supported_envs_pass():
    assert make_env(Countdown()).num_outputs >= 1
    env, params = gymnax.make("CartPole-v1")
    assert make_env((env, params)).discrete


def test_real_gymnasium_env():
    gymnasium = pytest.importorskip("gymnasium")
    spec = make_env(gymnasium.make("CartPole-v1"))  # a host env now (jes.envs.gymnasium)
    assert spec.host and spec.discrete and spec.obs_shape == (4,)
