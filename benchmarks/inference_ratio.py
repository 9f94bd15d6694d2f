"""ES against batch inference: env steps/s of a whole jes generation vs the same episodes with ONE parameter set.

For each policy size and population, side by side in one process:

* (a) jes full rank: the compiled generation step (sample, rollout, update), members with their own weights;
* (b) jes low rank (EGGROLL), r = 1 and 4: the same step, a shared GEMM plus each member's rank-r correction;
* (c) batch inference: the same rollout (same env, episodes, slots and compaction) with one shared parameter
  set, the policy applied as one GEMM per env step, no noise and no update.

Every program is compiled as ``jes.train`` compiles its step (threefry unrolled, :mod:`jes.threefry`). jes's
rows with the step's XLA options; batch inference with XLA's defaults on a CPU, and on a GPU with the options jes
compiles with there (:func:`jes.cpu.gpu_compiler_options`: loops and conditionals in XLA's CUDA graphs), so that
neither side gains from an option the other lacks.

Printed: env steps/s, the median over ``--seeds`` (one run per key) of each seed's median over ``--repeats``
timed generations (after one warm-up), and the ratios (a)/(c), (b)/(c) as median [min, max] over the seeds. The
rows take turns generation by generation, so a change of this machine's load falls on every row alike; full rank
takes its turns with its own inference row after the others (the rows timed between its generations ran slower).
The centre is not evaluated in the timed generations. Full rank is skipped where its
members would stream more than ``--full-rank-limit`` parameter floats per env step (C x P; it is then
memory-bound and takes minutes per generation here).

With ``--breakdown`` it splits instead, per cell and rank, a low-rank generation's time into its parts against
batch inference's rollout (each part its own compiled program, all taking turns): the member draw (``sample``),
the rollout of the draw's members (``rollout``, the draw included), the update from a fitness vector
(``update``), the whole step; and the policy's forward pass alone, ``--forward-steps`` env steps of the
population's first observations fed back into the policy (no env, no compaction; ``forward / inf``), so that
what the generation loses to batch inference can be told apart: the forward's correction, or the rest
(episodes the members' policies play longer than the shared one's, the draw and the update). ``env steps, jes / inf``
is the env steps the members' episodes took against the centre's on the same keys (not a timing: where it is below 1
the members' episodes hold fewer steps, and a rollout as long as inference's counts fewer steps/s), and ``longest
episode, jes / inf`` the range over seeds of each rollout's longest episode: the rollout steps its last slots
(compacted to ``rollout_min_batch``) until that one ends. With ``--profile DIR``
it then traces the step, the update, batch inference and both forward loops with JAX's profiler (on a GPU its
kernels, on the CPU XLA's thunks) and prints each part's top events per call; the traces are taken one part after another, not in
turns as the timings are, so a change of the machine's load between them shows as a difference between parts
(compare events within one trace). With ``--skip-corrections conv,dense`` (a diagnostic, not
a way to train) the named layers' low-rank corrections are left out of every jes part: the members keep their
vector leaves' noise and apply the shared matrices alone, so the parts show what the generation would cost were
those corrections free.

With ``--fixed-length`` every episode runs ``--max-steps`` steps, the env's own termination left out (the game
steps on from a terminal state): jes and batch inference then do the same work per episode, so the ratio is what
a step costs each, apart from how long the members' episodes are against the centre's. (MinAtar Breakout's
episodes are 6-28 steps at a new policy's play, and the members' longest outlast the centre's: a generation is
then some 20 steps deep, and its draw and update (batch inference has neither) and the members' longer episodes
weigh beside the forward pass's corrections. Pendulum's episodes are all 200 steps anyway.)

With ``--compare-forms`` it times instead, per cell and rank, low rank with every slot in its own form against
the compact form (a mirrored pair's slots sharing one draw in the rollout's first batch; jes picks it for
large rank-1 members, ``jes.perturbations.low_rank.COMPACT_MIN_DRAW``), and prints compact / per-slot.

    python benchmarks/inference_ratio.py                           # Pendulum MLP H x H, H in 64, 256, 1024
    python benchmarks/inference_ratio.py --envs minatar --hidden 64 --members 512
    python benchmarks/inference_ratio.py --envs minatar --fixed-length --hidden 256 --members 512
    python benchmarks/inference_ratio.py --limit 1e10 --chunk-size all             # on a GPU: one chunk
    python benchmarks/inference_ratio.py --compare-forms --members 512 --ranks 1
    python benchmarks/inference_ratio.py --breakdown --envs minatar --hidden 256 --members 512 --ranks 1
    python benchmarks/inference_ratio.py --breakdown --profile /tmp/traces --hidden 256 --members 512 --ranks 1
    python benchmarks/inference_ratio.py --breakdown --skip-corrections conv --envs minatar --hidden 256 --ranks 1
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import statistics
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

try:
    from jax import shard_map
except ImportError:  # older jax
    from jax.experimental.shard_map import shard_map

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jes  # noqa: E402
from jes.perturbations import low_rank  # noqa: E402
from jes.rollout import run_slots  # noqa: E402
from jes.strategies import noise  # noqa: E402
from jes.threefry import UnrolledJit  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import print_load, print_provenance  # noqa: E402


class MinAtarCNN(nn.Module):
    """A MinAtar-sized CNN: one 3x3 conv with ``channels`` filters, then a ``hidden`` dense layer and the head."""

    channels: int = 16
    hidden: int = 64
    num_outputs: int | None = None

    @nn.compact
    def __call__(self, obs):
        x = nn.relu(nn.Conv(self.channels, (3, 3), padding="VALID")(obs.astype(jnp.float32)))
        x = nn.relu(nn.Dense(self.hidden)(x.reshape(-1)))
        return nn.Dense(self.num_outputs)(x)


class SharedParams:
    """The rollout's view of slots that all use one parameter set (closed over: one GEMM per step)."""

    def __init__(self, fns, variables):
        self.fns, self.variables = fns, variables

    def initial_carry(self):
        return self.fns.initial_carry()

    def apply(self, _, carry, obs):
        return self.fns.apply(self.variables, carry, obs)


