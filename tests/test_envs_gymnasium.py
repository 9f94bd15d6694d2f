"""Gymnasium envs (jes.envs.gymnasium + jes.host_rollout): real Gymnasium envs, real worker processes.

Bit-identity is asserted for 0 vs 2 local worker processes, a dying worker and a resume; envs that are
deterministic given their seed (CartPole is) are what the guarantee covers.
"""
import gc
import hashlib
import json
import logging
import os
import re
import signal
import struct
import time
import warnings

import numpy as np
import pytest

gymnasium = pytest.importorskip("gymnasium")

import jax  # noqa: E402

import jes  # noqa: E402
from jes.distributed.local import LOCAL_MASTER_OPTIONS, LocalWorkers, new_secret  # noqa: E402
from jes.distributed.master import Master  # noqa: E402
from jes.envs import make_env  # noqa: E402
from jes.envs.gymnasium import GymnasiumEnv  # noqa: E402
from jes.generation import Trainer  # noqa: E402
from jes.host_rollout import HostEnvError  # noqa: E402
from jes.host_step import HostGeneration  # noqa: E402
from jes.loop import NonFiniteFitnessError, run  # noqa: E402

SMALL = dict(num_members=16, chunk_size=4, eval_episodes=4, max_episode_steps=60, num_generations=2)
POLICY = dict(hidden=4, layers=1)


def small_train(env="gymnasium:CartPole-v1", **kw):
    return jes.train(jes.GRUPolicy(**POLICY), env, "adam", log_dir=None, progress=False,
                     checkpoint_path=kw.pop("checkpoint_path", None), **{**SMALL, **kw})


class Target(gymnasium.Env):
    """A user's own env: observe a target in [-1, 1]^2, act near it (reward -|a - target|), 10 steps."""

    def __init__(self):
        self.observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.t, self.target = 0, np.zeros(2, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.target = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self.target, {}

    def step(self, action):
        self.t += 1
        reward = -float(np.abs(np.asarray(action) - self.target).sum())
        return self.target, reward, False, self.t >= 10, {}


class Broken(Target):
    """Raises on its third step, or returns a NaN reward (``mode``), or hangs."""

    mode = "raise"

    def step(self, action):
        if self.t == 2:
            if self.mode == "raise":
                raise RuntimeError("simulator exploded")
            if self.mode == "hang":
                time.sleep(3)
            if self.mode == "nan":
                self.t += 1
                return self.target, float("nan"), False, False, {}
        return super().step(action)


class DictObs(Target):
    def __init__(self):
        super().__init__()
        self.observation_space = gymnasium.spaces.Dict({"target": gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32),
                                                        "phase": gymnasium.spaces.Discrete(3)})

    def reset(self, *, seed=None, options=None):
        target, info = super().reset(seed=seed)
        return {"target": target, "phase": 0}, info

    def step(self, action):
        obs, *rest = super().step(action)
        return {"target": obs, "phase": self.t % 3}, *rest


def test_specs_of_ids_instances_classes_and_factories():
    spec = make_env("gymnasium:CartPole-v1")
    assert spec.host and spec.discrete and spec.num_outputs == 2 and spec.obs_shape == (4,)
    assert spec.max_steps == 500 and spec.solved_return == 475.0 and spec.name == "gymnasium:CartPole-v1"
    assert make_env("gymnasium:CartPole-v1", max_steps=50).max_steps == 50
    box = make_env(Target, max_steps=10)  # a class: called once per slot
    assert box.host and not box.discrete and box.action_shape == (2,)
    with pytest.raises(ValueError, match="max_episode_steps"):
        make_env(Target())  # no TimeLimit, no spec: the limit must be given
    assert make_env(Target(), max_steps=10).max_steps == 10
    assert make_env(DictObs, max_steps=10).obs_shape == (5,)  # Dict of Box(2) and Discrete(3), flattened
    assert make_env(gymnasium.make("Pendulum-v1")).action_low.tolist() == [-2.0]
    # An instance is never named by its bare id ("CartPole-v1" is gymnax's CartPole): the plain env of its id is the
    # id's env, named as one; another instance has a name that no env name resolves to.
    assert make_env(gymnasium.make("CartPole-v1")).name == "gymnasium:CartPole-v1"
    assert make_env(gymnasium.make("CartPole-v1", render_mode="rgb_array")).name == "gymnasium:CartPole-v1"
    changed = gymnasium.make("CartPole-v1")
    changed.unwrapped.length = 5.0  # after make(): not in its spec
    for other in (gymnasium.make("CartPole-v1", sutton_barto_reward=True), gymnasium.make("CartPole-v1", max_episode_steps=9),
                  gymnasium.wrappers.ClipReward(gymnasium.make("CartPole-v1"), -0.5, 0.5), changed):
        name = make_env(other).name
        assert name == "CartPole-v1" + jes.envs.gymnasium.INSTANCE_SUFFIX, name
        with pytest.raises(ValueError, match=r"gymnasium.Env instance made otherwise than its registered id .* from Python "
                                                 r"\(jes.load_policy\(path, env=env\).*the command line cannot rebuild it"):
            make_env(name)
    assert make_env(changed).env.make().unwrapped.length == 5.0  # the instance itself is what runs
    gymnasium.register("JesTestArrayKwargs-v0", entry_point="gymnasium.envs.classic_control:PendulumEnv",
                       max_episode_steps=20, kwargs={"g": 10.0})
    assert make_env(gymnasium.make("JesTestArrayKwargs-v0", g=np.array(9.0))).name.endswith("instance)")
    with pytest.raises(ValueError, match="unknown Gymnasium id"):
        make_env("gymnasium:CartPoleee-v1")
    with pytest.raises(ValueError, match="module:"):
        make_env("gymnasium:os:CartPole-v1")

    class TextObs(Target):
        def __init__(self):
            super().__init__()
            self.observation_space = gymnasium.spaces.Text(5)

    with pytest.raises(ValueError, match="observation space Text"):
        make_env(TextObs, max_steps=10)


@pytest.mark.hard_timeout(600)
def test_user_env_subclass_trains_and_improves():
    result = jes.train(jes.MLPPolicy(hidden_sizes=(8,)), Target, "adam", log_dir=None, progress=False, num_members=32,
                       chunk_size=8, eval_episodes=8, max_episode_steps=10, num_generations=8, learning_rate=0.05)
    scores = result.history["centre_return"]
    assert np.isfinite(scores).all() and scores[-1] > scores[0] + 1.0, scores


class Counted(Target):
    """Target counting its open instances (a MuJoCo renderer's, an EnvPool's threads stand for what an open one holds)."""

    open = 0

    def __init__(self):
        super().__init__()
        Counted.open += 1

    def close(self):
        Counted.open -= 1


@pytest.mark.hard_timeout(300)
def test_a_run_closes_the_env_instances_it_made_whether_it_ends_or_fails():
    """Review: each jes.train of a Python simulator left its instances open (a notebook's runs kept every run's), and so
    did a master evaluating one."""
    Counted.open = 0
    result = small_train(Counted, num_generations=1, eval_episodes=2)
    assert Counted.open == 0
    result.evaluate(3)  # its instances are kept for the next evaluation, and closed with the result
    assert Counted.open > 0
    del result
    gc.collect()
    assert Counted.open == 0

    class Failing(Counted):
        def step(self, action):
            raise RuntimeError("simulator exploded")

    with pytest.raises(HostEnvError, match="simulator exploded"):
        small_train(Failing, num_generations=1, eval_episodes=2)
    assert Counted.open == 0
    gymnasium.register("JesTestCounted-v0", entry_point=Counted, max_episode_steps=10)
    trainer = Trainer(jes.GRUPolicy(**POLICY), "gymnasium:JesTestCounted-v0", "adam",
                      jes.ESConfig(num_members=8, chunk_size=4))
    master = Master(trainer, "127.0.0.1:0", secret=new_secret(), env="gymnasium:JesTestCounted-v0", optimizer="adam")
    try:
        master._programs.chunks(trainer.init_state(0), np.arange(2, dtype=np.int32))  # both chunks evaluated here
        assert Counted.open > 0
    finally:
        master.close()
    assert Counted.open == 0


class InterruptedWhileClosing(Counted):
    """The user's second Ctrl-C, landing while the run closes its instances."""
    armed = False

    def close(self):
        super().close()
        if InterruptedWhileClosing.armed:
            InterruptedWhileClosing.armed = False
            os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.hard_timeout(300)
def test_a_ctrl_c_while_the_instances_close_keeps_the_run_it_interrupts_or_ends(tmp_path):
    """A review: a Ctrl-C while the run closed its instances was raised in their place: a run interrupted in a
    callback lost its .result and note, and one that had finished raised a bare KeyboardInterrupt."""
    # (Python's own Ctrl-C handler, whatever the test runner set: pytest-xdist's workers ignore SIGINT)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _ctrl_c_while_closing(tmp_path)
    finally:
        signal.signal(signal.SIGINT, previous)


