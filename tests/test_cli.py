"""jes.cli: the jes command as a subprocess (help, a short train, eval) and in-process (sweep, errors)."""
import csv
import inspect
import os
import re
import shutil
import socket
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jes
from jes import checkpoint, cli
from subprocess_for_tests import checkout_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL_FLAGS = ["--population", "16", "--chunk-size", "8", "--hidden", "3", "--layers", "1", "--eval-episodes", "4"]


def jes_cmd(*args, cwd=ROOT):
    # this checkout's jes, from any working directory
    return subprocess.run([sys.executable, "-m", "jes.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300, env=checkout_env())


def test_train_help():
    out = jes_cmd("train", "--help")
    assert out.returncode == 0
    for flag in ("--env", "--policy", "--hidden", "--layers", "--optimizer", "--population", "--generations", "--seed",
                 "--log-dir", "--checkpoint", "--resume", "--devices", "--listen", "--secret-file"):
        assert flag in out.stdout


def test_quickstart_module_help():
    out = subprocess.run([sys.executable, "-m", "jes", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and "--optimizer" in out.stdout


def test_python_m_jes_runs_the_jes_commands_where_no_console_script_is_on_path():
    # a new user tried `python -m jes train --perturbation low_rank`: "unrecognized arguments"
    out = subprocess.run([sys.executable, "-m", "jes", "train", "--help"], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0 and "--perturbation" in out.stdout and "--rank" in out.stdout, out.stderr
    out = subprocess.run([sys.executable, "-m", "jes", "eval"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and "jes eval: error: the following arguments are required: FILE" in out.stderr, \
        out.stderr
    out = subprocess.run([sys.executable, "-m", "jes", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "python -m jes train" in out.stdout


def test_quickstart_module_bad_values_are_one_line_errors(tmp_path):
    for flags, message in ((["--generations", "0"], "python -m jes: --generations must be a positive integer, got 0"),
                           (["--optimizer", "bogus"], "python -m jes: --optimizer bogus: unknown optimizer")):
        out = subprocess.run([sys.executable, "-m", "jes", *flags], capture_output=True, text=True, cwd=str(tmp_path),
                             timeout=300)
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_quickstart_module_prints_each_generation_once_when_its_output_is_not_a_terminal(tmp_path):
    # a log or CI: one console line per generation (no progress bar to clear, so no table after it)
    try:
        out = subprocess.run([sys.executable, "-m", "jes", "--generations", "2"], capture_output=True, text=True,
                             cwd=str(tmp_path), timeout=600)
    except subprocess.TimeoutExpired:
        pytest.fail("python -m jes --generations 2 did not finish within 600 s")
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split(":")[0] for line in lines if line.startswith("generation")] == \
        ["generation 1/2", "generation 2/2"], out.stdout
    assert any(line.startswith("centre policy over 100 fresh episodes:") for line in lines), out.stdout


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    out = jes_cmd("train", *SMALL_FLAGS, "--generations", "2", "--optimizer", "novograd", "--seed", "4",
                  "--log-dir", str(root / "run"), "--save-policy", str(root / "final.policy"), cwd=str(root))
    assert out.returncode == 0, out.stderr
    return root, out


def test_short_train_run_writes_logs_and_checkpoint(trained):
    root, out = trained
    assert "CartPole-v1 with novograd: 2 generations" in out.stdout
    assert f"logs: {root / 'run'}; checkpoint: {root / 'run' / 'checkpoint.ckpt'}" in out.stdout
    assert "generation 1/2: mean" in out.stdout  # not a terminal: a line per generation
    assert f"saved the centre policy to {root / 'final.policy'}" in out.stdout
    ckpt = checkpoint.read(str(root / "run" / "checkpoint.ckpt"))
    assert ckpt.generation == 2 and ckpt.optimizer == "novograd" and ckpt.meta["config"]["num_members"] == 16
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(root / "run"))


def test_eval_checkpoint(trained, capsys):
    root, _ = trained
    assert cli.main(["eval", str(root / "run" / "checkpoint.ckpt"), "--episodes", "4"]) == 0
    line = capsys.readouterr().out
    assert "generation 2: centre return" in line and "over 4 episodes" in line


@pytest.mark.hard_timeout(300)
def test_a_warning_prints_as_one_line_of_the_command(trained, tmp_path):
    """Warnings printed jes's source file and line (`/.../jes/cli.py:458: UserWarning ...  result = sweep(...)`)."""
    root, _ = trained
    ckpt = str(tmp_path / "c.ckpt")
    shutil.copy(root / "run" / "checkpoint.ckpt", ckpt)
    out = jes_cmd("train", "--resume", ckpt, "--generations", "3", "--learning-rate", "0.05", "--log-dir", "none",
                  "--no-progress", cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if "learning_rate=0.05" in line]
    assert lines and lines[0].startswith("jes train: UserWarning: ") and not re.search(r"jes/\w+\.py:\d+", out.stderr), \
        out.stderr


def test_an_unknown_optimizer_on_the_command_line_lists_the_names_it_takes(capsys):
    """The advice was to pass an optax object, which the command line cannot."""
    assert cli.main(["train", "--optimizer", "adamw", "--generations", "1", "--log-dir", "none"]) == 2
    err = capsys.readouterr().err
    assert "--optimizer adamw: unknown optimizer; the command line takes adabelief" in err and "optax." not in err


def test_resume_on_another_env_names_the_env(trained, capsys):
    """It was refused by the policy's output shape (the checkpoint's policy has CartPole's 2 outputs)."""
    root, _ = trained
    ckpt = str(root / "run" / "checkpoint.ckpt")
    assert cli.main(["train", "--resume", ckpt, "--env", "Acrobot-v1", "--generations", "3"]) == 2
    assert "--env Acrobot-v1: the checkpoint's run is on 'CartPole-v1'" in capsys.readouterr().err


@pytest.mark.hard_timeout(300)
def test_eval_of_a_saved_policy_file_gives_its_checkpoints_returns(trained, tmp_path, capsys):
    root, _ = trained
    ckpt = str(root / "run" / "checkpoint.ckpt")
    trainer, state, _ = checkpoint.load(ckpt)
    path = jes.loop.trained_policy(trainer, state.params, state).save(str(tmp_path / "centre.policy"))
    returns = lambda out: re.search(r"return (\S+ \+/- \S+) over 6 episodes", out).group(1)
    assert cli.main(["eval", ckpt, "--episodes", "6"]) == 0
    from_checkpoint = returns(capsys.readouterr().out)
    assert cli.main(["eval", path, "--episodes", "6"]) == 0
    out = capsys.readouterr().out
    assert "saved policy" in out and returns(out) == from_checkpoint  # the same episodes, the same bits
    # The command line writes the same file: jes train --save-policy (the fixture's run), jes eval --save-policy
    assert cli.main(["eval", ckpt, "--episodes", "6", "--save-policy", str(tmp_path / "new" / "from_eval.policy")]) == 0
    assert returns(capsys.readouterr().out) == from_checkpoint
    written = [jes.load_policy(str(p)) for p in (path, root / "final.policy", tmp_path / "new" / "from_eval.policy")]
    assert all(p.flat_params.tobytes() == written[0].flat_params.tobytes() and p.env_name == "CartPole-v1"
               for p in written)


def test_save_policy_paths_are_refused_before_anything_runs(trained, tmp_path, capsys):
    """--save-policy over the run's own checkpoint, into a folder that is not there, of a policy file."""
    root, _ = trained
    ckpt = str(tmp_path / "c.ckpt")
    shutil.copy(root / "run" / "checkpoint.ckpt", ckpt)
    (tmp_path / "afile").write_text("")
    for argv, message in (
            (["eval", ckpt, "--save-policy", ckpt], f"--save-policy {ckpt} is the run's checkpoint"),
            (["eval", ckpt, "--save-policy", str(tmp_path / "afile" / "x.policy")], "afile is a file, not a folder"),
            (["train", "--generations", "1", "--log-dir", str(tmp_path / "run"), "--save-policy",
              str(tmp_path / "run" / "checkpoint.ckpt")], "is the run's checkpoint"),  # the log dir's, by default
            (["eval", str(root / "final.policy"), "--save-policy", str(tmp_path / "x.policy")],
             "is a policy file already"),
            (["train", "--resume", ckpt, "--generations", "3", "--save-policy", ckpt], "is the run's checkpoint"),
            (["train", "--generations", "1", "--log-dir", "none", "--save-policy", str(tmp_path)], "is a folder"),
            (["train", "--generations", "1", "--log-dir", "none", "--save-policy", ckpt],  # another run's checkpoint
             f"--save-policy {ckpt} exists and is not a policy file"),
            (["eval", str(root / "final.policy"), "--save-policy", str(root / "final.policy")],  # the file it reads
             "is a policy file already")):
        assert cli.main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
    assert checkpoint.read(ckpt).generation == 2 and not os.path.exists(tmp_path / "x.policy")
    assert not os.path.exists(tmp_path / "run")  # refused before anything ran


def test_a_save_policy_the_run_never_reached_is_said(trained, monkeypatch, tmp_path, capsys):
    """A run that does not finish (Ctrl-C, SIGTERM, a diverged update) writes no policy file: said, with how to write
    it from the checkpoint."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(jes, "train", interrupted)
    path = str(tmp_path / "new" / "x.policy")  # a folder to be made when it is written
    assert cli.main(["train", "--generations", "1", "--log-dir", "none", "--save-policy", path]) == 130
    assert (f"there is nothing to --resume; nor --save-policy {path}: the run ended before it)"
            in capsys.readouterr().err)
    ckpt = tmp_path / "run.ckpt"  # the interrupted run's checkpoint: named with how to write its centre
    shutil.copy(trained[0] / "run" / "checkpoint.ckpt", ckpt)
    assert cli.main(["train", "--resume", str(ckpt), "--save-policy", path]) == 130
    assert (f"continue with --resume {ckpt}; --save-policy {path} was not written: jes eval {ckpt} --save-policy "
            f"{path} writes its centre)" in capsys.readouterr().err)


@pytest.mark.hard_timeout(300)
def test_eval_of_a_run_given_an_optax_object_and_a_schedule(tmp_path, capsys):
    """`jes eval` could not open such checkpoints ("unknown optimizer 'GradientTransformationExtraArgs'", "the run used
    schedule(s)"), though evaluating the centre reads neither."""
    import optax

    path = str(tmp_path / "run.ckpt")
    optimizer = optax.chain(optax.clip(1.0), optax.adam(0.05))
    noise = optax.linear_schedule(0.2, 0.1, 2)
    jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", optimizer, noise_std=noise, num_members=8,
              num_generations=2, eval_episodes=2, log_dir=None, checkpoint_path=path, progress=False, key=3)
    trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", optimizer,
                          jes.ESConfig(num_members=8, eval_episodes=2, noise_std=noise))
    state = checkpoint.read(path).restore_state(trainer)  # the run's own state, as the docs' recipe restores it
    expected = np.asarray(trainer.evaluate_centre(state, 6, jes.generation.as_key(12345))[0])
    assert cli.main(["eval", path, "--episodes", "6"]) == 0
    out = capsys.readouterr().out
    assert f"centre return {expected.mean():.2f} +/- {expected.std():.2f} over 6 episodes" in out, out


class _TopK(jes.strategies.OpenAIES):
    """A strategy of the user's own (own name, not registered): its module is not one a file may name."""

    name = "topk_es"

    def weights(self, ctx, state, fitness):
        top = jax.numpy.where(jax.numpy.argsort(jax.numpy.argsort(-fitness)) < 4, 1.0, 0.0)
        return top - top.mean()


def test_eval_of_a_checkpoint_of_your_own_strategy(tmp_path, capsys):
    """`jes eval` failed with "cannot rebuild the strategy ... unknown strategy 'topk_es'"; evaluating the centre
    does not need the strategy: it is evaluated as the run would, and the line names the file's strategy."""
    trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "adam",
                          jes.ESConfig(num_members=8, eval_episodes=2), strategy=_TopK())
    path = checkpoint.save(str(tmp_path / "run.ckpt"), trainer, trainer.init_state(3))
    state = checkpoint.read(path).restore_state(trainer)
    expected = np.asarray(trainer.evaluate_centre(state, 6, jes.generation.as_key(12345))[0])
    assert cli.main(["eval", path, "--episodes", "6"]) == 0
    out = capsys.readouterr().out
    assert f"strategy topk_es ({_TopK.__module__}:_TopK), generation 0: centre return {expected.mean():.2f} +/- " \
           f"{expected.std():.2f} over 6 episodes" in out, out
    # a resume needs the strategy itself: the command line says how to get at the run from Python
    assert cli.main(["train", "--resume", path, "--log-dir", "none", "--no-progress"]) == 2
    assert "restore_state(" in capsys.readouterr().err


def test_eval_missing_or_bad_checkpoint(tmp_path, capsys):
    assert cli.main(["eval", str(tmp_path / "none.ckpt")]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    (tmp_path / "junk.ckpt").write_bytes(b"junk" * 20)
    assert cli.main(["eval", str(tmp_path / "junk.ckpt")]) == 2
    assert "not a jes checkpoint" in capsys.readouterr().err


def test_eval_of_a_damaged_policy_file_calls_it_a_policy_file(trained, tmp_path, capsys):
    """`jes eval` chose its reader by the file's first bytes alone: an empty or damaged .policy file was called "a
    checkpoint" ("checkpoint x.policy is truncated", "x.policy is not a jes checkpoint"), unlike jes.load_policy."""
    for name, data, message in (("empty.policy", b"", "is truncated (0 bytes): not a complete jes policy file"),
                                ("junk.policy", b"junk" * 20, "junk.policy is not a jes policy file"),
                                ("missing.policy", None, "no policy file at")):
        path = tmp_path / name
        if data is not None:
            path.write_bytes(data)
        assert cli.main(["eval", str(path)]) == 2
        err = capsys.readouterr().err
        assert message in err and "checkpoint" not in err, err
    # A checkpoint named .policy is read by its first bytes, as before
    root, _ = trained
    shutil.copy(root / "run" / "checkpoint.ckpt", tmp_path / "named.policy")
    assert cli.main(["eval", str(tmp_path / "named.policy"), "--episodes", "2"]) == 0
    assert "generation 2: centre return" in capsys.readouterr().out


def test_a_strategy_given_as_the_optimizer_is_refused_in_the_command_lines_words(tmp_path, capsys):
    assert cli.main(["train", "--optimizer", "SNES", "--log-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "'SNES' is a strategy, not an optimizer: give it as --strategy SNES" in err
    assert "strategy=" not in err and not (tmp_path / "run").exists()


def test_config_errors_name_the_flags_given(tmp_path, capsys):
    assert cli.main(["train", "--population", "15", "--log-dir", "none"]) == 2
    assert "jes train: --population 15 is odd" in capsys.readouterr().err.replace("\n", " ")
    assert cli.main(["train", "--population", "16", "--chunk-size", "7", "--log-dir", "none"]) == 2
    err = capsys.readouterr().err
    assert "--chunk-size 7 must be even" in err and "chunk_size=" not in err
    assert cli._flag_named("num_members=15 is odd ... or antithetic=False") == "--population 15 is odd ... or --no-antithetic"
    for path in ("no checkpoint at 'runs/num_members=16/c'", "no checkpoint at runs/num_members=16,noise_std=0.02/c",
                 "no checkpoint at num_members=16,noise_std=0.02/c", 'no file "antithetic=False"'):
        assert cli._flag_named(path) == path  # paths and sweep run folders are left as they are


def test_distributed_flags(tmp_path, capsys):
    secret = tmp_path / "secret"
    if "master" in inspect.signature(jes.train).parameters:
        assert cli.main(["train", "--secret-file", str(secret)]) == 2  # a secret without a master
        assert "add --listen" in capsys.readouterr().err
        secret.write_text("\n")
        assert cli.main(["train", "--listen", "127.0.0.1:1", "--secret-file", str(secret)]) == 2
        assert "use at least 16" in capsys.readouterr().err
        secret.write_text("a-secret-of-sixteen-or-more-characters\n")
        with socket.socket() as busy:  # a port another program holds: one line, not a traceback
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
            assert cli.main(["train", "--listen", f"127.0.0.1:{port}", "--secret-file", str(secret),
                             "--generations", "1", "--log-dir", "none", "--checkpoint", "none"]) == 2
        assert f"jes train: cannot listen on tcp://127.0.0.1:{port}: Address already in use" in capsys.readouterr().err
    else:
        secret.write_text("s3cret\n")
        assert cli.main(["train", "--listen", "127.0.0.1:5555", "--secret-file", str(secret)]) == 2
        assert "does not have" in capsys.readouterr().err


def test_master_timing_flags(tmp_path, capsys, monkeypatch):
    assert cli.main(["train", "--worker-timeout", "5"]) == 2
    assert "add --listen" in capsys.readouterr().err
    if "master_options" not in inspect.signature(jes.train).parameters:
        pytest.skip("jes.train has no master_options yet")
    seen = {}

    class Stop(Exception):
        pass

    def fake_train(policy, env, optimizer, *, master=None, secret=None, master_options=None, **kwargs):
        seen.update(master=master, master_options=master_options)
        raise Stop

    monkeypatch.setattr(jes, "train", fake_train)
    # An unexpected error: its traceback, then 2, as any error that stops jes train
    assert cli.main(["train", "--listen", "127.0.0.1:0", "--heartbeat-interval", "0.5", "--worker-timeout", "5",
                     "--first-range-timeout", "30", "--min-range-deadline", "2", "--range-seconds", "3",
                     "--max-range-chunks", "8"]) == 2
    assert "Traceback" in capsys.readouterr().err
    assert seen["master"] == "127.0.0.1:0" and seen["master_options"] == dict(heartbeat_interval=0.5, worker_timeout=5.0, assign_timeout=30.0,
                                          min_deadline=2.0, target_range_seconds=3.0, max_range_chunks=8)


def test_keys_command(tmp_path, capsys):
    from jes.distributed.protocol import load_curve_key

    name = str(tmp_path / "master")
    assert cli.main(["keys", name]) == 0
    assert "--curve-server-key" in capsys.readouterr().out
    assert os.stat(name + ".secret").st_mode & 0o077 == 0  # the secret key is private
    public = load_curve_key(name + ".public", "key")
    import zmq

    assert zmq.curve_public(load_curve_key(name + ".secret", "key")) == public
    assert cli.main(["keys", name]) == 2  # never overwrites a key
    with pytest.raises(ValueError, match="40"):
        load_curve_key("short", "key")


def test_sweep_command(tmp_path, capsys):
    config = tmp_path / "sweep.toml"
    config.write_text(
        'env = "CartPole-v1"\nseeds = [0, 1]\n'
        f'out_dir = "{tmp_path / "out"}"\nlog_dir = "{tmp_path / "tb"}"\n'
        '[policy]\ntype = "gru"\nhidden = 3\nlayers = 1\n'
        '[config]\nnum_members = 16\nchunk_size = 8\nnum_generations = 2\neval_episodes = 4\n'
        'learning_rate = [0.01, 0.03]\n'
    )
    assert cli.main(["sweep", str(config)]) == 0
    assert "learning_rate=0.03: final centre return" in capsys.readouterr().out
    with open(tmp_path / "out" / "sweep.csv") as f:
        assert len(list(csv.DictReader(f))) == 2


@pytest.mark.slow
@pytest.mark.hard_timeout(420)
def test_train_as_distributed_master_with_a_worker(tmp_path):
    if "master" not in inspect.signature(jes.train).parameters:
        pytest.skip("this jes has no distributed training")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    secret = tmp_path / "secret"
    secret.write_text("a-test-secret-of-32-bytes-length\n")
    master = subprocess.Popen(
        [sys.executable, "-m", "jes.cli", "train", *SMALL_FLAGS, "--generations", "2", "--seed", "4",
         "--log-dir", str(tmp_path / "run"), "--listen", f"127.0.0.1:{port}", "--secret-file", str(secret)],
        cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The worker's output goes to a file: a pipe nobody reads can fill and block it.
    worker_log = open(tmp_path / "worker.log", "w")
    worker = subprocess.Popen(
        [sys.executable, "-m", "jes.distributed.worker", "--master", f"127.0.0.1:{port}", "--secret-file", str(secret)],
        cwd=str(tmp_path), stdout=worker_log, stderr=subprocess.STDOUT, text=True)
    try:
        out, err = master.communicate(timeout=240)
        assert master.returncode == 0, err
        assert "2 generations" in out
        assert checkpoint.read(str(tmp_path / "run" / "checkpoint.ckpt")).generation == 2
        # the master's own log, as the guide says (it was silent: only jes-worker configured logging)
        assert "jes.distributed.master INFO master listening on" in err and "connected" in err, err[-3000:]
    finally:
        slow_to_exit = []
        for proc in (master, worker):
            if proc.poll() is None:
                proc.terminate()
                try:
                    # SIGTERM is handled between Python bytecodes: a worker in the middle of an XLA compile
                    # (tens of seconds on a loaded 2-core machine) exits when that compile returns.
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=30)
                    slow_to_exit.append(proc)
        worker_log.close()
    assert not slow_to_exit, ("a process did not exit within 120 s of SIGTERM; worker log:\n"
                              + (tmp_path / "worker.log").read_text()[-3000:])


def test_help_is_plain_and_shows_real_defaults():
    for args in (["--help"], ["train", "--help"], ["eval", "--help"]):
        out = jes_cmd(*args)
        assert out.returncode == 0
        assert "(default: None)" not in out.stdout and "::" not in out.stdout and "``" not in out.stdout
        for line in out.stdout.replace("\n                        ", " ").splitlines():
            assert line.count("(default") <= 1, line
    train_help = jes_cmd("train", "--help").stdout
    assert "(default: 512)" in train_help
    for flag in ("--weight-decay", "--fitness-shaping", "--no-antithetic", "--policy-arg"):
        assert flag in train_help


def test_help_needs_no_jax():
    code = "import sys; import jes.cli; jes.cli._parser(); assert 'jax' not in sys.modules, 'jax was imported'"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr


def test_the_strategy_help_names_every_registered_strategy():
    help_text = " ".join(jes_cmd("train", "--help").stdout.split())
    for name in jes.strategies.names():
        # whole words: "cma_es" is also the tail of "sep_cma_es"
        assert re.search(rf"(?<![\w]){name}(?![\w])", help_text), f"jes train --help does not list the strategy {name}"


def test_help_defaults_match_esconfig():
    config = jes.ESConfig()
    for field, value in cli.CONFIG_DEFAULTS.items():
        assert getattr(config, field) == value, field


POLICY_MODULE = '''
import flax.linen as nn


class TinyPolicy(nn.Module):
    features: int = 4
    num_outputs: int | None = None

    @nn.compact
    def __call__(self, obs):
        return nn.Dense(self.num_outputs)(nn.tanh(nn.Dense(self.features)(obs)))
'''


def test_custom_policy_flags_and_resume_from_the_checkpoint_alone(tmp_path, monkeypatch, capsys):
    (tmp_path / "mypolicies_cli.py").write_text(POLICY_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    ckpt = str(tmp_path / "run.ckpt")
    flags = ["--population", "15", "--chunk-size", "8", "--eval-episodes", "2", "--log-dir", "none", "--no-progress",
             "--max-episode-steps", "50"]
    assert cli.main(["train", "--policy", "mypolicies_cli:TinyPolicy", "--policy-arg", "features=3", "--no-antithetic",
                     "--weight-decay", "0.01", "--fitness-shaping", "z_score", "--generations", "1",
                     "--checkpoint", ckpt, *flags]) == 0
    meta = checkpoint.read(ckpt).meta
    assert meta["policy"]["class"] == "mypolicies_cli:TinyPolicy" and meta["policy"]["fields"]["features"] == 3
    assert meta["config"]["antithetic"] is False and meta["config"]["weight_decay"] == 0.01
    assert meta["config"]["fitness_shaping"] == "z_score" and meta["config"]["num_members"] == 15
    capsys.readouterr()

    # --resume alone (plus more generations): everything else comes from the checkpoint
    assert cli.main(["train", "--resume", ckpt, "--generations", "2", "--log-dir", "none", "--no-progress"]) == 0
    assert "2 generations" in capsys.readouterr().out
    assert checkpoint.read(ckpt).generation == 2

    # a new learning rate is allowed with a warning, and used
    with pytest.warns(UserWarning, match="learning_rate=0.05"):
        assert cli.main(["train", "--resume", ckpt, "--generations", "3", "--learning-rate", "0.05",
                         "--log-dir", "none", "--no-progress"]) == 0
    assert checkpoint.read(ckpt).history["learning_rate"][-1] == pytest.approx(0.05)

    # an unsafe change is refused, naming it
    assert cli.main(["train", "--resume", ckpt, "--generations", "4", "--noise-std", "0.5", "--log-dir", "none"]) == 2
    err = capsys.readouterr().err
    assert "config.noise_std" in err and "num_generations" in err

    # another strategy is refused as a difference, not as an optimizer the user never gave
    assert cli.main(["train", "--resume", ckpt, "--generations", "4", "--strategy", "snes", "--log-dir", "none"]) == 2
    err = capsys.readouterr().err
    assert "strategy: checkpoint has" in err and "drop the optimizer" not in err, err

    # A fresh process never imports the checkpoint's policy module on the file's say-so; --allow-module permits it.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))
    refused = subprocess.run([sys.executable, "-m", "jes.cli", "eval", ckpt, "--episodes", "2"], capture_output=True,
                             text=True, env=env, timeout=300)
    assert refused.returncode == 2 and "--allow-module" in refused.stderr, refused.stderr
    allowed = subprocess.run([sys.executable, "-m", "jes.cli", "eval", ckpt, "--episodes", "2", "--allow-module",
                              "mypolicies_cli"], capture_output=True, text=True, env=env, timeout=300)
    assert allowed.returncode == 0 and "centre return" in allowed.stdout, allowed.stderr


RAW_MATMUL_MODULE = '''
import flax.linen as nn
import jax.numpy as jnp


class RawMatmulPolicy(nn.Module):
    num_outputs: int | None = None

    @nn.compact
    def __call__(self, obs):
        w = self.param("w", nn.initializers.lecun_normal(), (obs.shape[-1], 4))
        return nn.Dense(self.num_outputs)(jnp.tanh(obs @ w))
'''


@pytest.mark.hard_timeout(300)
def test_eval_of_a_low_rank_checkpoint_does_not_repeat_the_fallback_warning(tmp_path, monkeypatch, capsys):
    (tmp_path / "rawmatmul_cli.py").write_text(RAW_MATMUL_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    ckpt = str(tmp_path / "run.ckpt")
    with pytest.warns(jes.perturbations.LowRankFallbackWarning, match=r"(?s)full-rank noise.*params/w \[4, 4\] of layer RawMatmulPolicy"):
        assert cli.main(["train", "--policy", "rawmatmul_cli:RawMatmulPolicy", "--perturbation", "low_rank",
                         "--population", "8", "--generations", "1", "--eval-episodes", "2", "--max-episode-steps",
                         "20", "--checkpoint", ckpt, "--log-dir", "none", "--no-progress"]) == 0
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(["eval", ckpt, "--episodes", "2", "--allow-module", "rawmatmul_cli"]) == 0
    assert "centre return" in capsys.readouterr().out
    assert not [w for w in caught if issubclass(w.category, jes.perturbations.LowRankFallbackWarning)]


def test_a_bad_checkpoint_interval_or_device_count_is_a_clean_error_named_by_its_flag(tmp_path):
    # --checkpoint-every was checked after the step's compile had started in a thread: the process then aborted at
    # its exit ("FATAL: exception not rethrown", status 134) instead of returning 2
    # The CLI makes one CPU device per usable core: 2 CPU devices here, whatever the machine (on one of 99 cores or
    # more, --devices 99 would be valid and the run would train)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JES_CPU_DEVICES="2", JAX_PLATFORMS="cpu")
    for flags, message in ((["--checkpoint-every", "-2"], "jes train: --checkpoint-every -2: must be an integer >= 0"),
                           (["--devices", "99"], "jes train: --devices 99: this process sees 2 local device(s)")):
        out = subprocess.run([sys.executable, "-m", "jes.cli", "train", "--generations", "1", "--log-dir", "none",
                              "--no-progress", *flags], capture_output=True, text=True, cwd=str(tmp_path), timeout=300,
                             env=env)
        assert out.returncode == 2, (flags, out.returncode, out.stderr[-2000:])
        assert message in out.stderr and "FATAL" not in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("flags,message", [
    (["--policy", "nosuchmodule_xyz:Policy"], "cannot import"),
    (["--policy", "gru", "--policy-arg", "nonsense=1"], "has no such field"),
    (["--policy", "gru", "--policy-arg", "hidden"], "KEY=VALUE"),
    (["--policy", "lstm"], "module.path:ClassName"),
])
def test_bad_policy_flags_say_what_to_do(flags, message, capsys):
    assert cli.main(["train", *flags, "--log-dir", "none"]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flags,message", [
    (["--perturbation", "low_rank", "--rank", "0"], "--rank (perturbation_rank) must be a positive integer, got 0"),
    (["--population", "0"], "--population (num_members) must be a positive integer"),
])
def test_a_bad_config_value_is_named_by_its_flag(flags, message, capsys):
    assert cli.main(["train", "--policy", "gru", *flags, "--log-dir", "none"]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.hard_timeout(300)
def test_resume_continues_with_the_chunk_its_run_evaluated_though_the_default_changed(tmp_path, monkeypatch, capsys):
    from jes.perturbations import low_rank

    flags = ["--population", "16", "--hidden", "3", "--layers", "1", "--eval-episodes", "2", "--perturbation", "low_rank",
             "--no-progress", "--log-dir", "none"]
    first, whole = str(tmp_path / "first.ckpt"), str(tmp_path / "whole.ckpt")
    monkeypatch.setattr(low_rank, "CHUNK_SIZE", 8)  # the default chunk of the jes that started the run
    assert cli.main(["train", *flags, "--generations", "2", "--checkpoint", whole]) == 0
    assert cli.main(["train", *flags, "--generations", "1", "--checkpoint", first]) == 0
    monkeypatch.undo()  # today's default: one chunk of 16
    assert cli.main(["train", "--resume", first, "--generations", "2", "--no-progress", "--log-dir", "none"]) == 0
    resumed, uninterrupted = checkpoint.read(first), checkpoint.read(whole)
    assert resumed.meta["chunk_size"] == uninterrupted.meta["chunk_size"] == 8
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(resumed.state_dict),
                                                     jax.tree.leaves(uninterrupted.state_dict)))
    capsys.readouterr()
    assert cli.main(["train", "--resume", first, "--generations", "3", "--chunk-size", "16", "--log-dir", "none"]) == 2
    assert "evaluated 8 members a chunk, this run 16" in capsys.readouterr().err
    # a file from before jes recorded the chunk: the default of the jes that wrote it (a stand-in of 8 here)
    import test_checkpoint

    old = test_checkpoint._rewrite_meta(first, str(tmp_path / "old.ckpt"), lambda meta: meta.pop("chunk_size"))
    monkeypatch.setattr(checkpoint, "_OLD_LOW_RANK_CHUNK", (8, 2 ** 26))
    assert cli.main(["train", "--resume", old, "--generations", "3", "--no-progress", "--log-dir", "none"]) == 0
    assert checkpoint.read(old).meta["chunk_size"] == 8


def test_train_with_low_rank_perturbations_and_a_rank_without_them(tmp_path, capsys):
    assert cli.main(["train", *SMALL_FLAGS, "--generations", "1", "--seed", "2", "--perturbation", "low_rank",
                     "--rank", "2", "--log-dir", str(tmp_path / "run")]) == 0
    meta = checkpoint.read(str(tmp_path / "run" / "checkpoint.ckpt")).meta["config"]
    assert (meta["perturbation"], meta["perturbation_rank"]) == ("low_rank", 2)
    assert "with adam-lowrank-r2:" in capsys.readouterr().out  # the summary says which perturbation ran
    # Resumed as full rank: the mismatch with the checkpoint, not a rank the user never gave
    assert cli.main(["train", "--resume", str(tmp_path / "run" / "checkpoint.ckpt"), "--perturbation", "full_rank",
                     "--generations", "2", "--log-dir", "none"]) == 2
    err = capsys.readouterr().err
    assert "config.perturbation: checkpoint has 'low_rank' (rank 2), this run has 'full_rank'\n" in err
    assert "perturbation_rank" not in err  # not a rank the user never gave
    assert cli.main(["train", "--resume", str(tmp_path / "run" / "checkpoint.ckpt"), "--rank", "3",
                     "--generations", "2", "--log-dir", "none"]) == 2
    assert "config.perturbation: checkpoint has 'low_rank' (rank 2), this run has 'low_rank' (rank 3)" in \
        capsys.readouterr().err
    assert cli.main(["train", *SMALL_FLAGS, "--generations", "1", "--rank", "2", "--log-dir", str(tmp_path / "x")]) == 2
    assert "jes train: --rank 2 is the rank of low-rank perturbations" in capsys.readouterr().err


USERS_MODULE = '''
import flax.linen as nn


class TinyPolicy(nn.Module):
    num_outputs: int | None = None

    @nn.compact
    def __call__(self, obs):
        return nn.Dense(self.num_outputs)(nn.tanh(nn.Dense(4)(obs)))
'''


@pytest.mark.hard_timeout(600)
def test_the_jes_command_imports_an_allowed_module_from_the_current_directory(tmp_path):
    """``jes eval CKPT --allow-module M`` from the directory that holds M.py: the console script (unlike ``python -m``)
    does not put the working directory on sys.path, so an allowed module that ``--policy M:Class`` had found there
    failed to import ("No module named ...") and the error told the user to pass the flag they had passed."""
    script = shutil.which("jes", path=os.path.dirname(sys.executable))
    if script is None:
        pytest.skip("the jes console script is not installed next to this Python")
    (tmp_path / "users_policies.py").write_text(USERS_MODULE)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    train = subprocess.run([script, "train", "--policy", "users_policies:TinyPolicy", "--generations", "1",
                            "--population", "16", "--eval-episodes", "2", "--checkpoint", "run.ckpt", "--log-dir",
                            "none"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert train.returncode == 0, train.stderr[-3000:]
    evaluated = subprocess.run([script, "eval", "run.ckpt", "--allow-module", "users_policies", "--episodes", "2"],
                               capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "TinyPolicy" in evaluated.stdout and "over 2 episodes" in evaluated.stdout, evaluated.stdout


def test_an_interrupt_says_whether_a_checkpoint_was_saved(tmp_path, capsys, monkeypatch):
    """Ctrl-C while compiling, before any checkpoint, advised --resume of a checkpoint that did not exist; the
    advice names the saved checkpoint, and only when it exists."""
    saved = tmp_path / "run.ckpt"

    def interrupted(*args, **kwargs):
        interrupt = KeyboardInterrupt()
        if saved.exists():
            interrupt.checkpoint_path = str(saved)
        raise interrupt

    monkeypatch.setattr(jes, "train", interrupted)
    argv = ["train", "--generations", "1", "--log-dir", "none", "--checkpoint", str(saved)]
    assert cli.main(argv) == 130
    err = capsys.readouterr().err
    assert "no checkpoint was saved" in err and "continue with --resume" not in err
    saved.write_bytes(b"")
    assert cli.main(argv) == 130
    assert f"checkpoint {saved}; continue with --resume {saved}" in capsys.readouterr().err


def test_eval_refuses_zero_episodes_and_a_render_format_before_evaluating(trained, capsys):
    """--episodes 0 printed "over 0 episodes" for config.eval_episodes of them; --render x.png was refused only
    after 100 episodes; seeds beyond 32 bits ran the key of a smaller seed."""
    root, _ = trained
    ckpt = str(root / "run" / "checkpoint.ckpt")
    assert cli.main(["eval", ckpt, "--episodes", "0"]) == 2
    assert "--episodes must be a positive number of episodes, got 0" in capsys.readouterr().err
    evaluated = []
    real = jes.Trainer.evaluate_centre
    try:
        jes.Trainer.evaluate_centre = lambda *a, **k: evaluated.append(1) or real(*a, **k)
        assert cli.main(["eval", ckpt, "--render", str(root / "x.png")]) == 2
    finally:
        jes.Trainer.evaluate_centre = real
    assert "give a .gif path" in capsys.readouterr().err and not evaluated
    trainer, state, _ = checkpoint.load(ckpt)
    with pytest.raises(ValueError, match="num_episodes must be a positive integer, got 0"):
        trainer.evaluate_centre(state, 0)
    with pytest.raises(ValueError, match=r"seed 4294967296 is outside -2\*\*31 .. 2\*\*31 - 1"):
        jes.generation.as_key(2**32)
    with pytest.raises(ValueError, match="stop_at_return must be a number"):
        jes.ESConfig(stop_at_return=float("nan"))


def test_an_interrupted_sweep_says_what_finished_and_how_to_resume_it_not_a_checkpoint(tmp_path, capsys, monkeypatch):
    from envs_for_tests import interrupt_second_batch

    config = tmp_path / "sweep.toml"
    config.write_text(f'env = "CartPole-v1"\nseeds = [0]\nout_dir = "{tmp_path / "out"}"\nlog_dir = "none"\n'
                      '[policy]\ntype = "mlp"\nhidden = 4\nlayers = 1\n'
                      '[config]\nnum_members = [16, 24]\nchunk_size = 8\nnum_generations = 1\neval_episodes = 2\n')
    interrupt_second_batch(monkeypatch)
    assert cli.main(["sweep", str(config)]) == 130
    err = capsys.readouterr().err
    assert "after 1 of 2 configurations finished" in err and str(tmp_path / "out" / "sweep.csv") in err
    # The sweep's own resume (its table), never jes train's checkpoint advice
    assert "resume=True (jes sweep --resume)" in err and "checkpoint" not in err


def test_a_sweep_file_of_the_wrong_type_is_one_line_and_rc_2(tmp_path, capsys):
    config = tmp_path / "sweep.toml"
    config.write_text('env = "CartPole-v1"\n[policy]\nhidden = "eight"\n')
    assert cli.main(["sweep", str(config)]) == 2
    err = capsys.readouterr().err
    assert err == f"jes sweep: sweep file {config}: policy hidden must be a positive integer, got 'eight'\n"


TINY = ["--population", "16", "--chunk-size", "8", "--eval-episodes", "2", "--no-progress"]


def _line_starting(text: str, err: str) -> bool:
    return any(line.startswith(text) for line in err.splitlines())


def test_an_unwritable_checkpoint_is_refused_before_training_in_the_flags_words(tmp_path, capsys):
    """It was found at the first save, after training, with a message naming the save's temporary file."""
    assert cli.main(["train", *TINY, "--generations", "2", "--log-dir", "none", "--checkpoint", "/proc/x.ckpt"]) == 2
    out, err = capsys.readouterr()
    assert "generation 1/2" not in out
    # (after the wait for the step's compile, begun in the background, which every refusal there waits for)
    # (a line of its own: after that wait's line when the compile was still running, else the first line)
    assert "jes train: checkpoint '/proc/x.ckpt' cannot be written: a file cannot be created in '/proc'" in err
    assert _line_starting("jes train: checkpoint '/proc/x.ckpt'", err)
    assert "give --checkpoint PATH in a folder you can write, or --checkpoint none" in err and ".tmp" not in err
    assert cli.main(["train", *TINY, "--generations", "2", "--log-dir", "/proc/jes-runs"]) == 2
    err = capsys.readouterr().err
    assert _line_starting("jes train: log_dir '/proc/jes-runs' cannot be written", err)
    assert "give --log-dir DIR in a folder" in err


def test_a_save_failing_mid_run_prints_the_run_so_far_and_saves_it_elsewhere(tmp_path, capsys, monkeypatch):
    """The run was thrown away with one line naming a temporary file; no summary."""
    target = str(tmp_path / "sub" / "run.ckpt")
    real = checkpoint.save

    def full_from_the_second_save(path, *args, **kwargs):
        if path == target and os.path.exists(target):
            raise OSError(28, "No space left on device", str(tmp_path / "sub" / ".run.ckpt.1@h.x.tmp"))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "save", full_from_the_second_save)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", *TINY, "--hidden", "3", "--layers", "1", "--generations", "4", "--checkpoint-every", "1",
                     "--log-dir", "none", "--checkpoint", target]) == 2
    out, err = capsys.readouterr()
    assert "CartPole-v1 with adam: 2 generations" in out  # the summary of what it has
    rescued = "rescued-run.ckpt"  # in the current directory
    assert f"jes train: could not save the checkpoint {target}" in err and "No space left on device" in err
    assert "training stopped at generation 2 of 4" in err and ".tmp" not in err
    assert f"the run so far (generation 2) is saved in {rescued}: continue it with jes train --resume {rescued}" in err
    assert checkpoint.read(str(tmp_path / rescued)).generation == 2 and checkpoint.read(target).generation == 1


@pytest.mark.parametrize("flags, message", [
    (["--hidden", "0"], "--hidden must be a positive integer (units per layer), got 0"),
    (["--hidden", "-3"], "--hidden must be a positive integer (units per layer), got -3"),
    (["--layers", "0"], "--layers 0: a GRU policy needs at least one layer (--policy mlp --layers 0 is a linear "
                        "policy)"),
    (["--policy", "mlp", "--layers", "0", "--hidden", "4"], "--hidden 4 has no layer to size with --layers 0"),
    (["--policy-arg", "hidden=0"], "GRUPolicy hidden must be a positive integer"),
    (["--policy", "mlp", "--policy-arg", "hidden_sizes=(0,)"], "MLPPolicy hidden_sizes[0] must be a positive integer"),
])
def test_zero_units_or_layers_are_refused_not_replaced_by_the_defaults(flags, message, capsys):
    """--hidden 0 / --layers 0 trained the default 5x2 policy silently; --policy-arg hidden=0 was a
    ZeroDivisionError traceback."""
    assert cli.main(["train", *flags, "--generations", "1", "--log-dir", "none"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


def test_mlp_with_zero_layers_is_a_linear_policy():
    linear = cli._build_policy(cli._parser().parse_args(["train", "--policy", "mlp", "--layers", "0"]))
    assert isinstance(linear, jes.MLPPolicy) and tuple(linear.hidden_sizes) == ()
    sized = cli._build_policy(cli._parser().parse_args(["train", "--policy", "mlp", "--hidden", "7", "--layers", "1"]))
    assert tuple(sized.hidden_sizes) == (7,)
    assert "--policy mlp --layers 0: a linear policy" in " ".join(jes_cmd("train", "--help").stdout.split())


def test_an_interrupt_of_a_run_without_a_log_dir_says_why_there_is_no_checkpoint(tmp_path, capsys, monkeypatch):
    """It blamed "interrupted before the first generation ran, or --checkpoint none" when --log-dir none had turned
    the default checkpoint off, thousands of generations in."""
    monkeypatch.setattr(jes, "train", lambda *args, **kwargs: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert cli.main(["train", "--generations", "1", "--log-dir", "none"]) == 130
    err = capsys.readouterr().err
    assert "no checkpoint was saved: --log-dir none turns off the default checkpoint (which goes in the log dir); " \
           "pass --checkpoint PATH to keep one" in err and "--checkpoint none" not in err
    assert "before the first generation" not in err
    assert cli.main(["train", "--generations", "1", "--checkpoint", "none"]) == 130
    assert "no checkpoint was saved: --checkpoint none" in capsys.readouterr().err

    def failed_save(*args, **kwargs):
        interrupt = KeyboardInterrupt()
        interrupt.save_error = jes.CheckpointSaveError("could not save ...", generation=3, path=str(tmp_path / "c.ckpt"),
                                                       errno=28, reason="No space left on device")
        raise interrupt

    monkeypatch.setattr(jes, "train", failed_save)
    assert cli.main(["train", "--generations", "1", "--checkpoint", str(tmp_path / "c.ckpt")]) == 130
    assert "no checkpoint was saved: saving it failed (No space left on device)" in capsys.readouterr().err
    assert "'none' turns it off, and with it the default checkpoint" in " ".join(jes_cmd("train", "--help").stdout.split())


def test_render_steps_are_checked_before_evaluating_and_named_by_their_flag(trained, capsys):
    """--render-steps 0 was reported after every episode was evaluated, as max_steps; without --render it was
    accepted and did nothing."""
    root, _ = trained
    ckpt = str(root / "run" / "checkpoint.ckpt")
    evaluated = []
    real = jes.Trainer.evaluate_centre
    try:
        jes.Trainer.evaluate_centre = lambda *a, **k: evaluated.append(1) or real(*a, **k)
        assert cli.main(["eval", ckpt, "--render", str(root / "x.gif"), "--render-steps", "0"]) == 2
        assert "jes eval: --render-steps must be a positive number of steps, got 0" in capsys.readouterr().err
        assert cli.main(["eval", ckpt, "--render-steps", "5"]) == 2
        assert "jes eval: --render-steps 5 is the length of the --render episode" in capsys.readouterr().err
    finally:
        jes.Trainer.evaluate_centre = real
    assert not evaluated and not (root / "x.gif").exists()


def test_quickstart_module_names_its_own_flag_for_a_strategy_or_an_unknown_optimizer(capsys):
    """`python -m jes --optimizer snes` advised strategy='snes', and an unknown one an optax object: neither can
    be given to it."""
    from jes import __main__ as quickstart

    assert quickstart.main(["--optimizer", "snes"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m jes: --optimizer snes: 'snes' is a strategy, not an optimizer") and \
        "jes train --strategy snes" in err and "strategy=" not in err
    assert quickstart.main(["--optimizer", "bogus"]) == 2
    err = capsys.readouterr().err
    assert "python -m jes: --optimizer bogus: unknown optimizer; python -m jes takes adabelief" in err
    assert "optax" not in err


@pytest.mark.hard_timeout(300)
def test_a_run_stopped_at_its_target_resumes_with_stop_at_return_none(tmp_path, capsys):
    """The warning said to "drop" --stop-at-return, which the command line had no way to do."""
    ckpt = str(tmp_path / "c.ckpt")
    flags = [*TINY, "--hidden", "3", "--layers", "1", "--log-dir", "none"]
    assert cli.main(["train", *flags, "--generations", "3", "--stop-at-return", "1", "--checkpoint", ckpt]) == 0
    assert checkpoint.read(ckpt).generation == 1
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(["train", "--resume", ckpt, "--generations", "2", "--no-progress", "--log-dir", "none"]) == 0
    said = " ".join(str(w.message) for w in caught)
    assert "jes train: --stop-at-return none" in said and "drop it" not in said
    assert checkpoint.read(ckpt).generation == 1
    assert cli.main(["train", "--resume", ckpt, "--generations", "2", "--stop-at-return", "none", "--no-progress",
                     "--log-dir", "none"]) == 0
    ran = checkpoint.read(ckpt)
    assert ran.generation == 2 and ran.meta["config"]["stop_at_return"] is None
    assert cli._parser().parse_args(["train", "--stop-at-return", "None"]).stop_at_return == "none"


@pytest.mark.hard_timeout(300)
def test_eval_names_the_strategy_of_a_checkpoint_without_an_optimizer(tmp_path, capsys):
    """It printed `..., MLPPolicy, None, generation 2: ...` for snes, sep_cma_es, cma_es and ars checkpoints."""
    ckpt = str(tmp_path / "snes.ckpt")
    jes.train(jes.MLPPolicy(hidden_sizes=(3,)), "CartPole-v1", strategy="snes", num_members=16, num_generations=1,
              eval_episodes=2, log_dir=None, progress=False, checkpoint_path=ckpt)
    assert cli.main(["eval", ckpt, "--episodes", "2"]) == 0
    line = capsys.readouterr().out
    assert f"{ckpt}: CartPole-v1, MLPPolicy, snes, generation 1: centre return" in line and "None" not in line


@pytest.mark.parametrize("flags, message", [
    (["--devices", "0"], "jes train: --devices must be a positive number of local devices (default: all), got 0"),
    (["--workers", "-1"], "jes train: --workers must be an integer >= 0 (0: this process alone), got -1"),
    (["--strategy", "cma_es", "--fitness-shaping", "raw"], "jes train: --fitness-shaping raw would be ignored by "
                                                           "strategy 'cma_es'"),
])
def test_device_worker_and_shaping_errors_name_the_flags(flags, message, capsys):
    assert cli.main(["train", *flags, "--generations", "1", "--log-dir", "none"]) == 2
    err = capsys.readouterr().err
    assert message in err and "num_workers" not in err and "fitness_shaping=" not in err, err
    with pytest.raises(ValueError, match=r"devices must be a positive number of local devices \(None: all"):
        jes.arrays.resolve_devices(0)


def test_resume_takes_the_policy_flags_left_out_from_the_checkpoint(tmp_path, capsys):
    """A trial: `--resume CKPT --policy mlp` of an MLP 16 x 1 run was refused as "hidden_sizes [5, 5]" (the flags
    left out were the defaults), and `--hidden 16 --layers 1` as a GRUPolicy; they come from the checkpoint now, and
    a flag given that differs is still refused, named."""
    ckpt = str(tmp_path / "mlp.ckpt")
    flags = ["--population", "8", "--eval-episodes", "2", "--log-dir", "none", "--no-progress"]
    assert cli.main(["train", "--policy", "mlp", "--hidden", "16", "--layers", "1", "--generations", "1",
                     "--checkpoint", ckpt, *flags]) == 0
    for generation, given in ((2, ["--policy", "mlp"]), (3, ["--hidden", "16"]), (4, ["--layers", "1"]),
                              (5, ["--hidden", "16", "--layers", "1"])):
        assert cli.main(["train", "--resume", ckpt, *given, "--generations", str(generation), *flags]) == 0, given
        assert checkpoint.read(ckpt).generation == generation
    capsys.readouterr()
    assert cli.main(["train", "--resume", ckpt, "--hidden", "8", "--generations", "6", *flags]) == 2
    assert "hidden_sizes" in capsys.readouterr().err


def test_an_activation_by_name_and_conflicting_size_flags(tmp_path, capsys):
    """A trial: `--policy mlp --policy-arg activation=relu` failed at the first step with "'str' object is not
    callable" (no way to pick an activation from the command line), and `--hidden 7 --policy-arg
    hidden_sizes=(32,32)` ignored --hidden silently."""
    ckpt = str(tmp_path / "relu.ckpt")
    flags = ["--population", "8", "--eval-episodes", "2", "--log-dir", "none", "--no-progress", "--generations", "1"]
    assert cli.main(["train", "--policy", "mlp", "--hidden", "4", "--layers", "1", "--policy-arg", "activation=relu",
                     "--checkpoint", ckpt, *flags]) == 0
    assert checkpoint.read(ckpt).meta["policy"]["fields"]["activation"] == "relu"
    assert cli.main(["eval", ckpt, "--episodes", "2"]) == 0
    capsys.readouterr()
    assert cli.main(["train", "--policy", "mlp", "--policy-arg", "activation=rleu", *flags]) == 2
    assert "activation 'rleu' is not one of Flax's activations by name: tanh, relu" in capsys.readouterr().err
    assert cli.main(["train", "--policy", "mlp", "--hidden", "7", "--policy-arg", "hidden_sizes=(32,32)", *flags]) == 2
    assert "--policy-arg hidden_sizes=... and --hidden/--layers both size the policy" in capsys.readouterr().err
    x = jnp.linspace(-1.0, 1.0, 4)
    by_name, by_function = jes.MLPPolicy((3,), 2, "relu"), jes.MLPPolicy((3,), 2, jax.nn.relu)
    variables = by_name.init(jax.random.key(0), x)
    assert np.array_equal(by_name.apply(variables, x), by_function.apply(variables, x))
    with pytest.raises(TypeError, match="activation must be a function or a name"):
        jes.MLPPolicy((3,), 2, 5)


def test_version_flag(capsys):
    """A trial: `jes --version` was an error, though jes.__version__ exists."""
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"jes {jes.__version__}"


def test_master_options_reach_a_run_with_local_workers(monkeypatch, capsys):
    """A review: `jes train --workers 1 --audit 0.5` was refused ("add --listen HOST:PORT"), and with --listen added
    refused again (num_workers cannot be combined with master=), though jes.train(num_workers=..., master_options=...)
    takes both: the flags could not be used with local workers at all."""
    seen = {}

    def fake_train(*args, master_options=None, **kwargs):
        seen.update(master_options=master_options, num_workers=kwargs.get("num_workers"), master=kwargs.get("master"))
        raise ValueError("stop here")

    monkeypatch.setattr(jes, "train", fake_train)
    assert cli.main(["train", "--workers", "1", "--audit", "0.5", "--worker-timeout", "20", "--generations", "1",
                     "--log-dir", "none"]) == 2
    assert seen == {"master_options": {"audit": 0.5, "worker_timeout": 20.0}, "num_workers": 1, "master": None}, seen
    assert "stop here" in capsys.readouterr().err
    assert cli.main(["train", "--audit", "0.5", "--generations", "1", "--log-dir", "none"]) == 2
    assert "add --listen HOST:PORT (workers on other hosts) or --workers N" in capsys.readouterr().err


# A user's module registering Gymnasium envs (as `jes train --import MODULE` imports one): a counter whose constructor
# takes no render_mode, and one whose step raises on its third step.
HOST_ENVS = '''
import gymnasium
import numpy as np


class Counter(gymnasium.Env):
    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(2, 0.1 * self.t, np.float32), float(action), False, False, {}


class StepRaises(Counter):
    def step(self, action):
        if self.t == 2:
            raise RuntimeError("simulator exploded")
        return super().step(action)


class LateReset(Counter):
    """Its 21st reset (in all) raises: a simulator that fails after a few generations."""

    resets = 0

    def reset(self, *, seed=None, options=None):
        LateReset.resets += 1
        if LateReset.resets > 20:
            raise RuntimeError("simulator license expired")
        return super().reset(seed=seed, options=options)


gymnasium.register("JesCliCounter-v0", entry_point="jesclihostenvs:Counter", max_episode_steps=5)
gymnasium.register("JesCliLateReset-v0", entry_point="jesclihostenvs:LateReset", max_episode_steps=5)
gymnasium.register("JesCliStepRaises-v0", entry_point="jesclihostenvs:StepRaises", max_episode_steps=5)
'''
HOST_FLAGS = ["--policy", "mlp", "--hidden", "3", "--layers", "1", "--population", "8", "--eval-episodes", "2",
              "--generations", "1", "--no-progress", "--log-dir", "none"]


@pytest.fixture
def host_envs(tmp_path, monkeypatch):
    """The folder holding the module ``jesclihostenvs`` (importable here, registered once per process)."""
    pytest.importorskip("gymnasium")
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "jesclihostenvs.py").write_text(HOST_ENVS)
    monkeypatch.syspath_prepend(str(folder))
    return folder


@pytest.mark.hard_timeout(600)
def test_host_env_errors_are_one_line_messages(host_envs, tmp_path, capsys):
    """An env whose step raised (HostEnvError), gymnasium's DependencyNotInstalled (Box2D for LunarLander) and --render
    of an env whose constructor takes no render_mode were tracebacks; that --render was refused only after the
    episodes were evaluated (a trial), now before them."""
    assert cli.main(["train", "--env", "gymnasium:JesCliStepRaises-v0", "--import", "jesclihostenvs", *HOST_FLAGS]) == 2
    err = capsys.readouterr().err
    assert ("jes train: env 'gymnasium:JesCliStepRaises-v0': step raised RuntimeError: simulator exploded in member"
            in err and "Traceback" not in err), err
    import jesclihostenvs

    late = str(tmp_path / "late.ckpt")  # fails after a generation or two: the run so far is saved, and the line says so
    jesclihostenvs.LateReset.resets = 0
    assert cli.main(["train", "--env", "gymnasium:JesCliLateReset-v0", "--import", "jesclihostenvs", *HOST_FLAGS,
                     "--generations", "5", "--checkpoint", late]) == 2
    err = capsys.readouterr().err
    assert (f"jes train: env 'gymnasium:JesCliLateReset-v0': reset raised RuntimeError: simulator license expired in "
            in err and f"(the run so far is in checkpoint {late}: fix the env, then continue with --resume {late})"
            in err and "Traceback" not in err), err
    assert checkpoint.read(late).generation >= 1  # what ran before the env failed
    ckpt = str(tmp_path / "counter.ckpt")
    assert cli.main(["train", "--env", "gymnasium:JesCliCounter-v0", "--import", "jesclihostenvs", *HOST_FLAGS,
                     "--checkpoint", ckpt]) == 0
    capsys.readouterr()
    gif = tmp_path / "counter.gif"
    assert cli.main(["eval", ckpt, "--episodes", "2", "--import", "jesclihostenvs", "--render", str(gif)]) == 2
    out, err = capsys.readouterr()
    assert "centre return" not in out and not gif.exists()
    assert ("jes eval: env 'gymnasium:JesCliCounter-v0' cannot be made with render_mode='rgb_array' (its constructor "
            "takes no render_mode)" in err and "Traceback" not in err), err
    try:
        import Box2D  # noqa: F401
    except ImportError:
        assert cli.main(["train", "--env", "gymnasium:LunarLander-v3", *HOST_FLAGS]) == 2
        err = capsys.readouterr().err
        assert ("jes train: Gymnasium env 'gymnasium:LunarLander-v3' needs the package 'Box2D', which is not installed "
                "here" in err and 'pip install "gymnasium[box2d]"' in err and "Traceback" not in err), err
        with pytest.raises(ImportError, match=r"needs the package 'Box2D'") as raised:
            jes.make_env("gymnasium:LunarLander-v3")
        assert raised.value.name == "Box2D"


@pytest.mark.hard_timeout(600)
def test_env_rebuild_hints_name_the_options_of_the_command_run(host_envs, tmp_path, capsys):
    """`jes eval` of a user's registered id without --import advised `jes train --import MODULE` and `env=...`
    (not a command-line option); `jes train --resume` of a run on one's own env class printed the Python call
    `jes.train(policy, env, ..., --resume path)`."""
    import jesclihostenvs

    run = dict(num_members=8, num_generations=1, eval_episodes=2, log_dir=None, progress=False)
    policy = jes.train(jes.MLPPolicy((3,)), "gymnasium:JesCliCounter-v0", **run).save_policy(str(tmp_path / "c.policy"))
    ckpt = str(tmp_path / "c.ckpt")
    jes.train(jes.MLPPolicy((3,)), "gymnasium:JesCliCounter-v0", checkpoint_path=ckpt, **run)
    for path in (policy, ckpt):  # in a process that has not imported the module: the id is not registered
        out = jes_cmd("eval", path, "--episodes", "2", cwd=str(host_envs))
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert "with jes eval --import MODULE" in out.stderr and "jes train --import" not in out.stderr, out.stderr
        assert "env=..." not in out.stderr and "pass env" not in out.stderr, out.stderr
        fixed = jes_cmd("eval", path, "--episodes", "2", "--import", "jesclihostenvs", cwd=str(host_envs))
        assert fixed.returncode == 0 and "return" in fixed.stdout, fixed.stderr
    own = str(tmp_path / "own.ckpt")
    jes.train(jes.MLPPolicy((3,)), jesclihostenvs.Counter, checkpoint_path=own, max_episode_steps=5, **run)
    assert cli.main(["train", "--resume", own, "--generations", "2", "--no-progress", "--log-dir", "none"]) == 2
    err = capsys.readouterr().err
    assert "jes.train(policy, env, ..., resume=path)); the command line cannot rebuild it" in err, err
    assert "--resume path" not in err, err


def _a_full_log_disk(monkeypatch, interrupt=False):
    """TensorBoard's log disk fills up during generation 2 (its write fails, or a Ctrl-C comes then), and its close
    fails on the same disk."""
    from jes.logging import TensorBoardLogger

    write, close = TensorBoardLogger.__call__, TensorBoardLogger.close

    def full_from_generation_2(self, record):
        if record["generation"] >= 2:
            raise KeyboardInterrupt if interrupt else OSError(28, "No space left on device")
        write(self, record)

    def close_on_a_full_disk(self):
        close(self)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(TensorBoardLogger, "__call__", full_from_generation_2)
    monkeypatch.setattr(TensorBoardLogger, "close", close_on_a_full_disk)


@pytest.mark.hard_timeout(300)
@pytest.mark.parametrize("interrupt", [False, True], ids=["write fails", "ctrl-c"])
def test_a_full_log_disk_prints_the_run_so_far_and_how_to_resume_it(tmp_path, monkeypatch, capsys, interrupt):
    """`jes train --log-dir <a full disk>` printed only `jes train: [Errno 28] No space left on device` (closing the
    logs raised a new error in place of the one that carried the run) where a full checkpoint disk prints the run's
    summary and how to resume it; a Ctrl-C then read as that bare error too."""
    _a_full_log_disk(monkeypatch, interrupt)
    ckpt = str(tmp_path / "elsewhere" / "run.ckpt")
    with pytest.warns(UserWarning, match=r"could not close TensorBoardLogger \(OSError: \[Errno 28\] No space left"):
        code = cli.main(["train", *SMALL_FLAGS, "--generations", "4", "--checkpoint-every", "1", "--no-progress",
                         "--log-dir", str(tmp_path / "logs"), "--checkpoint", ckpt])
    out, err = capsys.readouterr()
    if interrupt:
        assert code == 130 and f"interrupted (checkpoint {ckpt}; continue with --resume {ckpt})" in err, err
    else:
        assert code == 2, err
        assert (f"jes train: [Errno 28] No space left on device (the run so far is in checkpoint {ckpt}: continue "
                f"with --resume {ckpt} once its cause is fixed)") in err, err
        assert "CartPole-v1 with adam: 1 generation," in out and f"checkpoint: {ckpt}" in out, out
    assert checkpoint.read(ckpt).generation == 1


def test_resume_without_a_file_starts_a_run_then_continues_it_as_a_requeued_job_would(tmp_path, capsys):
    """Preemption tester: no `jes train` command line both started a run and resumed it after a requeue (without
    --resume the rerun was refused as "another run"; with --resume FILE the first start found no file). `--resume`
    without a file continues the run's own checkpoint if it is there, else starts it; the run stopped after 2
    generations and requeued ends with the bits of one never stopped."""
    run = ["train", "--env", "CartPole-v1", "--policy", "mlp", "--hidden", "4", "--layers", "1", "--population", "16",
           "--eval-episodes", "2", "--seed", "5", "--checkpoint-every", "1", "--no-progress"]
    job = [*run, "--log-dir", str(tmp_path / "job"), "--resume"]
    assert cli.main([*job, "--generations", "2"]) == 0    # the job's first start (preempted after generation 2)
    assert cli.main([*job, "--generations", "4"]) == 0    # its requeue, the same command line
    assert cli.main([*run, "--generations", "4", "--log-dir", str(tmp_path / "whole")]) == 0
    requeued = checkpoint.read(str(tmp_path / "job" / "checkpoint.ckpt"))
    whole = checkpoint.read(str(tmp_path / "whole" / "checkpoint.ckpt"))
    assert requeued.generation == whole.generation == 4
    assert [np.asarray(x).tobytes() for x in jax.tree.leaves(requeued.state_dict)] == \
        [np.asarray(x).tobytes() for x in jax.tree.leaves(whole.state_dict)]
    for column in ("pop_mean", "pop_max", "centre_return", "grad_norm"):
        assert np.asarray(requeued.history[column]).tobytes() == np.asarray(whole.history[column]).tobytes(), column
    capsys.readouterr()
    assert cli.main([*run, "--generations", "2", "--resume"]) == 2  # the auto-named log dir is new each run
    assert "--resume without a file continues the run's own checkpoint if it is there: give the run a --log-dir" \
        in capsys.readouterr().err


def test_resume_true_in_python_needs_the_runs_own_folder_or_checkpoint():
    with pytest.raises(ValueError, match="resume=True continues the run's own checkpoint"):
        jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", num_generations=1, resume=True, progress=False)
    with pytest.raises(TypeError, match="resume must be a checkpoint path, True"):
        jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", num_generations=1, resume=1, log_dir=None,
                  progress=False)


def test_a_masters_log_is_printed_once_whatever_a_library_logs_at_the_root():
    """A trial: with a brax env, every master line came twice (MuJoCo MJX's logging.info gave the root logger a
    handler of its own, and jes.distributed's records reached both). A review: the fix (a handler on the root) hid
    every library's warnings, which Python prints while the root has no handler."""
    code = ("import logging, sys; from jes import cli; cli._log_distributed(); "
            "logging.getLogger('jax._src.xla_bridge').warning('a library warning'); logging.info('a library'); "
            "logging.getLogger('jes.distributed.master').info('a master line')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=checkout_env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("a master line") == 1, proc.stderr
    assert "a library warning" in proc.stderr, proc.stderr