def trainer_for(policy, env, config):
    """The cell's jes run. With several devices, chunks that give every device members where the default chunk would
    leave some idle: the ``chunk_size`` jes's own warning advises then (``jes.loop._warn_idle_devices``)."""
    trainer = jes.Trainer(policy, env, "adam", config)
    devices = len(trainer.devices)
    if devices > 1 and config.chunk_size is None and trainer.num_chunks < devices:
        spread = trainer.fit_chunk_size(math.ceil(config.num_members / devices))
        trainer = jes.Trainer(policy, env, "adam", dataclasses.replace(config, chunk_size=spread))
    return trainer


def generation_timer(trainer, seeds):
    """``time(seed) -> (seconds, env steps)`` of one more generation of ``seed``'s run (compiled and warmed here)."""
    states = {}
    step = None
    for seed in seeds:
        state = trainer.init_state(seed)
        step = step or trainer.compiled_step(state)[0]  # the program jes.train runs (threefry unrolled)
        state, _ = step(state, jnp.bool_(False), jnp.bool_(True))  # warm-up
        states[seed] = jax.block_until_ready(state)

    def time_one(seed):
        start = time.perf_counter()
        state, metrics = step(states[seed], jnp.bool_(False), jnp.bool_(True))
        jax.block_until_ready(state)
        seconds = time.perf_counter() - start
        states[seed] = state
        return seconds, int(metrics["env_steps"])

    time_one.generation = lambda seed: int(states[seed].generation)
    return time_one


def inference_options():
    """XLA options of batch inference's programs: jes's own on a GPU, XLA's defaults elsewhere (see above)."""
    return jes.cpu.gpu_compiler_options() if jax.default_backend() == "gpu" else None


