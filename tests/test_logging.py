"""jes.logging: TensorBoard scalars and hparams written by jes.train, custom sinks, the progress bar."""
import math
import re
import os
import struct
import warnings

import numpy as np
import pytest

import jes
from jes import cli, logging as jes_logging

SMALL = dict(num_members=16, chunk_size=8, num_generations=3, eval_episodes=4, eval_every=2)


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
    """One small run with the default log_dir (runs/<auto> under a temporary working directory)."""
    workdir = tmp_path_factory.mktemp("cwd")
    records = []
    old = os.getcwd()
    os.chdir(workdir)
    try:
        result = jes.train(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1", "adam", key=1,
                           callbacks=[records.append], progress=False, checkpoint_path=None, **SMALL)
    finally:
        os.chdir(old)
    runs = os.listdir(workdir / "runs")
    assert len(runs) == 1 and runs[0].startswith("CartPole-v1-GRUPolicy-adam-")
    return result, records, str(workdir / "runs" / runs[0])


def test_event_file_holds_every_scalar_per_generation(logged_run):
    result, _, log_dir = logged_run
    scalars = jes_logging.read_scalars(log_dir)
    for key, tag in jes_logging.SCALAR_TAGS.items():
        assert tag in scalars, f"{tag} missing from the event file"
        if key != "centre_return":
            assert [step for step, _ in scalars[tag]] == [1, 2, 3]
    # The centre is only logged on generations that evaluated it (every 2nd and the last).
    assert [step for step, _ in scalars["centre/return"]] == [2, 3]
    np.testing.assert_allclose([v for _, v in scalars["population/mean_return"]], result.history["pop_mean"], rtol=1e-6)
    np.testing.assert_allclose([v for _, v in scalars["es/param_norm"]], result.history["param_norm"], rtol=1e-6)
    assert all(v > 0 for _, v in scalars["perf/env_steps_per_second"])


def test_hyperparameters_are_recorded(logged_run):
    _, _, log_dir = logged_run
    tags = jes_logging.read_summary_tags(log_dir)
    assert "hparams/text_summary" in tags
    assert "_hparams_/experiment" in tags and "_hparams_/session_start_info" in tags


def test_user_callback_gets_each_generation_record(logged_run):
    result, records, _ = logged_run
    assert [r["generation"] for r in records] == [1, 2, 3]
    assert math.isnan(records[0]["centre_return"]) and math.isfinite(records[1]["centre_return"])
    for key in ("pop_mean", "pop_max", "noise_std", "learning_rate", "update_norm", "env_steps_per_second"):
        assert all(isinstance(r[key], (int, float)) for r in records), key
    assert records[-1]["env_steps"] == result.history["env_steps"][-1]


def test_logger_skips_unevaluated_centre(tmp_path):
    logger = jes_logging.TensorBoardLogger(str(tmp_path / "tb"), {"lr": 0.1})
    logger({"generation": 1, "pop_mean": 1.0, "centre_return": float("nan")})
    logger.close()
    scalars = jes_logging.read_scalars(str(tmp_path / "tb"))
    assert scalars["population/mean_return"] == [(1, 1.0)] and "centre/return" not in scalars
    (tmp_path / "nothing").mkdir()
    with pytest.raises(FileNotFoundError, match="no TensorBoard event files"):
        jes_logging.read_scalars(str(tmp_path / "nothing"))
    with pytest.raises(FileNotFoundError, match="'typo' does not exist"):  # said "no TensorBoard event files in"
        jes_logging.read_scalars("typo")


def test_progress_without_a_terminal_prints_lines_and_false_silences_everything(capsys):
    record = {"generation": 1, "pop_max": 12.0, "pop_mean": 3.5, "centre_return": 9.0, "env_steps_per_second": 1e4}
    lines = jes_logging.ProgressBar(total=3, enabled=None)  # pytest's stdout is not a terminal
    lines(record)
    lines.close()
    out = capsys.readouterr()
    assert lines.bar is None and out.err == ""
    assert "generation 1/3: mean 3.5, max 12.0 (best 12.0), centre 9.0" in out.out
    silent = jes_logging.ProgressBar(total=3, enabled=False)
    silent(record)
    silent.close()
    assert capsys.readouterr() == ("", "")
    shown = jes_logging.ProgressBar(total=3, enabled=True)
    shown(record)
    shown.close()
    out = capsys.readouterr()
    assert "best=12.0" in out.err and "mean=3.5" in out.err and "1/3" in out.err and out.out == ""


def test_long_runs_print_every_nth_generation_and_the_last(capsys):
    bar = jes_logging.ProgressBar(total=200, enabled=None)
    assert bar.line_every == 4
    for g in range(1, 201):
        bar({"generation": g, "pop_max": float(g), "pop_mean": 0.0})
    printed = [int(line.split()[1].split("/")[0]) for line in capsys.readouterr().out.splitlines()]
    assert printed == list(range(4, 201, 4))


