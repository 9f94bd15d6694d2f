"""jes.envs.brax: the brax adapter on its cheapest env and backend (inverted_pendulum, spring), small shapes."""
import dataclasses
import functools
import json
import os
import re
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

brax_envs = pytest.importorskip("brax.envs")

import jes  # noqa: E402
from jes.envs import make_env  # noqa: E402
from jes.policies import PolicyFns  # noqa: E402
from jes.rollout import run_episodes  # noqa: E402

ENV = "brax/inverted_pendulum"


@pytest.fixture(scope="module")
def spec():
    return make_env(ENV, max_steps=60)


def test_spec_shapes_bounds_and_name(spec):
    assert spec.name == "brax/inverted_pendulum?backend=spring"   # the backend is part of the name
    assert spec.obs_shape == (4,) and spec.num_outputs == 1 and not spec.discrete and spec.action_shape == (1,)
    np.testing.assert_array_equal(spec.action_low, [-1.0]) and np.testing.assert_array_equal(spec.action_high, [1.0])
    assert spec.max_steps == 60 and make_env(ENV).max_steps == 1000   # brax's EpisodeWrapper default
    assert make_env(spec.name).name == spec.name                   # the name resolves back
    other = make_env("brax/inverted_pendulum?backend=generalized")
    assert other.name == "brax/inverted_pendulum?backend=generalized"
    for value in (-1e6, 0.2, 1e6):
        assert -1.0 <= float(spec.action(jnp.array([value]))[0]) <= 1.0


@pytest.mark.parametrize("name,ctrl", [("inverted_pendulum", 3.0), ("hopper", 1.0)])
def test_a_saturated_policy_output_reaches_the_actuators_range_once(name, ctrl):
    """brax's envs take actions in [-1, 1]; inverted_pendulum (ctrl_range +-3) scales them itself, hopper (+-1) passes
    them on. jes squashed into ctrl_range before, so inverted_pendulum's step scaled +-3 to +-9."""
    spec = make_env(f"brax/{name}", max_steps=5)
    env = spec.env.env
    given = []
    step = env.pipeline_step
    env.pipeline_step = lambda state, action: (given.append(np.asarray(action)), step(state, action))[1]
    try:
        _, state = spec.env.reset_env(jax.random.key(0), spec.params)
        for value in (1e6, -1e6):
            spec.env.step_env(jax.random.key(1), state, spec.action(jnp.full(spec.action_shape, value)), spec.params)
    finally:
        env.pipeline_step = step
    np.testing.assert_allclose(given[0], ctrl, rtol=1e-6)
    np.testing.assert_allclose(given[1], -ctrl, rtol=1e-6)


def test_a_format_7_checkpoint_of_an_env_whose_actions_jes_scaled_twice_warns(tmp_path):
    from jes import checkpoint
    from test_checkpoint import _rewrite_meta

    cfg = jes.ESConfig(num_members=4, num_generations=1, max_episode_steps=10, eval_episodes=1)
    for name, warns in (("brax/inverted_pendulum", True), ("brax/hopper", False)):
        trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(2,)), name, "adam", cfg)
        path = str(tmp_path / f"{name[5:]}.ckpt")
        checkpoint.save(path, trainer, trainer.init_state(0))
        old = _rewrite_meta(path, str(tmp_path / f"{name[5:]}-7.ckpt"), lambda meta: meta.update(version=7))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            checkpoint.read(old).restore_state(trainer)
            checkpoint.read(path).restore_state(trainer)
        said = [str(w.message) for w in caught if "ctrl_range" in str(w.message)]
        assert len(said) == int(warns), said
        assert not warns or ("[-1, 1]" in said[0] and "-7.ckpt" in said[0])


def test_brax_env_object_is_accepted_and_named_with_its_backend():
    raw = brax_envs.get_environment("inverted_pendulum", backend="spring")
    assert make_env(raw).name == "brax/inverted_pendulum?backend=spring"
    with pytest.raises(TypeError, match="get_environment"):
        make_env(brax_envs.create("inverted_pendulum", backend="spring"))