def inference_timer(trainer, seeds, generation_of):
    """``time(seed) -> (seconds, env steps)``: the members' episodes of the generation ``generation_of(seed)`` of
    ``seed``'s run would evaluate next (same keys, slots and compaction), with the centre's parameters."""
    states = {seed: trainer.init_state(seed) for seed in seeds}

    def episodes(flat, keys, obs_scale):
        shared = SharedParams(trainer.fns, trainer.unravel(flat))
        slot_params = jnp.zeros((keys.shape[0], 0), jnp.float32)
        out = run_slots(shared, trainer.spec, slot_params, keys, jnp.zeros(keys.shape[0], bool),
                        obs_scale=obs_scale, min_slots=trainer.rollout_min_batch)
        return out["returns"], out["steps"].sum()[None]

    # With several devices each plays its contiguous share of the episodes, as jes's chunks on its devices do
    on_devices = episodes if len(jax.devices()) == 1 else shard_map(
        episodes, mesh=Mesh(np.array(jax.devices()), ("devices",)), in_specs=(P(), P("devices"), P()),
        out_specs=(P("devices"), P("devices")), check_vma=False)

    @functools.partial(UnrolledJit, compiler_options=inference_options())
    def rollout(flat, es_key, generation):
        members = jnp.arange(trainer.config.num_members, dtype=jnp.int32)
        keys = noise.episode_keys(noise.generation_key(es_key, generation), members, 1, trainer.antithetic)
        returns, steps = on_devices(flat, keys.reshape(-1), trainer.obs_scale(states[seeds[0]]))
        return returns, steps.sum()

    def time_one(seed):
        state = states[seed]
        args = (state.params, state.es_key, jnp.int32(generation_of(seed)))
        start = time.perf_counter()
        _, total = jax.block_until_ready(rollout(*args))
        return time.perf_counter() - start, int(total)

    for seed in seeds:
        time_one(seed)  # compile (first seed) + warm-up
    return time_one


def measure(timers, seeds, repeats, per_second=True):
    """Every row timed in turn, generation by generation (so a change of the machine's load falls on all rows
    alike): ``{row: [[steps/s of each repeat] of each seed]}`` (``per_second=False``: ``(seconds, steps)``)."""
    rates = {name: [[] for _ in seeds] for name in timers}
    for _ in range(repeats):
        for i, seed in enumerate(seeds):
            for name, time_one in timers.items():
                seconds, steps = time_one(seed)
                rates[name][i].append(steps / seconds if per_second else (seconds, steps))
    return rates


def forced_form(trainer, compact: bool):
    """``trainer`` with its low-rank members in one form whatever their size (see ``--compare-forms``)."""
    trainer.member_fns = lambda centre: low_rank.FactoredMembers(trainer.fns, trainer.ctx.layout,
                                                                  trainer.unravel(centre), compact=compact)
    return trainer


def compare_forms(args, ranks, seeds) -> None:
    print("| env / policy | P | members | r | draw floats | default | per-slot | compact | compact / per-slot |")
    print("|" + "---|" * 9)
    for policy, env, label, members, base in cells(args):
        for r in ranks:
            config = jes.ESConfig(**base, perturbation=jes.LowRank(r))
            trainers = {form: forced_form(jes.Trainer(policy, env, "adam", config), form == "compact")
                        for form in ("per-slot", "compact")}
            some = trainers["compact"]
            if members * some.num_params > args.limit:
                print(f"| {label} | {some.num_params:,} | {members} | {r} | skipped (--limit) |")
                continue
            default = "compact" if low_rank.compact_by_default(some.ctx.layout) else "per-slot"
            rates = measure({form: generation_timer(t, seeds) for form, t in trainers.items()}, seeds,
                            args.repeats)
            each = [statistics.median(a / b for a, b in zip(c, p))
                    for c, p in zip(rates["compact"], rates["per-slot"])]
            fmt = lambda form: f"{statistics.median(statistics.median(x) for x in rates[form]):,.0f}"
            print(f"| {label} | {some.num_params:,} | {members} | {r} | {some.ctx.layout.draw_size:,} | "
                  f"{default} | {fmt('per-slot')} | {fmt('compact')} | {statistics.median(each):.2f} "
                  f"[{min(each):.2f}, {max(each):.2f}] |", flush=True)


