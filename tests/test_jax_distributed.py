"""The jax.distributed backend: real multi-process JAX runtimes on loopback, started with ``jes launch``.

2 processes x 1 CPU device and 2 processes x 2 CPU devices give bit-identical results to one
process on one device; a run checkpointed by 2 processes resumes in 1 and one checkpointed by 1
resumes in 2; a process that dies stops the others with a clear error.
"""
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import jes
from jes.distributed import jax_runtime
from jes.distributed.launch import NOT_ELASTIC, process_env

from jax_distributed_run import small_run
from subprocess_for_tests import checkout_env

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "jax_distributed_run.py")
ROOT = os.path.dirname(HERE)
LAUNCH_TIMEOUT = 360  # seconds for one launched run (two processes compiling on a loaded 2-core machine)

pytestmark = pytest.mark.hard_timeout(2 * LAUNCH_TIMEOUT + 120)


def launch(out_dir, processes, devices_per_process, generations, *extra, env=None, command=None):
    """``jes launch`` the test script (or ``command``); (status, output). Fails the test (and kills every process) past
    the timeout."""
    os.makedirs(out_dir, exist_ok=True)
    command = command or [sys.executable, SCRIPT, str(out_dir), str(generations), *extra]
    cmd = [sys.executable, "-m", "jes.cli", "launch", "--processes", str(processes),
           "--devices-per-process", str(devices_per_process), "--", *command]
    child_env = checkout_env(**(env or {}))
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


def test_two_processes_of_a_brax_run_are_bit_identical_to_one_process(tmp_path, monkeypatch):
    """A trial: every brax env failed to compile on process 1 (MuJoCo MJX put its model on jax.devices()[0], process
    0's device: "Closing over jax.Array that spans non-addressable devices")."""
    monkeypatch.setenv("JES_TEST_ENV", "brax/inverted_pendulum?backend=spring")
    one = reference(2)
    status, output = launch(tmp_path / "brax", 2, 1, 2)
    assert status == 0, output
    for got in results(tmp_path / "brax", 2):
        np.testing.assert_array_equal(got["flat"], one.flat_params)
        np.testing.assert_array_equal(got["pop_mean"], one.history["pop_mean"])
        np.testing.assert_array_equal(got["centre"], one.history["centre_return"])


def test_a_process_that_fails_ends_at_once_and_jes_launch_names_it(tmp_path, monkeypatch):
    """A trial: a process that failed (a compile error on process 1) waited in JAX's shutdown barrier while the
    others waited for it in a collective: the launch hung 5 minutes, until JAX aborted process 0, which jes launch
    then named. A failed process now ends at once: a script's uncaught error (status 1), jes train's error (2)."""
    status, output = launch(tmp_path / "script", 2, 1, 2, env={"JES_TEST_FAIL_COMPILING": "1"})
    assert "RuntimeError: process 1's compile failed" in output, output
    assert status == 1 and "jes launch: process 1 exited with status 1; stopping the other 1 process(es)" in output, \
        output
    module = tmp_path / "jes_test_fails_in_process_1.py"  # jes train --import runs it: the same failure
    module.write_text("import os, jes\n\ndef fails(self, state):\n    raise RuntimeError('compile failed here')\n\n"
                      "if os.environ['JES_PROCESS_ID'] == '1':\n    jes.Trainer.compiled_step = fails\n")
    command = [sys.executable, "-m", "jes.cli", "train", "--distributed", "--import", module.stem, "--policy", "mlp",
               "--hidden", "4", "--layers", "1", "--generations", "2", "--population", "16", "--log-dir", "none",
               "--checkpoint", "none", "--no-progress"]
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # (after the checkout's own path: jes_launch's env)
    status, output = launch(tmp_path / "cli", 2, 1, 2, command=command)
    assert "unexpected RuntimeError: compile failed here" in output, output
    assert status == 2 and "jes launch: process 1 exited with status 2; stopping the other 1 process(es)" in output, \
        output


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