def _ctrl_c_while_closing(tmp_path):
    def interrupted(record):
        InterruptedWhileClosing.armed = True
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as caught:
        small_train(InterruptedWhileClosing, num_generations=3, eval_episodes=1, callbacks=[interrupted])
    assert len(caught.value.result.history["generation"]) == 0 and any("interrupted" in n for n in caught.value.__notes__)

    def arms(record):
        InterruptedWhileClosing.armed = True

    with pytest.raises(KeyboardInterrupt) as caught:
        jes.train(jes.GRUPolicy(**POLICY), InterruptedWhileClosing, "adam", log_dir=str(tmp_path / "logs"),
                  progress=False, checkpoint_path=None, **{**SMALL, "num_generations": 2, "eval_episodes": 1},
                  callbacks=[arms])
    assert len(caught.value.result.history["generation"]) == 2 and any("after generation 2" in n for n in caught.value.__notes__)
    assert not InterruptedWhileClosing.armed  # (the Ctrl-C was sent)
    # (a review: the finished run's logs were closed as interrupted, its final metrics never written)
    assert "hparams/generations" in jes.logging.read_scalars(str(tmp_path / "logs"))


@pytest.mark.hard_timeout(300)
def test_the_summary_of_a_host_env_run_claims_no_compile_time_it_did_not_measure():
    result = small_train(num_generations=1)
    assert result.compile_time == 0.0 and "compile" not in result.summary()
    assert "1 generation," in result.summary() and "wall" in result.summary()


def test_reset_seed_from_episode_keys_same_fitness_in_any_batch():
    trainer = Trainer(jes.GRUPolicy(**POLICY), "gymnasium:CartPole-v1", "adam",
                      jes.ESConfig(**{**SMALL, "num_members": 8}))
    state = trainer.init_state(3)
    host = HostGeneration(trainer)
    together = host.evaluate_chunks(state, np.arange(2))
    apart = [host.evaluate_chunks(state, np.array([c])) for c in range(2)]
    for j in range(4):
        np.testing.assert_array_equal(together[j], np.concatenate([a[j] for a in apart]))
    again = host.evaluate_chunks(state, np.arange(2))
    assert all(np.array_equal(a, b) for a, b in zip(together, again))
    other = host.evaluate_chunks(trainer.init_state(4), np.arange(2))
    assert not np.array_equal(together[0], other[0])  # other key, other episodes


@pytest.mark.hard_timeout(300)
def test_low_rank_members_on_a_host_env_step_the_same_episodes_compact_or_one_form_per_slot():
    """The host rollout applies low-rank members through the member view's batch forward: compact (a mirrored pair's
    episodes sharing one draw, as jes does for large members) or each slot in its own form, the same episodes."""
    from jes.perturbations import low_rank

    config = jes.ESConfig(**{**SMALL, "num_members": 8}, episodes_per_member=2, perturbation=jes.LowRank(1))
    results = {}
    for compact in (True, False):
        trainer = Trainer(jes.MLPPolicy((8,)), "gymnasium:CartPole-v1", "adam", config)
        trainer.member_fns = lambda centre, t=trainer, c=compact: low_rank.FactoredMembers(
            t.fns, t.ctx.layout, t.unravel(centre), compact=c)
        results[compact] = HostGeneration(trainer).evaluate_chunks(trainer.init_state(3), np.arange(2))
    np.testing.assert_array_equal(results[True][0], results[False][0])  # CartPole's returns count whole steps
    np.testing.assert_array_equal(results[True][1], results[False][1])
    assert len(set(results[True][0].reshape(-1).tolist())) > 1  # the members differ


@pytest.mark.hard_timeout(900)
def test_zero_vs_two_local_workers_and_resume_bit_identical(tmp_path):
    alone = small_train()
    spread = small_train(num_workers=2)
    np.testing.assert_array_equal(alone.flat_params, spread.flat_params)
    np.testing.assert_array_equal(alone.history["centre_return"], spread.history["centre_return"])
    path = str(tmp_path / "run.ckpt")
    small_train(num_generations=1, checkpoint_path=path)
    resumed = small_train(resume=path, checkpoint_path=path)
    np.testing.assert_array_equal(alone.flat_params, resumed.flat_params)
    assert np.isfinite(alone.history["centre_return"]).all()


@pytest.mark.hard_timeout(600)
def test_an_env_workers_cannot_build_is_refused_or_ends_the_wait_on_their_refusals(monkeypatch):
    with pytest.raises(ValueError, match="is your own class, instance or factory, which cannot travel to them"):
        small_train(Target, num_workers=2)  # refused before any worker starts
    # An id whose entry point is in a script or notebook (__main__): workers started, compiled and each refused it,
    # the run going on alone with a warning (a trial); refused before any starts, saying where to register it.
    gymnasium.register("JesTestInMain-v0", entry_point=type("InMain", (Target,), {"__module__": "__main__"}),
                       max_episode_steps=10)
    with pytest.raises(ValueError, match=r"num_workers=2: .*'JesTestInMain-v0' is registered with an entry point in "
                                         r"your script or notebook \(__main__\).*jes train --import mymodule"):
        small_train("gymnasium:JesTestInMain-v0", num_workers=2)
    # An id registered in this process only: each worker refuses the run, and the wait for them ends on their
    # refusals (it waited out LOCAL_WORKERS_TIMEOUT, here longer than this test's hard timeout).
    gymnasium.register("JesTestTargetOnlyHere-v0", entry_point=Target, max_episode_steps=10)
    monkeypatch.setattr(jes.loop, "LOCAL_WORKERS_TIMEOUT", 3600.0)
    with pytest.warns(UserWarning, match=r"0 local worker\(s\) became ready \(the others refused the run"):
        spread = small_train("gymnasium:JesTestTargetOnlyHere-v0", num_workers=2, num_generations=1)
    alone = small_train("gymnasium:JesTestTargetOnlyHere-v0", num_generations=1)
    np.testing.assert_array_equal(spread.flat_params, alone.flat_params)


@pytest.mark.hard_timeout(900)
def test_dying_worker_is_replaced_and_its_members_rerun(caplog):
    """Workers built by id from the description (no code travels); one is killed after generation 1. Its
    replacement is named apart from it (both were local-0 in the master's log)."""
    caplog.set_level(logging.WARNING, logger="jes.distributed.local")
    config = jes.ESConfig(**{**SMALL, "num_generations": 3})
    reference = small_train(num_generations=3)
    trainer = Trainer(jes.GRUPolicy(**POLICY), "gymnasium:CartPole-v1", "adam", config)
    secret = new_secret()
    with Master(trainer, "127.0.0.1:0", secret=secret, env="gymnasium:CartPole-v1", optimizer="adam",
                **LOCAL_MASTER_OPTIONS) as server, LocalWorkers(f"127.0.0.1:{server.port}", secret, 2) as workers:
        state = trainer.init_state(0)
        assert server.wait_for_workers(state, 2, timeout=300) == 2, "local workers did not connect within 300 s"
        killed = []

        def kill_one(record):
            if record["generation"] == 1:
                pid = workers.pids()[0]
                killed.append(pid)
                os.kill(pid, signal.SIGKILL)

        result = run(trainer, state, step_fn=server.step, callbacks=[kill_one])
        deadline = time.monotonic() + 60
        while workers.restarts < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert workers.restarts >= 1 and killed and killed[0] not in workers.pids()
        assert "local worker local-0 exited (code -9); started local-0 (restart 1) to replace it" in caplog.text
        replacement = workers.processes[0]
        if os.path.exists(f"/proc/{replacement.pid}/cmdline"):  # the name the replacement gives the master
            with open(f"/proc/{replacement.pid}/cmdline", "rb") as f:
                assert b"--name\0local-0 (restart 1)\0" in f.read()
    np.testing.assert_array_equal(reference.flat_params, result.flat_params)
    assert server.stats["master_chunks"] < 3 * trainer.num_chunks, server.stats


STEP_RAISES_MODULE = '''
import gymnasium
import numpy as np


class StepRaises(gymnasium.Env):
    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t == 3:
            raise RuntimeError("simulator exploded")
        return np.zeros(2, np.float32), 1.0, False, False, {}


gymnasium.register("JesTestStepRaises-v0", entry_point="jesteststepraises:StepRaises", max_episode_steps=10)
'''