def breakdown_timers(trainer, seeds, forward_steps):
    """``{part: time(seed) -> (seconds, env steps or 0)}`` of a low-rank generation's parts (see ``--breakdown``)."""
    states, step = {}, None
    for seed in seeds:  # the state after one generation: the timed parts then see a trained centre's episodes
        state = trainer.init_state(seed)
        step = step or trainer.compiled_step(state)[0]  # the program jes.train runs (threefry unrolled)
        state, _ = step(state, jnp.bool_(False), jnp.bool_(True))
        states[seed] = jax.block_until_ready(state)
    members = trainer.config.num_members
    flat_members = jnp.arange(members, dtype=jnp.int32)

    def keys_of(state):
        gen_key = noise.generation_key(state.es_key, state.generation)
        return noise.episode_keys(gen_key, flat_members, 1, trainer.antithetic).reshape(-1)

    def rollout_of(params_view, slot_params, state):
        keys = keys_of(state)
        out = run_slots(params_view, trainer.spec, slot_params, keys, jnp.zeros(keys.shape[0], bool),
                        obs_scale=trainer.obs_scale(state), min_slots=trainer.rollout_min_batch)
        return out["returns"], out["steps"].sum(), out["steps"].max()

    # jes's parts compiled with the step's XLA options (as jes.train compiles them); batch inference with its own
    as_jes = lambda fn: UnrolledJit(fn, compiler_options=trainer.step_compiler_options)

    @as_jes
    def sample(state):
        return trainer.sample_chunk(state, jnp.int32(0))[0]

    @as_jes
    def rollout(state):
        view = trainer.member_fns(state.params)
        return rollout_of(view, view.slot_params(trainer.sample_chunk(state, jnp.int32(0))[0]), state)

    @functools.partial(UnrolledJit, compiler_options=inference_options())
    def inference(state):
        return rollout_of(SharedParams(trainer.fns, trainer.unravel(state.params)),
                          jnp.zeros((members, 0), jnp.float32), state)

    fitness = jax.random.normal(jax.random.key(1), (members,))
    update = as_jes(trainer.apply_fitness)

    def forward_loop(forward, options):
        def run(params, obs, carry):
            def body(_, oc):
                obs, carry = oc
                carry, out = forward(params, carry, obs)
                return obs + 1e-3 * out.sum(-1).reshape((-1,) + (1,) * (obs.ndim - 1)), carry
            return jax.lax.fori_loop(0, forward_steps, body, (obs, carry))
        return UnrolledJit(run, compiler_options=options)

    first_obs = {}
    for seed, state in states.items():
        obs, _ = jax.vmap(lambda k: trainer.spec.env.reset_env(jax.random.fold_in(k, 0), trainer.spec.params))(
            keys_of(state))
        first_obs[seed] = obs.astype(jnp.float32)
    carry = jax.tree.map(lambda c: jnp.broadcast_to(c, (members,) + c.shape), trainer.fns.initial_carry())
    view_of = lambda state: trainer.member_fns(state.params)
    low_rank_forward = forward_loop(lambda p, c, o: view_of(p[1]).apply_batch(p[0], c, o), trainer.step_compiler_options)
    shared_forward = forward_loop(lambda p, c, o: jax.vmap(SharedParams(trainer.fns, trainer.unravel(p)).apply,
                                                           in_axes=(None, 0, 0))(p, c, o), inference_options())
    slot_params = {seed: as_jes(lambda st: view_of(st).slot_params(sample(st)))(st) for seed, st in states.items()}

    longest = {"rollout": {}, "inf": {}}  # each seed's longest episode (env steps) in the two rollouts

    def timed(fn, steps_of=None, longest_of=None):
        def time_one(seed):
            start = time.perf_counter()
            out = jax.block_until_ready(fn(seed))
            seconds = time.perf_counter() - start
            if longest_of is not None:
                longest_of[seed] = int(out[2])
            return seconds, int(steps_of(out)) if steps_of else 0
        for seed in seeds:
            time_one(seed)  # compile (first seed) + warm-up
        return time_one

    return {
        "step": timed(lambda s: step(states[s], jnp.bool_(False), jnp.bool_(True)), lambda out: out[1]["env_steps"]),
        "sample": timed(lambda s: sample(states[s])),
        "rollout": timed(lambda s: rollout(states[s]), lambda out: out[1], longest["rollout"]),
        "update": timed(lambda s: update(states[s], fitness)),
        "inf": timed(lambda s: inference(states[s]), lambda out: out[1], longest["inf"]),
        "forward": timed(lambda s: low_rank_forward((slot_params[s], states[s]), first_obs[s], carry)),
        "forward inf": timed(lambda s: shared_forward(states[s].params, first_obs[s], carry)),
    }, longest