def test_a_stop_training_raised_in_one_process_stops_every_process_at_that_generation(tmp_path):
    """Every process runs the callbacks: one process stopping alone would leave the others waiting in the next step."""
    status, output = launch(tmp_path / "stop", 2, 1, 6, env={"JES_TEST_STOP_AT": "3"})
    assert status == 0, output
    done = results(tmp_path / "stop", 2)
    for result in done:
        assert len(result["pop_mean"]) == 3 and str(result["stopped"]) == "enough (process 1)"
    np.testing.assert_array_equal(done[0]["flat"], done[1]["flat"])
    assert jes.checkpoint.read(str(tmp_path / "stop" / "runs" / "checkpoint.ckpt")).generation == 3


def test_an_error_in_one_process_callback_stops_every_process_at_that_generation(tmp_path):
    """The per-generation agreement carried StopTraining only: another error in one process's callback left the
    others waiting in it (jes launch stops them once it exits; a Slurm or manual launch waited for JAX's heartbeat
    timeout). Every process stops at that generation, process 0 keeping the run in its checkpoint."""
    status, output = launch(tmp_path / "error", 2, 1, 6, env={"JES_TEST_ERROR_AT": "3"})
    assert status != 0, output
    errors = [open(tmp_path / "error" / f"error{i}.txt").read().splitlines() for i in range(2)]
    assert errors[1] == ["RuntimeError: a callback's bug", "[1, 2]"], output
    assert errors[0][0].startswith("CallbackFailedInAnotherProcess: a callback of process 1 of this jax.distributed "
                                   "run raised RuntimeError: a callback's bug at generation 3"), output
    assert errors[0][1] == "[1, 2]", output
    assert jes.checkpoint.read(str(tmp_path / "error" / "runs" / "checkpoint.ckpt")).generation == 2


def test_the_other_processes_of_a_run_all_stop_at_wait_for_process_0s_checkpoint(tmp_path):
    """A review: since processes that failed end at once, one whose callback raised (so every process stops there)
    ended 1 s later, and jes launch then killed process 0 while it saved the run's checkpoint (a save that takes
    seconds: here made 8 s slower, beyond jes launch's 5 s grace after its SIGTERM), which was lost. An error every
    process stops at is left to JAX's shutdown, which waits for process 0."""
    status, output = launch(tmp_path / "error", 2, 1, 6, env={"JES_TEST_ERROR_AT": "3", "JES_TEST_NO_WAIT": "1",
                                                              "JES_TEST_CHECKPOINT_EVERY": "100",
                                                              "JES_TEST_SLOW_SAVE": "8"})
    assert status != 0, output
    assert (tmp_path / "error" / "runs" / "checkpoint.ckpt").exists(), output
    assert jes.checkpoint.read(str(tmp_path / "error" / "runs" / "checkpoint.ckpt")).generation == 2, output
    assert open(tmp_path / "error" / "error0.txt").read().startswith("CallbackFailedInAnotherProcess"), output


def test_an_error_in_a_one_process_runtime_ends_the_script_as_python_does(tmp_path):
    """A review: a script's uncaught error after jes.distributed.initialize() ended the process at once with one
    process too (a Slurm job of one task), where nothing waits for it: its atexit handlers never ran."""
    script = tmp_path / "one_process.py"
    script.write_text("import atexit, sys\nimport jes\n\njes.distributed.initialize()\n"
                      "atexit.register(lambda: open(sys.argv[1], 'w').write('atexit ran'))\n"
                      "raise ValueError('the script failed')\n")
    status, output = launch(tmp_path / "one", 1, 1, 0, command=[sys.executable, str(script), str(tmp_path / "ran")])
    assert status == 1 and "ValueError: the script failed" in output, output
    assert (tmp_path / "ran").read_text() == "atexit ran", output