@pytest.mark.hard_timeout(600)
def test_a_worker_whose_env_fails_in_its_warm_up_chunk_says_the_env_failed(tmp_path, monkeypatch, caplog, capfd):
    """Workers logged "cannot build run ...: cannot build: HostEnvError" for an env that raised in the chunk they
    evaluate to warm up: it read as a problem of the run's description."""
    (tmp_path / "jesteststepraises.py").write_text(STEP_RAISES_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import jesteststepraises  # noqa: F401 - registers the id (local workers import it themselves)

    caplog.set_level(logging.ERROR, logger="jes.distributed.master")
    with pytest.warns(UserWarning, match=r"0 local worker\(s\) became ready"), \
            pytest.raises(HostEnvError, match="step raised RuntimeError: simulator exploded"):
        small_train("gymnasium:JesTestStepRaises-v0", num_workers=1, num_generations=1, max_episode_steps=10)
    refused = [r.getMessage() for r in caplog.records if "refused run" in r.getMessage()]
    said = ("its env failed: HostEnvError: env 'gymnasium:JesTestStepRaises-v0': step raised RuntimeError: simulator "
            "exploded", "(in the chunk this worker evaluates to warm up, before any assignment)")
    assert refused and all(all(s in m for s in said) and "cannot build" not in m for m in refused), refused
    worker_log = capfd.readouterr().err  # the worker process's own log (its stderr is this process's)
    assert re.search(r"built run \S+ sent by the master, but its env failed: HostEnvError: env "
                     r"'gymnasium:JesTestStepRaises-v0': step raised", worker_log), worker_log
    assert "cannot build" not in worker_log, worker_log


@pytest.mark.hard_timeout(600)
@pytest.mark.parametrize("mode", ["raise", "hang"])
def test_env_failure_names_env_member_and_generation(mode, monkeypatch):
    monkeypatch.setattr(Broken, "mode", mode)
    env = GymnasiumEnv(Broken, "Broken", episode_seconds=1.0 if mode == "hang" else None)
    with pytest.raises(HostEnvError, match=r"env 'Broken'.*member 0 \(episode 0\) of generation 1") as err:
        small_train(env, max_episode_steps=10, eval_episodes=2)
    assert ("exploded" in str(err.value)) if mode == "raise" else ("time limit of 1 s" in str(err.value))


class Slow(Target):
    """Each step takes 2 ms of the env's own time (10 steps: 20 ms an episode)."""

    def step(self, action):
        time.sleep(0.002)
        return super().step(action)


class HalfBox(Target):
    """Target with actions bounded below only."""

    def __init__(self):
        super().__init__()
        self.action_space = gymnasium.spaces.Box(0.0, np.inf, (2,), np.float32)


def test_resuming_a_format_5_checkpoint_of_a_half_bounded_box_warns_that_its_actions_map_otherwise(tmp_path):
    from flax import serialization
    from jes import checkpoint

    path = str(tmp_path / "half.ckpt")
    small_train(HalfBox, num_generations=1, max_episode_steps=10, checkpoint_path=path)
    data = open(path, "rb").read()
    header = struct.Struct("<8sQ32s")
    content = serialization.msgpack_restore(data[header.size:])
    meta = json.loads(content["meta"])
    meta["version"] = 5
    payload = serialization.msgpack_serialize(dict(content, meta=json.dumps(meta)))
    with open(path, "wb") as f:
        f.write(header.pack(checkpoint.MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload)
    with pytest.warns(UserWarning, match="raw policy outputs; this jes maps each dimension by its own bounds"):
        small_train(HalfBox, num_generations=2, max_episode_steps=10, resume=path, checkpoint_path=path)


@pytest.mark.hard_timeout(600)
def test_the_episode_time_limit_is_each_episodes_own_time_not_its_batchs():
    """256 episodes in one batch, stepped in turns: ~5 s of env time for the batch, ~20 ms for each episode, well
    within a limit of 1 s each (the limit was on the batch's time since its start: every episode ran past it)."""
    env = GymnasiumEnv(Slow, "Slow", episode_seconds=1.0)
    result = small_train(env, max_episode_steps=10, eval_episodes=2, num_members=256, chunk_size=256,
                         num_generations=1)
    assert np.isfinite(result.history["pop_mean"]).all()


@pytest.mark.hard_timeout(600)
def test_nan_reward_is_non_finite_fitness(monkeypatch):
    monkeypatch.setattr(Broken, "mode", "nan")
    with pytest.raises(NonFiniteFitnessError, match=r"member 0 of generation 1 on env 'Broken'"):
        small_train(GymnasiumEnv(Broken, "Broken"), max_episode_steps=10, eval_episodes=2)


@pytest.mark.slow
@pytest.mark.hard_timeout(1800)
def test_cartpole_solved_with_default_gru_and_novograd():
    result = jes.train(jes.GRUPolicy(), "gymnasium:CartPole-v1", "novograd", key=0, log_dir=None, progress=False)
    returns, _ = HostGeneration(result.trainer).evaluate_centre(result.state, 64, key=jax.random.key(10_000))
    assert returns.mean() >= 475, (returns.mean(), result.history["centre_return"])


class Drawn(Target):
    """:class:`Target` drawing itself: ``render_mode="rgb_array"``, an 8x12 frame with the target's pixel and time lit."""

    render_mode = "rgb_array"
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def render(self):
        frame = np.zeros((8, 12, 3), np.uint8)
        i, j = ((self.target + 1) * 3.5).round().astype(int)
        frame[i, j] = 255
        frame[0, 8 + self.t % 4] = frame[1, 8 + self.t // 4] = 128  # distinct frames (a GIF merges equal ones)
        return frame


@pytest.mark.hard_timeout(600)
def test_trained_policy_evaluates_as_training_evaluates_the_centre(tmp_path):
    result = small_train(normalize_observations=True)
    assert result.trainer.normalize_observations
    reference, _ = HostGeneration(result.trainer).evaluate_centre(result.state, 6, key=jax.random.key(7))
    np.testing.assert_array_equal(result.evaluate(6, key=7), reference)
    loaded = jes.load_policy(result.save_policy(str(tmp_path / "cartpole.jes")))  # the env rebuilt from its id
    np.testing.assert_array_equal(loaded.evaluate(6, key=7), reference)
    assert not np.array_equal(result.evaluate(6, key=8), reference)


@pytest.mark.hard_timeout(600)
def test_every_evaluation_of_a_normalised_continuous_run_gives_training_centres_bits(tmp_path):
    """Training's centre evaluation, ``jes eval``'s (HostGeneration of the checkpoint), ``result.evaluate``,
    ``TrainedPolicy.evaluate`` and a loaded policy file's: the same returns bit for bit. Continuous actions
    show any last-bit difference of the normalised observations (CartPole's argmax hides them): computed
    eagerly, the normaliser's variance was rounded twice where the compiled one fused it, and 4 of these 8
    returns differed."""
    from jes.checkpoint import read

    path = str(tmp_path / "run.ckpt")
    result = jes.train(jes.MLPPolicy((8,)), "gymnasium:Pendulum-v1", "adam", num_members=8, num_generations=2,
                       eval_episodes=4, max_episode_steps=40, key=3, normalize_observations=True, log_dir=None,
                       progress=False, checkpoint_path=path)
    trainer, state = read(path).centre_for_evaluation()
    assert trainer.normalize_observations
    host = HostGeneration(trainer)
    reference, _ = host.evaluate_centre(state, 8, key=jax.random.key(12345))
    loaded = jes.load_policy(result.save_policy(str(tmp_path / "run.policy")))
    for name, returns in [("result.evaluate", result.evaluate(8, key=12345)),
                          ("TrainedPolicy.evaluate", result.trained_policy().evaluate(8, key=jax.random.key(12345))),
                          ("load_policy().evaluate", loaded.evaluate(8, key=12345))]:
        assert np.array_equal(returns, reference), (name, returns.tolist(), reference.tolist())
    # and training's own centre evaluation of the last generation, with its key: its mean is the history's
    centre_key = jes.strategies.noise.generation_key(state.es_key, state.generation)
    training, _ = host.evaluate_centre(state)
    assert np.array_equal(loaded.evaluate(4, key=centre_key), training)
    assert np.mean(training, dtype=np.float32) == np.float32(result.history["centre_return"][-1])


class DrawsWithMissing(Drawn):
    """Draws with a package that is not installed, as Gymnasium's CartPole without pygame: DependencyNotInstalled."""

    def render(self):
        try:
            import jes_no_such_drawing  # noqa: F401
        except ImportError as err:
            raise gymnasium.error.DependencyNotInstalled(
                "jes_no_such_drawing is not installed, run `pip install jes_no_such_drawing`") from err


@pytest.mark.hard_timeout(600)
def test_act_flattens_the_raw_observation_of_a_dict_or_discrete_space_as_training_did(tmp_path):
    """act(carry, obs) with the dict env.reset() returns raised "float() argument must be ... not 'dict'"."""
    result = small_train(DictObs, max_episode_steps=10, num_generations=1)
    env = DictObs()
    obs, _ = env.reset(seed=0)
    flat = gymnasium.spaces.flatten(env.observation_space, obs)
    carry = result.initial_carry()
    expected = result.act(carry, flat)
    path = result.save_policy(str(tmp_path / "dict.policy"))
    for policy in (result, result.trained_policy(), jes.load_policy(path, env=DictObs)):
        for given in (obs, flat, list(flat)):  # raw, or flattened already
            got = policy.act(carry, given)
            assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)))
    with pytest.raises(ValueError, match=r"act takes one observation of the env's observation space Dict\(.*as "
                                         r"env.reset\(\) and env.step\(\) return it .* of shape \(5,\); "
                                         r"flattening this dict failed: KeyError"):
        result.act(carry, {"target": obs["target"]})
    alone = jes.load_policy(path)  # a class of one's own: no name rebuilds it, so nothing knows its space
    assert np.array_equal(alone.act(carry, flat)[1], expected[1])
    assert np.array_equal(alone.act(carry, tuple(flat))[1], expected[1])  # a tuple of numbers is an observation too
    assert np.array_equal(result.act(carry, tuple(flat))[1], expected[1])
    with pytest.raises(ValueError, match=r"act takes one observation of shape \(5,\), as training gave it to the "
                                         r"policy; got a dict, .* Pass gymnasium.spaces.flatten\("
                                         r"env.observation_space, obs\), or load the policy with "
                                         r"jes.load_policy\(path, env=your_env\)"):
        alone.act(carry, obs)
    # a registered id with a Discrete observation (an int): the loaded policy rebuilds its env to flatten it
    lake = jes.train(jes.MLPPolicy((3,)), "gymnasium:FrozenLake-v1", "adam", num_members=8, num_generations=1,
                     eval_episodes=2, max_episode_steps=20, log_dir=None, progress=False)
    loaded = jes.load_policy(lake.save_policy(str(tmp_path / "lake.policy")))
    state = 6
    one_hot = np.eye(16, dtype=np.float32)[state]
    assert loaded.act((), state)[1] == loaded.act((), one_hot)[1] == lake.act((), np.int64(state))[1]


