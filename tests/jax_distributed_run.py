"""One process of a jax.distributed test run (tests/test_jax_distributed.py starts it with ``jes launch``).

    python tests/jax_distributed_run.py OUT_DIR GENERATIONS [RESUME_CHECKPOINT]

Trains the small run of :func:`small_run` with ``distributed=True`` and writes what this process's
result holds to ``OUT_DIR/result<process id>.npz``. ``JES_TEST_DIE_AT=G`` makes process 1 exit
abruptly (status 3) after generation G, as a crashed host would; ``JES_TEST_PERTURBATION=low_rank`` trains
with low-rank members, ``JES_TEST_SCHEDULE=1`` with a learning-rate schedule; ``JES_TEST_KEY_PER_PROCESS=1`` gives each process its own key (a mistake jes refuses),
``JES_TEST_PROCESSES_OF_1=N`` launches process 1 as one of N processes (another host's ``jes launch --processes N``),
``JES_TEST_STOP_AT=G`` makes process 1's callback alone raise ``jes.StopTraining`` at generation G,
``JES_TEST_ENV`` names the env (default CartPole-v1), ``JES_TEST_FAIL_COMPILING=1`` makes process 1's step compile
raise, ``JES_TEST_ERROR_AT=G`` a ``RuntimeError`` (each process then writes what it raised to ``OUT_DIR/error<process id>.txt``:
its type, message and the generations of the run it carries; process 1 waits for process 0's file unless
``JES_TEST_NO_WAIT=1``). ``JES_TEST_CHECKPOINT_EVERY=N`` sets checkpoint_every (default 1) and ``JES_TEST_SLOW_SAVE=S``
makes process 0's checkpoint saves take S seconds more, as a large checkpoint or a slow disk would.
"""
import os
import sys

import numpy as np


def small_run(num_generations: int) -> dict:
    """Keyword arguments of ``jes.train`` shared by the launched processes and the one-process reference."""
    import optax

    import jes

    perturbation = os.environ.get("JES_TEST_PERTURBATION", "full_rank")
    # a schedule's repr holds a memory address, which differs from process to process
    rate = optax.linear_schedule(0.1, 0.01, 10) if os.environ.get("JES_TEST_SCHEDULE") else None
    return dict(policy=jes.MLPPolicy(hidden_sizes=(8,)), env=os.environ.get("JES_TEST_ENV", "CartPole-v1"),
                optimizer="adam", key=7,
                config=jes.ESConfig(num_members=16, chunk_size=4, num_generations=num_generations, eval_every=1,
                                    eval_episodes=2, max_episode_steps=60, perturbation=perturbation,
                                    perturbation_rank=2 if perturbation == "low_rank" else 1, learning_rate=rate))


def main(out: str, generations: int, resume: str | None = None) -> None:
    import jes

    jes.enable_compilation_cache(os.environ.get("JES_TEST_CACHE") or None)
    die_at = int(os.environ.get("JES_TEST_DIE_AT", "0"))
    stop_at = int(os.environ.get("JES_TEST_STOP_AT", "0"))
    error_at = int(os.environ.get("JES_TEST_ERROR_AT", "0"))

    def maybe_die(record):
        import jax

        if die_at and record["generation"] == die_at and jax.process_index() == 1:
            os._exit(3)
        if record["generation"] == stop_at and jax.process_index() == 1:
            raise jes.StopTraining("enough")
        if record["generation"] == error_at and jax.process_index() == 1:
            raise RuntimeError("a callback's bug")

    if os.environ.get("JES_TEST_FAIL_COMPILING") and os.environ["JES_PROCESS_ID"] == "1":
        def fails(self, state):  # as a compile error on one host: the other process waits for this one's step
            raise RuntimeError("process 1's compile failed")

        jes.Trainer.compiled_step = fails
    if os.environ.get("JES_TEST_SLOW_SAVE") and os.environ["JES_PROCESS_ID"] == "0":
        import time

        from jes import checkpoint

        save = checkpoint.save

        def slow_save(*args, **kwargs):
            time.sleep(float(os.environ["JES_TEST_SLOW_SAVE"]))
            return save(*args, **kwargs)

        checkpoint.save = slow_save
    kwargs = small_run(generations)
    if os.environ.get("JES_TEST_PROCESSES_OF_1") and os.environ["JES_PROCESS_ID"] == "1":  # its host's other count
        os.environ["JES_NUM_PROCESSES"] = os.environ["JES_TEST_PROCESSES_OF_1"]
    if os.environ.get("JES_TEST_KEY_PER_PROCESS"):  # a per-process seed, as data-parallel scripts often have
        kwargs["key"] += int(os.environ["JES_PROCESS_ID"])
    try:
        result = jes.train(kwargs.pop("policy"), kwargs.pop("env"), kwargs.pop("optimizer"), distributed=True,
                           log_dir=os.path.join(out, "runs"),
                           checkpoint_every=int(os.environ.get("JES_TEST_CHECKPOINT_EVERY", "1")), progress=False,
                           callbacks=[maybe_die], resume=resume, **kwargs)
    except Exception as err:
        if not error_at:
            raise
        import time

        import jax

        carried = getattr(err, "result", None)
        generations = [int(g) for g in carried.history["generation"]] if carried is not None else None
        with open(os.path.join(out, f"error{jax.process_index()}.txt"), "w") as f:
            f.write(f"{type(err).__name__}: {err}\n{generations}\n")
        if jax.process_index() == 1 and not os.environ.get("JES_TEST_NO_WAIT"):  # the other process writes its file before jes launch stops it (once this
            other = os.path.join(out, "error0.txt")  # one exits): wait for it, boundedly (the test's own timeout)
            deadline = time.monotonic() + 240
            while not os.path.exists(other) and time.monotonic() < deadline:
                time.sleep(0.1)
        raise
    import jax

    np.savez(os.path.join(out, f"result{jax.process_index()}.npz"), flat=result.flat_params,
             pop_mean=result.history["pop_mean"], centre=result.history["centre_return"],
             best=result.best.flat_params, processes=jax.process_count(), devices=jax.device_count(),
             checkpoint=str(result.checkpoint_path), log_dir=str(result.log_dir), stopped=str(result.stopped))
    print(f"process {jax.process_index()} of {jax.process_count()} done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
