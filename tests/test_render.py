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
    _, _, length = record_episode(result.trainer, result.state, __import__("jax").random.key(1), max_steps=40)
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
    assert "2 run(s)" in capsys.readouterr().out
    image = Image.open(out)
    assert image.format == "PNG" and image.size == (1000, 400)
    pixels = np.asarray(image.convert("RGB"))
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 10      # curves, not a blank canvas
    assert cli.main(["plot", str(tmp_path / "nothing"), "-o", str(tmp_path / "n.png")]) == 2
    assert "no TensorBoard event files" in capsys.readouterr().err
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
