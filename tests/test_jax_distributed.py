"""The jax.distributed backend: real multi-process JAX runtimes on loopback, started with ``jes launch``.

2 processes x 1 CPU device and 2 processes x 2 CPU devices give bit-identical results to one
process on one device; a run checkpointed by 2 processes resumes in 1 and one checkpointed by 1
resumes in 2; a process that dies stops the others with a clear error.
"""
import os
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

import jes
from jes.distributed import jax_runtime
from jes.distributed.launch import NOT_ELASTIC, process_env

from jax_distributed_run import small_run

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "jax_distributed_run.py")
ROOT = os.path.dirname(HERE)
LAUNCH_TIMEOUT = 360  # seconds for one launched run (two processes compiling on a loaded 2-core machine)

pytestmark = pytest.mark.hard_timeout(2 * LAUNCH_TIMEOUT + 120)


def launch(out_dir, processes, devices_per_process, generations, *extra, env=None):
    """``jes launch`` the test script; (status, output). Fails the test (and kills every process) past the timeout."""
    os.makedirs(out_dir, exist_ok=True)
    cmd = [sys.executable, "-m", "jes.cli", "launch", "--processes", str(processes),
           "--devices-per-process", str(devices_per_process), "--", sys.executable, SCRIPT, str(out_dir),
           str(generations), *extra]
    child_env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
                     **(env or {}))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"jes launch {processes}x{devices_per_process} did not finish within {LAUNCH_TIMEOUT}s:\n{output}")
    return proc.returncode, output


def results(out_dir, processes):
    return [dict(np.load(os.path.join(out_dir, f"result{i}.npz"))) for i in range(processes)]


def reference(generations, **overrides):
    kwargs = {**small_run(generations), "devices": 1, "log_dir": None, "checkpoint_path": None, "progress": False,
              **overrides}
    return jes.train(kwargs.pop("policy"), kwargs.pop("env"), kwargs.pop("optimizer"), **kwargs)


def test_two_processes_with_one_and_two_devices_are_bit_identical_to_one_process_and_resume_across_counts(tmp_path):
    one = reference(4)
    half_path = str(tmp_path / "one-process.ckpt")
    half = reference(2, checkpoint_path=half_path)

    # 2 processes x 2 devices, 2 generations from scratch.
    status, output = launch(tmp_path / "2x2", 2, 2, 2)
    assert status == 0, output
    assert "[p0] process 0 of 2 done" in output and "[p1] process 1 of 2 done" in output, output
    for got in results(tmp_path / "2x2", 2):  # every process returns the same result
        assert int(got["processes"]) == 2 and int(got["devices"]) == 4
        np.testing.assert_array_equal(got["flat"], half.flat_params)
        np.testing.assert_array_equal(got["pop_mean"], one.history["pop_mean"][:2])
        np.testing.assert_array_equal(got["centre"], half.history["centre_return"])
        np.testing.assert_array_equal(got["best"], half.best.flat_params)
        assert str(got["checkpoint"]) == str(tmp_path / "2x2" / "runs" / "checkpoint.ckpt")  # process 0's path
    # Only process 0 wrote logs and the checkpoint (a second writer would leave a second event file).
    runs = tmp_path / "2x2" / "runs"
    assert sorted(p.name.split(".")[0] for p in runs.iterdir()) == ["checkpoint", "events"], list(runs.iterdir())
    # Written by 2 processes, resumed by 1.
    resumed = reference(4, resume=str(runs / "checkpoint.ckpt"))
    np.testing.assert_array_equal(resumed.flat_params, one.flat_params)

    # Written by 1 process, resumed by 2 processes x 1 device.
    status, output = launch(tmp_path / "2x1", 2, 1, 4, half_path)
    assert status == 0, output
    for got in results(tmp_path / "2x1", 2):
        assert int(got["devices"]) == 2
        np.testing.assert_array_equal(got["flat"], one.flat_params)
        np.testing.assert_array_equal(got["pop_mean"], one.history["pop_mean"])
        np.testing.assert_array_equal(got["best"], one.best.flat_params)


