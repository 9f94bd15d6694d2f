import json
import os
import subprocess
import sys
import textwrap

import pytest


def devices_in_fresh_process(code: str, **env) -> str:
    full_env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JES_CPU_DEVICES")}
    full_env.update(env, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1]


def test_use_cpu_cores_splits_the_cpu_before_jax_starts():
    out = devices_in_fresh_process("""
        import jax, jes
        from jes.cpu import use_cpu_cores
        asked = use_cpu_cores(3)
        print(asked, len(jax.devices()))
    """)
    assert out == "3 3"


def test_respects_user_settings_and_a_running_backend():
    out = devices_in_fresh_process("""
        import jax
        from jes.cpu import use_cpu_cores
        print(use_cpu_cores(), len(jax.devices()))
    """, JES_CPU_DEVICES="1")
    assert out == "None 1"
    out = devices_in_fresh_process("""
        import jax
        from jes.cpu import use_cpu_cores
        print(use_cpu_cores(4), len(jax.devices()))
    """, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    assert out == "None 2"
    out = devices_in_fresh_process("""
        import jax, jax.numpy as jnp
        jnp.zeros(1).block_until_ready()          # backend already running
        from jes.cpu import use_cpu_cores
        print(use_cpu_cores(4), len(jax.devices()))
    """)
    assert out == "None 1"


def test_bad_env_value_is_explained(monkeypatch):
    from jes.cpu import use_cpu_cores

    monkeypatch.setenv("JES_CPU_DEVICES", "two")
    with pytest.raises(ValueError, match="JES_CPU_DEVICES must be an integer"):
        use_cpu_cores()


def test_a_jaxlib_without_the_older_emitters_gets_the_newer_ones_as_jes_compiles_them(monkeypatch):
    # jaxlib 0.11 dropped xla_cpu_use_fusion_emitters: asking for it failed every compile ("No such compile option")
    import jax
    from jes import cpu

    real = cpu._knows_option
    monkeypatch.setattr(cpu, "_knows_option", lambda name, value: name != cpu.OLDER_EMITTERS_OPTION and real(name, value))
    options = cpu.compiler_options(jax.devices("cpu"))
    assert cpu.OLDER_EMITTERS_OPTION not in options
    assert options == cpu.compiler_options(jax.devices("cpu"), fusion_emitters=True)
    assert set(options["xla_disable_hlo_passes"].split(",")) == set(cpu.NEWER_EMITTERS_PASSES)
    assert jax.jit(lambda x: x * 2, compiler_options=options)(1.0) == 2.0


def test_gpus_compile_with_loops_and_conditionals_in_cuda_graphs_other_accelerators_with_xla_defaults(monkeypatch):
    # On an H200 the rollout's while loop and the step's conds each waited on the host without them (same bits with)
    from jes import cpu

    gpu, tpu = type("Gpu", (), {"platform": "gpu"})(), type("Tpu", (), {"platform": "tpu"})()
    monkeypatch.delenv(cpu.GPU_GRAPH_LOOPS_ENV, raising=False)
    monkeypatch.setattr(cpu, "_knows_option", lambda name, value, platform="cpu": platform == "gpu")
    assert cpu.compiler_options([gpu, gpu]) == {cpu.GPU_COMMAND_BUFFER_OPTION: cpu.GPU_COMMAND_BUFFER_TYPES}
    assert {"FUSION", "CUBLAS", "WHILE", "CONDITIONAL"} <= set(cpu.GPU_COMMAND_BUFFER_TYPES.split(","))
    assert cpu.compiler_options([tpu]) is None and cpu.compiler_options([gpu, tpu]) is None
    monkeypatch.setenv(cpu.GPU_GRAPH_LOOPS_ENV, "0")  # the user's way out, should a driver mishandle them
    assert cpu.compiler_options([gpu]) is None
    monkeypatch.delenv(cpu.GPU_GRAPH_LOOPS_ENV)
    monkeypatch.setattr(cpu, "_knows_option", lambda *args: False)  # a GPU compiler that refuses the option
    assert cpu.compiler_options([gpu]) is None


def test_the_gpu_options_probe_answers_none_without_a_gpu():
    import jax
    from jes import cpu

    if any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("this machine has a GPU")
    assert cpu.gpu_compiler_options() is None


def test_the_option_probe_runs_a_loop_with_a_cond_and_answers_per_option():
    # the probe's program (run off the CPU, where a driver may lack CUDA graphs' conditional nodes) computes x + 3
    import jax
    from jes import cpu

    assert float(jax.jit(cpu._loop_with_a_cond)(jax.numpy.float32(1))) == 4.0
    assert cpu._knows_option("xla_cpu_enable_fast_math", False)  # an option every XLA:CPU has
    assert cpu._knows_option("xla_cpu_enable_fast_math", False, "cpu", run=True)  # the GPU's path: compiled, run
    assert not cpu._knows_option("xla_no_such_option_at_all", True)
    assert not cpu._knows_option(cpu.GPU_COMMAND_BUFFER_OPTION, cpu.GPU_COMMAND_BUFFER_TYPES, "gpu") or any(
        d.platform == "gpu" for d in jax.devices())

# One run per line: its parameters' bits and every metric of its history but the clock's (hex strings: bits).
SAME_RUN_ON_CORES = """
    import os, sys, json
    os.sched_setaffinity(0, set(json.loads(sys.argv[1])))
    import numpy as np, jes, flax.linen as nn

    class ConvNet(nn.Module):  # factored Conv layers: low rank compiles them with the older emitters
        @nn.compact
        def __call__(self, obs):
            x = nn.relu(nn.Conv(8, (3,), padding="SAME")(obs[:, None]))  # 1 channel in: the windows' reduction
            x = nn.relu(nn.Conv(4, (3,), padding="SAME")(x))  # 8 in: each offset's product (a batched dot)
            return nn.Dense(1)(nn.relu(nn.Dense(256)(x.reshape(-1))))

    config = jes.ESConfig(num_members=32, num_generations=4, chunk_size=16, max_episode_steps=20, eval_episodes=1)
    # 2,048 members in one chunk: the update's A^T diag(w) B contracts 1,024 pairs (XLA:CPU split that among threads)
    wide = dict(num_members=2048, chunk_size=2048, num_generations=2, max_episode_steps=5)
    runs = {"openai_es r4": ("openai_es", "adam", jes.LowRank(4), {}),
            "openai_es r1": ("openai_es", "adam", jes.LowRank(1), {}),
            "openai_es r1 2048": ("openai_es", "adam", jes.LowRank(1), wide),
            "openai_es r1 conv": ("openai_es", "adam", jes.LowRank(1), {}),
            "openai_es": ("openai_es", "adam", None, {}),
            "sep_cma_es": ("sep_cma_es", None, None, {}), "pgpe": ("pgpe", "adam", None, {}),
            # 353 parameters: the covariance's eigendecomposition (generation 3 on) threads its LAPACK from ~256 on
            "cma_es": ("cma_es", None, None, {})}
    for name, (strategy, optimizer, perturbation, fields) in runs.items():
        run = config.replace(**fields) if perturbation is None else config.replace(perturbation=perturbation, **fields)
        policy = ConvNet() if name.endswith("conv") else jes.MLPPolicy((16, 16) if name == "cma_es" else (256, 256))
        result = jes.train(policy, "Pendulum-v1", optimizer, strategy=strategy, config=run,
                           progress=False, log_dir=None)
        history = {k: [float(x).hex() for x in np.asarray(v).reshape(-1)] for k, v in result.history.items()
                   if k not in ("wall_time", "generation_time")}
        print(json.dumps({"run": name, "params": np.asarray(result.flat_params).view(np.uint32).tolist(),
                          "history": history}))
"""


@pytest.mark.hard_timeout(900)
@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two cores to compare one against two")
def test_a_run_gives_the_same_bits_on_one_core_and_on_two():
    """XLA:CPU splits some work among the threads of the process (YNNPACK's reductions; the newer fusion emitters'
    loop fusions, compiled for low rank), so a sum's bits could depend on the cores a process may use: a rank-4
    run's parameters from its third generation on, a low-rank update over 1,024 pairs (its A^T diag(w) B products),
    and every run's param_norm / grad_norm / update_norm / noise_std metrics. ``jes launch`` gives each process its
    own cores, and workers run on machines of any size. cma_es's eigendecomposition (LAPACK, scipy's OpenBLAS)
    split among threads too from ~256 dimensions (a trial: jes launch's processes computed another run)."""
    two = sorted(os.sched_getaffinity(0))[:2]
    runs = {}
    for cores in ([two[0]], two):
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(SAME_RUN_ON_CORES), json.dumps(cores)],
                              capture_output=True, text=True, timeout=840,
                              env={k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JES_CPU_DEVICES")})
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[len(cores)] = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"run"')]
    assert [r["run"] for r in runs[1]] == ["openai_es r4", "openai_es r1", "openai_es r1 2048", "openai_es r1 conv",
                                           "openai_es", "sep_cma_es", "pgpe", "cma_es"]
    for one, both in zip(runs[1], runs[2]):
        assert one["params"] == both["params"], f"{one['run']}: parameters differ between one core and two"
        differ = [k for k in one["history"] if one["history"][k] != both["history"].get(k)]
        assert not differ, f"{one['run']}: history differs between one core and two in {differ}"
