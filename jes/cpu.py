"""One XLA CPU device per usable core, for jes's own entry points.

XLA's CPU backend keeps a second core poorly busy from one device. Because a
jes population sharded over several devices gives bit-identical results, the
``jes`` CLI and ``python -m jes`` expose one CPU device per usable core before
JAX starts (measured on 2 quiet vCPUs: 1.73-2.67x more env steps/s, median over
seeds 0-4; slower on a crowded machine; see benchmarks/README.md). The library never does this on its own: call
:func:`use_cpu_cores` at the top of your script to get the same.
"""
from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp

ENV = "JES_CPU_DEVICES"
_FLAG = "--xla_force_host_platform_device_count"


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


_LAPACK_THREADS_PINNED = False


def pin_lapack_threads() -> None:
    """Run the LAPACK that JAX's CPU linear algebra calls (``jnp.linalg.eigh``: jaxlib takes its routines from
    scipy's OpenBLAS) on one thread, once per process.

    OpenBLAS splits a large problem's work among as many threads as the process has cores, and the split changes
    the bits: ``cma_es``'s eigendecomposition of a covariance of 256 or more dimensions (a 367-parameter GRU's)
    gave other means on one core than on two, so ``jes launch`` (one core per process) and ``jes-worker --cores``
    computed other runs than one process (a trial; below ~200 dimensions, bbob's, OpenBLAS runs one thread
    anyway). Called where a ``cma_es`` run is built; it leaves numpy's own OpenBLAS alone, and scipy's
    ``scipy.linalg`` calls of the process run on one thread from then on. A scipy without its OpenBLAS's
    ``set_num_threads`` (another BLAS) is left as it is."""
    global _LAPACK_THREADS_PINNED
    if _LAPACK_THREADS_PINNED:
        return
    _LAPACK_THREADS_PINNED = True
    try:
        import scipy
        import scipy.linalg.cython_lapack  # noqa: F401 - loads the OpenBLAS jaxlib's LAPACK kernels call
    except ImportError:  # no scipy: jaxlib has no LAPACK of its own to thread
        return
    import ctypes
    import glob

    folder = os.path.join(os.path.dirname(os.path.dirname(scipy.__file__)), "scipy.libs")
    for path in sorted(glob.glob(os.path.join(folder, "*openblas*"))):
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("scipy_openblas_set_num_threads", "openblas_set_num_threads"):
            setter = getattr(library, name, None)
            if setter is not None:
                setter(1)
                break


def _backends_initialized() -> bool:
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - layout of other jax versions
        return False
    check = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(check()) if check is not None else False


def distributed_initialized() -> bool:
    """Whether ``jax.distributed`` has been initialised in this process (by jes or by the user); here, in a module
    the core may import (:func:`jes.distributed.jax_runtime.is_initialized` is this)."""
    check = getattr(jax.distributed, "is_initialized", None)
    if check is not None:
        return bool(check())
    from jax._src import distributed as _distributed  # older jax: no public probe

    return _distributed.global_state.client is not None


def use_cpu_cores(count: int | None = None) -> int | None:
    """Ask JAX for ``count`` CPU devices (default: ``$JES_CPU_DEVICES``, else one per usable core).

    Returns the device count asked for, or ``None`` when nothing was changed: fewer than two
    devices asked for, the count already set by the user (``XLA_FLAGS`` or ``jax_num_cpu_devices``),
    or JAX's backends already running (the setting only takes effect before the first computation).
    """
    if count is None and os.environ.get(ENV):
        try:
            count = int(os.environ[ENV])
        except ValueError as err:
            raise ValueError(f"{ENV} must be an integer number of CPU devices, got {os.environ[ENV]!r}") from err
    count = usable_cores() if count is None else count
    if count < 2 or _FLAG in os.environ.get("XLA_FLAGS", "") or _backends_initialized():
        return None
    if hasattr(jax.config, "jax_num_cpu_devices"):
        if jax.config.jax_num_cpu_devices not in (-1, None):
            return None
        jax.config.update("jax_num_cpu_devices", count)
    else:  # older jax: the XLA flag, read when the CPU backend starts
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}={count}".strip()
    return count


