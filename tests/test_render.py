"""jes.render and jes.plot (and their CLI commands): each output opens as a valid image of the expected size."""
import os

import numpy as np
import pytest

import jes
from jes import cli
from jes.render import FRAME_SIZE, record_episode, render

Image = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("render")
    result = jes.train(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1?keep_obs=0,2", "adam", key=0, num_members=8,
                       num_generations=2, eval_episodes=2, log_dir=str(root / "run"), progress=False)
    return root, result


def _frames(path):
    image = Image.open(path)
    frames = []
    for index in range(image.n_frames):
        image.seek(index)
        frames.append(np.asarray(image.convert("RGB")))
    return image.format, image.size, frames


def test_result_render_writes_one_frame_per_step(trained_run, tmp_path):
    _, result = trained_run
    path = render(result.trainer, result.state, str(tmp_path / "episode.gif"), key=1, max_steps=40)
    trainer, state = result.trainer, result.state
    _, _, length = record_episode(trainer.spec, trainer.fns, trainer.unravel(state.params), trainer.obs_scale(state),
                                  __import__("jax").random.key(1), max_steps=40)
    kind, size, frames = _frames(path)
    assert kind == "GIF" and size == FRAME_SIZE and len(frames) == length + 1 >= 2
    assert all((frame < 250).any() for frame in frames)            # something is drawn on every frame
    assert not np.array_equal(frames[0], frames[-1])                # and it moves


def test_render_names_a_bad_step_count_or_key(trained_run, tmp_path):
    _, result = trained_run
    for bad in (0, -5, 2.5, True):
        with pytest.raises(ValueError, match=f"max_steps must be a positive number of steps .* got {bad!r}"):
            result.render(str(tmp_path / "x.gif"), max_steps=bad)
    for key in ("abc", 1.5):
        with pytest.raises(TypeError, match="key must be an int seed or a jax.random key"):
            result.render(str(tmp_path / "x.gif"), key=key)
    assert not (tmp_path / "x.gif").exists()


def test_eval_render_from_the_command_line(trained_run, tmp_path, capsys):
    root, _ = trained_run
    out = tmp_path / "cartpole.gif"
    ckpt = str(root / "run" / "checkpoint.ckpt")
    assert cli.main(["eval", ckpt, "--episodes", "2", "--render", str(out), "--render-steps", "30"]) == 0
    assert f"rendered one episode to {out}" in capsys.readouterr().out
    kind, size, frames = _frames(out)
    assert kind == "GIF" and size == FRAME_SIZE and 2 <= len(frames) <= 31
    assert cli.main(["eval", ckpt, "--episodes", "2", "--render", str(tmp_path / "x.html")]) == 2
    assert "give a .gif path" in capsys.readouterr().err


@pytest.mark.hard_timeout(400)
@pytest.mark.parametrize("env", ["CartPole-v1?keep_obs=0,2", "Pendulum-v1"])
def test_a_saved_policy_draws_the_frames_of_its_checkpoint(env, tmp_path):
    """A .policy file could not be rendered at all (no TrainedPolicy.render; `jes eval x.policy --render` refused):
    loaded, it draws its checkpoint's centre episode byte for byte (normalised observations; Pendulum's continuous
    actions show a last-bit difference of the normaliser or the action mapping)."""
    ckpt = str(tmp_path / "run.ckpt")
    result = jes.train(jes.GRUPolicy(hidden=3, layers=1), env, "adam", key=2, num_members=8, num_generations=2,
                       eval_episodes=2, max_episode_steps=50, normalize_observations=True, log_dir=None,
                       progress=False, checkpoint_path=ckpt)
    trainer, state, _ = jes.checkpoint.load(ckpt)
    assert trainer.normalize_observations
    policy = jes.load_policy(result.save_policy(str(tmp_path / "run.policy")))
    expected = render(trainer, state, str(tmp_path / "checkpoint.gif"), key=3, max_steps=40)
    got = policy.render(str(tmp_path / "policy.gif"), key=3, max_steps=40)
    assert got == str(tmp_path / "policy.gif")
    assert open(got, "rb").read() == open(expected, "rb").read()
    assert len(_frames(got)[2]) >= 2
    # another key another episode; no max_steps the env's limit, as render's; env= as evaluate takes it
    policy.render(str(tmp_path / "other.gif"), key=4)
    render(trainer, state, str(tmp_path / "other-checkpoint.gif"), key=4)
    assert (tmp_path / "other.gif").read_bytes() == (tmp_path / "other-checkpoint.gif").read_bytes()
    assert (tmp_path / "other.gif").read_bytes() != open(got, "rb").read()
    policy.render(str(tmp_path / "env.gif"), key=3, max_steps=40, env=trainer.spec)
    assert (tmp_path / "env.gif").read_bytes() == open(expected, "rb").read()