def test_brax_names_are_registered():
    names = jes.registered_env_names()
    assert "CartPole-v1" in names and "brax/inverted_pendulum" in names and "brax/hopper" in names
    assert not any(name.startswith("brax/") for name in jes.registered_env_names(include_brax=False))


def test_bad_brax_names_are_explained():
    with pytest.raises(ValueError, match="brax/hopper"):
        make_env("brax/hoper")
    with pytest.raises(ValueError, match="backend"):
        make_env("brax/inverted_pendulum?backend=warp_drive")
    with pytest.raises(ValueError, match="key=value"):
        make_env("brax/inverted_pendulum?spring")


def test_reset_randomness_comes_from_episode_keys(spec):
    reset = jax.jit(jax.vmap(lambda k: spec.env.reset_env(k, spec.params)[0]))
    keys = jax.random.split(jax.random.key(3), 4)
    first, again = np.asarray(reset(keys)), np.asarray(reset(keys))
    np.testing.assert_array_equal(first, again)                    # same keys, same starts
    assert len({tuple(row) for row in first}) == 4                 # different keys, different starts


@pytest.fixture(scope="module")
def pushing_rollout(spec):
    """A constant full push topples the pole within the limit; returns, steps and the episode keys used."""
    fns = PolicyFns(jes.MLPPolicy(hidden_sizes=(2,), num_outputs=1), spec.obs_shape)
    params = jax.vmap(fns.init)(jax.random.split(jax.random.key(0), 2))
    params = jax.tree.map(jnp.zeros_like, params)
    params["params"]["head"]["bias"] = jnp.full((2, 1), 5.0)       # tanh(5) ~ 1: push at +3 every step
    keys = jax.random.split(jax.random.key(7), 6).reshape(2, 3)
    out = jax.jit(lambda p, k: run_episodes(fns, spec, p, k, jnp.array([True, False])))(params, keys)
    return out, keys


def test_rewards_after_done_never_count(spec, pushing_rollout):
    out, keys = pushing_rollout
    steps = np.asarray(out.steps[0])
    assert np.all(steps > 0) and np.all(steps < spec.max_steps)    # every episode terminated early
    # The raw env keeps simulating (and rewarding) after done: replay it unmasked and compare.
    raw = spec.env.env
    step = jax.jit(raw.step)
    for episode in range(3):
        state = jax.jit(raw.reset)(jax.random.fold_in(keys[0, episode], 0))
        rewards, dones = [], []
        for _ in range(spec.max_steps):
            state = step(state, jnp.array([3.0 * float(jnp.tanh(5.0))]))
            rewards.append(float(state.reward))
            dones.append(float(state.done))
        first_done = dones.index(1.0)
        assert steps[episode] == first_done + 1
        assert float(out.returns[0, episode]) == pytest.approx(sum(rewards[:first_done + 1]))
        assert sum(rewards) > float(out.returns[0, episode])     # what multiplying nothing out would have counted
    np.testing.assert_array_equal(out.returns[1], 0.0)            # padding member never steps