@pytest.mark.hard_timeout(600)
def test_render_draws_the_envs_own_rgb_array_frames(tmp_path):
    PIL = pytest.importorskip("PIL.Image")
    result = small_train(Drawn, max_episode_steps=10, num_generations=1)
    path = result.render(str(tmp_path / "drawn.gif"))
    with PIL.open(path) as gif:
        assert gif.n_frames == 11 and gif.size == (12, 8)  # the reset frame and one per step
    with pytest.raises(ValueError, match=r"\.gif path"):
        result.render(str(tmp_path / "drawn.html"))
    plain = small_train(Target, max_episode_steps=10, num_generations=1)
    with pytest.raises(ValueError, match="rgb_array"):
        plain.render(str(tmp_path / "plain.gif"))
    # gymnasium's DependencyNotInstalled (not an ImportError) was a traceback: an ImportError naming env and package
    missing = small_train(DrawsWithMissing, max_episode_steps=10, num_generations=1)
    with pytest.raises(ImportError, match=r"env '.*DrawsWithMissing.*' needs the package 'jes_no_such_drawing', which "
                                          r"is not installed here \(.*pip install jes_no_such_drawing"):
        missing.render(str(tmp_path / "missing.gif"))
    assert not (tmp_path / "missing.gif").exists()


@pytest.mark.hard_timeout(600)
def test_a_saved_policy_draws_the_frames_of_its_run(tmp_path):
    """A policy file could not be rendered (no TrainedPolicy.render): loaded, it draws its run's centre episode byte
    for byte, its env of one's own given to load_policy or to render, with render's refusals."""
    pytest.importorskip("PIL.Image")
    from jes.checkpoint import load
    from jes.render import render

    result = small_train(Drawn, max_episode_steps=10, num_generations=1)
    path = result.save_policy(str(tmp_path / "drawn.policy"))
    expected = open(render(result.trainer, result.state, str(tmp_path / "run.gif"), key=5), "rb").read()
    for policy, env in [(jes.load_policy(path, env=Drawn), None), (jes.load_policy(path), Drawn)]:
        got = policy.render(str(tmp_path / "policy.gif"), key=5, env=env)
        assert open(got, "rb").read() == expected
    with pytest.raises(ValueError, match=r"\.gif path"):
        policy.render(str(tmp_path / "drawn.html"), env=Drawn)
    with pytest.raises(ValueError, match="rgb_array"):
        policy.render(str(tmp_path / "plain.gif"), env=Target)
    with pytest.raises(ImportError, match=r"env '.*DrawsWithMissing.*' needs the package 'jes_no_such_drawing'"):
        policy.render(str(tmp_path / "missing.gif"), env=DrawsWithMissing)
    assert sorted(os.listdir(tmp_path)) == ["drawn.policy", "policy.gif", "run.gif"]
    pytest.importorskip("pygame")  # Gymnasium's CartPole draws with pygame (gymnasium[classic-control])
    ckpt = str(tmp_path / "run.ckpt")
    small_train(num_generations=1, checkpoint_path=ckpt)
    trainer, state, _ = load(ckpt)
    policy = jes.load_policy(jes.loop.trained_policy(trainer, state.params, state).save(str(tmp_path / "c.policy")))
    expected = open(render(trainer, state, str(tmp_path / "cartpole-run.gif"), key=2, max_steps=20), "rb").read()
    assert open(policy.render(str(tmp_path / "cartpole.gif"), key=2, max_steps=20), "rb").read() == expected


@pytest.mark.hard_timeout(600)
def test_jes_eval_and_render_of_a_gymnasium_checkpoint(tmp_path, capsys):
    pytest.importorskip("pygame")  # CartPole draws with pygame (gymnasium[classic-control])
    PIL = pytest.importorskip("PIL.Image")
    from jes.cli import main

    path = str(tmp_path / "run.ckpt")
    result = small_train(num_generations=1, checkpoint_path=path)
    gif = str(tmp_path / "cartpole.gif")
    assert main(["eval", path, "--episodes", "4", "--seed", "3", "--render", gif, "--render-steps", "20"]) == 0
    out = capsys.readouterr().out
    expected = result.evaluate(4, key=3).mean()
    assert f"centre return {expected:.2f}" in out and "gymnasium:CartPole-v1" in out, out
    with PIL.open(gif) as frames:
        assert 2 <= frames.n_frames <= 21 and frames.size[0] > 100