def test_a_trained_policy_refuses_what_render_refuses_before_the_episode(trained_run, tmp_path, monkeypatch):
    import sys

    from jes import render as render_module

    root, result = trained_run
    policy = result.trained_policy()
    ran = []
    monkeypatch.setattr(render_module, "record_episode", lambda *a, **k: ran.append(1))
    with pytest.raises(ValueError, match="gymnax envs render to an animated GIF: give a .gif path"):
        policy.render(str(tmp_path / "x.html"))
    ckpt = str(root / "run" / "checkpoint.ckpt")
    with pytest.raises(NotADirectoryError, match=f"cannot write '{ckpt}/x.gif': '{ckpt}' is a file"):
        policy.render(f"{ckpt}/x.gif")
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match=f"max_steps must be a positive number of steps .* got {bad!r}"):
            policy.render(str(tmp_path / "x.gif"), max_steps=bad)
    with pytest.raises(TypeError, match="key must be an int seed or a jax.random key"):
        policy.render(str(tmp_path / "x.gif"), key="abc")
    with pytest.raises(ValueError, match=r"env 'Pendulum-v1' does not fit this policy"):
        policy.render(str(tmp_path / "x.gif"), env="Pendulum-v1")
    acrobot = jes.Trainer(jes.MLPPolicy(hidden_sizes=(2,)), "Acrobot-v1", "adam", jes.ESConfig(num_members=4))
    with pytest.raises(ValueError, match="no drawing for env 'Acrobot-v1': jes renders CartPole-v1, Pendulum-v1"):
        jes.loop.trained_policy(acrobot, acrobot.init_state(0).params, acrobot.init_state(0)).render(
            str(tmp_path / "a.gif"))
    assert not ran and os.listdir(tmp_path) == []
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "PIL", None)  # Pillow not installed
    with pytest.raises(ImportError, match=r"rendering GIFs needs Pillow: pip install 'jax-jes\[viz\]'"):
        policy.render(str(tmp_path / "x.gif"), max_steps=5)
    assert os.listdir(tmp_path) == []


def test_eval_renders_a_saved_policy_file_as_its_checkpoint(trained_run, tmp_path, capsys, monkeypatch):
    """`jes eval x.policy --render out.gif` was refused ("--render draws an episode of a checkpoint")."""
    root, result = trained_run
    ckpt = str(root / "run" / "checkpoint.ckpt")
    trainer, state, _ = jes.checkpoint.load(ckpt)
    path = jes.loop.trained_policy(trainer, state.params, state).save(str(tmp_path / "centre.policy"))
    flags = ["--episodes", "2", "--seed", "5", "--render-steps", "30", "--render"]
    assert cli.main(["eval", ckpt, *flags, str(tmp_path / "checkpoint.gif")]) == 0
    capsys.readouterr()
    out = tmp_path / "policy.gif"
    assert cli.main(["eval", path, *flags, str(out)]) == 0
    printed = capsys.readouterr().out
    assert "saved policy: return" in printed and f"rendered one episode to {out}" in printed, printed
    assert out.read_bytes() == (tmp_path / "checkpoint.gif").read_bytes()
    # a format the env has no drawing in, or a path that cannot be written: refused before the episodes
    evaluated = []
    monkeypatch.setattr(jes.TrainedPolicy, "evaluate", lambda *a, **k: evaluated.append(1))
    assert cli.main(["eval", path, "--render", str(tmp_path / "x.html")]) == 2
    assert "give a .gif path" in capsys.readouterr().err
    assert cli.main(["eval", path, "--render", f"{ckpt}/x.gif"]) == 2
    assert f"cannot write '{ckpt}/x.gif': '{ckpt}' is a file, not a folder" in capsys.readouterr().err
    assert not evaluated and sorted(os.listdir(tmp_path)) == ["centre.policy", "checkpoint.gif", "policy.gif"]