def breakdown(args, ranks, seeds) -> None:
    print("| env / policy | members | r | step ms | sample ms | rollout ms | update ms | inference rollout ms | "
          "env steps, jes / inf | longest episode, jes / inf | rollout / inf | step / inf | forward / inf |")
    print("|" + "---|" * 13)
    for policy, env, label, members, base in cells(args):
        for r in ranks:
            trainer = jes.Trainer(policy, env, "adam", jes.ESConfig(**base, perturbation=jes.LowRank(r)))
            if members * trainer.num_params > args.limit or trainer.num_chunks != 1:
                print(f"| {label} | {members} | {r} | skipped: members x P above --limit, or more than one chunk |")
                continue
            LEFT_OUT.clear()
            timers, longest = breakdown_timers(trainer, seeds, args.forward_steps)  # traces (and compiles) every part
            raw = measure(timers, seeds, args.repeats, per_second=False)
            ms = lambda name: statistics.median(statistics.median(t for t, _ in x) for x in raw[name]) * 1e3

            def ratio(mine, inf, per_step):
                # env steps/s where both count env steps (their episodes differ), else inverse time
                speed = (lambda t, n: n / t) if per_step else (lambda t, n: 1.0 / t)
                each = [statistics.median(speed(*m) / speed(*i) for m, i in zip(a, b))
                        for a, b in zip(raw[mine], raw[inf])]
                return f"{statistics.median(each):.2f} [{min(each):.2f}, {max(each):.2f}]"

            span = lambda by_seed: "-".join(dict.fromkeys(str(f(by_seed.values())) for f in (min, max)))  # "16", "26-28"
            # the members' episodes against the centre's (the same keys): steps each rollout counted, per seed
            work = [x[0][1] / y[0][1] for x, y in zip(raw["rollout"], raw["inf"])]
            print(f"| {label} | {members} | {r} | {ms('step'):.1f} | {ms('sample'):.1f} | {ms('rollout'):.1f} | "
                  f"{ms('update'):.1f} | {ms('inf'):.1f} | {statistics.median(work):.2f} [{min(work):.2f}, "
                  f"{max(work):.2f}] | {span(longest['rollout'])} / {span(longest['inf'])} | "
                  f"{ratio('rollout', 'inf', True)} | "
                  f"{ratio('step', 'inf', True)} | {ratio('forward', 'forward inf', False)} |", flush=True)
            missing = [name for name in args.skip_corrections or () if name not in LEFT_OUT]
            if missing:
                print(f"  (--skip-corrections: {label} has no factored {' or '.join(missing)} layer; nothing of "
                      f"it was left out)", flush=True)
            if args.profile:
                for part in ("step", "update", "inf", "forward", "forward inf"):
                    profile(timers[part], seeds[0], args.repeats,
                            os.path.join(args.profile, f"{label.replace(' ', '')}-{members}-r{r}-{part.replace(' ', '-')}"))


# --skip-corrections: the layer types whose corrections a diagnostic run leaves out
CORRECTED_LAYERS = {"conv": (nn.Conv,), "dense": (nn.Dense, nn.DenseGeneral), "embed": (nn.Embed,)}