class Scaled(gymnasium.Env, gymnasium.utils.EzPickle):
    """An EzPickle env (as Gymnasium's MuJoCo and Box2D envs are): deepcopy rebuilds it from its constructor."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gymnasium.spaces.Box(0, 3, (1,), np.int64)

    def __init__(self):
        gymnasium.utils.EzPickle.__init__(self)
        self.reward_scale, self.actions = 1.0, []

    def reset(self, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.actions.append(action)
        return np.zeros(1, np.float32), self.reward_scale, True, False, {}


def test_instances_are_copied_with_what_was_set_on_them_and_named_never_as_another_env():
    """An EzPickle instance was copied by calling its constructor again: a changed attribute (a MuJoCo model's
    gravity, a reward scale) was dropped and the run trained on the default env."""
    import threading

    env = Scaled()
    env.reward_scale = 100.0
    copied = make_env(env, max_steps=5).env.make()
    assert copied is not env and copied.reward_scale == 100.0

    class Locked(Scaled):  # state that cannot be copied, as a Box2D world: copied by its constructor instead
        def __init__(self):
            super().__init__()
            self.lock = threading.Lock()

        def reset(self, seed=None, options=None):
            self.t = 0  # episode state a reset adds: not a setting the copies drop
            return super().reset(seed=seed, options=options)

    reset = Locked()
    reset.reset(seed=0)
    assert make_env(reset, max_steps=5).env.make().reward_scale == 1.0
    locked = Locked()
    locked.reward_scale = 100.0  # ... which would drop this: refused, naming it
    with pytest.raises(TypeError, match=r"copies only by its constructor arguments .* \(reward_scale\)"):
        make_env(locked, max_steps=5)
    plain = Target()
    plain.lock = threading.Lock()
    with pytest.raises(TypeError, match=r"cannot be copied .*jes.envs.gymnasium.make\(factory\)"):
        make_env(plain, max_steps=5)
    # A user's factory named as an id jes would rebuild otherwise (gymnax's CartPole here) is marked as an instance.
    heavy = GymnasiumEnv(lambda: gymnasium.make("CartPole-v1"), "CartPole-v1")
    assert heavy.name == "CartPole-v1 (a gymnasium.Env instance)"
    # gymnasium.make(id) itself travels to workers by its id (workers refused it as an unknown class before).
    assert jes.envs.resolvable_name(gymnasium.make("CartPole-v1")) == "gymnasium:CartPole-v1"
    assert jes.envs.resolvable_name(env) is None
    with pytest.raises(ValueError, match=r"master='127.0.0.1:9': worker processes rebuild a Python env"):
        jes.train(jes.MLPPolicy(hidden_sizes=(2,)), env, max_episode_steps=5, master="127.0.0.1:9", num_members=4,
                  log_dir=None, progress=False)


def test_an_integer_box_action_is_the_nearest_integer_within_the_bounds():
    """The tanh-mapped action was truncated: the top value 3 came only at saturation."""
    spec = make_env(Scaled(), max_steps=5)
    assert [int(spec.env.env_action(np.array([a]))[0]) for a in (0.4, 0.6, 2.5001, 2.9, 3.2, -0.2)] == [0, 1, 3, 3, 3, 0]
    assert spec.env.env_action(np.array([1.7])).dtype == np.int64


def test_a_mujoco_models_settings_tell_an_instance_from_its_ids_env():
    """Only plain public attributes were compared: Hopper with zero gravity was named (and rebuilt) as Hopper-v5."""
    mujoco = pytest.importorskip("mujoco")
    from jes.envs.gymnasium import _plain_attributes

    class Holder:
        def __init__(self):
            self.model = mujoco.MjModel.from_xml_string("<mujoco><worldbody><body><freejoint/><geom size='1'/>"
                                                        "</body></worldbody></mujoco>")

    a, b = Holder(), Holder()
    assert _plain_attributes(a) == _plain_attributes(b)
    b.model.opt.gravity[:] = 0
    assert _plain_attributes(a) != _plain_attributes(b)
    b.model.opt.gravity[:] = a.model.opt.gravity
    b.model.body_mass[1] *= 5
    assert _plain_attributes(a) != _plain_attributes(b)


CORRIDOR_PACKAGE = '''
import gymnasium
import numpy as np


class Corridor(gymnasium.Env):
    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.x = float(self.np_random.uniform(-0.5, 0.5))
        return np.array([self.x], np.float32), {}

    def step(self, action):
        self.x += 0.1 if action == 1 else -0.1
        return np.array([self.x], np.float32), -abs(self.x - 1.0), self.x >= 1.0, False, {}


gymnasium.register("JesTestCorridor-v0", entry_point="jestestcorridor:Corridor", max_episode_steps=20)
'''


@pytest.mark.hard_timeout(600)
def test_a_users_registered_id_runs_on_local_workers_that_import_its_module(tmp_path, monkeypatch):
    """Workers could not register a user's own Gymnasium id (no way to import its module): each refused the run and
    it went on in one process. Local workers now import the module behind the id; jes-worker takes --import."""
    import subprocess
    import sys
    import warnings

    (tmp_path / "jestestcorridor.py").write_text(CORRIDOR_PACKAGE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import jestestcorridor  # noqa: F401 - registers the id here, as the user's script does

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "0 local worker(s) became ready (the others refused the run" before
        spread = small_train("gymnasium:JesTestCorridor-v0", num_workers=1, num_generations=1)
    alone = small_train("gymnasium:JesTestCorridor-v0", num_generations=1)
    np.testing.assert_array_equal(spread.flat_params, alone.flat_params)
    bad = subprocess.run([sys.executable, "-m", "jes.distributed.worker", "--master", "127.0.0.1:9", "--import",
                          "jes_no_such_module"], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, JES_SECRET="x" * 32))
    assert bad.returncode == 2 and "--import jes_no_such_module: ModuleNotFoundError" in bad.stderr, bad.stderr


class Misbehaving(Target):
    """Steps as `how` says: the old 4-tuple API, a None reward, or an observation of another shape."""

    how = "four"

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.how == "four":
            return obs, reward, terminated or truncated, info
        if self.how == "none":
            return obs, None, terminated, truncated, info
        if self.how == "column":  # (2, 1) for a (2,) space: the same values in order, taken
            return obs[:, None], reward, terminated, truncated, info
        return obs[:1], reward, terminated, truncated, info


class Transposed(Target):
    """A (3, 2) observation space, stepping (2, 3) arrays."""

    def __init__(self):
        super().__init__()
        self.observation_space = gymnasium.spaces.Box(-1.0, 1.0, (3, 2), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros((3, 2), np.float32), {}

    def step(self, action):
        _, reward, terminated, truncated, info = super().step(action)
        return np.zeros((2, 3), np.float32), reward, terminated, truncated, info


@pytest.mark.hard_timeout(600)
@pytest.mark.parametrize("how,message", [
    ("four", r"step\(action\) must return \(obs, reward, terminated, truncated, info\) \(Gymnasium's API\); it "
             r"returned a tuple of 4"),
    ("none", r"step's reward does not fit: TypeError: the reward is None, not a number in .* after 1 step$"),
    ("shape", r"step's observation \(against the env's observation_space\) does not fit: ValueError.* after 1 step$"),
    ("transposed", r"step's observation \(against the env's observation_space\) does not fit: ValueError: the "
                   r"observation's shape is \(2, 3\), the observation_space's \(3, 2\) .* after 1 step$"),
])
def test_an_env_breaking_gymnasiums_api_is_named_as_the_envs_fault(how, message, monkeypatch):
    """Conversions of what the env returned failed as "step raised ...", blaming the call. The first step's bad reward
    said "after 0 steps" and its bad observation "after 1 steps" (a trial): the step is counted from its return on.
    An observation of another shape was reshaped to the space's when it had its size (a trial: a (2, 3) array for a
    (3, 2) space scrambled silently); size-1 axes aside (a review: such envs trained before, their values in order)."""
    monkeypatch.setattr(Misbehaving, "how", how)
    env = GymnasiumEnv(Transposed if how == "transposed" else Misbehaving, "Misbehaving")
    with pytest.raises(HostEnvError, match=message):
        small_train(env, max_episode_steps=10, eval_episodes=2)
    if how == "transposed":
        monkeypatch.setattr(Misbehaving, "how", "column")
        small_train(GymnasiumEnv(Misbehaving, "Misbehaving"), max_episode_steps=10, eval_episodes=2, num_generations=1)
    with pytest.raises(ValueError, match="episode_seconds must be a positive, finite number of seconds"):
        make_env("gymnasium:CartPole-v1?episode_seconds=inf")  # an OverflowError in the first reset before


def test_env_classes_jes_cannot_build_or_read_say_what_to_pass():
    """Raw AttributeError / TypeError / gymnasium flatten errors before."""

    class NeedsArgs(Target):
        def __init__(self, size):
            super().__init__()

    class NoSpaces(gymnasium.Env):
        def reset(self, seed=None, options=None):
            return np.zeros(1, np.float32), {}

    class Sequenced(Target):
        def __init__(self):
            super().__init__()
            self.observation_space = gymnasium.spaces.Dict(
                {"a": gymnasium.spaces.Sequence(gymnasium.spaces.Discrete(2))})

    with pytest.raises(TypeError, match=r"with no arguments .*jes.envs.gymnasium.make\(lambda: YourEnv\(...\)\)"):
        make_env(NeedsArgs)
    with pytest.raises(TypeError, match="has no observation_space or action_space"):
        make_env(NoSpaces, max_steps=5)

    def buggy():
        return Target() + 1  # the factory's own TypeError, not "pass arguments"

    with pytest.raises(TypeError, match="unsupported operand"):
        make_env(jes.envs.gymnasium.make(buggy))
    with pytest.raises(ValueError, match="does not flatten to a fixed size"):
        make_env(Sequenced)


def test_a_registered_id_whose_package_is_missing_names_the_env_and_the_package(monkeypatch):
    """gymnasium:GymV26Environment-v0 without shimmy (or any id whose entry point's package is not installed) raised
    gymnasium's raw ImportError from make_env and jes.train, naming no env."""
    spec = gymnasium.envs.registration.EnvSpec("JesNeedsMissing-v0", entry_point="jes_no_such_package.envs:Env",
                                               max_episode_steps=20)
    monkeypatch.setitem(gymnasium.registry, spec.id, spec)
    message = (r"Gymnasium env 'gymnasium:JesNeedsMissing-v0' needs the package 'jes_no_such_package', which is not "
               r"installed here")
    with pytest.raises(ImportError, match=message) as raised:
        make_env("gymnasium:JesNeedsMissing-v0")
    assert raised.value.name == "jes_no_such_package"
    with pytest.raises(ImportError, match=message):
        small_train("gymnasium:JesNeedsMissing-v0")
    try:
        import shimmy  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"Gymnasium env 'gymnasium:GymV26Environment-v0' needs a package that "
                                              r"is not installed here: .*shimmy"):
            small_train("gymnasium:GymV26Environment-v0")