def test_a_process_interrupted_alone_ends_after_its_grace_not_jaxs_deadline(tmp_path):
    """A review: a process that got Ctrl-C (or SIGTERM) alone waited in JAX's shutdown barrier for the others, which
    waited for it in the next collective, until JAX's 5-minute deadline aborted both. It waits
    $JES_END_GRACE_SECONDS (here 2 s) for process 0's save, then ends; jes launch names it."""
    script = tmp_path / "interrupted_alone.py"
    script.write_text("import sys\nimport jes\n\njes.distributed.initialize()\nimport jax\n"
                      "from jax.experimental import multihost_utils\n\n"
                      "multihost_utils.sync_global_devices('first')\n"
                      "if jax.process_index() == 1:\n"
                      "    raise KeyboardInterrupt  # Ctrl-C in this process's terminal alone\n"
                      "multihost_utils.sync_global_devices('second')  # process 0 waits for process 1 here\n")
    status, output = launch(tmp_path / "alone", 2, 1, 0, command=[sys.executable, str(script)],
                            env={"JES_END_GRACE_SECONDS": "2"})
    assert status == 130 and "jes launch: process 1 exited with status 130" in output, output


def test_a_failed_process_gets_advice_for_a_refusal_and_for_a_run_that_had_begun():
    """No exit status tells a refusal before the first generation (status 2 from jes train, 1 from a script, a busy
    port's crash) from a failure mid-run: the advice says to fix the error first, and to resume a run that had begun."""
    import io

    from jes.distributed.launch import launch as launch_processes

    for code in (1, 2, 3):
        err = io.StringIO()
        status = launch_processes([sys.executable, "-c", f"import sys; sys.exit({code})"], 2, devices_per_process=None,
                                  pin_cores=False, out=io.StringIO(), err=err, grace=2.0)
        assert status == code and f"exited with status {code}" in err.getvalue(), err.getvalue()
        assert NOT_ELASTIC in err.getvalue(), err.getvalue()
        assert "fix that and launch again; a run that had begun continues from its last checkpoint" in NOT_ELASTIC


def test_processes_given_different_runs_are_refused_naming_what_differs(tmp_path):
    """A per-process seed ran silently into a result that was neither process's run."""
    status, output = launch(tmp_path / "keys", 2, 1, 2, env={"JES_TEST_KEY_PER_PROCESS": "1"})
    assert status != 0, output
    assert ("the processes of this jax.distributed run were given different runs (process 1's key differs from "
            "process 0's)") in output, output
    assert "done" not in output and not os.path.exists(tmp_path / "keys" / "runs" / "checkpoint.ckpt")


def test_hosts_launched_with_different_process_counts_are_refused(tmp_path):
    """Defect (new-user tester): a host's `jes launch --processes 3` joining a 2-process run went unnoticed (JAX
    takes the coordinator's count). Every process now compares the count it was launched with."""
    status, output = launch(tmp_path / "counts", 2, 1, 2, env={"JES_TEST_PROCESSES_OF_1": "3"})
    assert status != 0, output
    assert ("launched with different process counts (process 1 was launched as one of 3, but the run has 2 "
            "processes): give every host's `jes launch` the same --processes") in output, output
    assert "done" not in output and not os.path.exists(tmp_path / "counts" / "runs" / "checkpoint.ckpt")


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