def test_two_writers_in_one_log_dir_within_a_second_keep_both_their_events(tmp_path):
    """tensorboardX names an event file by the second and the host: the second writer used to overwrite the first."""
    for generation in (1, 2):
        logger = jes_logging.TensorBoardLogger(str(tmp_path))
        logger({"generation": generation, "pop_mean": float(generation), "pop_max": 1.0, "pop_min": 0.0})
        logger.close()
    assert len(jes_logging.event_files(str(tmp_path))) == 2
    assert jes_logging.read_scalars(str(tmp_path))["population/mean_return"] == [(1, 1.0), (2, 2.0)]


def test_a_folder_of_runs_names_its_runs(tmp_path):
    """`jes plot runs/sweep` (a sweep's log_dir) said only that it held no event files."""
    for name in ("lr=0.01", "lr=0.05"):
        logger = jes_logging.TensorBoardLogger(str(tmp_path / name))
        logger({"generation": 1, "pop_mean": 1.0, "pop_max": 1.0, "pop_min": 0.0})
        logger.close()
    with pytest.raises(FileNotFoundError, match=r"its subfolders lr=0.01, lr=0.05 hold runs"):
        jes_logging.read_scalars(str(tmp_path))


def test_a_generation_logged_again_by_a_resume_is_read_once(tmp_path):
    """A run killed while its checkpoint was saved (after its logs were flushed), or logged by an earlier jes, logs
    the generations past the checkpoint again when resumed: `jes plot` drew them twice."""
    for generations in ((1, 2), (2, 3)):
        logger = jes_logging.TensorBoardLogger(str(tmp_path))
        for g in generations:
            logger({"generation": g, "pop_mean": float(g), "pop_max": 1.0, "pop_min": 0.0})
        logger.close()
    assert jes_logging.read_scalars(str(tmp_path))["population/mean_return"] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    # An earlier jes's resumed file (no restart marker, starting past generation 1) continues the run before it
    assert jes_logging.read_runs(str(tmp_path)) == [jes_logging.read_scalars(str(tmp_path))]
    other = jes_logging.TensorBoardLogger(str(tmp_path))  # another run's values at the same steps: all kept
    other({"generation": 3, "pop_mean": 9.0, "pop_max": 1.0, "pop_min": 0.0})
    other.close()
    assert jes_logging.read_scalars(str(tmp_path))["population/mean_return"][-1] == (3, 9.0)


KILLED_AFTER_A_CHECKPOINT = """
import os, signal, sys
import jes

def kill_at_generation_3(record):  # generation 2 is in the checkpoint (checkpoint_every=2)
    if record["generation"] == 3:
        os.kill(os.getpid(), signal.SIGKILL)

jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=3, log_dir=sys.argv[1], progress=False, checkpoint_every=2,
          callbacks=[kill_at_generation_3], num_members=16, chunk_size=8, num_generations=5, eval_episodes=2,
          eval_every=2)
"""


def _steps(log_dir: str, tag: str) -> list[int]:
    """Every step ``tag`` was written at, from the raw events (a step written twice is listed twice)."""
    return [int(event.step) for event in jes_logging.iter_events(log_dir) for value in event.summary.value
            if value.tag == tag]


@pytest.mark.hard_timeout(400)
def test_a_killed_run_keeps_the_curves_its_checkpoint_holds(tmp_path):
    """tensorboardX buffers events for up to 120 s: a run killed (SIGKILL: the OOM killer, a preemption) after its
    checkpoint at generation 2 left an empty event file, and its resumed curves began at generation 3."""
    import signal
    import subprocess
    import sys

    log_dir = str(tmp_path / "run")
    killed = subprocess.run([sys.executable, "-c", KILLED_AFTER_A_CHECKPOINT, log_dir], capture_output=True,
                            text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-2000:])
    assert jes.checkpoint.read(os.path.join(log_dir, "checkpoint.ckpt")).generation == 2
    assert _steps(log_dir, "population/mean_return") == [1, 2], "the killed session's logs stop short of its checkpoint"
    jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", resume=os.path.join(log_dir, "checkpoint.ckpt"),
              progress=False, num_members=16, chunk_size=8, num_generations=5, eval_episodes=2, eval_every=2)
    scalars = jes_logging.read_scalars(log_dir)
    for tag in ("population/mean_return", "es/param_norm", "perf/wall_time", "perf/env_steps"):
        assert [step for step, _ in scalars[tag]] == [1, 2, 3, 4, 5], tag
        assert _steps(log_dir, tag) == [1, 2, 3, 4, 5], tag


KILLED_PAST_ITS_CHECKPOINT = """
import os, signal, sys
import jes
import jes.logging

jes.logging.LIVE_FLUSH_SECONDS = 0.0  # every generation on disk as soon as it is written: 3 is, past the checkpoint

def kill_at_generation_4(record):  # generation 2 is in the checkpoint (checkpoint_every=2), 3 in the logs
    if record["generation"] == 4:
        os.kill(os.getpid(), signal.SIGKILL)

jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=3, log_dir=sys.argv[1], progress=False, checkpoint_every=2,
          callbacks=[kill_at_generation_4], num_members=16, chunk_size=8, num_generations=5, eval_episodes=2,
          eval_every=2)
"""