def test_two_processes_of_a_low_rank_run_are_bit_identical_to_one_process(tmp_path, monkeypatch):
    """Low-rank members: every process rebuilds the update from the all-gathered fitness alone."""
    monkeypatch.setenv("JES_TEST_PERTURBATION", "low_rank")
    one = reference(3)
    status, output = launch(tmp_path / "lowrank", 2, 1, 3)
    assert status == 0, output
    for got in results(tmp_path / "lowrank", 2):
        assert int(got["processes"]) == 2
        np.testing.assert_array_equal(got["flat"], one.flat_params)
        np.testing.assert_array_equal(got["pop_mean"], one.history["pop_mean"])
        np.testing.assert_array_equal(got["centre"], one.history["centre_return"])


def test_a_run_with_a_schedule_passes_the_processes_check_and_is_bit_identical(tmp_path, monkeypatch):
    """The processes compare hashes of their runs; a schedule is described by a repr with a memory address, which
    differs from process to process and must not count as another run."""
    monkeypatch.setenv("JES_TEST_SCHEDULE", "1")
    one = reference(2)
    status, output = launch(tmp_path / "schedule", 2, 1, 2)
    assert status == 0, output
    for got in results(tmp_path / "schedule", 2):
        np.testing.assert_array_equal(got["flat"], one.flat_params)


def test_a_process_that_dies_stops_the_others_with_a_clear_error(tmp_path):
    status, output = launch(tmp_path / "die", 2, 1, 6, env={"JES_TEST_DIE_AT": "2"})
    assert status == 3, output
    assert "jes launch: process 1 exited with status 3; stopping the other 1 process(es)" in output, output
    assert NOT_ELASTIC in output
    assert "process 0 of 2 done" not in output  # process 0 did not go on alone
    # The checkpoint of the last generation both processes finished is intact.
    ckpt = jes.checkpoint.read(str(tmp_path / "die" / "runs" / "checkpoint.ckpt"))
    assert 1 <= ckpt.generation <= 2


def test_a_process_exiting_with_status_2_is_told_to_fix_a_usage_error_before_resuming():
    """Status 2 is mostly a usage error or refusal (jes train's, argparse's), which resuming would not fix."""
    import io

    from jes.distributed.launch import launch as launch_processes

    for code, advice in ((2, False), (3, True)):
        err = io.StringIO()
        status = launch_processes([sys.executable, "-c", f"import sys; sys.exit({code})"], 2, devices_per_process=None,
                                  pin_cores=False, out=io.StringIO(), err=err, grace=2.0)
        assert status == code and f"exited with status {code}" in err.getvalue(), err.getvalue()
        assert NOT_ELASTIC in err.getvalue(), err.getvalue()
        assert ("If its message above is a usage error or a refusal, fix that" in err.getvalue()) != advice


def test_processes_given_different_runs_are_refused_naming_what_differs(tmp_path):
    """A per-process seed ran silently into a result that was neither process's run."""
    status, output = launch(tmp_path / "keys", 2, 1, 2, env={"JES_TEST_KEY_PER_PROCESS": "1"})
    assert status != 0, output
    assert ("the processes of this jax.distributed run were given different runs (process 1: key differ from "
            "process 0's)") in output, output
    assert "done" not in output and not os.path.exists(tmp_path / "keys" / "runs" / "checkpoint.ckpt")


def test_a_launched_process_without_distributed_is_refused_or_warned(monkeypatch, capsys):
    """Under jes launch without --distributed every process trained the whole run alone into the same files (one
    died on the other's checkpoint save)."""
    monkeypatch.setenv(jax_runtime.ENV_NUM_PROCESSES, "2")
    assert jes.cli.main(["train", "--generations", "1", "--log-dir", "none"]) == 2
    assert ("jes train: jes launch started 2 processes of this command, but without --distributed each would train "
            "the whole run alone, all writing the same files: add --distributed") in capsys.readouterr().err
    with pytest.warns(UserWarning, match="this process is one of 2 that jes launch started, but distributed=False"):
        jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", num_members=8, num_generations=1, log_dir=None,
                  progress=False)