def compiler_options(devices: list | None = None, fusion_emitters: bool = False,
                     tree_reductions: bool = True) -> dict | None:
    """XLA options jes compiles its rollout programs with (the generation step, policy evaluation).

    On CPU, XLA's older fusion emitters (``xla_cpu_use_fusion_emitters=False``): generations no slower,
    and less compile time: ~28 % less CPU time for the generation step when a process compiles several
    programs (sweeps, tests, notebooks), a few percent for a fresh process's first compile, ~20 % for the
    100-episode evaluation (benchmarks/README.md, issue 9). On GPUs :func:`gpu_compiler_options`; ``None``
    elsewhere. A jaxlib without this option
    (jaxlib 0.11 dropped the older emitters) compiles with the newer ones, as ``fusion_emitters=True`` does.

    **The emitters can change bits**: they order some long sums otherwise (an MLP 256x256's update differed in
    the last bit of 9,764 of its 67,073 parameters). So every program that computes part of a run's generation
    (the step; a master's, worker's, host env's or sweep's programs) compiles with the run's options,
    ``Trainer.step_compiler_options``.

    **Nor may the cores a process runs on change bits** (``jes launch`` gives each process its own cores; workers
    run on machines of any size): long reductions stay XLA's own loops rather than YNNPACK's, which splits them
    among the process's threads, and programs with the newer emitters compile without XLA's parallel task
    assignment, whose split of their loop fusions among threads changed a rank-4 low-rank run's parameters
    (tests/test_cpu.py runs the same runs on one core and on two).

    Args (the last two for XLA:CPU only):
        devices: the devices the program runs on (default: ``jax.devices()``).
        fusion_emitters: keep XLA's default (newer) fusion emitters, for programs the older ones run slower
            (low-rank corrections as batched products, rank 3 and up: see
            :attr:`jes.perturbations.LowRank.cpu_fusion_emitters`).
        tree_reductions: keep XLA's tree reduction rewriter with the older emitters (the newer ones never run it, see
            ``NEWER_EMITTERS_PASSES``). False for low-rank programs (``LowRank.cpu_tree_reductions``): it split a
            corrected layer's ``x A`` into an elementwise product written to memory, a reduce-window and a reduce.
            Full rank keeps it: it decides the bits of its pinned runs.
    """
    devices = jax.devices() if devices is None else devices
    if devices and all(d.platform == "gpu" for d in devices):
        return gpu_compiler_options()
    if not all(d.platform == "cpu" for d in devices):
        return None
    # The newer emitters' loop fusions split among the process's threads (XLA's parallel task assignment) gave other
    # bits on one core than on two (a rank-4 low-rank MLP 256x256's update, from its second generation); the older
    # emitters' did not. With the newer emitters a long row reduction also stays one fused loop (NEWER_EMITTERS_PASSES)
    if not fusion_emitters and not _knows_option(OLDER_EMITTERS_OPTION, False):
        fusion_emitters = True  # a jaxlib without the older emitters (jax 0.11): the newer ones, as jes compiles them
    disabled = list(NEWER_EMITTERS_PASSES) if fusion_emitters else ([] if tree_reductions else [TREE_REDUCTIONS_PASS])
    options = {} if fusion_emitters else {OLDER_EMITTERS_OPTION: False}
    if disabled:
        options["xla_disable_hlo_passes"] = ",".join(disabled)
    if _knows_option(YNN_FUSION_OPTION, YNN_FUSION_TYPES):
        options[YNN_FUSION_OPTION] = YNN_FUSION_TYPES
    return options or None