@pytest.mark.hard_timeout(400)
def test_a_resumed_run_supersedes_what_a_killed_run_logged_past_its_checkpoint(tmp_path):
    """Generations a killed run logged past its checkpoint are stepped (and logged) again by the resumed run, with
    other timings: the resumed run's restart marker (TensorBoard's purge) makes read_scalars keep the new ones."""
    import signal
    import subprocess
    import sys

    log_dir = str(tmp_path / "run")
    killed = subprocess.run([sys.executable, "-c", KILLED_PAST_ITS_CHECKPOINT, log_dir], capture_output=True,
                            text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-2000:])
    assert jes.checkpoint.read(os.path.join(log_dir, "checkpoint.ckpt")).generation == 2
    assert _steps(log_dir, "perf/wall_time") == [1, 2, 3]
    resumed = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", resume=os.path.join(log_dir, "checkpoint.ckpt"),
                        progress=False, num_members=16, chunk_size=8, num_generations=5, eval_episodes=2, eval_every=2)
    assert _steps(log_dir, "perf/wall_time") == [1, 2, 3, 3, 4, 5]  # both sessions' generation 3 in the files
    scalars = jes_logging.read_scalars(log_dir)
    for tag in ("population/mean_return", "perf/wall_time", "perf/generation_time"):
        assert [step for step, _ in scalars[tag]] == [1, 2, 3, 4, 5], tag
    assert [v for _, v in scalars["perf/wall_time"]][2:] == pytest.approx(list(resumed.history["wall_time"])[2:])
    assert jes_logging.read_runs(log_dir) == [scalars]  # the killed session and the resumed one: one run


@pytest.mark.hard_timeout(400)
@pytest.mark.parametrize("checkpoint_every", [0, 1])
def test_a_generation_interrupted_among_its_callbacks_is_logged_once(tmp_path, checkpoint_every):
    """Ctrl-C among generation 3's callbacks leaves the run (and its checkpoint) at generation 2, and the resumed
    run steps 3 again: generation 3 was logged by both sessions, its perf/* timings with two values (a back-step in
    TensorBoard's curves). checkpoint_every=1: generation 2's checkpoint is already saved, and the interrupt saves
    none (its logs were written when the run closed, generation 3 included)."""
    common = dict(progress=False, num_members=16, chunk_size=8, num_generations=5, eval_episodes=2, eval_every=2)

    def interrupt_at_generation_3(record):
        if record["generation"] == 3:
            raise KeyboardInterrupt

    log_dir = str(tmp_path / "run")
    with pytest.raises(KeyboardInterrupt) as interrupted:
        jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=3, log_dir=log_dir, checkpoint_every=checkpoint_every,
                  callbacks=[interrupt_at_generation_3], **common)
    assert list(interrupted.value.result.history["generation"]) == [1, 2]
    assert _steps(log_dir, "perf/wall_time") == [1, 2]
    assert "hparams/generations" not in jes_logging.read_scalars(log_dir)  # "final" metrics: at the run's end only
    resumed = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", resume=os.path.join(log_dir, "checkpoint.ckpt"),
                        **common)
    scalars = jes_logging.read_scalars(log_dir)
    for tag in ("population/mean_return", "perf/wall_time", "perf/generation_time", "perf/env_steps_per_second"):
        assert _steps(log_dir, tag) == [1, 2, 3, 4, 5], tag
    assert jes_logging.read_runs(log_dir) == [scalars]
    assert [v for _, v in scalars["perf/wall_time"]] == pytest.approx(list(resumed.history["wall_time"]))
    # Once, at the end: the interrupted session's at generation 2 made TensorBoard draw them as two-point curves
    assert scalars["hparams/generations"] == [(5, 5.0)]
    assert [step for step, _ in scalars["hparams/final_pop_mean"]] == [5]


@pytest.mark.hard_timeout(300)
def test_a_resumed_run_continues_its_curves_in_the_checkpoints_log_dir_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an auto-named directory would go under ./runs
    common = dict(progress=False, **dict(SMALL, eval_every=1))
    first = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=0, log_dir=str(tmp_path / "run"), **common)
    assert first.checkpoint_path == str(tmp_path / "run" / "checkpoint.ckpt")
    resumed = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", resume=first.checkpoint_path,
                        **dict(common, num_generations=SMALL["num_generations"] + 2))
    assert resumed.log_dir == str(tmp_path / "run") and not os.path.exists(tmp_path / "runs")
    scalars = jes.logging.read_scalars(resumed.log_dir)
    steps = [step for step, _ in scalars["centre/return"]]
    assert steps == list(range(1, SMALL["num_generations"] + 3))  # one curve, each generation once
    # The final summary's best centre return is the whole run's (it began again at the resume), and wall_time goes
    # on from the first session's (it went back to 0).
    centres = [float(x) for x in resumed.history["centre_return"] if np.isfinite(x)]
    assert scalars["hparams/best_centre_return"][-1] == (SMALL["num_generations"] + 2, np.float32(max(centres)))
    walls = [float(x) for x in resumed.history["wall_time"]]
    assert walls == sorted(walls) and walls[:SMALL["num_generations"]] == [float(x) for x in first.history["wall_time"]]
    # A checkpoint kept apart from any logs: the resumed run logs into a fresh directory, as a new run does.
    apart = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=1, log_dir=None,
                      checkpoint_path=str(tmp_path / "apart.ckpt"), **common)
    again = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", resume=apart.checkpoint_path,
                      **dict(common, num_generations=SMALL["num_generations"] + 1))
    assert os.path.dirname(again.log_dir) == "runs"


