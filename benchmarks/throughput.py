"""Env steps/s of a full jes generation next to the environment's random-action ceiling.

    python benchmarks/throughput.py [--envs CartPole-v1,Acrobot-v1] [--sizes 256,1024,4096] [--repeats 5]

For each env and batch size N (= population x episodes), in one process:

* ceiling: N gymnax envs stepped for 500 steps with random actions, no policy, in one
  compiled ``lax.scan`` (gymnax ``step_env``; finished envs reset, so every step is real);
* jes: one full generation (noise, GRU rollouts of N members, shaping, gradient, optax update;
  no centre evaluation) counting only real, un-padded env steps. Measured twice: at the
  initial policy (short CartPole episodes, the while-loop stops early) and after a few
  generations of training ("trained", longer episodes).

Prints medians over ``--repeats`` runs, the ratio jes / ceiling, compile times and memory
(XLA's temp allocation of the compiled generation, and the process's peak RSS).
"""
from __future__ import annotations

import argparse
import platform
import resource
import time

import jax
import jax.numpy as jnp
import numpy as np

import jes
from jes.loop import run

STEPS = 500


def median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def ceiling(env_name: str, n: int, repeats: int) -> tuple[float, float]:
    """Steps/s of N envs under random actions, and compile seconds."""
    spec = jes.make_env(env_name)
    env, params = spec.env, spec.params
    space = env.action_space(params)

    def rollout(key):
        obs, state = jax.vmap(env.reset_env, in_axes=(0, None))(jax.random.split(key, n), params)

        def body(state, key):
            k_act, k_step, k_reset = jax.random.split(key, 3)
            actions = jax.vmap(space.sample)(jax.random.split(k_act, n)) if not spec.discrete else \
                jax.random.randint(k_act, (n,), 0, spec.num_outputs)
            _, new, reward, term, _ = jax.vmap(env.step_env, in_axes=(None, 0, 0, None))(k_step, state, actions, params)
            done = jax.vmap(spec.done_after)(term, new)
            _, fresh = env.reset_env(k_reset, params)
            new = jax.tree.map(lambda f, s: jnp.where(done.reshape(done.shape + (1,) * (s.ndim - 1)), f, s), fresh, new)
            return new, reward.sum()

        state, rewards = jax.lax.scan(body, state, jax.random.split(key, STEPS))
        return rewards.sum()

    key = jax.random.key(0)
    t0 = time.perf_counter()
    compiled = jax.jit(rollout).lower(key).compile()
    compile_s = time.perf_counter() - t0
    seconds = median_time(lambda: compiled(key), repeats)
    return n * STEPS / seconds, compile_s


def jes_generation(env_name: str, n: int, repeats: int, train_gens: int, devices: int | None = None) -> dict:
    layers = 3 if env_name.startswith("Acrobot") else 2
    config = jes.ESConfig(num_members=n, eval_every=0)
    trainer = jes.Trainer(jes.GRUPolicy(hidden=5, layers=layers), env_name, "adam", config, devices=devices)
    state = trainer.init_state(0)
    compiled, compile_s = trainer.compiled_step(state)
    temp_mb = compiled.memory_analysis().temp_size_in_bytes / 2**20
    out = dict(params=trainer.num_params, compile_s=compile_s, temp_mb=temp_mb)
    for label, s in (("init", state), ("trained", None)):
        if s is None:
            s = run(trainer, state, num_generations=train_gens).state
        no, yes = jnp.bool_(False), jnp.bool_(True)
        steps = int(compiled(s, no, yes)[1]["env_steps"])
        seconds = median_time(lambda: compiled(s, no, yes), repeats)
        out[label] = (steps / seconds, steps / (n * trainer.spec.max_steps), seconds)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default="CartPole-v1,Acrobot-v1")
    parser.add_argument("--sizes", default="256,1024,4096")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--train-gens", type=int, default=5, help="generations trained before the 'trained' row")
    parser.add_argument("--compare-devices", action="store_true",
                        help="instead: jes on 1 device vs all local devices, side by side (set "
                             "XLA_FLAGS=--xla_force_host_platform_device_count=2 for two CPU devices)")
    args = parser.parse_args()
    if args.compare_devices:
        return compare_devices(args)
    print(f"# jax {jax.__version__}, backend {jax.default_backend()}, {len(jax.devices())} device(s): "
          f"{jax.devices()[0].device_kind}; {platform.processor() or platform.machine()}")
    print("| env | N | params | ceiling steps/s | jes steps/s (init) | ratio | real-step fraction | "
          "jes steps/s (trained) | ratio | real-step fraction | s/generation (trained) | compile s (jes / ceiling) | XLA temp MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for env_name in args.envs.split(","):
        for n in (int(s) for s in args.sizes.split(",")):
            ceil, ceil_compile = ceiling(env_name, n, args.repeats)
            j = jes_generation(env_name, n, args.repeats, args.train_gens)
            (init_sps, init_frac, _), (tr_sps, tr_frac, tr_s) = j["init"], j["trained"]
            print(f"| {env_name} | {n} | {j['params']} | {ceil:,.0f} | {init_sps:,.0f} | {init_sps / ceil:.2f} | "
                  f"{init_frac:.2f} | {tr_sps:,.0f} | {tr_sps / ceil:.2f} | {tr_frac:.2f} | {tr_s:.3f} | "
                  f"{j['compile_s']:.1f} / {ceil_compile:.1f} | {j['temp_mb']:.1f} |", flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak RSS of this process: {peak:.0f} MB")


def compare_devices(args):
    """Trained-policy generation throughput on 1 device vs all local devices (results are bit-identical)."""
    count = len(jax.devices())
    print(f"# jax {jax.__version__}, {count} local device(s)")
    print("| env | N | devices | jes steps/s (trained) | s/generation | speed-up |")
    print("|---|---|---|---|---|---|")
    for env_name in args.envs.split(","):
        for n in (int(s) for s in args.sizes.split(",")):
            base = None
            for devices in sorted({1, count}):
                sps, _, seconds = jes_generation(env_name, n, args.repeats, args.train_gens, devices)["trained"]
                base = base or sps
                print(f"| {env_name} | {n} | {devices} | {sps:,.0f} | {seconds:.3f} | {sps / base:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