# XLA:CPU hands dots, convolutions and reductions to its YNNPACK library (jaxlib 0.10), which splits a long reduction
# (a norm over the parameters) among the threads of the process: its bits depended on the cores the process may use
# (param_norm, grad_norm, update_norm and noise_std of an MLP 256x256's run differed in their last bits between one
# core and two; its parameters did not). Reductions stay XLA's own loops here, whose order the program fixes; dots
# and convolutions still go to YNNPACK, as by XLA's default (they gave the same bits on one core and on two).
YNN_FUSION_OPTION = "xla_cpu_experimental_ynn_fusion_type"
OLDER_EMITTERS_OPTION = "xla_cpu_use_fusion_emitters"
# Passes programs compiled with the newer emitters run without: XLA's parallel task assignment (see above), and its
# tree reduction rewriter, which splits a long reduction into a reduce-window and a second reduce, and left the
# elementwise product it reduces a fusion of its own, written to memory and read back: a low-rank Dense layer's x A
# (MLP 256x256, r = 1, 512 members: the whole generation 0.57x batch inference with the rewriter, 0.76x without it,
# in one process, seeds 0-2, 2026-12-03 23:0x UTC).
TREE_REDUCTIONS_PASS = "tree_reduction_rewriter"
NEWER_EMITTERS_PASSES = ("cpu-parallel-task-assigner", TREE_REDUCTIONS_PASS)
YNN_FUSION_TYPES = "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION"


# XLA:GPU records a program's kernels as CUDA graphs (command buffers), by default not its loops and conditionals: then
# every iteration of a while loop (a rollout's env steps) and every lax.cond (the step's guards) copies its predicate
# to the host and waits for it, and the GPU idles while the host launches the next kernels one by one. With loops and
# conditionals in the graphs the predicates stay on the GPU. The same kernels run, so the same bits. A compile option
# replaces the whole list, so it names XLA's default types (jaxlib 0.11) with WHILE and CONDITIONAL added.
GPU_COMMAND_BUFFER_OPTION = "xla_gpu_enable_command_buffer"
GPU_COMMAND_BUFFER_TYPES = "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION,WHILE,CONDITIONAL"
GPU_GRAPH_LOOPS_ENV = "JES_GPU_GRAPH_LOOPS"


def gpu_compiler_options() -> dict | None:
    """XLA options jes compiles its rollout programs with on GPUs: while loops and conditionals inside XLA's CUDA
    graphs (``xla_gpu_enable_command_buffer`` with ``WHILE`` and ``CONDITIONAL`` added to XLA's default types).

    ``None`` (XLA's defaults) where there is no GPU, where the jaxlib's GPU compiler refuses the option, where a
    small loop with a conditional compiled with it fails to run or gives a wrong result (a driver without CUDA
    graphs' conditional nodes, say), or with ``$JES_GPU_GRAPH_LOOPS=0``: programs compiled otherwise, the same bits
    (measured on an H200), kept apart by jes's program cache.
    """
    if os.environ.get(GPU_GRAPH_LOOPS_ENV, "1").strip() == "0":
        return None
    if not _knows_option(GPU_COMMAND_BUFFER_OPTION, GPU_COMMAND_BUFFER_TYPES, "gpu"):
        return None
    return {GPU_COMMAND_BUFFER_OPTION: GPU_COMMAND_BUFFER_TYPES}


def _loop_with_a_cond(x: jax.Array) -> jax.Array:
    """The option probe's program: a while loop whose body holds a ``lax.cond`` (``x + 3`` for ``x`` below 100)."""
    def body(carry):
        i, v = carry
        return i + 1, jax.lax.cond(v > 100, lambda u: u - 1, lambda u: u + 1, v)

    return jax.lax.while_loop(lambda carry: carry[0] < 3, body, (jnp.int32(0), x))[1]


@functools.cache
def _knows_option(name: str, value, platform: str = "cpu", run: bool | None = None) -> bool:
    """Whether this jaxlib's compiler for ``platform`` takes option ``name`` set to ``value`` (older ones have no
    YNNPACK and fail on its option; jaxlib 0.11 dropped the older fusion emitters and fails on theirs). With ``run``
    (default: off the CPU) the probe also runs: a loop with a conditional, compiled with the option, must give its
    result."""
    try:
        # the platform's compiler (the CPU's in a GPU process too), on a device of this process
        device = jax.local_devices(backend=platform)[0]
        on_device = jax.sharding.SingleDeviceSharding(device)
        compiled = jax.jit(_loop_with_a_cond, compiler_options={name: value}).lower(
            jax.ShapeDtypeStruct((), "float32", sharding=on_device)).compile()
        if platform != "cpu" if run is None else run:
            return float(compiled(jax.device_put(jnp.float32(1), device))) == 4.0
    except Exception:  # noqa: BLE001 - "No such compile option" (XlaRuntimeError), an invalid value, a failed run
        return False
    return True