@pytest.mark.hard_timeout(300)
def test_the_progress_lines_best_continues_across_a_resume(tmp_path, capsys):
    common = dict(progress=None, log_dir=None, **dict(SMALL, num_generations=2))  # not a terminal: a line each
    first = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=2, checkpoint_path=str(tmp_path / "c.ckpt"),
                      **common)
    capsys.readouterr()
    resumed = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", resume=first.checkpoint_path,
                        **dict(common, num_generations=3))
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("generation 3/3")][0]
    best = max(float(x) for x in resumed.history["pop_max"])
    assert f"(best {best:.1f})" in line and best >= max(float(x) for x in first.history["pop_max"])


@pytest.mark.hard_timeout(300)
def test_a_new_run_never_overwrites_another_runs_checkpoint(tmp_path, capsys):
    """A second run into the same log_dir would replace the first one's checkpoint (it could no longer be resumed or
    evaluated): refused before anything runs, naming the way to continue it; resuming it into its own file is fine."""
    log_dir = str(tmp_path / "A")
    common = dict(log_dir=log_dir, progress=False, **SMALL)
    first = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=1, **common)
    path = os.path.join(log_dir, "checkpoint.ckpt")
    assert first.checkpoint_path == path
    before = open(path, "rb").read()
    with pytest.raises(FileExistsError, match=rf"checkpoint '{re.escape(path)}' already holds a checkpoint of another "
                                              rf"run \(env 'CartPole-v1', generation {SMALL['num_generations']}\), "
                                              rf"which this run would overwrite: continue that run with "
                                              rf"resume='{re.escape(path)}', pass another log_dir"):
        jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=0, **common)
    with pytest.raises(FileExistsError, match="already holds a checkpoint of another run"):  # the path given itself
        jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=0, log_dir=None, checkpoint_path=path,
                  progress=False, **SMALL)
    garbage = tmp_path / "other.bin"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(FileExistsError, match="already holds a file this run did not write, which this run would "
                                              "overwrite: pass another log_dir"):
        jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", log_dir=None, checkpoint_path=str(garbage),
                  progress=False, **SMALL)
    assert open(path, "rb").read() == before and garbage.read_bytes() == b"not a checkpoint"
    assert cli.main(["train", "--env", "CartPole-v1", "--policy", "mlp", "--hidden", "4", "--log-dir", log_dir,
                     "--population", str(SMALL["num_members"]), "--generations", "1", "--no-progress"]) == 2
    assert (f"continue that run with --resume '{path}', pass another --log-dir (or --checkpoint), or delete that "
            f"file to start over") in capsys.readouterr().err
    resumed = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", resume=path,
                        **dict(common, num_generations=SMALL["num_generations"] + 1))
    assert resumed.checkpoint_path == path and open(path, "rb").read() != before


def test_a_new_run_into_a_log_dir_with_event_files_warns_and_a_resumed_one_does_not(tmp_path):
    log_dir = str(tmp_path / "tb")
    common = dict(log_dir=log_dir, progress=False, **SMALL)
    first = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=0, checkpoint_path=str(tmp_path / "c.ckpt"), **common)
    with pytest.warns(UserWarning, match="already holds the TensorBoard event files of an earlier run.*resume="):
        jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=0, checkpoint_path=None, **common)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # continuing the run that wrote them is what the directory is for
        jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", resume=first.checkpoint_path,
                  **dict(common, num_generations=SMALL["num_generations"] + 1))


