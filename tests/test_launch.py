"""jes.distributed.launch: ``jes launch`` owns the process tree of its run, on real process trees.

Each launched process runs ``bash`` with a ``sleep`` in the background and a Python leaf that has a
``sleep`` child of its own; every one of them writes its pid to a file. SIGKILL the launcher, one
process's watchdog, its command or its leaf: the launcher reports the failure and no process of the
run survives. Its normal behaviour (prefixed output, the failing process's status, SIGTERM to the
others, one each) is checked on the way.
"""
import os
import signal
import subprocess
import sys
import time

import pytest
from subprocess_for_tests import checkout_env

START_TIMEOUT = 120  # seconds for both processes' trees to start (Python leaves on a loaded 2-core machine)
EXIT_TIMEOUT = 120  # seconds for the launcher to exit, or for a tree to vanish, once it should

pytestmark = [pytest.mark.hard_timeout(START_TIMEOUT + 2 * EXIT_TIMEOUT + 60),
              pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="reads /proc; the full guarantee is Linux's")]

# One launched process: bash (the command), a sleep it starts, a Python leaf with a sleep child.
TREE = r'''
f="$PIDS_DIR/$JES_PROCESS_ID"
sleep 300 &
echo "sleep $!" >> "$f"
echo "watchdog $PPID" >> "$f"
echo "command $$" >> "$f"
"$PYTHON" -c '
import os, subprocess, sys, time
child = subprocess.Popen(["sleep", "300"])
with open(sys.argv[1], "a") as f:
    f.write(f"grandchild {child.pid}\nleaf {os.getpid()}\n")
time.sleep(300)
' "$f"
exit $?
'''