def test_masking_a_gymnasium_env_says_to_wrap_it():
    """The error listed 'gymnasium:<id>' among the forms mask_observations takes."""
    for masked in (lambda: make_env("gymnasium:CartPole-v1?keep_obs=0,2"),
                   lambda: jes.envs.mask_observations("gymnasium:CartPole-v1", keep=[0, 2])):
        with pytest.raises(ValueError, match="masks the observations of JAX envs .* a Gymnasium env masks its own"):
            masked()


def make_target():
    return Target()


def rewrite_meta(path, **changes):
    """Rewrite a checkpoint's metadata (as an older jes wrote it)."""
    from flax import serialization
    from jes import checkpoint

    data = open(path, "rb").read()
    header = struct.Struct("<8sQ32s")
    content = serialization.msgpack_restore(data[header.size:])
    meta = dict(json.loads(content["meta"]), **changes)
    payload = serialization.msgpack_serialize(dict(content, meta=json.dumps(meta)))
    with open(path, "wb") as f:
        f.write(header.pack(checkpoint.MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload)


@pytest.mark.hard_timeout(900)
def test_a_class_or_factory_of_ones_own_is_named_by_where_it_is_and_resumes_only_with_itself(tmp_path):
    """A run on an env class or factory of one's own recorded its bare ``__name__`` ("Target", "<lambda>"): loading
    its file without the env said "unknown env ...; valid gymnax env names are ...", and any other lambda (another
    env with the same spaces) resumed it silently. They are named like instances now, module-qualified, a lambda with
    its line; a file without them says to pass the env again, and another factory is refused naming both."""
    from jes import checkpoint
    from jes.envs.gymnasium import make as gym_make

    first = lambda: Target()  # noqa: E731
    second = lambda: DictObs()  # noqa: E731
    assert make_env(Target, max_steps=10).name == f"{__name__}.Target (a gymnasium.Env class)"
    assert gym_make(make_target, max_steps=10).name == f"{__name__}.make_target (a gymnasium.Env factory)"
    line = first.__code__.co_firstlineno
    assert gym_make(first, max_steps=10).name == (
        f"{__name__}.test_a_class_or_factory_of_ones_own_is_named_by_where_it_is_and_resumes_only_with_itself."
        f"<locals>.<lambda>:{line} (a gymnasium.Env factory)")
    assert gym_make(second, max_steps=10).name != gym_make(first, max_steps=10).name
    for env in (Target, make_target, first):
        with pytest.raises(ValueError, match=r"of your own, which no name rebuilds: pass that env itself again"):
            make_env(gym_make(env, max_steps=10).name)

    train = dict(max_episode_steps=10, eval_episodes=2, key=5)
    path = str(tmp_path / "target.ckpt")
    whole = small_train(Target, num_generations=2, **train)
    small_train(Target, num_generations=1, checkpoint_path=path, **train)
    with pytest.raises(checkpoint.CheckpointError, match=r"pass that env itself again") as refused:
        checkpoint.load(path)
    assert "valid gymnax env names" not in str(refused.value)
    resumed = small_train(Target, num_generations=2, resume=path, **train)
    np.testing.assert_array_equal(whole.flat_params, resumed.flat_params)
    with pytest.raises(checkpoint.CheckpointError, match=r"env: checkpoint has .*\.Target \(a gymnasium.Env class\), "
                                                         r"this run has .*\.make_target \(a gymnasium.Env factory\)"):
        small_train(gym_make(make_target), num_generations=2, resume=path, **train)

    lambda_path = str(tmp_path / "lambda.ckpt")
    small_train(gym_make(first), num_generations=1, checkpoint_path=lambda_path, **train)
    other = lambda: Target()  # noqa: E731 - another lambda of this module (a notebook cell edited above it moves
    # one): jes cannot tell it from the first, and resumes with a warning saying so
    with pytest.warns(UserWarning, match=r"ran the env lambda .*<lambda>:\d+ .*this run passes .*<lambda>:\d+ .*"
                                         r"another line"):
        small_train(gym_make(other), num_generations=2, resume=lambda_path, **train)
    with pytest.raises(checkpoint.CheckpointError, match=r"env: checkpoint has .*<lambda>:\d+ .*this run has "
                                                         r".*\.make_target "):  # a lambda is not a named factory
        small_train(gym_make(make_target), num_generations=2, resume=lambda_path, **train)

    # A file of an older jes named the class by its bare __name__: it resumes with the class passed again, warning
    # that the name cannot say which class it ran.
    rewrite_meta(path, env_name="Target")
    with pytest.warns(UserWarning, match="cannot say whether it ran"):
        again = small_train(Target, num_generations=2, resume=path, **train)
    np.testing.assert_array_equal(whole.flat_params, again.flat_params)


def test_a_vector_env_or_envpool_pool_is_refused_with_what_to_pass():
    """Trial: an EnvPool pool was refused as "cannot be copied", advising a factory, and a factory of one failed deep in
    a step ("'int' object has no attribute 'dtype'") after EnvPool had ignored every episode's seed."""
    from jes.envs.gymnasium import make as gym_make

    closed = []
    pool = type("CartPoleGymnasiumEnvPool", (Target,), {"__module__": "envpool.python.lax", "num_envs": 4,
                                                        "close": lambda self: closed.append(self)})
    vector = gymnasium.make_vec("CartPole-v1", num_envs=2)
    wrapped = lambda: gymnasium.wrappers.TimeLimit(pool(), 50)  # noqa: E731 - (a review: taken, failing at reset)
    for env, what in ((pool(), r"env CartPoleGymnasiumEnvPool, an EnvPool pool of 4 env"),
                      (lambda: pool(), r"env factory for .*<lambda>.* returned CartPoleGymnasiumEnvPool, an EnvPool"),
                      (wrapped, r"env factory for .*<lambda>.* returned CartPoleGymnasiumEnvPool, an EnvPool"),
                      (vector, r"env CartPoleVectorEnv, a vector env \(gymnasium.make_vec / a VectorEnv\) of 2 env")):
        with pytest.raises(TypeError, match=what + r".*Pass the single env: its id \('gymnasium:CartPole-v1'\)"):
            gym_make(env)
    assert len(closed) == 2  # what the factories made, refused: closed (a review: a pool's threads were left running)
    vector.close()


@pytest.mark.hard_timeout(600)
def test_instances_of_two_classes_of_one_name_are_told_apart_on_resume(tmp_path):
    """Trial: an instance was named by its class's bare name, so mypkg.envs.Corridor() resumed a checkpoint of
    otherpkg.envs.Corridor() (other dynamics) with only the warning every instance gets. It is named by module and
    qualified name, as a class is; a checkpoint of an older jes (the bare name) resumes with a warning."""
    from jes import checkpoint

    mine = type("Corridor", (Target,), {"__module__": "mypkg.envs"})
    theirs = type("Corridor", (Target,), {"__module__": "otherpkg.envs"})
    assert make_env(mine(), max_steps=10).name == "mypkg.envs.Corridor (a gymnasium.Env instance)"
    train = dict(max_episode_steps=10, eval_episodes=2, key=5)
    path = str(tmp_path / "corridor.ckpt")
    small_train(mine(), num_generations=1, checkpoint_path=path, **train)
    with pytest.raises(checkpoint.CheckpointError, match=r"env: checkpoint has mypkg\.envs\.Corridor \(a gymnasium"
                       r"\.Env instance\), this run has otherpkg\.envs\.Corridor \(a gymnasium\.Env instance\)"):
        small_train(theirs(), num_generations=2, resume=path, **train)
    whole = small_train(mine(), num_generations=2, **train)
    rewrite_meta(path, env_name="Corridor (a gymnasium.Env instance)")  # as an older jes named it
    with pytest.warns(UserWarning, match=r"names its env 'Corridor \(a gymnasium.Env instance\)', as jes did before "
                                         r"it named a gymnasium.Env class, factory or instance"):
        again = small_train(mine(), num_generations=2, resume=path, **train)
    np.testing.assert_array_equal(whole.flat_params, again.flat_params)


@pytest.mark.hard_timeout(600)
def test_resuming_a_run_on_a_gymnasium_instance_warns_that_its_settings_cannot_be_checked(tmp_path):
    """A run on a changed instance (gravity 20) resumed on one of other physics (gravity 5) without a word: a file
    names an instance by its id or class only. No fingerprint of its objects could tell a legitimate resume (the
    same settings made again) from another, so the resume is not refused: it warns, every time, and a run on the
    id's plain env (rebuilt from its name) does not."""
    def cartpole(gravity):
        env = gymnasium.make("CartPole-v1")
        env.unwrapped.gravity = gravity
        return env

    train = dict(num_members=8, chunk_size=8, eval_episodes=2, max_episode_steps=20)
    path = str(tmp_path / "instance.ckpt")
    small_train(cartpole(20.0), num_generations=1, checkpoint_path=path, **train)
    assert jes.checkpoint.read(path).env_name == "CartPole-v1" + jes.envs.gymnasium.INSTANCE_SUFFIX
    for gravity in (20.0, 5.0):  # the run's settings made again, and others: the file cannot tell them apart
        with pytest.warns(UserWarning, match=r"ran the gymnasium.Env instance 'CartPole-v1 \(a gymnasium.Env "
                                             r"instance\)'.*not what was set on it .*jes cannot check that the "
                                             r"instance given now is the one it ran"):
            resumed = small_train(cartpole(gravity), num_generations=2, resume=path, **train)
        assert resumed.history["generation"][-1] == 2
    plain = str(tmp_path / "plain.ckpt")
    small_train(num_generations=1, checkpoint_path=plain, **train)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        small_train(num_generations=2, resume=plain, **train)


class Huge(Target):
    """Observations beyond float32's range (float64 1e40)."""

    def __init__(self):
        super().__init__()
        self.observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.float64)

    def step(self, action):
        _, *rest = super().step(action)
        return np.array([1e40 if self.t >= 2 else 0.5, 0.0]), *rest