def test_envs_without_a_drawing_are_explained(tmp_path):
    trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(2,)), "Acrobot-v1", "adam", jes.ESConfig(num_members=4))
    with pytest.raises(ValueError, match="CartPole-v1, Pendulum-v1"):
        render(trainer, trainer.init_state(0), str(tmp_path / "a.gif"))


def test_plot_draws_several_runs_into_a_png(trained_run, tmp_path, capsys):
    root, _ = trained_run
    second = jes.train(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1?keep_obs=0,2", "adam", key=1, num_members=8,
                       num_generations=3, eval_episodes=2, eval_every=2, log_dir=str(root / "run2"), progress=False)
    assert len(second.history["generation"]) == 3
    out = tmp_path / "curves.png"
    assert cli.main(["plot", str(root / "run"), str(root / "run2"), "-o", str(out), "--labels", "a,b"]) == 0
    assert "2 run folder(s)" in capsys.readouterr().out
    image = Image.open(out)
    assert image.format == "PNG" and image.size == (1000, 400)
    pixels = np.asarray(image.convert("RGB"))
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 10      # curves, not a blank canvas
    (tmp_path / "nothing").mkdir()
    assert cli.main(["plot", str(tmp_path / "nothing"), "-o", str(tmp_path / "n.png")]) == 2
    assert "no TensorBoard event files" in capsys.readouterr().err
    # a typo: "no TensorBoard event files in 'runs/typo'" read as if the folder were there
    assert cli.main(["plot", str(tmp_path / "typo"), "-o", str(tmp_path / "n.png")]) == 2
    assert f"'{tmp_path / 'typo'}' does not exist" in capsys.readouterr().err
    for name in ("curves.jpg", "curves"):  # PNG bytes under another format's name (or none) were written before
        assert cli.main(["plot", str(root / "run"), "-o", str(tmp_path / name)]) == 2
        assert f"give a path ending in .png, not '{tmp_path / name}'" in capsys.readouterr().err
        assert not (tmp_path / name).exists()


def test_plot_runs_refuses_labels_that_are_not_one_per_run(trained_run, tmp_path):
    from jes.plot import plot_runs

    root, _ = trained_run
    runs = [str(root / "run"), str(root / "run")]
    for labels in (["only-one"], ["a", "b", "c"], "ab"):  # the second run was left out of the picture silently
        with pytest.raises(ValueError, match="labels"):
            plot_runs(runs, str(tmp_path / "x.png"), labels=labels)
    assert not (tmp_path / "x.png").exists()


def test_plot_labels_runs_of_one_name_by_the_folders_that_tell_them_apart(trained_run, tmp_path, monkeypatch):
    # Two sweeps' configurations (sweep-a/learning_rate=0.01, sweep-b/learning_rate=0.01) were both labelled
    # learning_rate=0.01: two curves of one name in the legend
    import shutil

    import matplotlib.axes

    from jes.plot import plot_runs

    root, _ = trained_run
    for sweep in ("sweep-a", "sweep-b"):
        shutil.copytree(root / "run", tmp_path / sweep / "learning_rate=0.01")
    shutil.copytree(root / "run", tmp_path / "other")
    drawn, plot = [], matplotlib.axes.Axes.plot

    def recording(self, *args, **kwargs):
        drawn.append(kwargs.get("label"))
        return plot(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", recording)
    runs = [str(tmp_path / "sweep-a" / "learning_rate=0.01"), str(tmp_path / "sweep-b" / "learning_rate=0.01"),
            str(tmp_path / "other")]
    plot_runs(runs, str(tmp_path / "x.png"))
    names = {label.split(": ")[0] for label in drawn if label}
    assert names == {"sweep-a/learning_rate=0.01", "sweep-b/learning_rate=0.01", "other"}
    drawn.clear()
    plot_runs([runs[2], runs[2] + "/"], str(tmp_path / "y.png"))  # one folder twice: nothing tells it apart
    assert {label.split(": ")[0] for label in drawn if label} == {"other"}


def test_brax_renders_to_html(tmp_path):
    pytest.importorskip("brax")
    trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(2,)), "brax/inverted_pendulum", "adam",
                          jes.ESConfig(num_members=4, max_episode_steps=20))
    state = trainer.init_state(0)
    with pytest.raises(ValueError, match=".html"):
        render(trainer, state, str(tmp_path / "pendulum.gif"))
    path = render(trainer, state, str(tmp_path / "pendulum.html"), key=2)
    text = open(path).read()
    assert os.path.getsize(path) > 1000 and "<html" in text.lower() and "brax" in text.lower()
    saved = jes.loop.trained_policy(trainer, state.params, state).save(str(tmp_path / "p.policy"))
    policy = jes.load_policy(saved)  # a saved policy, its env rebuilt from the file's name: the same page
    assert open(policy.render(str(tmp_path / "policy.html"), key=2)).read() == text
    with pytest.raises(ValueError, match="brax envs render to brax's HTML viewer: give a .html path"):
        policy.render(str(tmp_path / "policy.gif"))


