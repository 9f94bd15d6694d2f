import jax
import jax.numpy as jnp
import numpy as np

import jes
from jes.envs import make_env
from jes.policies import PolicyFns
from jes.rollout import compaction_sizes, run_episodes


def test_compaction_sizes():
    assert compaction_sizes(256) == [256, 64]
    assert compaction_sizes(1024, min_slots=16) == [1024, 256, 64, 16]
    assert compaction_sizes(8) == [8]


def test_compacted_rollout_returns_equal_uncompacted():
    """Gathering running episodes into smaller batches must not change any episode's return or length."""
    spec = make_env("CartPole-v1")
    fns = PolicyFns(jes.GRUPolicy(hidden=3, layers=1, num_outputs=2), spec.obs_shape)
    members, episodes = 32, 4
    params = jax.vmap(fns.init)(jax.random.split(jax.random.key(0), members))
    keys = jax.random.split(jax.random.key(1), members * episodes).reshape(members, episodes)
    active = jnp.arange(members) < 30     # two padding members too

    def go(min_slots):
        return jax.jit(lambda p, k, a: run_episodes(fns, spec, p, k, a, min_slots=min_slots,
                                                    collect_obs_stats=True))(params, keys, active)

    compacted, plain = go(8), go(10_000)
    assert len(compaction_sizes(members * episodes, 8)) == 3
    np.testing.assert_array_equal(compacted.returns, plain.returns)
    np.testing.assert_array_equal(compacted.steps, plain.steps)
    np.testing.assert_array_equal(compacted.obs_sum, plain.obs_sum)       # bit for bit, not just close
    np.testing.assert_array_equal(compacted.obs_sumsq, plain.obs_sumsq)
    assert np.all(np.asarray(plain.obs_sumsq) > 0)
    lengths = np.asarray(plain.steps[:30])
    assert lengths.max() > 3 * lengths.min(), lengths   # episodes end at very different times
    np.testing.assert_array_equal(plain.steps[30:], 0)


def test_trainer_results_do_not_depend_on_rollout_min_batch():
    def params(min_batch):
        trainer = jes.Trainer(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1", "adam",
                              jes.ESConfig(num_members=64, chunk_size=64, num_generations=2, eval_episodes=4),
                              rollout_min_batch=min_batch)
        return jes.loop.run(trainer, trainer.init_state(1), key=1).flat_params

    np.testing.assert_array_equal(params(4), params(64))


def test_fixed_length_envs_compile_no_compaction_levels_and_keep_their_bits():
    """Pendulum never ends an episode itself (gymnax's is_terminated is the constant False): its rollout has one
    batch level instead of three, with the same bits; a wrong hint (CartPole's episodes do end early) costs
    speed, never bits."""
    import dataclasses

    for name, fixed in (("Pendulum-v1", True), ("CartPole-v1", False)):
        spec = make_env(name)
        assert spec.fixed_length is fixed, name
        fns = PolicyFns(jes.MLPPolicy(hidden_sizes=(4,), num_outputs=spec.num_outputs), spec.obs_shape)
        members, episodes = 32, 2
        params = jax.vmap(fns.init)(jax.random.split(jax.random.key(0), members))
        keys = jax.random.split(jax.random.key(1), members * episodes).reshape(members, episodes)
        active = jnp.arange(members) < 30     # two padding members too

        def go(s):
            run = jax.jit(lambda p, k, a: run_episodes(fns, s, p, k, a, min_slots=4, collect_obs_stats=True))
            return run(params, keys, active), run.lower(params, keys, active).as_text().count("stablehlo.while")

        (hinted, hinted_loops), (plain, plain_loops) = go(dataclasses.replace(spec, fixed_length=True)), \
            go(dataclasses.replace(spec, fixed_length=False))
        assert hinted_loops < plain_loops, (name, hinted_loops, plain_loops)
        for a, b in zip(jax.tree.leaves(hinted), jax.tree.leaves(plain)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))    # bit for bit
        np.testing.assert_array_equal(hinted.steps[30:], 0)