@pytest.mark.hard_timeout(600)
def test_an_observation_beyond_float32_is_named_as_the_cause():
    """A float64 observation of 1e40 became inf in the cast to float32 with only numpy's overflow warning; the run
    then stopped a generation later on a non-finite fitness blamed on "unnormalised huge observations", although
    observations were normalised. The step's observation is named now, as the env's failure."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no numpy overflow warning in its place
        with pytest.raises(HostEnvError, match=r"step's observation.*not finite as float32.*1e\+40.*Scale the "
                                               r"observation") as error:
            small_train(Huge, max_episode_steps=10, eval_episodes=2, num_generations=1)
    assert "generation 1" in str(error.value)


class FailsLate(Target):
    """Raises in ``reset`` once ``fail_after`` episodes began in this process (a simulator that crashes hours in)."""

    fail_after = None
    resets = 0

    def reset(self, *, seed=None, options=None):
        FailsLate.resets += 1
        if self.fail_after is not None and FailsLate.resets > self.fail_after:
            raise RuntimeError("simulator licence expired")
        return super().reset(seed=seed, options=options)


@pytest.mark.hard_timeout(600)
def test_an_env_that_fails_midway_keeps_the_run_so_far_in_a_checkpoint_that_resumes(tmp_path, monkeypatch):
    """A host env that raised in generation 3 ended the run with no checkpoint and no result: every generation since
    the last periodic save was lost. The last good state is saved now, and resuming it (the env fixed) ends
    bit-identical to a run that never failed."""
    from jes import checkpoint

    env = GymnasiumEnv(FailsLate, "FailsLate")
    reference = small_train(env, max_episode_steps=10, num_generations=5, eval_every=2)
    per_generation = FailsLate.resets // 5  # members' and centre's episodes, about
    path = str(tmp_path / "run.ckpt")
    monkeypatch.setattr(FailsLate, "resets", 0)
    monkeypatch.setattr(FailsLate, "fail_after", 3 * per_generation)
    with pytest.raises(HostEnvError, match="licence expired") as err:
        small_train(env, max_episode_steps=10, num_generations=5, eval_every=2, checkpoint_path=path,
                    checkpoint_every=0)
    done = int(err.value.result.history["generation"][-1])
    assert 2 <= done < 5 and err.value.checkpoint_path == path, (done, per_generation)
    assert checkpoint.read(path).meta["generation"] == done
    np.testing.assert_array_equal(err.value.result.flat_params, checkpoint.read(path).restore_state(
        Trainer(jes.GRUPolicy(**POLICY), env, "adam", jes.ESConfig(**{**SMALL, "max_episode_steps": 10,
                                                                     "num_generations": 5, "eval_every": 2}))).params)
    monkeypatch.setattr(FailsLate, "fail_after", None)  # the env fixed
    resumed = small_train(env, max_episode_steps=10, num_generations=5, eval_every=2, resume=path,
                          checkpoint_path=path)
    assert resumed.flat_params.tobytes() == reference.flat_params.tobytes()
    for name in ("generation", "pop_mean", "centre_return"):
        assert resumed.history[name].tobytes() == reference.history[name].tobytes(), name


class ImportsWrongly(Target):
    """An env whose constructor imports a name its (installed) module lacks: the env's own bug."""

    def __init__(self):
        from json import no_such_name  # noqa: F401
        super().__init__()


def test_an_import_error_of_the_envs_own_is_not_called_a_missing_package():
    """Any ImportError from an env's constructor was reworded as "needs the package 'json', which is not installed
    here; install it"; only a module that is not there is a missing package."""
    with pytest.raises(ImportError, match="cannot import name 'no_such_name'") as err:
        small_train(ImportsWrongly, max_episode_steps=10, num_generations=1)
    assert "not installed" not in str(err.value)


class ShiftedActions(Target):
    """Discrete(3, start=-1) actions (a step of -1, 0 or +1 towards the target's first coordinate); an action outside
    the space is an error, as a strict simulator's."""

    def __init__(self):
        super().__init__()
        self.action_space = gymnasium.spaces.Discrete(3, start=-1)

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        self.t += 1
        return self.target, -abs(float(self.target[0]) - 0.5 * int(action)), False, self.t >= 10, {}


class IntegerActions(Target):
    """Box(0, 4, (2,), int64) actions; one outside the space is an error."""

    dtype = np.int64

    def __init__(self):
        super().__init__()
        self.action_space = gymnasium.spaces.Box(0, 4, (2,), self.dtype)


class SmallIntegerActions(IntegerActions):
    dtype = np.uint8

    def step(self, action):
        if not self.action_space.contains(np.asarray(action)):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        self.t += 1
        return self.target, -float(np.abs(np.asarray(action) / 4.0 - self.target).sum()), False, self.t >= 10, {}


@pytest.mark.parametrize("env_class", [ShiftedActions, IntegerActions, SmallIntegerActions],
                         ids=["discrete-start", "int64-box", "uint8-box"])
def test_act_and_policy_fn_return_the_action_the_env_takes(env_class, tmp_path):
    """A trial: training handed the env its own action (a Discrete start added, an integer Box rounded), but
    result.act / policy_fn / a loaded policy's act returned the policy's index (2 for Discrete(3, start=-1), which
    the env refuses) or a float (2.25 for an int64 Box). Now every step of a hand-written loop is in the space, and a
    policy file keeps it (format 3; other files stay 2)."""
    result = jes.train(jes.MLPPolicy((4,)), env_class, "adam", log_dir=None, progress=False,
                       **dict(SMALL, max_episode_steps=10))
    env = env_class()
    fn = jax.jit(result.policy_fn())
    path = result.save_policy(str(tmp_path / "p.policy"))
    loaded = jes.load_policy(path)  # no env: the file itself says what the env adds
    carries = [result.initial_carry()] * 3
    obs, _ = env.reset(seed=0)
    for _ in range(10):
        steps = [result.act(carries[0], obs), fn(carries[1], obs), loaded.act(carries[2], obs)]
        actions = [np.asarray(action) for _, action in steps]
        # (policy_fn, a JAX function, gives a 64-bit Box's action in its 32-bit kin without x64; act the Box's dtype)
        assert all(np.array_equal(a, actions[0]) for a in actions), actions
        assert actions[0].dtype == actions[2].dtype == env.action_space.dtype if actions[0].ndim else True
        assert env.action_space.contains(actions[0] if actions[0].ndim else int(actions[0])), actions[0]
        carries = [carry for carry, _ in steps]
        obs, _, _, truncated, _ = env.step(actions[0] if actions[0].ndim else int(actions[0]))
        if truncated:
            break
    from flax import serialization

    def version(file):
        with open(file, "rb") as f:
            return json.loads(serialization.msgpack_restore(f.read()[jes.trained._HEADER.size:])["meta"])["version"]

    assert version(path) == 3 and version(small_train().save_policy(str(tmp_path / "cartpole.policy"))) == 2
    # A file of format 2 (a jes before format 3 wrote the same file without the action's start and integer): act gives
    # the policy's own action, unless the env is given to load_policy, whose action space says what it adds (the
    # env's action before, a review: the index even with env= given).
    with open(path, "rb") as f:
        content = serialization.msgpack_restore(f.read()[jes.trained._HEADER.size:])
    meta = json.loads(content["meta"])
    meta["version"] = 2
    meta["action"] = {k: v for k, v in meta["action"].items() if k not in ("start", "integer")}
    payload = serialization.msgpack_serialize(dict(content, meta=json.dumps(meta)))
    old = tmp_path / "old.policy"
    old.write_bytes(jes.trained._HEADER.pack(jes.trained.POLICY_MAGIC, len(payload), hashlib.sha256(payload).digest())
                    + payload)
    obs, _ = env.reset(seed=0)
    carry = result.initial_carry()
    expected = np.asarray(result.act(carry, obs)[1])
    given = np.asarray(jes.load_policy(str(old), env=env_class).act(carry, obs)[1])
    assert np.array_equal(given, expected) and given.dtype == expected.dtype, (given, expected)
    raw = np.asarray(jes.load_policy(str(old)).act(carry, obs)[1])  # no env: the file cannot say
    assert (int(raw) == int(expected) + 1) if env_class is ShiftedActions else raw.dtype == np.float32, raw