def test_a_ctrl_c_while_an_event_is_written_leaves_no_torn_record(tmp_path, monkeypatch):
    """Events are written in the caller's (main) thread: a KeyboardInterrupt between a record's four writes (length,
    CRC, event, CRC) left a torn record, and every event after it (the generation re-written by the interrupt's
    flush, the hparams at close) unreadable."""
    from tensorboardX import record_writer

    real, calls = record_writer.masked_crc32c, []

    def interrupted_once(data):
        calls.append(len(calls))
        if len(calls) == 6:  # the third record's data CRC: its length and length CRC computed, the event not
            raise KeyboardInterrupt
        return real(data)

    logger = jes_logging.TensorBoardLogger(str(tmp_path), {"lr": 0.1})
    record = {"pop_mean": 1.0, "pop_max": 2.0, "pop_min": 0.0, "pop_std": 0.5}
    logger({"generation": 1, **record})
    logger({"generation": 2, **record})  # generation 1 is written now
    monkeypatch.setattr(record_writer, "masked_crc32c", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        logger({"generation": 3, **record})  # writes generation 2, interrupted within
    monkeypatch.setattr(record_writer, "masked_crc32c", real)
    logger.flush(2)  # as the interrupt path does: generation 2 written again, 3 dropped
    logger.close()
    scalars = jes_logging.read_scalars(str(tmp_path))
    for tag in ("population/mean_return", "population/max_return", "population/min_return", "population/std_return"):
        assert [step for step, _ in scalars[tag]] == [1, 2], tag
    assert "hparams/generations" in scalars


def test_a_logger_of_ones_own_with_a_flush_without_arguments_is_flushed():
    """Logger.flush gained a ``generation`` argument: a user's Logger whose ``flush(self)`` predates it got a
    TypeError warning at every checkpoint and was never flushed."""
    class Mine(jes_logging.Logger):
        flushed = 0

        def __call__(self, record):
            pass

        def flush(self):
            self.flushed += 1

    mine = Mine()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jes_logging.flush_all([mine], 5)
    assert mine.flushed == 1


def test_a_non_finite_hyperparameter_is_recorded_as_text_without_tensorboardxs_stray_warning(tmp_path, caplog):
    """``jes train --stop-at-return inf`` printed tensorboardX's "NaN or Inf found in input tensor." at the end of
    the run (its HPARAMS entry took the infinite threshold for a number)."""
    logger = jes_logging.TensorBoardLogger(str(tmp_path / "tb"), {"stop_at_return": float("inf"), "lr": 0.1})
    assert logger.hparams["stop_at_return"] == "inf" and logger.hparams["lr"] == 0.1
    logger({"generation": 1, "pop_mean": 1.0, "centre_return": 2.0})
    with caplog.at_level("WARNING"):
        logger.close()
    assert not [r for r in caplog.records if "NaN or Inf" in r.getMessage()], caplog.text
    assert "_hparams_/session_start_info" in jes_logging.read_summary_tags(str(tmp_path / "tb"))


def _event_file(log_dir) -> str:
    (path,) = jes_logging.event_files(str(log_dir))
    return path


def test_a_damaged_event_file_is_read_around_the_damage_with_a_warning(logged_run, tmp_path):
    """`jes plot` and read_scalars stopped at the first bad record of a damaged event file without a word: a
    7-generation run's 40 flipped bytes left generations 1-3 plotted. (Its checksums were not checked either: a
    flipped bit in a value was read as a value.)"""
    _, _, log_dir = logged_run
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an intact file: no warning
        intact = jes_logging.read_scalars(log_dir)
    data = open(_event_file(log_dir), "rb").read()
    # Damaged in the middle (the records of generation 2): the records after the damage are read on
    damaged = bytearray(data)
    middle = len(data) // 2
    damaged[middle: middle + 40] = bytes(b ^ 0xA5 for b in damaged[middle: middle + 40])
    (tmp_path / "damaged").mkdir()
    path = str(tmp_path / "damaged" / os.path.basename(_event_file(log_dir)))
    open(path, "wb").write(bytes(damaged))
    with pytest.warns(UserWarning, match=rf"TensorBoard event file {re.escape(path)} is damaged: bytes \d+-\d+ of "
                                         rf"{len(data)} cannot be read .* The last generation read from it is 3"):
        scalars = jes_logging.read_scalars(str(tmp_path / "damaged"))
    assert scalars["population/mean_return"][0][0] == 1
    assert scalars["hparams/generations"] == intact["hparams/generations"]  # the records at the file's end are read
    assert max(step for points in scalars.values() for step, _ in points) == 3
    for tag, points in scalars.items():  # what is read is what was written: no value of a damaged record
        assert set(points) <= set(intact[tag]), tag
    # One flipped bit in a value: its record is dropped, not read as another value
    flipped = bytearray(data)
    value = struct.pack("<f", intact["population/mean_return"][1][1])
    flipped[data.index(value)] ^= 0x01
    (tmp_path / "flipped").mkdir()
    open(tmp_path / "flipped" / os.path.basename(path), "wb").write(bytes(flipped))
    with pytest.warns(UserWarning, match="is damaged: .* the scalars written there, from generation 1 to 2, are missing"):
        scalars = jes_logging.read_scalars(str(tmp_path / "flipped"))
    assert [step for step, _ in scalars["population/mean_return"]] == [1, 3]
    # Cut short (a record still being written by a writer that writes it in several calls, a killed run's last
    # record): the generations before it are read, without a warning (a live file is not damaged)
    (tmp_path / "cut").mkdir()
    open(tmp_path / "cut" / os.path.basename(path), "wb").write(data[: len(data) - 5])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scalars = jes_logging.read_scalars(str(tmp_path / "cut"))
    assert [step for step, _ in scalars["population/mean_return"]] == [1, 2, 3]


def _hparams(log_dir: str) -> tuple[list[dict], list[dict]]:
    """Every hyperparameter table (text) and HPARAMS session entry in ``log_dir``'s event files, in file order."""
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData

    tables, sessions = [], []
    for event in jes_logging.iter_events(log_dir):
        for value in event.summary.value:
            if value.tag == "hparams/text_summary":
                rows = value.tensor.string_val[0].decode().splitlines()[2:]
                tables.append({cells[1].strip(): cells[2].strip() for cells in (row.split("|") for row in rows)})
            if value.tag == "_hparams_/session_start_info":
                entry = HParamsPluginData.FromString(value.metadata.plugin_data.content).session_start_info.hparams
                sessions.append({k: getattr(v, v.WhichOneof("kind")) for k, v in entry.items()})
    return tables, sessions


@pytest.mark.hard_timeout(400)
def test_the_hyperparameters_are_recorded_as_the_run_ran_them(tmp_path):
    """The table and the HPARAMS entry held the config as passed: learning_rate None, chunk_size None,
    max_episode_steps None and policy GRUPolicy, where the run used 0.2, 16, 500 and a GRU of 3 units (runs that
    differed in the optimizer's default rate or the GRU's size looked the same in TensorBoard's HPARAMS view)."""
    log_dir = str(tmp_path / "tb")
    common = dict(num_members=16, eval_episodes=2, log_dir=log_dir, progress=False)
    first = jes.train(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1", "adam", key=0, num_generations=2, **common)
    resumed = jes.train(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1", "adam", resume=first.checkpoint_path,
                        num_generations=3, **common)
    alone = jes.train(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1", "adam", key=0, num_generations=3,
                      log_dir=None, checkpoint_path=None, num_members=16, eval_episodes=2, progress=False)
    np.testing.assert_array_equal(resumed.flat_params, alone.flat_params)  # the bits are the run's, as before
    assert first.config.learning_rate is None and first.config.chunk_size is None  # the config as passed
    tables, sessions = _hparams(log_dir)
    assert len(tables) == 2 and len(sessions) == 2  # the first session's and the resumed one's
    ran = {"learning_rate": 0.2, "chunk_size": 16, "max_episode_steps": 500,
           "policy": "GRUPolicy(hidden=3, layers=1, num_outputs=2, torch_layout=True)"}
    for table, session in zip(tables, sessions):
        assert {k: table[k] for k in ran} == {k: str(v) for k, v in ran.items()}
        assert {k: session[k] for k in ran} == ran
        assert session["optimizer"] == "adam" and session["env"] == "CartPole-v1"
    assert sessions[0]["num_generations"] == 2 and sessions[1]["num_generations"] == 3
    scalars = jes_logging.read_scalars(log_dir)
    assert [step for step, _ in scalars["population/mean_return"]] == [1, 2, 3]
    assert scalars["es/learning_rate"][0][1] == pytest.approx(0.2)


def test_an_auto_run_folder_name_fits_a_file_systems_name_limit():
    """A long env name (a user's env instance's repr) or optimizer label made runs/<auto> longer than 255 bytes:
    the run failed at its first log with ENAMETOOLONG."""
    name = jes.logging.default_run_name("MyEnv(" + "option=1, " * 40 + ")", "Policy" * 30, "adam(schedule=é" + "x" * 90)
    assert len(name.encode()) < 255 - 8 and name.startswith("MyEnv_option_1__option_1_"), name
    assert "-PolicyPolicy" in name and "-adam_schedule__xx" in name and name.isascii()
    assert jes.logging.default_run_name("CartPole-v1", "MLPPolicy", "adam").startswith("CartPole-v1-MLPPolicy-adam-")


def test_a_full_log_disk_names_the_event_file(tmp_path):
    """A write that failed on a full disk said only `[Errno 28] No space left on device`: which disk?"""
    events = jes_logging._EventFile(str(tmp_path / "logs"))
    real = events._file

    class FullDisk:
        def write(self, data):
            raise OSError(28, "No space left on device")

        flush = close = lambda self: (_ for _ in ()).throw(OSError(28, "No space left on device"))

    events._file = FullDisk()
    for call in (lambda: events.add_scalar("a", 1.0, 1), events.flush, events.close):
        with pytest.raises(OSError, match=r"\[Errno 28\] No space left on device: '.*events\.out\.tfevents\.") as err:
            call()
        assert err.value.errno == 28 and err.value.filename == events.path
    real.close()


def test_a_logger_creates_its_event_file_at_its_first_write(tmp_path):
    """A run stopped (Ctrl-C) or killed during its step's compile left an event file without generations, which the
    next run into the folder took for an earlier run's."""
    log_dir = str(tmp_path / "tb")
    logger = jes_logging.TensorBoardLogger(log_dir, {"lr": 0.1}, purge_from=4)
    assert not jes_logging.has_event_files(log_dir)  # nothing written yet (a kill -9 now leaves nothing)
    logger.close(completed=False)
    assert not jes_logging.has_event_files(log_dir)
    logger = jes_logging.TensorBoardLogger(log_dir, {"lr": 0.1})
    logger.flush(0)  # nothing to write (a Ctrl-C during the first generation, no checkpoint saved): no file
    assert not jes_logging.has_event_files(log_dir)
    jes_logging.flush_all([logger], 0, saving=True)  # before a checkpoint's save: its folder holds its event file
    assert jes_logging.has_event_files(log_dir) and not jes_logging.has_logged_scalars(log_dir)
    logger({"generation": 1, "pop_mean": 1.0})
    logger.close()
    assert jes_logging.has_logged_scalars(log_dir)
    assert "hparams/text_summary" in jes_logging.read_summary_tags(log_dir)


@pytest.mark.hard_timeout(300)
def test_a_run_stopped_during_its_compile_leaves_no_event_file_and_no_false_warning(tmp_path, monkeypatch):
    log_dir = str(tmp_path / "tb")
    common = dict(log_dir=log_dir, progress=False, checkpoint_path=None, **SMALL)

    def interrupted_compile(self, state):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(jes.Trainer, "compiled_step", interrupted_compile)
        with pytest.raises(KeyboardInterrupt):
            jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=0, **common)
    assert not jes_logging.has_event_files(log_dir)
    # A file an earlier jes left so (the hyperparameter table, no scalar): nothing of a run to "show both" of
    leftover = jes_logging._EventFile(log_dir)
    leftover.add_text("hparams", "| hyperparameter | value |", 0)
    leftover.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=0, **common)
    assert len(jes_logging.read_runs(log_dir)) == 1 and again.log_dir == log_dir
    with pytest.warns(UserWarning, match="already holds the TensorBoard event files of an earlier run"):
        jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=0, **common)