def skip_corrections(names: list[str]) -> None:
    """``--skip-corrections``: from now on in this process, the named layers' low-rank corrections are left out
    (their output is the shared matrices' alone). A diagnostic: it bounds what the corrections cost."""
    correction = low_rank._correction

    def without_skipped(module, x, out, a_t, b_t, inner):
        for name in names:
            if isinstance(module, CORRECTED_LAYERS[name]):
                LEFT_OUT.add(name)
                return out
        return correction(module, x, out, a_t, b_t, inner)

    low_rank._correction = without_skipped


# --skip-corrections: the layer kinds whose corrections were left out since the set was last cleared
LEFT_OUT: set[str] = set()


def layer_names_arg(value: str) -> list[str]:
    """``--skip-corrections``: comma-separated names among :data:`CORRECTED_LAYERS`."""
    names = [v for v in value.split(",") if v]
    unknown = [n for n in names if n not in CORRECTED_LAYERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{value!r}: give layer kinds among {', '.join(CORRECTED_LAYERS)}, "
                                         f"comma-separated")
    return names


def profile(time_one, seed, calls, directory, top=20) -> None:
    """``--profile``: JAX's profiler over ``calls`` calls of one part (a Perfetto trace kept in ``directory``), and
    its ``top`` events by time per call: the XLA programs' kernels or thunks, then anything else the trace holds."""
    import collections
    import glob
    import gzip
    import json

    with jax.profiler.trace(directory, create_perfetto_trace=True):
        for _ in range(calls):
            time_one(seed)
    path = glob.glob(os.path.join(directory, "**", "*perfetto_trace.json.gz"), recursive=True)
    if not path:
        print(f"  {directory}: no Perfetto trace written", flush=True)
        return
    events = json.load(gzip.open(path[0]))
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    total, count = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") == "X" and "dur" in e and not e["name"].startswith("$"):  # "$": Python frames
            key = (names.get(e["pid"], str(e["pid"]))[:28], e["name"][:100])
            total[key] += e["dur"]
            count[key] += 1
    print(f"  {os.path.basename(directory)}: top events, ms and occurrences per call ({calls} calls; trace in "
          f"{directory})", flush=True)
    for (process, name), us in total.most_common(top):
        print(f"  {us / calls / 1e3:9.3f} ms {count[(process, name)] / calls:8.1f}x  {process:28s} {name}", flush=True)


def cells(args):
    """``(policy, env, label, members, base config fields)`` of every cell the arguments ask for, in table order."""
    for env_name in args.envs.split(","):
        for hidden in (int(h) for h in args.hidden.split(",")):
            for members in (int(m) for m in args.members.split(",")):
                policy, env, label = workload(env_name, hidden)
                if args.fixed_length:
                    env, label = fixed_length(env), f"{label}, fixed length"
                chunk = members if args.chunk_size == "all" else (int(args.chunk_size) if args.chunk_size else None)
                yield policy, env, label, members, dict(num_members=members, eval_episodes=2, chunk_size=chunk,
                                                        max_episode_steps=args.max_steps, normalize_observations=False)


def workload(env: str, hidden: int):
    if env == "pendulum":
        return jes.MLPPolicy((hidden, hidden)), "Pendulum-v1", f"MLP {hidden}x{hidden}"
    if env == "minatar":
        return MinAtarCNN(hidden=hidden), "Breakout-MinAtar", f"CNN 16c3x3 + {hidden}"
    raise ValueError(env)


WORKLOADS = ("pendulum", "minatar")


class FixedLength:
    """A gymnax env whose episodes only its time limit ends (``--fixed-length``): its termination is left out, and
    the game steps on from a terminal state (its rewards there count too). Every episode then runs ``--max-steps``
    steps whatever the policy, so jes and batch inference do the same work per episode: what differs is only what
    a step of each costs, not how long the members' episodes are against the centre's."""

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):
        return getattr(self._env, name)

    def step_env(self, key, state, action, params):
        obs, state, reward, done, info = self._env.step_env(key, state, action, params)
        return obs, state, reward, jnp.zeros_like(done), info

    def is_terminated(self, state, params):
        return False