def _interrupted_midway(fp, written=b"GIF89a partial"):
    fp.write(written)  # Pillow had opened (and truncated) the target and begun encoding when Ctrl-C came
    raise KeyboardInterrupt


@pytest.mark.parametrize("what", ["ctrl_c", "error"])
def test_a_gif_interrupted_while_written_leaves_the_previous_file(tmp_path, monkeypatch, what):
    """Ctrl-C during ``jes eval --render`` left a 0-byte GIF where a good one had been: the frames were encoded
    straight into the target path."""
    from PIL import GifImagePlugin

    from jes import render as render_module

    target = tmp_path / "episode.gif"
    frames = [Image.new("RGB", (8, 6), colour) for colour in ("white", "black", "red")]
    render_module._save_gif(frames, str(target), duration_ms=20)
    good = target.read_bytes()
    assert Image.open(target).n_frames == 3

    def failing(im, fp, filename):
        if what == "ctrl_c":
            _interrupted_midway(fp)
        fp.write(b"GIF89a")
        raise OSError(28, "No space left on device")

    monkeypatch.setitem(Image.SAVE_ALL, "GIF", failing)
    with pytest.raises(KeyboardInterrupt if what == "ctrl_c" else OSError):
        render_module._save_gif(frames[:2], str(target), duration_ms=20)
    assert target.read_bytes() == good and os.listdir(tmp_path) == ["episode.gif"]  # no temporary file left
    monkeypatch.setitem(Image.SAVE_ALL, "GIF", GifImagePlugin._save_all)
    render_module._save_gif(frames[:2], str(target), duration_ms=20)  # a save that completes replaces it
    assert Image.open(target).n_frames == 2 and os.listdir(tmp_path) == ["episode.gif"]
    assert oct(os.stat(target).st_mode & 0o777) == oct(0o666 & ~_umask())  # not mkstemp's 0600


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_brax_html_interrupted_while_rendered_leaves_the_previous_file(tmp_path, monkeypatch):
    pytest.importorskip("brax")
    from types import SimpleNamespace

    from brax.io import html

    from jes import render as render_module

    target = tmp_path / "episode.html"
    target.write_text("<html>the good one</html>")
    env = SimpleNamespace(env=SimpleNamespace(dt=0.1, sys=SimpleNamespace(tree_replace=lambda replacements: "sys")))
    states = SimpleNamespace(pipeline_state=np.zeros((3, 2)))

    def interrupted(sys, frames):
        raise KeyboardInterrupt

    monkeypatch.setattr(html, "render", interrupted)
    with pytest.raises(KeyboardInterrupt):
        render_module._render_brax_html(env, states, 2, str(target))
    assert target.read_text() == "<html>the good one</html>" and os.listdir(tmp_path) == ["episode.html"]
    monkeypatch.setattr(html, "render", lambda sys, frames: f"<html>{len(frames)} frames</html>")
    render_module._render_brax_html(env, states, 2, str(target))
    assert target.read_text() == "<html>3 frames</html>" and os.listdir(tmp_path) == ["episode.html"]


def test_a_plot_interrupted_while_written_leaves_the_previous_png(trained_run, tmp_path, monkeypatch):
    """``jes plot`` drew straight into the target: Ctrl-C while the PNG was encoded left a truncated file where a
    good picture had been."""
    import matplotlib.figure

    from jes.plot import plot_runs

    root, _ = trained_run
    target = tmp_path / "curves.png"
    plot_runs([str(root / "run")], str(target))
    good = target.read_bytes()
    savefig = matplotlib.figure.Figure.savefig

    def interrupted(self, fname, **kwargs):
        fname.write(good[:100])  # the encoder had begun writing when Ctrl-C came
        raise KeyboardInterrupt

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", interrupted)
    with pytest.raises(KeyboardInterrupt):
        plot_runs([str(root / "run")], str(target))
    assert target.read_bytes() == good and os.listdir(tmp_path) == ["curves.png"]  # no temporary file left
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    plot_runs([str(root / "run")], str(target), size=(6, 3))
    assert Image.open(target).size == (600, 300)