def test_distributed_without_a_multi_process_environment_says_how_to_start_one(monkeypatch):
    for name in (jax_runtime.ENV_NUM_PROCESSES, jax_runtime.ENV_PROCESS_ID, jax_runtime.ENV_COORDINATOR,
                 "JAX_COORDINATOR_ADDRESS", "SLURM_JOB_ID", "OMPI_MCA_orte_hnp_uri"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(jax_runtime.DistributedSetupError, match="jes launch --processes N"):
        jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", distributed=True, log_dir=None)
    # Here JAX is already computing: joining a runtime now is impossible, and the error says when to call it.
    monkeypatch.setenv(jax_runtime.ENV_NUM_PROCESSES, "2")
    monkeypatch.setenv(jax_runtime.ENV_PROCESS_ID, "1")
    monkeypatch.setenv(jax_runtime.ENV_COORDINATOR, "127.0.0.1:1")
    jax.numpy.zeros(1).block_until_ready()
    with pytest.raises(jax_runtime.DistributedSetupError, match="before any other JAX code"):
        jes.distributed.initialize()
    with pytest.raises(ValueError, match="two different backends"):
        jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", distributed=True, master=":0", log_dir=None)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_processes=0), "positive integer"),
    (dict(num_processes=2, process_id=2), "outside 0..1"),
    (dict(coordinator="localhost", num_processes=2, process_id=0), "HOST:PORT"),
    (dict(coordinator="127.0.0.1:99999", num_processes=2, process_id=0), "with a port in 1..65535"),
])
def test_initialize_refuses_bad_coordinates(kwargs, message):
    with pytest.raises(jax_runtime.DistributedSetupError, match=message):
        jes.distributed.initialize(**kwargs)


def test_launch_environment_and_argument_errors():
    env = process_env({"PATH": "/bin"}, "127.0.0.1:5", 3, 2, 2)
    assert (env["JES_COORDINATOR"], env["JES_NUM_PROCESSES"], env["JES_PROCESS_ID"]) == ("127.0.0.1:5", "3", "2")
    assert env["JAX_NUM_CPU_DEVICES"] == env["JES_CPU_DEVICES"] == "2"
    run = lambda *args: subprocess.run([sys.executable, "-m", "jes.cli", "launch", *args], capture_output=True,
                                       text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    no_command = run("--processes", "2")
    assert no_command.returncode == 2 and "no command to launch" in no_command.stderr
    split = run("--processes", "4", "--local-processes", "2", "--", "true")
    assert split.returncode == 2 and "--coordinator HOST:PORT" in split.stderr
    port = run("--processes", "2", "--coordinator", "127.0.0.1:99999", "--", "true")
    assert port.returncode == 2 and "coordinator='127.0.0.1:99999' must be HOST:PORT with a port in 1..65535" in port.stderr
    beyond = run("--processes", "2", "--first-process-id", "2", "--", "true")
    assert beyond.returncode == 2 and "--first-process-id 2 is not a process of a 2-process run (ids 0 to 1)" in \
        beyond.stderr, beyond.stderr
    too_many = run("--processes", "3", "--first-process-id", "1", "--local-processes", "3", "--", "true")
    assert too_many.returncode == 2 and ("--local-processes 3 from --first-process-id 1 asks for process ids 1 to 3, "
                                         "but a 3-process run has ids 0 to 2") in too_many.stderr, too_many.stderr
    ok = run("--processes", "2", "--", sys.executable, "-c",
             "import os; print('id', os.environ['JES_PROCESS_ID'], 'of', os.environ['JES_NUM_PROCESSES'])")
    assert ok.returncode == 0 and "[p0] id 0 of 2" in ok.stdout and "[p1] id 1 of 2" in ok.stdout