def fixed_length(env_id: str):
    """``(env, params)`` of the gymnax env ``env_id`` with its termination left out (:class:`FixedLength`)."""
    import gymnax

    env, params = gymnax.make(env_id)
    return FixedLength(env), params


def env_names_arg(value: str) -> str:
    """``--envs``: comma-separated names among :data:`WORKLOADS`."""
    unknown = [v for v in value.split(",") if v not in WORKLOADS]
    if unknown or not value:
        raise argparse.ArgumentTypeError(f"{value!r}: give envs among {', '.join(WORKLOADS)}, comma-separated")
    return value


def chunk_size_arg(value: str) -> str:
    """``--chunk-size``: a positive even number of members, or ``all``."""
    if value != "all" and not (value.isdigit() and int(value) > 0 and int(value) % 2 == 0):
        raise argparse.ArgumentTypeError(f"{value!r}: give a positive even number of members (mirrored pairs), or all")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default="pendulum", type=env_names_arg, help="pendulum and/or minatar, comma-separated")
    parser.add_argument("--hidden", default="64,256,1024")
    parser.add_argument("--members", default="512,4096")
    parser.add_argument("--ranks", default="1,4")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="runs (keys) per cell; rows take turns on each")
    parser.add_argument("--repeats", type=int, default=2, help="timed generations per seed and row")
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--fixed-length", action="store_true",
                        help="every episode runs --max-steps steps: the env's termination left out (see above)")
    parser.add_argument("--full-rank-limit", type=float, default=1.5e8,
                        help="skip full rank above this many member parameter floats (members x P)")
    parser.add_argument("--limit", type=float, default=5e8,
                        help="skip a whole cell above this many GEMM multiply-adds per env step (members x P)")
    parser.add_argument("--breakdown", action="store_true",
                        help="split a low-rank generation's time into its parts against inference (see above)")
    parser.add_argument("--forward-steps", type=int, default=20, help="--breakdown: policy steps of the forward loop")
    parser.add_argument("--profile", metavar="DIR", default=None,
                        help="--breakdown: then trace the step, the update, batch inference and the forward loops with JAX's profiler "
                             "(Perfetto traces under DIR) and print each one's top events per call")
    parser.add_argument("--skip-corrections", metavar="LAYERS", type=layer_names_arg, default=None,
                        help="--breakdown, a diagnostic: leave these layers' low-rank corrections out of jes's parts "
                             f"({', '.join(CORRECTED_LAYERS)}; comma-separated): what the rest costs")
    parser.add_argument("--compare-forms", action="store_true",
                        help="time low rank's per-slot and compact forms against each other instead (see above)")
    parser.add_argument("--chunk-size", default=None, type=chunk_size_arg,
                        help="members per chunk of jes's rows (ESConfig.chunk_size; 'all': one chunk of the whole "
                             "population, as on a GPU); default: jes's own (other bits than another chunk size)")
    parser.add_argument("--cpu-devices", type=int, default=1,
                        help="XLA CPU devices, every row sharded over them (jes train makes one per core: "
                             "jes.use_cpu_cores); with more than one, chunks that give every device members")
    args = parser.parse_args()
    print_provenance()
    if args.chunk_size == "all" and args.cpu_devices > 1:
        parser.error("--chunk-size all makes one chunk, which runs on one device: give a size, or leave out --cpu-devices")
    if args.profile and not args.breakdown:
        parser.error("--profile profiles --breakdown's parts: add --breakdown")
    if args.skip_corrections and not args.breakdown:
        parser.error("--skip-corrections is a diagnostic of --breakdown's parts: add --breakdown")
    if args.cpu_devices > 1 and (args.breakdown or args.compare_forms):
        parser.error("--breakdown and --compare-forms time one chunk on one device: leave out --cpu-devices")
    if args.cpu_devices > 1 and jes.use_cpu_cores(args.cpu_devices) is None:
        parser.error(f"--cpu-devices {args.cpu_devices}: the device count is already set (XLA_FLAGS or "
                     f"jax_num_cpu_devices); unset it")
    ranks = [int(r) for r in args.ranks.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    if args.compare_forms:
        print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, {os.cpu_count()} CPUs; env steps/s, median "
              f"over seeds {args.seeds} of each seed's median of {args.repeats} generations; compact / per-slot per "
              f"seed and generation (the forms take turns), median [min, max] over seeds")
        return compare_forms(args, ranks, seeds)
    if args.breakdown:
        print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, {os.cpu_count()} CPUs; ms: median over seeds "
              f"{args.seeds} of each seed's median of {args.repeats} calls (the parts take turns); ratios: per seed and "
              f"call, median [min, max] over seeds (rollout and step: env steps/s; forward: time per step); env steps: the "
              f"members' episodes' against the centre's, per seed; longest episode: its range over the seeds"
              + (f"; DIAGNOSTIC: the low-rank corrections of {', '.join(args.skip_corrections)} layers left out"
                 if args.skip_corrections else ""))
        if args.skip_corrections:
            skip_corrections(args.skip_corrections)
        return breakdown(args, ranks, seeds)
    chunks = "jes's default chunks" if args.chunk_size is None else f"--chunk-size {args.chunk_size}"
    print(f"jax {jax.__version__}, {len(jax.devices())} x {jax.devices()[0].device_kind}, {os.cpu_count()} CPUs, {chunks}; "
          f"env steps/s, median over seeds {args.seeds} of each seed's median of {args.repeats} generations; ratios per seed and generation "
          f"(the rows take turns), median [min, max] over seeds")
    header = ["env / policy", "P", "members", "full rank", *[f"low rank r={r}" for r in ranks], "inference",
              "full / inf", *[f"r={r} / inf" for r in ranks]]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for policy, env, label, members, base in cells(args):
        trainers = {"full": trainer_for(policy, env, jes.ESConfig(**base))}
        num_params = trainers["full"].num_params
        if members * num_params > args.limit:
            print(f"| {label} | {num_params:,} | {members} | skipped: members x P = "
                  f"{members * num_params:.1e} per step is beyond this machine's time budget |")
            continue
        full = trainers.pop("full")
        full = full if members * num_params <= args.full_rank_limit else None
        for r in ranks:
            trainers[r] = trainer_for(policy, env, jes.ESConfig(**base, perturbation=jes.LowRank(r)))
        timers = {name: generation_timer(trainer, seeds) for name, trainer in trainers.items()}
        # the episodes of the generation the first row evaluates next (the rows' generations stay in step)
        first = next(iter(timers.values()))
        rates = measure({"inf": inference_timer(full or trainers[ranks[0]], seeds, first.generation), **timers},
                        seeds, args.repeats)
        inf_of = {name: rates["inf"] for name in rates}
        if full is not None:
            # Full rank takes its turns with its own inference row, after the others: its generations stream C x P
            # floats, and the rows timed after them ran slower (CNN 16c3x3 + 256, 512 members: low rank r = 1 at
            # 0.52x inference between full-rank generations, 0.73x without them; seeds 0-4, 2026-12-03).
            full_timer = generation_timer(full, seeds)
            full_rates = measure({"inf": inference_timer(full, seeds, full_timer.generation), "full": full_timer},
                                 seeds, args.repeats)
            rates["full"], inf_of["full"] = full_rates["full"], full_rates["inf"]
        per_seed = lambda name: [statistics.median(r) for r in rates[name]]
        fmt = lambda name: f"{statistics.median(per_seed(name)):,.0f}" if name in rates else "skipped"

        def ratio(name):
            if name not in rates:
                return "-"
            each = [statistics.median(a / b for a, b in zip(mine, inf))
                    for mine, inf in zip(rates[name], inf_of[name])]
            return f"{statistics.median(each):.2f} [{min(each):.2f}, {max(each):.2f}]"

        row = [label, f"{num_params:,}", str(members), fmt("full"), *[fmt(r) for r in ranks], fmt("inf"),
               ratio("full"), *[ratio(r) for r in ranks]]
        print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
    print_load()