def test_plot_runs_takes_one_run_directory_as_a_string_or_path(trained_run, tmp_path):
    """``plot_runs("runs/a", ...)`` iterated the string: "no TensorBoard event files in 'r'"."""
    import pathlib

    from jes.plot import plot_runs

    root, _ = trained_run
    for run_dir in (str(root / "run"), pathlib.Path(root / "run")):
        out = tmp_path / "one.png"
        assert plot_runs(run_dir, str(out)) == str(out)
        assert Image.open(out).format == "PNG"
        out.unlink()


@pytest.mark.hard_timeout(400)
def test_two_fresh_runs_in_one_log_dir_are_drawn_apart_and_a_resumed_run_as_one(tmp_path):
    """A second fresh run into a log dir (its checkpoint deleted to start over, as jes train's refusal suggests) was
    spliced into one curve with the first: generations 1-3 of the second run, then 4-5 of the first."""
    from jes.logging import read_runs, read_scalars
    from jes.plot import load_curves, load_runs, plot_runs

    log_dir = str(tmp_path / "x")
    common = dict(num_members=8, chunk_size=8, eval_episodes=2, log_dir=log_dir, progress=False)
    policy = jes.GRUPolicy(hidden=3, layers=1)
    first = jes.train(policy, "CartPole-v1", "adam", key=0, num_generations=3, **common)
    resumed = jes.train(policy, "CartPole-v1", "adam", resume=first.checkpoint_path, num_generations=4, **common)
    (runs,) = [load_runs(log_dir)]
    assert len(runs) == 1 and list(runs[0]["generation"]) == [1, 2, 3, 4]  # a resumed run's sessions: one run
    np.testing.assert_allclose(load_curves(log_dir)["pop_mean"], resumed.history["pop_mean"], rtol=1e-6)
    os.remove(first.checkpoint_path)  # start over in the same folder
    with pytest.warns(UserWarning, match="already holds the TensorBoard event files of an earlier run"):
        second = jes.train(policy, "CartPole-v1", "adam", key=1, num_generations=2, **common)
    assert len(read_scalars(log_dir)["population/mean_return"]) == 6  # TensorBoard's view: both runs' points
    separate = read_runs(log_dir)
    assert [[step for step, _ in run["population/mean_return"]] for run in separate] == [[1, 2, 3, 4], [1, 2]]
    runs = load_runs(log_dir)
    np.testing.assert_allclose(runs[0]["pop_mean"], resumed.history["pop_mean"], rtol=1e-6)
    np.testing.assert_allclose(runs[1]["pop_mean"], second.history["pop_mean"], rtol=1e-6)
    np.testing.assert_allclose(runs[1]["env_steps"], second.history["env_steps"], rtol=1e-6)
    with pytest.raises(ValueError, match="holds 2 separate runs .*load_runs"):
        load_curves(log_dir)
    with pytest.warns(UserWarning, match=r"holds 2 separate runs .* drawn as 'x \(run 1\)', 'x \(run 2\)'"):
        plot_runs([log_dir], str(tmp_path / "both.png"))
    assert Image.open(tmp_path / "both.png").format == "PNG"
    with pytest.warns(UserWarning, match=r"drawn as 'x \(run 1\)', 'x \(run 2\)'"):
        assert cli.main(["plot", log_dir, "-o", str(tmp_path / "cli.png")]) == 0
    assert Image.open(tmp_path / "cli.png").format == "PNG"