@pytest.mark.hard_timeout(300)
def test_another_runs_checkpoint_is_refused_before_the_step_compiles(tmp_path, monkeypatch):
    """The FileExistsError came once the background compile had finished (seconds with a default-sized policy)."""
    log_dir = str(tmp_path / "A")
    jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=1, log_dir=log_dir, progress=False, **SMALL)
    compiles = []
    monkeypatch.setattr(jes.Trainer, "start_compiling_step", lambda self: compiles.append(self))
    with pytest.raises(FileExistsError, match="already holds a checkpoint of another run"):
        jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=0, log_dir=log_dir, progress=False, **SMALL)
    assert compiles == []


@pytest.mark.hard_timeout(300)
def test_a_ctrl_c_during_the_first_step_leaves_no_event_file_without_a_checkpoint(tmp_path, monkeypatch):
    """The interrupt's flush created the event file (no scalar in it) even with no checkpoint to save; with one, the
    file is made before the generation-0 checkpoint, whose resume then logs into the same folder."""
    real = jes.Trainer.compiled_step

    def interrupted_step(self, state):
        compiled, seconds = real(self, state)

        def step(*args):
            raise KeyboardInterrupt

        return step, seconds

    monkeypatch.setattr(jes.Trainer, "compiled_step", interrupted_step)
    for checkpoint_path in (None, "<log_dir>/checkpoint.ckpt"):
        log_dir = str(tmp_path / str(checkpoint_path is not None))
        with pytest.raises(KeyboardInterrupt):
            jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=0, log_dir=log_dir, progress=False,
                      checkpoint_path=checkpoint_path, **SMALL)
        if checkpoint_path is None:
            assert not jes_logging.has_event_files(log_dir)
        else:
            assert jes.checkpoint.read(os.path.join(log_dir, "checkpoint.ckpt")).generation == 0
            assert jes_logging.has_event_files(log_dir) and not jes_logging.has_logged_scalars(log_dir)