def start_time(pid):
    """The start time of a live ``pid`` (None if gone or a zombie): tells a pid from its reuse."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


class Run:
    """A ``jes launch --processes 2`` of ``TREE`` in a subprocess, with the pids of every process it started."""

    def __init__(self, tmp_path):
        self.pids_dir = tmp_path / "pids"
        self.pids_dir.mkdir()
        self.log = open(tmp_path / "launch.log", "w+")
        env = checkout_env(PIDS_DIR=str(self.pids_dir), PYTHON=sys.executable)
        self.launcher = subprocess.Popen([sys.executable, "-m", "jes.cli", "launch", "--processes", "2",
                                          "--no-pin-cores", "--", "bash", "-c", TREE], env=env,
                                         stdout=self.log, stderr=subprocess.STDOUT)
        self.tree = {}  # (process id, role) -> (pid, start time)

    def output(self):
        self.log.seek(0)
        return self.log.read()

    def wait_for_trees(self):
        deadline = time.monotonic() + START_TIMEOUT
        roles = {"watchdog", "command", "sleep", "leaf", "grandchild"}
        while time.monotonic() < deadline:
            lines = {}
            for process in (0, 1):
                path = self.pids_dir / str(process)
                if path.exists():
                    for line in path.read_text().splitlines():
                        role, _, pid = line.partition(" ")
                        if pid.strip():
                            lines[process, role] = int(pid)
            if {role for _, role in lines} == roles and len(lines) == 2 * len(roles):
                for key, pid in lines.items():
                    self.tree[key] = (pid, start_time(pid))
                assert all(start for _, start in self.tree.values()), f"a process died early: {self.tree}"
                return
            assert self.launcher.poll() is None, f"jes launch exited early:\n{self.output()}"
            time.sleep(0.1)
        pytest.fail(f"the launched trees did not start within {START_TIMEOUT}s (pids so far: {lines}):\n"
                    f"{self.output()}")

    def survivors(self):
        return {key: pid for key, (pid, start) in self.tree.items() if start_time(pid) == start}

    def assert_all_gone(self, what):
        deadline = time.monotonic() + EXIT_TIMEOUT
        while self.survivors() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not self.survivors(), (f"after {what}, these processes of the run still ran {EXIT_TIMEOUT}s later: "
                                      f"{self.survivors()}\n{self.output()}")

    def wait_launcher(self):
        try:
            return self.launcher.wait(timeout=EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"jes launch did not exit within {EXIT_TIMEOUT}s:\n{self.output()}")

    def close(self):
        """Whatever the test left running (it failed): kill it, so that one failure does not leak into the others."""
        if self.launcher.poll() is None:
            self.launcher.kill()
            self.launcher.wait()
        for pid in self.survivors().values():
            os.kill(pid, signal.SIGKILL)
        self.log.close()


@pytest.fixture
def run(tmp_path):
    runs = []

    def start():
        runs.append(Run(tmp_path))
        return runs[-1]

    yield start
    for each in runs:
        each.close()


@pytest.mark.parametrize("role", ["watchdog", "command", "leaf"])
def test_sigkill_of_a_process_of_the_tree_stops_the_run_and_leaves_nothing_running(run, role):
    launched = run()
    launched.wait_for_trees()
    os.kill(launched.tree[1, role][0], signal.SIGKILL)
    status = launched.wait_launcher()
    output = launched.output()
    assert status == 128 + signal.SIGKILL, output  # the killed process's status (bash passes its leaf's on)
    assert "jes launch: process 1 " in output and "stopping the other 1 process(es)" in output, output
    launched.assert_all_gone(f"SIGKILL of process 1's {role}")


def test_sigkill_of_the_launcher_leaves_nothing_running(run):
    launched = run()
    launched.wait_for_trees()
    launched.launcher.kill()
    assert launched.wait_launcher() == -signal.SIGKILL
    launched.assert_all_gone("SIGKILL of the launcher")


def launch(tmp_path, script, *flags):
    """``jes launch --processes 2 FLAGS -- bash -c SCRIPT``: (status, output)."""
    env = checkout_env(PIDS_DIR=str(tmp_path))
    try:
        done = subprocess.run([sys.executable, "-m", "jes.cli", "launch", "--processes", "2", *flags, "--",
                               "bash", "-c", script], env=env, capture_output=True, text=True, timeout=EXIT_TIMEOUT)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"jes launch did not exit within {EXIT_TIMEOUT}s:\n{error.stdout}\n{error.stderr}")
    return done.returncode, done.stdout + done.stderr


def test_a_failure_stops_the_others_with_one_sigterm_and_returns_its_status(tmp_path):
    script = r'''
if [ "$JES_PROCESS_ID" = 1 ]; then
    until [ -e "$PIDS_DIR/ready" ]; do sleep 0.05; done
    exit 3
fi
trap 'echo "SIGTERM in $JES_PROCESS_ID of $JES_NUM_PROCESSES"; exit 0' TERM
sleep 300 &
touch "$PIDS_DIR/ready"
wait
'''
    status, output = launch(tmp_path, script)
    assert status == 3, output
    assert "jes launch: process 1 exited with status 3; stopping the other 1 process(es)" in output, output
    assert output.count("[p0] SIGTERM in 0 of 2\n") == 1, output  # forwarded once by its watchdog


def test_what_a_command_leaves_running_is_stopped_when_it_exits(tmp_path):
    status, output = launch(tmp_path, 'sleep 300 & echo "left $!"; echo "id $JES_PROCESS_ID"', "--no-prefix")
    assert status == 0, output
    assert "id 0\n" in output and "id 1\n" in output, output
    left = [int(line.split()[1]) for line in output.splitlines() if line.startswith("left ")]
    assert len(left) == 2, output
    deadline = time.monotonic() + EXIT_TIMEOUT
    while any(start_time(pid) for pid in left) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(start_time(pid) for pid in left), f"the background sleeps {left} outlived their run:\n{output}"


def test_a_command_that_cannot_start_is_an_error(tmp_path):
    env = checkout_env()
    done = subprocess.run([sys.executable, "-m", "jes.cli", "launch", "--processes", "2", "--",
                           str(tmp_path / "no-such-program")], env=env, capture_output=True, text=True,
                          timeout=EXIT_TIMEOUT)
    assert done.returncode == 2 and "cannot start" in done.stderr and "no such executable" in done.stderr, done.stderr


# Each process saves for 2 s on Ctrl-C (as jes train's process 0 does a checkpoint), then exits 130.
SAVES_ON_CTRL_C = r'''
trap 'echo "saving in $JES_PROCESS_ID"; sleep 2; echo "saved in $JES_PROCESS_ID"; exit 130' INT
trap 'echo "SIGTERM in $JES_PROCESS_ID"; exit 143' TERM
sleep 300 &
touch "$PIDS_DIR/ready$JES_PROCESS_ID"
wait
'''


def wait_for(predicate, what, launcher, log):
    deadline = time.monotonic() + START_TIMEOUT
    while not predicate():
        if launcher.poll() is not None or time.monotonic() > deadline:
            launcher.kill()
            launcher.wait()
            pytest.fail(f"{what} did not happen within {START_TIMEOUT}s (launcher status {launcher.returncode}):\n"
                        f"{log.read_text()}")
        time.sleep(0.05)


@pytest.mark.parametrize("first, second", [(signal.SIGINT, signal.SIGINT), (signal.SIGTERM, signal.SIGTERM),
                                           (signal.SIGINT, signal.SIGTERM)], ids=["int-int", "term-term", "int-term"])
def test_ctrl_c_or_sigterm_is_passed_on_and_a_second_one_waits_for_the_processes_to_save(tmp_path, first, second):
    """A second Ctrl-C while the processes saved printed a traceback and left them to their watchdogs (process 0's
    checkpoint cut off); SIGTERM (timeout, docker stop) killed the launcher at once, silently, their output lost."""
    log = tmp_path / "launch.log"
    env = checkout_env(PIDS_DIR=str(tmp_path))
    with open(log, "w") as out:
        launcher = subprocess.Popen([sys.executable, "-m", "jes.cli", "launch", "--processes", "2", "--no-pin-cores",
                                     "--", "bash", "-c", SAVES_ON_CTRL_C], env=env, stdout=out,
                                    stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: all((tmp_path / f"ready{i}").exists() for i in (0, 1)), "both processes' start", launcher,
                 log)
        launcher.send_signal(first)
        wait_for(lambda: "saving in 0" in log.read_text(), "process 0's save", launcher, log)
        launcher.send_signal(second)
        try:
            status = launcher.wait(timeout=EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"jes launch did not exit within {EXIT_TIMEOUT}s:\n{log.read_text()}")
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    output = log.read_text()
    assert status == 128 + first, output
    assert "Traceback" not in output and "SIGTERM in" not in output, output  # no traceback, no process cut off
    assert "[p0] saved in 0" in output and "[p1] saved in 1" in output, output
    assert "jes launch: still waiting for the processes to save and exit" in output, output
    if first == signal.SIGTERM:
        assert "jes launch: SIGTERM: passing it on as a Ctrl-C" in output, output