def test_a_resumed_run_continues_its_own_run_not_a_longer_one_beside_it(tmp_path):
    """Run A (5 generations) and run B (8) logged into one folder, their checkpoints elsewhere; A resumed to 7 was
    joined onto B (the newest run that had got that far): B's curve went 1-5 then A's 6-7, and A's stopped at 5."""
    from jes.logging import read_runs

    log_dir = str(tmp_path / "ab")
    common = dict(num_members=8, chunk_size=8, eval_episodes=2, log_dir=log_dir, progress=False)
    policy = jes.GRUPolicy(hidden=3, layers=1)
    a = jes.train(policy, "CartPole-v1", "adam", key=0, num_generations=5,
                  checkpoint_path=str(tmp_path / "a.ckpt"), **common)
    with pytest.warns(UserWarning, match="already holds the TensorBoard event files of an earlier run"):
        b = jes.train(policy, "CartPole-v1", "adam", key=1, num_generations=8,
                      checkpoint_path=str(tmp_path / "b.ckpt"), **common)
    resumed = jes.train(policy, "CartPole-v1", "adam", resume=a.checkpoint_path, num_generations=7,
                        checkpoint_path=a.checkpoint_path, **common)
    runs = read_runs(log_dir)
    assert [[step for step, _ in run["population/mean_return"]] for run in runs] == [list(range(1, 8)),
                                                                                     list(range(1, 9))]
    for run, result in zip(runs, (resumed, b)):
        assert [np.float32(v) for _, v in run["population/mean_return"]] == \
            [np.float32(v) for v in result.history["pop_mean"]]


@pytest.mark.hard_timeout(300)
def test_plotting_a_run_that_has_logged_no_generation_yet_says_so(tmp_path):
    """In a run's first seconds its event file is empty (each generation's scalars wait for the next generation,
    and the file is flushed every 10 s): `jes plot` asked "is it a jes run directory?"."""
    from jes.plot import plot_runs

    log_dir = str(tmp_path / "early")
    seen = []

    def plot_at_generation_1(record):
        if record["generation"] == 1:
            try:
                plot_runs([log_dir], str(tmp_path / "early.png"))
            except ValueError as err:
                seen.append(str(err))

    jes.train(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1", "adam", key=0, num_members=8, num_generations=2,
              eval_episodes=2, log_dir=log_dir, progress=False, callbacks=[plot_at_generation_1])
    assert len(seen) == 1 and seen[0].startswith(f"{log_dir!r} has logged no generation yet"), seen
    assert not (tmp_path / "early.png").exists()
    plot_runs([log_dir], str(tmp_path / "early.png"))  # once it has: drawn
    assert Image.open(tmp_path / "early.png").format == "PNG"


def test_an_output_path_that_cannot_be_written_is_named_before_any_work(trained_run, tmp_path, capsys):
    """jes eval --render evaluated every episode, then failed naming jes's hidden temporary file
    ('/proc/.cart.gif.6mpiwmqv.tmp'), or "File exists: '.../checkpoint.ckpt'" for a file where the folder should
    be; jes plot -o and render() did the same."""
    from jes.plot import plot_runs

    root, result = trained_run
    ckpt = str(root / "run" / "checkpoint.ckpt")
    for name in ("cart.gif", "curves.png"):
        targets = [(f"{ckpt}/{name}", f"'{ckpt}' is a file, not a folder"),
                   (f"{ckpt}/deeper/{name}", f"'{ckpt}' is a file, not a folder"),
                   (f"/proc/{name}", "a file cannot be created in '/proc'")]
        for target, cause in targets:
            if name.endswith(".gif"):
                assert cli.main(["eval", ckpt, "--episodes", "2", "--render", target]) == 2
            else:
                assert cli.main(["plot", str(root / "run"), "-o", target]) == 2
            out = capsys.readouterr()
            assert f"cannot write '{target}': {cause}" in out.err, out.err
            assert ".tmp" not in out.err and "File exists" not in out.err, out.err
            assert "centre return" not in out.out  # refused before the evaluation's episodes
    with pytest.raises(NotADirectoryError, match=f"cannot write '{ckpt}/x.gif': '{ckpt}' is a file"):
        result.render(f"{ckpt}/x.gif")
    with pytest.raises(NotADirectoryError, match=f"cannot write '{ckpt}/x.png': '{ckpt}' is a file"):
        plot_runs([str(root / "run")], f"{ckpt}/x.png")
    (tmp_path / "folder.gif").mkdir()
    with pytest.raises(IsADirectoryError, match="it is a folder"):
        result.render(str(tmp_path / "folder.gif"))
    assert os.listdir(tmp_path) == ["folder.gif"] and os.path.isfile(ckpt)