class Offset(Target):
    """Observes ``offset + N(0, 1)`` (an altitude, a price) beside ``N(0, 1)``."""

    offset = 1e5

    def __init__(self):
        super().__init__()
        self.observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        _, info = super().reset(seed=seed)
        return self._obs(), info

    def _obs(self):
        return np.array([self.offset + self.np_random.normal(), self.np_random.normal()], np.float32)

    def step(self, action):
        _, *rest = super().step(action)
        return self._obs(), *rest


class SmallOffset(Offset):
    offset = 50.0


def test_an_observation_offset_float32_sums_cannot_resolve_is_warned_of():
    """A trial: 1e5 + N(0, 1) was normalised with std 55-400 (float32 sums cancel), silently. The run now says which
    dimension, and what to do; an offset the sums resolve (50 against 1) says nothing."""
    with pytest.warns(UserWarning, match=r"observation dimension \[0\] mean 9999\d\.\d, estimated std .*float32 running "
                                         r"sums cannot resolve it.*Subtract the offset in the env"):
        jes.train(jes.MLPPolicy((4,)), Offset, "adam", log_dir=None, progress=False, **SMALL)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = jes.train(jes.MLPPolicy((4,)), SmallOffset, "adam", log_dir=None, progress=False, **SMALL)
    assert abs(float(result.trainer.obs_norm(result.state)[1][0]) - 1.0) < 0.1  # resolved: std near 1


class DrawnOnRequest(Drawn):
    """:class:`Drawn` as Gymnasium's own envs are: it draws only when made with ``render_mode="rgb_array"``."""

    def __init__(self, render_mode=None):
        super().__init__()
        self.render_mode = render_mode


def test_render_makes_an_env_class_of_the_gymnasium_convention_with_render_mode(tmp_path):
    """A trial: result.render() of a run on an env class taking render_mode said "make your env with it", with no way
    to give one to result.render; the class is now made with render_mode="rgb_array" (and the refusal of a class
    without one names the way that works: a policy's render(path, env=instance))."""
    PIL = pytest.importorskip("PIL.Image")
    result = small_train(DrawnOnRequest, max_episode_steps=10, num_generations=1)
    with PIL.open(result.render(str(tmp_path / "drawn.gif"))) as gif:
        assert gif.n_frames == 11
    plain = small_train(Target, max_episode_steps=10, num_generations=1)
    with pytest.raises(ValueError, match=r"render_mode=None.*result.trained_policy\(\).render\(path, "
                                         r"env=YourEnv\(render_mode='rgb_array'\)\)"):
        plain.render(str(tmp_path / "plain.gif"))


def test_env_mistakes_of_a_gymnasium_user_are_told_what_works(monkeypatch):
    """A trial: a functools.partial factory got the generic "not an env" error (a function got the bridge's advice),
    env kwargs in an id got only "take only ?episode_seconds", and a Gymnasium-registered id given without its
    'gymnasium:' prefix listed gymnax's names."""
    import functools

    with pytest.raises(TypeError, match=r"a factory of a Python env goes in as jes.envs.gymnasium.make\(factory\)"):
        make_env(functools.partial(Target))
    with pytest.raises(ValueError, match=r"gymnasium.make\(id, key=value\).*gymnasium.register\(id=..., entry_point"):
        make_env("gymnasium:CartPole-v1?gravity=20.0")
    spec = gymnasium.envs.registration.EnvSpec("JesTarget-v0", entry_point=Target, max_episode_steps=10)
    monkeypatch.setitem(gymnasium.registry, spec.id, spec)
    with pytest.raises(ValueError, match=r"unknown env 'JesTarget-v0'; Gymnasium has 'JesTarget-v0' registered: a "
                                         r"Python simulator goes in as 'gymnasium:JesTarget-v0'. valid gymnax env"):
        make_env("JesTarget-v0")


class SquareOverflows(Target):
    """Observes 1e20 on its second step: finite in float32, its square is not."""

    def step(self, action):
        obs, *rest = super().step(action)
        return (np.full(2, 1e20, np.float32) if self.t == 2 else obs), *rest


class ArrayDone(Target):
    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, np.array([terminated, terminated]), truncated, info


def test_an_observation_whose_square_overflows_and_an_array_done_flag_are_named():
    """A trial: 1e20 overflowed the normaliser's sum of squares with only NumPy's RuntimeWarning, then a non-finite
    fitness error; an array `terminated` was reported as a bad observation ("truth value ... ambiguous")."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(HostEnvError, match=r"the observation normaliser's sums does not fit: OverflowError: an "
                                               r"observation value of 1e\+20 squares past float32's range"):
            small_train(SquareOverflows, normalize_observations=True, num_generations=1)
    with pytest.raises(HostEnvError, match=r"step's terminated and truncated \(one bool each\) does not fit"):
        small_train(ArrayDone, num_generations=1)


class UnboundedIntegerActions(IntegerActions):
    def __init__(self):
        super().__init__()
        self.action_space = gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.int64)  # its bounds: int64's extremes


def test_an_integer_box_float32_actions_cannot_hold_is_refused():
    """A review: an unbounded int64 Box (bounds +-9.2e18) trained with actions squashed into that range, and the
    top bound wrapped to the bottom one when rounded (2**63 as a float64 overflows int64)."""
    with pytest.raises(ValueError, match=r"integer Box action space .* bounds are beyond \+-2\*\*24"):
        make_env(UnboundedIntegerActions)


class PhaseOverflows(DictObs):
    """Observes phase 3 of a Discrete(3) on its second step (gymnasium's flatten took -1 as the last cell)."""

    def step(self, action):
        obs, *rest = super().step(action)
        return ({**obs, "phase": 3} if self.t == 2 else obs), *rest


def test_an_index_outside_a_discrete_observation_space_is_named_not_wrapped(tmp_path):
    """A trial: act(-1) on a Discrete(25) observation one-hot encoded the last cell (gymnasium's flatten indexes
    onehot[x - start]), act(25) raised an IndexError, and a MultiDiscrete's overflow would set the next component's
    cell; training on an env returning such an index went on with the wrong observation."""
    with pytest.raises(HostEnvError, match=r"step's observation .* does not fit: ValueError: observation\['phase'\] 3 "
                                           r"is outside Discrete\(3\) \(indices 0..2\) in .* after 2 steps"):
        small_train(GymnasiumEnv(PhaseOverflows, "PhaseOverflows"), max_episode_steps=10, eval_episodes=2)
    policy = small_train(GymnasiumEnv(DictObs, "DictObs"), max_episode_steps=10, eval_episodes=2,
                         num_generations=1).trained_policy()
    carry = policy.initial_carry()
    policy.act(carry, {"target": np.zeros(2, np.float32), "phase": 2})
    for phase in (-1, 3):
        with pytest.raises(ValueError, match=rf"observation\['phase'\] {phase} is outside Discrete\(3\)"):
            policy.act(carry, {"target": np.zeros(2, np.float32), "phase": phase})
    env = GymnasiumEnv(lambda: gymnasium.make("FrozenLake-v1"), "lake")
    assert env.observation(15).tolist() == [0.0] * 15 + [1.0]
    with pytest.raises(ValueError, match=r"observation -1 is outside Discrete\(16\)"):
        env.observation(-1)
    multi = GymnasiumEnv(lambda: MultiObs(), "multi")
    assert multi.observation(np.array([2, 0])).tolist() == [0, 0, 1, 1, 0, 0]
    with pytest.raises(ValueError, match=r"observation \[3, 0\] is outside MultiDiscrete"):
        multi.observation(np.array([3, 0]))  # flatten set the second component's first cell


class MultiObs(Target):
    def __init__(self):
        super().__init__()
        self.observation_space = gymnasium.spaces.MultiDiscrete([3, 3])