@pytest.mark.hard_timeout(600)
def test_final_metrics_stay_one_point_when_a_completed_run_is_resumed(tmp_path):
    """A run ended by StopTraining (or finished, then given more generations) wrote its final metrics at its last
    generation, and its resume wrote them again at its new end: a two-point "final" curve. The resume's restart
    marker goes at the checkpoint's generation (TensorBoard drops that step's points), whose scalars it writes again."""
    common = dict(progress=False, num_members=16, chunk_size=8, eval_episodes=2, eval_every=2)

    def stop_at_3(record):
        if record["generation"] == 3:
            raise jes.StopTraining("plateau")

    log_dir = str(tmp_path / "run")
    stopped = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=3, log_dir=log_dir, callbacks=[stop_at_3],
                        num_generations=5, **common)
    assert jes_logging.read_scalars(log_dir)["hparams/generations"] == [(3, 3.0)]
    before = jes_logging.read_scalars(log_dir)
    resumed = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", resume=stopped.checkpoint_path,
                        num_generations=5, **common)
    scalars = jes_logging.read_scalars(log_dir)
    assert scalars["hparams/generations"] == [(5, 5.0)]
    assert [step for step, _ in scalars["hparams/final_pop_mean"]] == [5]
    for tag in ("population/mean_return", "perf/wall_time", "perf/env_steps_per_second", "es/param_norm"):
        assert [step for step, _ in scalars[tag]] == [1, 2, 3, 4, 5], tag
        assert scalars[tag][:3] == before[tag], tag  # generation 3, written again after the marker: the same values
    assert _steps(log_dir, "population/mean_return") == [1, 2, 3, 3, 4, 5]
    assert jes_logging.read_runs(log_dir) == [scalars]
    assert [v for _, v in scalars["population/mean_return"]] == pytest.approx(list(resumed.history["pop_mean"]))
    # A finished run given more generations
    jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", resume=stopped.checkpoint_path, num_generations=6,
              **common)
    scalars = jes_logging.read_scalars(log_dir)
    assert scalars["hparams/generations"] == [(6, 6.0)]
    assert [step for step, _ in scalars["population/mean_return"]] == [1, 2, 3, 4, 5, 6]
    try:  # TensorBoard's own reader, where installed
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        return
    accumulator = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    accumulator.Reload()
    assert [(e.step, e.value) for e in accumulator.Scalars("hparams/generations")] == [(6, 6.0)]
    assert [e.step for e in accumulator.Scalars("population/mean_return")] == [1, 2, 3, 4, 5, 6]