SCRIPT = textwrap.dedent("""
    import json
    import jax, numpy as np
    import jes
    from jes import checkpoint
    from jes.loop import run
    jes.enable_compilation_cache()   # the session's cache (tests/conftest.py)
    assert len(jax.devices()) == 2, jax.devices()
    cfg = jes.ESConfig(num_members=8, chunk_size=4, num_generations=3, max_episode_steps=40, eval_episodes=4,
                       noise_std=0.05, learning_rate=0.05)
    policy = jes.MLPPolicy(hidden_sizes=(8,))
    trainers = {d: jes.Trainer(policy, "brax/inverted_pendulum", "adam", cfg, devices=d) for d in (1, 2)}
    runs = {d: run(t, t.init_state(3), key=3) for d, t in trainers.items()}
    out = {d: {"params": r.flat_params.tolist(), "pop_mean": r.history["pop_mean"].tolist(),
               "centre": r.history["centre_return"].tolist(), "steps": r.history["env_steps"].tolist()}
           for d, r in runs.items()}
    # Interrupt after 2 of 3 generations, resume from the checkpoint file.
    t = trainers[1]
    run(t, t.init_state(3), key=3, num_generations=2, checkpoint_path="brax.ckpt")
    ckpt = checkpoint.read("brax.ckpt")
    resumed = run(t, ckpt.restore_state(t), key=ckpt.key, history=ckpt.history)
    out["resumed"] = {"params": resumed.flat_params.tolist(), "pop_mean": resumed.history["pop_mean"].tolist()}
    out["ckpt_env"] = ckpt.env_name
    out["rebuilt_env"] = checkpoint.load("brax.ckpt")[0].spec.name   # the trainer rebuilt from the file alone
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_brax_training_is_bit_identical_on_two_devices_and_after_resume(tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    try:
        proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600,
                              cwd=tmp_path)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"brax training subprocess did not finish in {err.timeout} s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    one, two = out["1"], out["2"]
    assert all(np.isfinite(one["params"])) and all(s > 0 for s in one["steps"])
    assert one == two                                               # exact, element by element
    assert out["resumed"] == {"params": one["params"], "pop_mean": one["pop_mean"]}
    assert out["ckpt_env"] == out["rebuilt_env"] == "brax/inverted_pendulum?backend=spring"


def test_run_descriptions_carry_the_backend():
    """Workers rebuild a brax env by its name (with the backend), also when the master got an env object."""
    from jes.distributed import protocol

    config = jes.ESConfig(num_members=4, max_episode_steps=20)
    raw = brax_envs.get_environment("inverted_pendulum", backend="spring")
    for env in ("brax/inverted_pendulum", raw, jes.envs.mask_observations(raw, keep=[0, 1])):
        trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(2,)), env, "adam", config)
        description = protocol.describe_run(trainer, env, "adam")
        rebuilt = protocol.build_run(description)
        assert isinstance(description["env"], str) and rebuilt.spec.name == trainer.spec.name
        assert "backend=spring" in rebuilt.spec.name and rebuilt.spec.obs_shape == trainer.spec.obs_shape


def test_the_solved_threshold_counts_only_for_the_registered_env_at_brax_s_own_limit(spec):
    """Gym's 950 of 1000 is a threshold for 1000 steps of the env as registered: 0.95 x 60 steps was an easier task,
    and an env stepping its physics once a step (n_frames=1) is another one."""
    assert spec.solved_return is None and make_env(ENV, max_steps=999).solved_return is None
    assert make_env(ENV).solved_return == pytest.approx(950.0)
    assert make_env(ENV + "?backend=generalized").solved_return == pytest.approx(950.0)   # the task, other physics
    assert make_env(ENV + "?n_frames=1").solved_return is None
    assert jes.envs.mask_observations(ENV, keep=[0, 1]).solved_return(1000) == pytest.approx(950.0)


def test_an_env_object_is_named_by_its_constructor_arguments_and_its_name_rebuilds_it():
    """brax envs keep their arguments as attributes (n_frames as _n_frames): the name carries those that differ, so
    jes eval, load_policy, resumes and workers rebuild the same physics, not the defaults."""
    raw = brax_envs.get_environment("inverted_pendulum", backend="spring", n_frames=1)
    name = make_env(raw).name
    assert name == "brax/inverted_pendulum?backend=spring&n_frames=1"
    rebuilt = make_env(name).env.env
    assert rebuilt._n_frames == 1 and float(rebuilt.dt) == pytest.approx(float(raw.dt))
    assert make_env(name).name == name
    hopper = brax_envs.get_environment("hopper", backend="spring", terminate_when_unhealthy=False, ctrl_cost_weight=1)
    assert make_env(hopper).name == "brax/hopper?backend=spring&ctrl_cost_weight=1.0&terminate_when_unhealthy=false"
    # One env, one name, however it was spelt: a default value is left out
    assert make_env(ENV + "?n_frames=4").name == make_env(brax_envs.get_environment(
        "inverted_pendulum", backend="spring")).name == "brax/inverted_pendulum?backend=spring"


def test_an_env_object_no_name_rebuilds_is_named_an_instance_and_rebuilding_it_is_refused():
    changed = brax_envs.get_environment("inverted_pendulum", backend="spring")
    changed.sys = changed.sys.tree_replace({"opt.timestep": 0.01})   # a changed sys
    late = brax_envs.get_environment("inverted_pendulum", backend="spring")
    late.extra_push = 2.0                                            # an attribute set after construction
    held = brax_envs.get_environment("hopper", backend="spring", healthy_z_range=(0.5, 3.0))   # not writable in a name

    class Pendulum(type(late)):                                      # a class of one's own
        pass

    for env in (changed, late, held, Pendulum(backend="spring")):
        name = make_env(env).name
        assert " (a brax env instance) physics:" in name, name
        assert make_env(env).solved_return is None
        for asked in (name, name + "?keep_obs=0,1"):
            with pytest.raises(ValueError, match="pass that env itself again"):
                make_env(asked)


def test_resumes_and_workers_rebuild_an_env_object_s_physics_or_refuse(tmp_path):
    from jes import checkpoint
    from jes.distributed import protocol
    from jes.describe import DescriptionError

    cfg = jes.ESConfig(num_members=4, num_generations=1, max_episode_steps=10, eval_episodes=1)
    policy = jes.MLPPolicy(hidden_sizes=(2,))
    one_frame = brax_envs.get_environment("inverted_pendulum", backend="spring", n_frames=1)
    trainer = jes.Trainer(policy, one_frame, "adam", cfg)
    path = str(tmp_path / "one_frame.ckpt")
    checkpoint.save(path, trainer, trainer.init_state(0))
    assert checkpoint.load(path)[0].spec.env.env._n_frames == 1      # jes eval / load rebuild its physics
    default = jes.Trainer(policy, "brax/inverted_pendulum", "adam", cfg)
    with pytest.raises(checkpoint.CheckpointError, match="n_frames=1"):
        checkpoint.read(path).check_compatible(default)             # a resume on other physics is refused
    rebuilt = protocol.build_run(protocol.describe_run(trainer, one_frame, "adam"))
    assert rebuilt.spec.name == trainer.spec.name and rebuilt.spec.env.env._n_frames == 1
    changed = brax_envs.get_environment("inverted_pendulum", backend="spring")
    changed.sys = changed.sys.tree_replace({"opt.timestep": 0.01})
    with pytest.raises(DescriptionError, match="no name rebuilds"):
        protocol.describe_run(jes.Trainer(policy, changed, "adam", cfg), changed, "adam")


def _changed_timestep(factor: float):
    env = brax_envs.get_environment("inverted_pendulum", backend="spring")
    env.sys = env.sys.tree_replace({"opt.timestep": env.sys.opt.timestep * factor})
    return env


FINGERPRINT_SCRIPT = textwrap.dedent("""
    import jax
    import brax.envs
    import jes
    env = brax.envs.get_environment("inverted_pendulum", backend="spring")
    env.sys = jax.device_put(env.sys.tree_replace({"opt.timestep": env.sys.opt.timestep * 2}), jax.devices()[1])
    assert jax.config.jax_enable_x64 and env.sys.link.inertia.mass.dtype == "float64"
    print(jes.make_env(env).name)
""")


def test_an_instance_s_name_holds_a_fingerprint_of_its_sys_the_same_in_every_process():
    """A brax System is data: an instance's name ends with a numbered fingerprint of its sys (and of nothing else),
    the same for the same System in another process, with 64-bit JAX (an exact edit) and with the sys on another
    device; another System, another."""
    name = make_env(_changed_timestep(2)).name
    assert re.fullmatch(r"brax/inverted_pendulum\?backend=spring \(a brax env instance\) physics:1:[0-9a-f]{12}",
                        name), name
    assert make_env(_changed_timestep(2)).name == name                      # built again: the same
    assert make_env(_changed_timestep(5)).name != name                      # another timestep: another
    late = brax_envs.get_environment("inverted_pendulum", backend="spring")
    late.extra_push = 2.0
    later = brax_envs.get_environment("inverted_pendulum", backend="spring")
    later.extra_push = 3.0
    assert " (a brax env instance) physics:1:" in make_env(late).name       # an instance still
    assert make_env(late).name == make_env(later).name                      # an attribute: not the physics' sys
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu",
               JAX_ENABLE_X64="1")
    proc = subprocess.run([sys.executable, "-c", FINGERPRINT_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == name


def test_a_resume_or_policy_load_on_an_instance_of_another_sys_warns(tmp_path):
    """A run on a brax env instance resumed, or its policy file loaded, on an instance of another sys: said (naming
    both fingerprints), not refused, as a brax or MuJoCo upgrade changes the fingerprint too; a file written before
    names held one, or with one of another scheme, warns that it cannot check."""
    from jes import checkpoint
    from jes.loop import trained_policy
    from test_checkpoint import _rewrite_meta

    cfg = jes.ESConfig(num_members=4, num_generations=1, max_episode_steps=10, eval_episodes=1)
    policy = jes.MLPPolicy(hidden_sizes=(2,))
    trainer = jes.Trainer(policy, _changed_timestep(2), "adam", cfg)
    state = trainer.init_state(0)
    path = str(tmp_path / "instance.ckpt")
    checkpoint.save(path, trainer, state)
    other = jes.Trainer(policy, _changed_timestep(5), "adam", cfg)
    mine, theirs = other.spec.name.rpartition(":")[2], trainer.spec.name.rpartition(":")[2]
    with pytest.warns(UserWarning, match=r"has other physics: its sys \(brax System\) differs from the one the file "
                                         r"ran") as caught:
        restored = checkpoint.read(path).restore_state(other)
    said = " ".join(str(w.message) for w in caught)
    for part in (trainer.spec.name, other.spec.name, f"fingerprint 1:{mine}, the file's 1:{theirs}",
                 "resuming continues on the physics given", "brax or MuJoCo upgrade", "64-bit JAX"):
        assert part in said, (part, said)
    np.testing.assert_array_equal(np.asarray(restored.params), np.asarray(state.params))
    again = jes.Trainer(policy, _changed_timestep(2), "adam", cfg)          # the same physics, built again
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checkpoint.read(path).restore_state(again)
    assert not [w for w in caught if "brax env instance" in str(w.message)], [str(w.message) for w in caught]

    policy_path = str(tmp_path / "instance.policy")
    trained = trained_policy(trainer, state.params, state)
    trained.save(policy_path)
    with pytest.warns(UserWarning, match="has other physics: its sys.*its policy is evaluated on the physics given"):
        loaded = jes.load_policy(policy_path, env=_changed_timestep(5))
    assert loaded.env_name == trainer.spec.name
    registered = trainer.spec.name.partition(" (a brax env instance)")[0]   # the class's registered env, by its name
    with pytest.warns(UserWarning, match=r"ran the brax env instance .* but the env given is the registered "
                                         rf"{re.escape(repr(registered))}, with brax's default physics"):
        jes.load_policy(policy_path, env=registered)
    # The same said by evaluate(env=) / render(env=) of a policy loaded without one (the env they step, unstepped)
    with pytest.warns(UserWarning, match=r"this policy ran the brax env instance .* but the env given is the "
                                         rf"registered {re.escape(repr(registered))}.*\(env=instance\)"):
        jes.load_policy(policy_path)._env_for(registered)
    with pytest.warns(UserWarning, match="this policy ran the brax env instance .* has other physics"):
        jes.load_policy(policy_path)._env_for(_changed_timestep(5))
    same, loaded = _changed_timestep(2), jes.load_policy(policy_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded._env_for(same)     # the physics it ran: nothing to say

    # Files written before an instance's name held its physics, or by another scheme: said, cannot check
    plain = trainer.spec.name.partition(" physics:")[0]
    assert plain.endswith(" (a brax env instance)")
    for label, written in (("old", plain), ("scheme2", plain + " physics:2:0123456789ab"),
                           ("unnumbered", plain + " physics:0123456789ab")):
        old = _rewrite_meta(path, str(tmp_path / f"{label}.ckpt"), lambda meta: meta.update(env_name=written))
        with pytest.warns(UserWarning, match="cannot check that the instance given now") as caught:
            checkpoint.read(old).restore_state(again)
        if label != "old":
            assert any("a fingerprint of another scheme" in str(w.message) for w in caught)
        trained.env_name = written
        old_policy = trained.save(str(tmp_path / f"{label}.policy"))
        with pytest.warns(UserWarning, match="cannot check that the instance given now.*evaluating on it as given"):
            jes.load_policy(old_policy, env=_changed_timestep(2))


class _CachingPendulum(brax_envs.inverted_pendulum.InvertedPendulum):
    """A class of one's own (always an instance) whose use changes its attributes: a cached property read by
    reset, and a count of traces (as brax's "fast" env keeps)."""

    @functools.cached_property
    def pole(self) -> int:
        return 1

    def reset(self, rng):
        self.traces = getattr(self, "traces", 0) + 1
        assert self.pole == 1
        return super().reset(rng)


def test_the_same_instance_resumes_and_loads_after_a_run_in_the_same_process(tmp_path):
    """The notebook workflow: train on an instance, then resume and load_policy(path, env=env) with that very object,
    which the run has used (its attributes changed): the fingerprint is of its sys only, so nothing is said."""
    env = _CachingPendulum(backend="spring")
    env.sys = env.sys.tree_replace({"opt.timestep": env.sys.opt.timestep * 2})
    name = make_env(env).name
    cfg = jes.ESConfig(num_members=4, num_generations=1, max_episode_steps=10, eval_episodes=1)
    policy = jes.MLPPolicy(hidden_sizes=(2,))
    path = str(tmp_path / "run.ckpt")
    first = jes.train(policy, env, "adam", config=cfg, progress=False, log_dir=None, checkpoint_path=path)
    policy_path = first.save_policy(str(tmp_path / "run.policy"))
    assert "pole" in vars(env) and env.traces > 0                          # the run used it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert make_env(env).name == name
        resumed = jes.train(policy, env, "adam", config=dataclasses.replace(cfg, num_generations=2), progress=False,
                            log_dir=None, checkpoint_path=path, resume=path)
        loaded = jes.load_policy(policy_path, env=env)
    assert not [w for w in caught if "brax env instance" in str(w.message)], [str(w.message) for w in caught]
    assert int(np.asarray(resumed.history["generation"])[-1]) == 2 and loaded.env_name == name


def test_brax_wrappers_are_refused_at_any_depth():
    from brax.envs.wrappers import training

    raw = brax_envs.get_environment("inverted_pendulum", backend="spring")

    class ScaleReward(brax_envs.Wrapper):
        def step(self, state, action):
            new = self.env.step(state, action)
            return new.replace(reward=new.reward * 10.0)

    class MyEpisodes(training.EpisodeWrapper):
        pass

    for wrapped in (training.EvalWrapper(training.wrap(raw, episode_length=100)), training.EvalWrapper(raw),
                    ScaleReward(raw), MyEpisodes(raw, 1000, 1)):
        with pytest.raises(TypeError, match="not a wrapped one") as caught:
            make_env(wrapped)
        assert "register_environment" in str(caught.value) and type(wrapped).__name__ in str(caught.value)


def test_bad_option_values_name_the_option_the_env_and_what_it_takes():
    with pytest.raises(ValueError, match=r"inverted_pendulum.*n_frames='abc' is not an int"):
        make_env(ENV + "?n_frames=abc")
    with pytest.raises(ValueError, match=r"debug='1' is not true or false"):
        make_env(ENV + "?debug=1")
    with pytest.raises(ValueError, match=r"takes no option 'bogus'.*backend, n_frames, debug"):
        make_env(ENV + "?bogus=3")
    with pytest.raises(ValueError, match="given twice"):
        make_env("brax/hopper?backend=spring&backend=generalized")


def test_an_example_value_is_the_env_s_own_default_on_its_backend():
    """inverted_pendulum steps 4 physics frames on spring, 2 on generalized: not PipelineEnv's 1."""
    for backend, frames in (("spring", 4), ("generalized", 2)):
        with pytest.raises(ValueError) as caught:
            make_env(f"{ENV}?backend={backend}&n_frames=abc")
        assert f"'brax/inverted_pendulum?backend={backend}&n_frames={frames}', inverted_pendulum's default" \
            in str(caught.value), caught.value


def test_n_frames_below_one_is_refused_by_name_and_as_an_object():
    """n_frames=0 or -1 never steps the physics: every member would score alike (the maximum, on inverted_pendulum)."""
    for frames in (0, -1):
        with pytest.raises(ValueError, match=rf"n_frames={frames} runs no physics step.*1 or more"):
            make_env(f"{ENV}?n_frames={frames}")
    with pytest.raises(ValueError, match="n_frames=0 runs no physics step"):
        make_env(brax_envs.get_environment("inverted_pendulum", backend="spring", n_frames=0))


def test_a_negative_infinite_or_nan_reset_noise_scale_is_refused():
    """brax draws uniform(-scale, scale): a negative scale clamps every draw to -scale (all episodes start alike),
    an infinite or NaN one draws NaN (an env object's NaN is said to be NaN; a name's is refused with any option)."""
    for scale in ("-0.1", "inf"):
        with pytest.raises(ValueError, match=rf"reset_noise_scale={scale} gives no reset noise.*"
                                             rf"'brax/hopper\?backend=spring&reset_noise_scale=0.005'"):
            make_env(f"brax/hopper?reset_noise_scale={scale}")
    with pytest.raises(ValueError, match="reset_noise_scale=-1 gives no reset noise"):
        make_env(brax_envs.get_environment("hopper", backend="spring", reset_noise_scale=-1))
    with pytest.raises(ValueError, match=r"reset_noise_scale=nan gives no reset noise \(NaN, not a number") as caught:
        make_env(brax_envs.get_environment("hopper", backend="spring", reset_noise_scale=float("nan")))
    assert "infinite" not in str(caught.value)
    assert make_env("brax/hopper?reset_noise_scale=0").name == "brax/hopper?backend=spring&reset_noise_scale=0.0"


def test_brax_s_own_option_names_are_answered_with_jes_s():
    for option in ("episode_length", "max_episode_steps"):
        with pytest.raises(ValueError, match=r"max_episode_steps=100\) or jes train --max-episode-steps 100"):
            make_env(f"{ENV}?{option}=100")
    with pytest.raises(ValueError, match=r"action_repeat.*n_frames.*'brax/inverted_pendulum\?backend=spring&n_frames=4'"):
        make_env(f"{ENV}?action_repeat=2")


def test_an_unsupported_backend_is_answered_with_the_env_s_own_backends():
    with pytest.raises(ValueError, match=r"'swimmer' does not support backend 'spring'.*supports generalized:") as caught:
        make_env("brax/swimmer?backend=spring")
    assert "positional" not in str(caught.value)


def test_a_format_7_checkpoint_naming_a_default_option_still_resumes(tmp_path):
    """Before format 8, brax names kept options as written ("...&n_frames=4", spring's default); today's name leaves
    them out, and the file's run (the same env) must still resume, by a trainer given either name or rebuilt from it."""
    from jes import checkpoint
    from test_checkpoint import _rewrite_meta

    cfg = jes.ESConfig(num_members=4, num_generations=1, max_episode_steps=10, eval_episodes=1)
    trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(2,)), "brax/inverted_pendulum", "adam", cfg)
    path = str(tmp_path / "today.ckpt")
    checkpoint.save(path, trainer, trainer.init_state(0))
    old = _rewrite_meta(path, str(tmp_path / "old.ckpt"), lambda meta: meta.update(
        version=7, env_name="brax/inverted_pendulum?backend=spring&n_frames=4"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the format-7 ctrl_range warning of this env
        assert checkpoint.read(old).names_env(trainer.spec.name)
        state = checkpoint.read(old).restore_state(trainer)
        rebuilt, _, _ = checkpoint.load(old)
    assert int(state.generation) == 0 and rebuilt.spec.name == trainer.spec.name
    other = _rewrite_meta(path, str(tmp_path / "other.ckpt"), lambda meta: meta.update(
        version=7, env_name="brax/inverted_pendulum?backend=spring&n_frames=1"))
    with pytest.raises(checkpoint.CheckpointError, match="n_frames=1"):
        checkpoint.read(other).restore_state(trainer)  # another env stays refused