def run_launch(*args, timeout=LAUNCH_TIMEOUT):
    """``jes launch ARGS`` in a session of its own; (status, output). Fails the test (killing it all) past ``timeout``."""
    env = checkout_env()
    proc = subprocess.Popen([sys.executable, "-m", "jes.cli", "launch", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"jes launch {' '.join(args)} did not finish within {timeout}s:\n{proc.communicate()[0]}")
    return proc.returncode, output


def test_a_busy_coordinator_port_is_refused_naming_it_not_a_crash(tmp_path):
    """Process 0 crashed with SIGSEGV inside JAX's gRPC when the coordinator's port was taken; the launcher then
    advised resuming a run that never began."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        status, output = run_launch("--processes", "2", "--coordinator", address, "--", sys.executable, "-m",
                                    "jes.cli", "train", "--distributed", "--generations", "1", "--log-dir", "none")
        assert status == 2, output  # jes train's refusal, not 128 + SIGSEGV
        assert f"[p0] jes train: process 0 cannot listen on the coordinator address {address}: port " in output, output
        assert "is in use" in output and "jes launch --coordinator HOST:PORT" in output, output
        # The documented Python API: a DistributedSetupError, not a crash.
        script = ("import jes\ntry:\n    jes.distributed.initialize(coordinator=%r, num_processes=2, process_id=0)\n"
                  "except jes.distributed.DistributedSetupError as err:\n    print('refused:', err)\n" % address)
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=LAUNCH_TIMEOUT,
                              env=dict(os.environ, PYTHONPATH=ROOT))
        assert done.returncode == 0 and f"refused: process 0 cannot listen on the coordinator address {address}" \
            in done.stdout, (done.returncode, done.stdout, done.stderr[-2000:])


LISTENS = """
import os, sys, time
import jes
jes.distributed.initialize()
print("up", flush=True)
open(os.path.join(sys.argv[1], "up" + os.environ["JES_PROCESS_ID"]), "w").close()
deadline = time.monotonic() + 300
while not os.path.exists(os.path.join(sys.argv[1], "done")) and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def listening_addresses(port):
    """The local addresses of the sockets listening on TCP ``port`` (/proc/net/tcp and tcp6, hex as the kernel has)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if os.path.exists(table):
            with open(table) as f:
                for line in f.readlines()[1:]:
                    local, state = line.split()[1], line.split()[3]
                    host, _, hex_port = local.rpartition(":")
                    if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                        found.append(host)
    return found


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads the kernel's socket tables (Linux)")
def test_a_loopback_coordinator_listens_on_loopback_only(tmp_path):
    """JAX's coordination service is unauthenticated; it listened on every interface ([::]) for 127.0.0.1 too."""
    import threading

    from jes.distributed.launch import free_port

    port = free_port()
    seen = {}

    def watch():  # once both processes are up (the service runs), read which addresses listen on the port
        deadline = time.monotonic() + LAUNCH_TIMEOUT
        while not all((tmp_path / f"up{i}").exists() for i in (0, 1)) and time.monotonic() < deadline:
            time.sleep(0.05)
        seen["listening"] = listening_addresses(port)
        (tmp_path / "done").touch()

    script = tmp_path / "listens.py"
    script.write_text(LISTENS)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    status, output = run_launch("--processes", "2", "--coordinator", f"127.0.0.1:{port}", "--", sys.executable,
                                str(script), str(tmp_path))
    watcher.join(timeout=10)
    assert status == 0 and "[p0] up" in output and "[p1] up" in output, output
    listening = seen.get("listening")
    assert listening, f"nothing listened on port {port} while the run was up:\n{output}"
    loopback = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}
    assert set(listening) <= loopback, f"the coordinator listens on {listening}, not only loopback (0100007F)"


def test_the_port_check_probes_ipv4_on_a_host_without_ipv6(monkeypatch):
    """On a kernel without IPv6 the check's own IPv6 socket failed (EAFNOSUPPORT): a raw OSError refused a
    multi-host run that gRPC, listening on IPv4 there, would have started."""
    import errno
    import socket

    from jes.distributed import jax_runtime

    real_socket = socket.socket

    def no_ipv6(family=socket.AF_INET, *args, **kwargs):
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return real_socket(family, *args, **kwargs)

    monkeypatch.setattr(socket, "socket", no_ipv6)
    with real_socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("0.0.0.0", 0))
        port = probe.getsockname()[1]
    jax_runtime._check_can_listen(f"[::]:{port}", f"10.0.0.1:{port}")  # free on IPv4: no error
    with real_socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(jes.distributed.DistributedSetupError, match=f"port {port} is in use"):
            jax_runtime._check_can_listen(f"[::]:{port}", f"10.0.0.1:{port}")