@pytest.mark.hard_timeout(400)
def test_a_ctrl_c_during_the_final_save_still_writes_the_final_metrics(tmp_path, monkeypatch):
    """The logs closed as interrupted, and the resume had nothing left to train: the final metrics were never
    written. A run whose state reached its end closes its logs as completed."""
    common = dict(progress=False, num_members=16, chunk_size=8, num_generations=4, eval_episodes=2, eval_every=2)
    real, interrupted_once = jes.checkpoint.save, []

    def save(path, trainer, state, *args, **kwargs):
        real(path, trainer, state, *args, **kwargs)
        if int(state.generation) == 4 and not interrupted_once:
            interrupted_once.append(True)
            raise KeyboardInterrupt  # as a Ctrl-C deferred to the end of the final save

    log_dir = str(tmp_path / "run")
    with monkeypatch.context() as patch:
        patch.setattr(jes.checkpoint, "save", save)
        with pytest.raises(KeyboardInterrupt) as interrupted:
            jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=3, log_dir=log_dir, **common)
    assert jes.checkpoint.read(interrupted.value.checkpoint_path).generation == 4
    assert jes_logging.read_scalars(log_dir)["hparams/generations"] == [(4, 4.0)]
    with pytest.warns(UserWarning, match="nothing left to train"):
        jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", resume=interrupted.value.checkpoint_path, **common)
    assert jes_logging.read_scalars(log_dir)["hparams/generations"] == [(4, 4.0)]


@pytest.mark.hard_timeout(300)
def test_resuming_a_finished_run_compiles_nothing_and_adds_no_event_file(tmp_path, monkeypatch):
    log_dir = str(tmp_path / "run")
    common = dict(progress=False, **SMALL)
    first = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=1, log_dir=log_dir, **common)
    files = jes_logging.event_files(log_dir)
    compiles = []
    monkeypatch.setattr(jes.Trainer, "start_compiling_step", lambda self: compiles.append("background"))
    monkeypatch.setattr(jes.Trainer, "compiled_step", lambda self, state: compiles.append("step"))
    # num_workers=: no local workers started (each compiling its step) and waited for
    monkeypatch.setattr("jes.loop.LocalWorkers", lambda *args, **kwargs: compiles.append("workers"))
    monkeypatch.setattr("jes.loop.Master", lambda *args, **kwargs: compiles.append("master"))
    for workers in (0, 2):
        with pytest.warns(UserWarning, match="nothing left to train"):
            again = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", resume=first.checkpoint_path,
                              num_workers=workers, **common)
        np.testing.assert_array_equal(again.flat_params, first.flat_params)
        np.testing.assert_array_equal(again.history["pop_mean"], first.history["pop_mean"])
        assert again.compile_time == 0.0 and again.log_dir == log_dir
    assert compiles == [] and jes_logging.event_files(log_dir) == files


@pytest.mark.hard_timeout(300)
def test_an_empty_log_dir_is_the_current_folder(tmp_path, monkeypatch):
    # log_dir="" (jes train --log-dir "") compiled and trained, then stopped at its first log write with "[Errno 2] No
    # such file or directory: ''", its summary saying "logs: off" beside a checkpoint it had saved in the current folder
    monkeypatch.chdir(tmp_path)
    result = jes.train(jes.GRUPolicy(hidden=2, layers=1), "CartPole-v1", "adam", log_dir="", progress=False,
                       **dict(SMALL, num_generations=2))
    assert result.history["generation"].tolist() == [1, 2]
    assert [g for g, _ in jes_logging.read_scalars(str(tmp_path))["population/mean_return"]] == [1, 2]
    assert (tmp_path / "checkpoint.ckpt").exists() and "logs: .;" in result.summary()
