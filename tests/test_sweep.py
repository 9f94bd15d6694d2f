"""jes.sweep: grid expansion, vmapped seeds and hyperparameters equal sequential runs, result tables."""
import csv
import dataclasses
import json
import os
import warnings

import numpy as np
import pytest

import jes
from jes import logging as jes_logging
from jes import sweep as jes_sweep
from envs_for_tests import interrupt_second_batch
from jes.loop import run

BASE = jes.ESConfig(num_members=16, chunk_size=8, num_generations=3, eval_episodes=4)
POLICY = jes.GRUPolicy(hidden=3, layers=1)


@pytest.fixture(scope="module")
def grid_result(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    result = jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE, seeds=[0, 1],
                             grid={"num_members": [16, 24], "learning_rate": [0.01, 0.05]},
                             log_dir=str(root / "tb"), out_dir=str(root / "out"))
    return result, root


def test_two_by_two_grid_gives_four_rows(grid_result):
    result, root = grid_result
    assert len(result.rows) == 4 and len(result.runs) == 8
    assert [(r["num_members"], r["learning_rate"]) for r in result.rows] == [(16, 0.01), (16, 0.05), (24, 0.01), (24, 0.05)]
    # learning_rate is batched: each num_members value is one compiled program over 2 rates x 2 seeds
    assert {r["group_batch_size"] for r in result.rows} == {4}
    with open(result.csv_path) as f:
        table = list(csv.DictReader(f))
    assert len(table) == 4 and float(table[3]["final_centre_return_mean"]) == pytest.approx(result.rows[3]["final_centre_return_mean"])
    with open(result.json_path) as f:
        assert len(json.load(f)) == 4
    runs = sorted(os.listdir(root / "tb"))
    assert runs == ["num_members=16,learning_rate=0.01", "num_members=16,learning_rate=0.05",
                    "num_members=24,learning_rate=0.01", "num_members=24,learning_rate=0.05"]
    scalars = jes_logging.read_scalars(str(root / "tb" / runs[1]))
    assert [s for s, _ in scalars["population/mean_return"]] == [1, 2, 3]
    assert scalars["es/learning_rate"][0][1] == pytest.approx(0.05)


def test_a_sweep_result_prints_short(grid_result):
    """``print(sweep_result)`` in a notebook dumped every run's parameters, history and state (33 kB for a 2x2 sweep
    of a small GRU); the training result's repr had been made short for the same reason."""
    result, _ = grid_result
    text = repr(result)
    best = max(range(4), key=lambda i: result.rows[i]["final_centre_return_mean"])
    assert text.startswith("SweepResult(4 configuration(s) x 2 seed(s): 8 runs; best: configuration "
                           f"{best}, final centre return {result.rows[best]['final_centre_return_mean']:.1f}")
    assert text.endswith(f"; table: {result.csv_path})") and len(text) < 300, text
    run = result.run(1, 0)
    assert repr(run) == (f"SweepRun(configuration 1, seed 0, 3 generations, final centre return "
                         f"{run.history['centre_return'][-1]:.1f}, {run.flat_params.size} params)")
    assert str(result) == text
    one = dataclasses.replace(run, history={key: value[:1] for key, value in run.history.items()})
    assert ", 1 generation, final centre return " in repr(one), repr(one)  # it said "1 generations"
    # a copy with other parameters would have kept the old ones' policy: it holds none, and says so
    with pytest.raises(ValueError, match="holds no trained policy: it was not made by jes.sweep .*dataclasses.replace"
                                         ".* re-run its configuration with jes.train"):
        dataclasses.replace(run, flat_params=run.flat_params * 0).save_policy("never.policy")


def test_a_sweep_run_holds_its_centre_as_flax_variables(grid_result):
    """As jes.train's result: ``run.params`` (the flat vector as the policy's variables, bit for bit) applies with the
    policy; a trial found only ``flat_params`` there. The result still pickles (a Flax module would not: jnp.tanh)."""
    import pickle

    import jax.numpy as jnp
    from jax.flatten_util import ravel_pytree

    result, _ = grid_result
    for run in (result.run(0, 0), result.run(3, 1)):
        assert np.asarray(ravel_pytree(run.params)[0]).tobytes() == run.flat_params.tobytes()
        carry, logits = jes.GRUPolicy(hidden=3, layers=1, num_outputs=2).apply(run.params, jnp.zeros((1, 3)), jnp.zeros(4))
        assert logits.shape == (2,) and carry.shape == (1, 3)
    assert result.run(0, 0).flat_params.tobytes() != result.run(3, 1).flat_params.tobytes()
    again = pickle.loads(pickle.dumps(result)).run(3, 1)
    assert np.asarray(ravel_pytree(again.params)[0]).tobytes() == again.flat_params.tobytes()
    from jes.trained import policy_bytes
    assert policy_bytes(again.trained_policy()) == policy_bytes(result.run(3, 1).trained_policy())


def test_a_sweeps_tensorboard_runs_record_the_hyperparameters_they_ran_with(grid_result):
    """As jes.train's: the policy with its fields and the episode length, not ``GRUPolicy`` and ``None``."""
    _, root = grid_result
    rows = []
    for event in jes_logging.iter_events(str(root / "tb" / "num_members=24,learning_rate=0.05")):
        for value in event.summary.value:
            if value.tag == "hparams/text_summary":
                rows += value.tensor.string_val[0].decode().splitlines()
    for row in ("| policy | GRUPolicy(hidden=3, layers=1, num_outputs=2, torch_layout=True) |",
                "| max_episode_steps | 500 |", "| learning_rate | 0.05 |", "| num_members | 24 |", "| chunk_size | 8 |",
                "| seeds | 0 1 |"):
        assert row in rows, (row, rows)


HISTORY_BITS = ("pop_mean", "pop_max", "pop_min", "pop_std", "centre_return", "env_steps", "noise_std",
                "learning_rate", "grad_norm", "update_norm", "param_norm")


def assert_same_bits(swept, alone):
    assert np.array_equal(swept.flat_params, alone.flat_params)
    for key in HISTORY_BITS:
        assert np.array_equal(np.asarray(swept.history[key]), np.asarray(alone.history[key]), equal_nan=True), key


def test_swept_seeds_and_rates_equal_standalone_runs_bit_for_bit(grid_result):
    result, _ = grid_result
    for config_index, seed in [(3, 1), (0, 0)]:
        swept = result.run(config_index, seed)
        alone = jes.train(POLICY, "CartPole-v1", "adam", key=seed, config=swept.config,
                          log_dir=None, checkpoint_path=None, progress=False)
        assert_same_bits(swept, alone)
    rates = {result.run(i, 0).config.learning_rate for i in range(4)}
    assert rates == {0.01, 0.05}
    assert not np.allclose(result.run(2, 0).flat_params, result.run(3, 0).flat_params)


def test_a_sweep_without_a_grid_equals_the_standalone_run_bit_for_bit():
    """The case of issue 26: GRU 5x2, CartPole, adam, key 22, no grid (it differed in 113 of 367 parameters).
    Called as jes.sweep(...), as jes.train(...) is: the module, called, is its sweep function."""
    config = jes.ESConfig(num_generations=5, num_members=64, eval_episodes=8)
    result = jes.sweep(jes.GRUPolicy(5, 2), "CartPole-v1", "adam", grid={}, seeds=[22], config=config, log_dir=None)
    alone = jes.train(jes.GRUPolicy(5, 2), "CartPole-v1", "adam", key=22, config=config, log_dir=None,
                      checkpoint_path=None, progress=False)
    assert_same_bits(result.run(0, 22), alone)


def test_the_vmapped_sweep_stays_close_to_standalone_runs(tmp_path):
    """vmap=True is a different XLA program: close, not promised bit for bit (see jes.sweep)."""
    result = jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE, seeds=[3, 4], vmap=True,
                             grid={"noise_std": [0.05, 0.2]}, log_dir=None)
    trainer = jes.Trainer(POLICY, "CartPole-v1", "adam", BASE.replace(noise_std=0.2))
    alone = run(trainer, trainer.init_state(3), key=3)
    np.testing.assert_allclose(result.run(1, 3).flat_params, alone.flat_params, rtol=1e-5, atol=1e-6)
    assert result.rows[0]["group_batch_size"] == 4
    assert result.csv_path is None
    swept = result.run(1, 3)  # its policy is its own parameters and normaliser, not the standalone run's
    loaded = jes.load_policy(swept.save_policy(str(tmp_path / "vmapped.policy")))
    assert loaded.flat_params.tobytes() == swept.flat_params.tobytes()
    np.testing.assert_array_equal(loaded.obs_stats[1], swept.state.obs_sum)
    np.testing.assert_array_equal(swept.evaluate(4, key=1), loaded.evaluate(4, key=1))


def test_expand_grid():
    points = jes_sweep.expand_grid({"num_members": [16, 32], "noise_std": [0.1, 0.2, 0.3], "eval_every": 5})
    assert len(points) == 6 and all(p["eval_every"] == 5 for p in points)
    with pytest.raises(ValueError, match="unknown sweep key.*num_member"):
        jes_sweep.expand_grid({"num_member": [16]})
    with pytest.raises(ValueError, match="empty list"):
        jes_sweep.expand_grid({"num_members": []})


@pytest.mark.parametrize("suffix, text", [
    (".toml", 'env = "CartPole-v1"\noptimizer = ["adam", "sgd"]\nseeds = [0, 1]\n'
              '[policy]\ntype = "mlp"\nhidden = 8\nlayers = 1\n[config]\nnum_members = [16, 32]\nnum_generations = 2\n'),
    (".json", '{"env": "CartPole-v1", "optimizer": ["adam", "sgd"], "seeds": [0, 1], '
              '"policy": {"type": "mlp", "hidden": 8, "layers": 1}, '
              '"config": {"num_members": [16, 32], "num_generations": 2}}'),
])
def test_sweep_files(tmp_path, suffix, text):
    path = tmp_path / f"sweep{suffix}"
    path.write_text(text)
    kwargs = jes_sweep.load_sweep_file(str(path))
    assert kwargs["policy"] == jes.MLPPolicy(hidden_sizes=(8,))
    assert kwargs["grid"] == {"num_members": [16, 32], "num_generations": 2, "optimizer": ["adam", "sgd"]}
    assert len(jes_sweep.expand_grid(kwargs["grid"])) == 4 and kwargs["seeds"] == [0, 1]


def test_bad_sweep_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('env = "CartPole-v1"\nseed = [1]\n')
    with pytest.raises(ValueError, match="unknown key.*seed"):
        jes_sweep.load_sweep_file(str(path))
    path.write_text("env = [unclosed\n")
    with pytest.raises(ValueError, match="cannot be parsed"):
        jes_sweep.load_sweep_file(str(path))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nested too deeply"):
        jes_sweep.load_sweep_file(str(deep))
    path.write_text('env = "CartPole-v1"\nlog_dir = 3\n')
    with pytest.raises(ValueError, match='log_dir must be a directory or "none", got 3'):
        jes_sweep.load_sweep_file(str(path))
    # A review: an optimizer (or strategy) at the top level and in [config] was resolved silently, one way for a
    # list (the [config] one dropped) and the other for a name (the sweep ran [config]'s, its identity said the other)
    for key, top, inner in (("optimizer", '["adam", "novograd"]', '["sgd"]'), ("optimizer", '"adam"', '"sgd"'),
                            ("strategy", '"openai_es"', '"pgpe"')):
        path.write_text(f'env = "CartPole-v1"\n{key} = {top}\n[config]\n{key} = {inner}\n')
        with pytest.raises(ValueError, match=rf"{key} is given both at the top level and in \[config\]; give it once"):
            jes_sweep.load_sweep_file(str(path))


@pytest.mark.parametrize("text", ["[1, 2]", '["env", "CartPole-v1"]', "3", '"CartPole-v1"', "null"])
def test_a_json_sweep_file_that_is_no_object_is_named(tmp_path, text, capsys):
    # a JSON list or value at the top of the file was an unexpected TypeError with a traceback (jes sweep)
    path = tmp_path / "bad.json"
    path.write_text(text + "\n")
    with pytest.raises(ValueError, match=rf"^sweep file {path} must hold a table of keys \(env, seeds, config, "
                                         rf"\.\.\.\): a JSON object, got "):
        jes_sweep.load_sweep_file(str(path))
    from jes.cli import main

    capsys.readouterr()
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"jes sweep: sweep file {path} must hold a table of keys" in err


@pytest.mark.parametrize("text, key", [
    ('{"env": "CartPole-v1", "config": {"learning_rate": [0.1], "learning_rate": [0.2, 0.3]}}', "learning_rate"),
    ('{"env": "CartPole-v1", "seeds": [0], "seeds": [1, 2]}', "seeds"),
    ('{"env": "CartPole-v1", "policy": {"hidden": 4, "hidden": 8}}', "hidden"),
])
def test_a_json_sweep_file_key_given_twice_is_refused(tmp_path, text, key):
    # json keeps the last of a repeated key: the first value (part of the grid) was dropped silently; TOML refuses
    path = tmp_path / "twice.json"
    path.write_text(text + "\n")
    with pytest.raises(ValueError, match=rf"^sweep file {path} cannot be parsed: the key '{key}' is given twice in "
                                         rf"one object"):
        jes_sweep.load_sweep_file(str(path))


def test_a_log_dir_that_cannot_be_written_is_refused_naming_what_jes_sweep_takes(tmp_path, capsys):
    # jes sweep was told to pass --log-dir DIR or --log-dir none, flags it does not have (its file's log_dir says)
    (tmp_path / "afile").write_text("")
    path = tmp_path / "s.toml"
    path.write_text(f'env = "CartPole-v1"\nseeds = [0]\nlog_dir = "{tmp_path / "afile" / "logs"}"\n'
                    f'out_dir = "{tmp_path / "out"}"\n[config]\nnum_members = 8\nnum_generations = 1\n')
    from jes.cli import main

    capsys.readouterr()
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err
    assert "is a file, not a folder" in err and "--log-dir" not in err
    assert 'a sweep file: log_dir = "DIR"), or log_dir=None (a sweep file: log_dir = "none") to log nothing' in err
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


@pytest.mark.hard_timeout(600)
def test_an_empty_out_dir_is_the_current_folder(tmp_path, monkeypatch):
    # out_dir="" (a sweep file's out_dir = "") trained every run, then lost the table to "[Errno 2] No such file or
    # directory: ''" (its sweep.resume.json was written in the current folder, its lock taken there)
    monkeypatch.chdir(tmp_path)
    result = jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE.replace(num_generations=1), seeds=[0],
                             grid={}, log_dir=None, out_dir="")
    assert result.csv_path == "sweep.csv" and result.json_path == "sweep.json"
    assert {"sweep.csv", "sweep.json", jes_sweep.RESUME_FILE} <= set(os.listdir(tmp_path))
    assert json.load(open(tmp_path / "sweep.json"))[0]["status"] == "completed"


@pytest.mark.hard_timeout(300)
def test_out_dir_none_writes_no_table_as_log_dir_none_writes_no_logs(tmp_path, monkeypatch, capsys):
    # TOML has no null: out_dir = "none" wrote the table into a folder named none (log_dir = "none" is no logs), and
    # JSON's null printed "table: None and None"
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "s.toml"
    for line, flag in (('out_dir = "none"', []), ('out_dir = "None"', []), ("", ["--out-dir", "none"])):
        path.write_text(f'env = "CartPole-v1"\nlog_dir = "none"\n{line}\n'
                        f'[config]\nnum_members = 8\nnum_generations = 1\neval_episodes = 1\n')
        if line:
            assert jes_sweep.load_sweep_file(str(path))["out_dir"] is None
        from jes.cli import main

        capsys.readouterr()
        assert main(["sweep", str(path), *flag]) == 0
        assert "table: not written (out_dir none)" in capsys.readouterr().out
        assert sorted(os.listdir(tmp_path)) == ["s.toml"]


def test_a_value_repeated_in_the_grid_is_refused_without_a_log_dir_too(tmp_path, monkeypatch):
    # With log_dir=None (a sweep file's log_dir = "none") [0.1, 0.1] ran one configuration twice, two rows of one
    # point (jes sweep printed "base: ..." twice); with a log_dir it was refused, the two sharing a folder
    trained = _no_training(monkeypatch)
    with pytest.raises(ValueError, match=r"sweep grid points \(learning_rate=0.1\) and \(learning_rate=0.1\) are one "
                                         r"configuration.*remove the repeated value from the grid"):
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE, seeds=[0], grid={"learning_rate": [0.1, 0.1]},
                        log_dir=None, out_dir=str(tmp_path / "out"))
    assert not trained and not os.path.exists(tmp_path / "out" / "sweep.csv")


def test_bad_seeds_are_named_before_anything_runs(tmp_path):
    for seeds, message in ((3, "got 3"), (["a"], "'a' is not an integer"), ([1.5], "1.5 is not an integer"),
                           ([True], "True is not an integer")):
        with pytest.raises(TypeError, match=r"seeds must be a list of distinct integers \(e.g. \[0, 1, 2\]\).*"
                                            + message):
            jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE, grid={}, seeds=seeds, log_dir=None)
        path = tmp_path / "seeds.toml"
        path.write_text(f'env = "CartPole-v1"\nseeds = {json.dumps(seeds)}\n')
        with pytest.raises(ValueError, match=f"sweep file {path}: seeds must be a list of distinct integers.*"
                                             + message):
            jes_sweep.load_sweep_file(str(path))
    assert jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE.replace(num_generations=1), grid={},
                           seeds=np.array([2]), log_dir=None).runs[0].seed == 2
    with pytest.raises(ValueError, match=r"seed 4294967296 is outside"):  # it ran seed 0's key as a "distinct" seed
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE, grid={}, seeds=[0, 2**32], log_dir=None)


def test_a_second_sweep_never_replaces_the_first_ones_table_and_warns_of_its_curves(grid_result, tmp_path):
    result, root = grid_result
    table = open(result.csv_path).read()
    grid = {"num_members": [16, 24], "learning_rate": [0.01, 0.05]}
    with pytest.raises(FileExistsError, match=rf"out_dir '{root / 'out'}' already holds an earlier sweep's table "
                                              rf"\(sweep.csv, sweep.json, sweep.resume.json\), which this sweep would overwrite: pass "
                                              rf"another out_dir"):
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE, seeds=[0], grid=grid, log_dir=None,
                        out_dir=str(root / "out"))
    assert open(result.csv_path).read() == table
    with pytest.warns(UserWarning, match=rf"log_dir '{root / 'tb'}' already holds TensorBoard event files of an "
                                         rf"earlier sweep in 4 of this sweep's 4 configuration folders"):
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE.replace(num_generations=1), seeds=[0], grid=grid,
                        log_dir=str(root / "tb"), out_dir=str(tmp_path / "out"))


def test_a_sweep_file_turns_logging_off_as_the_command_line_does(tmp_path):
    path = tmp_path / "s.toml"
    for text, expected in (('log_dir = "none"', None), ('log_dir = "None"', None), ('log_dir = "tb"', "tb"),
                           ("", "runs/<auto>")):
        path.write_text(f'env = "CartPole-v1"\n{text}\n')
        assert jes_sweep.load_sweep_file(str(path)).get("log_dir", "runs/<auto>") == expected


def test_multi_optimizer_sweep_shows_each_optimizers_own_rate():
    config = BASE.replace(num_generations=1)
    result = jes_sweep.sweep(POLICY, "CartPole-v1", config=config, seeds=[0], grid={"optimizer": ["adam", "novograd"]},
                             log_dir=None)
    rates = {r["optimizer"]: (r["learning_rate"], r["learning_rate_source"]) for r in result.rows}
    # (exactly: the float32 rate's shortest form; the table read 0.20000000298023224, a trial)
    assert rates == {"adam": (0.2, "optimizer default"), "novograd": (1.5, "optimizer default")}


def test_a_rate_swept_over_several_optimizers_warns():
    config = BASE.replace(num_generations=1)
    with pytest.warns(UserWarning, match=r"instead of its own default \(adam 0.2, novograd 1.5\)"):
        result = jes_sweep.sweep(POLICY, "CartPole-v1", config=config, seeds=[0],
                                 grid={"optimizer": ["adam", "novograd"], "learning_rate": 0.05}, log_dir=None)
    assert {r["learning_rate_source"] for r in result.rows} == {"grid"}


def test_sweep_is_reachable_after_import_jes():
    import subprocess
    import sys

    code = ("import jes; assert callable(jes.sweep.sweep) and callable(jes.sweep.load_sweep_file); "
            "assert callable(jes.sweep)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


@pytest.mark.hard_timeout(300)
def test_a_sweep_over_perturbations_and_ranks_equals_standalone_runs_bit_for_bit(tmp_path):
    """Full rank beside low rank r = 1 and 2 in one grid: full rank runs once (the rank means nothing there),
    its row under rank 1, not once per swept rank under that rank's label. A run's policy file is the standalone
    run's, byte for byte (a sweep run had no save_policy: a new user's trial)."""
    config = BASE.replace(num_generations=2)
    result = jes_sweep.sweep(jes.MLPPolicy((8,)), "CartPole-v1", "adam", config=config, seeds=[5], log_dir=None,
                             grid={"perturbation": ["full_rank", "low_rank"], "perturbation_rank": [2, 1]})
    assert [(r["perturbation"], r["perturbation_rank"]) for r in result.rows] == [
        ("full_rank", 1), ("low_rank", 2), ("low_rank", 1)]
    for i, rank in ((1, 2), (2, 1)):
        alone = jes.train(jes.MLPPolicy((8,)), "CartPole-v1", "adam", key=5, log_dir=None, checkpoint_path=None,
                          progress=False, config=config.replace(perturbation="low_rank", perturbation_rank=rank))
        assert_same_bits(result.run(i, 5), alone)
        swept = result.run(i, 5)
        with open(swept.save_policy(str(tmp_path / f"swept{i}.policy")), "rb") as a, \
                open(alone.save_policy(str(tmp_path / f"alone{i}.policy")), "rb") as b:
            assert a.read() == b.read()
        np.testing.assert_array_equal(swept.evaluate(8, key=3), alone.evaluate(8, key=3))
        assert swept.act(swept.initial_carry(), np.zeros(4, np.float32))[1] in (0, 1)
    full = jes.train(jes.MLPPolicy((8,)), "CartPole-v1", "adam", key=5, log_dir=None, checkpoint_path=None,
                     progress=False, config=config)
    assert result.run(0, 5).config.perturbation_rank == 1
    assert_same_bits(result.run(0, 5), full)
    assert not np.array_equal(result.run(1, 5).flat_params, result.run(2, 5).flat_params)


def test_a_sweep_over_ranks_with_no_low_rank_point_is_refused_before_it_runs():
    with pytest.raises(ValueError, match=r"perturbation_rank=\[1, 2\].*every point is full rank.*perturbation='low_rank'\) \(a sweep file: perturbation = \"low_rank\" under \[config\]\)"):
        jes_sweep.sweep(jes.MLPPolicy((8,)), "CartPole-v1", "adam", config=BASE, seeds=[0], log_dir=None,
                        grid={"perturbation_rank": [1, 2]})


def test_swept_perturbation_objects_are_rows_of_a_name_and_a_rank(tmp_path):
    result = jes_sweep.sweep(jes.MLPPolicy((8,)), "CartPole-v1", "adam", config=BASE.replace(num_generations=1),
                             seeds=[0], log_dir=None, out_dir=str(tmp_path),
                             grid={"perturbation": [jes.FullRank(), jes.LowRank(2)]})
    assert [(r["perturbation"], r["perturbation_rank"]) for r in result.rows] == [("full_rank", 1), ("low_rank", 2)]
    with open(result.csv_path) as f:
        table = list(csv.DictReader(f))
    assert [(r["perturbation"], r["perturbation_rank"]) for r in table] == [("full_rank", "1"), ("low_rank", "2")]


def test_a_config_that_is_not_an_esconfig_is_refused_saying_what_to_pass():
    """A trial's jes.sweep(..., config={"num_members": 16}) failed as "'dict' object has no attribute 'perturbation'"
    (and jes.train's as "... no attribute 'replace'")."""
    for call in (lambda: jes.sweep(POLICY, "CartPole-v1", "adam", config={"num_members": 16}, grid={}, log_dir=None),
                 lambda: jes.train(POLICY, "CartPole-v1", "adam", config={"num_members": 16}, log_dir=None)):
        with pytest.raises(TypeError, match=r"config must be a jes.ESConfig, got dict: pass jes.ESConfig\(\*\*\{\.\.\.\}\) "
                                            r"of your dict, or its fields as keywords \(num_members=\.\.\.\)"):
            call()


def test_runs_are_labelled_by_the_values_that_tell_their_points_apart():
    """Labels list the values that differ between points: not a fixed value in the grid (a sweep file's [config]
    scalar), and the rank of swept jes.LowRank objects, which the grid names only as perturbation (a review found
    LowRank(2) and LowRank(4) both labelled "perturbation=low_rank, seed 0")."""
    runs = []
    jes_sweep.sweep(jes.MLPPolicy((8,)), "CartPole-v1", "adam", config=BASE.replace(num_generations=1), seeds=[0],
                    log_dir=None, grid={"perturbation": [jes.LowRank(1), jes.LowRank(2)], "eval_episodes": 2},
                    callbacks=[lambda record: runs.append(record["run"])])
    assert runs == ["perturbation_rank=1, seed 0", "perturbation_rank=2, seed 0"]


def test_a_grid_point_a_strategy_or_perturbation_refuses_stops_the_sweep_before_any_point_trains(monkeypatch):
    trained = []
    monkeypatch.setattr(jes_sweep, "run_batch", lambda *a, **k: trained.append(1) or (_ for _ in ()).throw(AssertionError))
    low_rank = BASE.replace(perturbation="low_rank")
    with pytest.raises(ValueError, match=r"grid point \(strategy='pgpe'\).*pgpe keeps a sigma per parameter.*; a sweep "
                       r"runs every point of its grid: sweep the strategies that refuse low_rank perturbations in a "
                       r"sweep of their own$"):
        jes_sweep.sweep(jes.MLPPolicy((8,)), "CartPole-v1", None, config=low_rank, seeds=[0], log_dir=None,
                        grid={"strategy": ["openai_es", "ars", "pgpe"]})
    # a rank above both sides of the policy's matrices (4x8, 8x2), refused as each group's Trainer is built
    with pytest.raises(ValueError, match=r"grid point \(perturbation_rank=9\): LowRank\(rank=9\) is larger than both"):
        jes_sweep.sweep(jes.MLPPolicy((8,)), "CartPole-v1", "adam", config=low_rank, seeds=[0], log_dir=None,
                        grid={"perturbation_rank": [1, 9]})
    assert not trained


def test_a_rank_given_twice_in_a_grid_point_is_refused_instead_of_mislabelled():
    # ESConfig reads perturbation_rank=1 beside a LowRank object as unset: the row would say 1 and run rank 2.
    with pytest.raises(ValueError, match="the rank is given twice"):
        jes_sweep.sweep(jes.MLPPolicy((8,)), "CartPole-v1", "adam", config=BASE, seeds=[0], log_dir=None,
                        grid={"perturbation": [jes.LowRank(2)], "perturbation_rank": [1]})


def _no_training(monkeypatch):
    trained = []
    monkeypatch.setattr(jes_sweep, "run_batch", lambda *a, **k: trained.append(1) or (_ for _ in ()).throw(AssertionError))
    return trained


def test_a_noise_std_a_strategy_objects_own_sigma_overrides_is_refused_before_any_point_trains(monkeypatch):
    """SNES(sigma_init=0.3) starts from its own sigma: a sweep over noise_std ran rows that differed only in their
    label. Refused, as jes.train and jes.optimize refuse both; a strategy starting from noise_std sweeps it."""
    trained = _no_training(monkeypatch)
    with pytest.raises(ValueError, match=r"grid point \(noise_std=0.05\): noise_std=0.05 and SNES\(sigma_init=0.3\) "
                                         r"both set the initial sigma.*drop noise_std, or the strategy's sigma_init"):
        jes_sweep.sweep(jes.MLPPolicy((8,)), "CartPole-v1", None, config=BASE, seeds=[0], log_dir=None,
                        strategy=jes.strategies.SNES(sigma_init=0.3), grid={"noise_std": [0.05, 0.1]})
    with pytest.raises(ValueError, match=r"grid point \(strategy=CMAES\(.*noise_std=0.05\): noise_std=0.05 and "
                                         r"CMAES\(sigma_init=0.5\) both set"):
        jes_sweep.sweep(jes.MLPPolicy((8,)), "CartPole-v1", None, config=BASE, seeds=[0], log_dir=None,
                        grid={"strategy": ["snes", jes.strategies.CMAES(sigma_init=0.5)], "noise_std": [0.05]})
    assert not trained
    with pytest.raises(ValueError, match=r"grid point \(num_members=16\): noise_std=0.05 and SNES\(sigma_init=0.3\)"):
        jes_sweep.sweep(jes.MLPPolicy((8,)), "CartPole-v1", None, config=BASE.replace(noise_std=0.05), seeds=[0],
                        log_dir=None, strategy=jes.strategies.SNES(sigma_init=0.3), grid={"num_members": [16]})
    assert not trained
    for given in (dict(noise_std=0.05), dict(config=jes.ESConfig(noise_std=0.05, num_members=16, num_generations=1))):
        with pytest.raises(ValueError, match=r"noise_std=0.05 and SNES\(sigma_init=0.3\) both set the initial sigma"):
            jes.train(jes.MLPPolicy((8,)), "CartPole-v1", strategy=jes.strategies.SNES(sigma_init=0.3),
                      **({"num_members": 16, "num_generations": 1} if "config" not in given else {}), **given,
                      log_dir=None, progress=False)


def test_a_learning_rate_a_points_strategy_ignores_is_refused_before_any_point_trains(monkeypatch):
    """snes/ars never read learning_rate: swept, their rows differed only in their label (learning_rate_source
    'grid'); jes.train refuses it, and so does the sweep, naming the point."""
    trained = _no_training(monkeypatch)
    with pytest.raises(ValueError, match=r"grid point \(strategy='ars', learning_rate=0.05\): learning_rate=0.05 "
                                         r"would be ignored by strategy 'ars'.*split it into one sweep per strategy"):
        jes_sweep.sweep(jes.MLPPolicy((8,)), "CartPole-v1", None, config=BASE, seeds=[0], log_dir=None,
                        grid={"strategy": ["openai_es", "pgpe", "ars"], "learning_rate": [0.05, 0.1]})
    with pytest.raises(ValueError, match=r"grid point \(learning_rate=0.05\): learning_rate=0.05 would be ignored by "
                                         r"strategy 'snes'.*drop it"):
        jes_sweep.sweep(jes.MLPPolicy((8,)), "CartPole-v1", None, config=BASE, seeds=[0], log_dir=None,
                        strategy="snes", grid={"learning_rate": [0.05, 0.1]})
    assert not trained


def test_an_optimizer_with_a_strategy_that_uses_none_is_refused_before_any_group_runs_or_logs(monkeypatch, tmp_path):
    trained = _no_training(monkeypatch)
    with pytest.raises(ValueError, match=r"grid point \(strategy='sep_cma_es', noise_std=0.1\): strategy "
                                         r"'sep_cma_es' does not use an optax optimizer"):
        jes_sweep.sweep(jes.MLPPolicy((8,)), "CartPole-v1", "adam", config=BASE, seeds=[0], log_dir=str(tmp_path / "tb"),
                        out_dir=str(tmp_path / "out"), grid={"strategy": ["openai_es", "sep_cma_es"], "noise_std": [0.1, 0.2]})
    assert not trained and not (tmp_path / "tb").exists() and not (tmp_path / "out").exists()


def test_stop_at_return_is_refused_in_a_sweep(monkeypatch):
    """It never applied (every run does all its generations), yet SweepRun.config kept it: jes.train on that
    config stopped early and gave other bits."""
    trained = _no_training(monkeypatch)
    with pytest.raises(ValueError, match=r"stop_at_return=50.0 does not apply in a sweep: a sweep runs every generation"):
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE.replace(stop_at_return=50.0), seeds=[0],
                        log_dir=None, grid={"learning_rate": [0.01, 0.05]})
    assert not trained


def test_an_interrupted_sweep_keeps_the_table_of_the_configurations_that_finished(monkeypatch, tmp_path, capsys):
    interrupt_second_batch(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE.replace(num_generations=1), seeds=[0], log_dir=None,
                        out_dir=str(tmp_path / "out"), grid={"num_members": [16, 24]})
    err = capsys.readouterr().err
    assert "sweep interrupted after 1 of 2 configurations finished" in err and "resume=True" in err
    with open(tmp_path / "out" / "sweep.json") as f:
        table = json.load(f)
    assert [(r["num_members"], r["sweep_complete"]) for r in table] == [(16, False)]
    with open(tmp_path / "out" / "sweep.csv") as f:
        assert [r["sweep_complete"] for r in csv.DictReader(f)] == ["False"]


def test_env_steps_per_seed_is_the_mean_over_seeds():
    result = jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE.replace(num_generations=2), seeds=[0, 1, 2],
                             grid={}, log_dir=None)
    steps = [int(result.run(0, seed).history["env_steps"][-1]) for seed in (0, 1, 2)]
    assert len(set(steps)) > 1  # seeds' episodes end at different steps
    assert result.rows[0]["env_steps_per_seed"] == pytest.approx(np.mean(steps))
    assert result.rows[0]["generations"] == 2


@pytest.mark.parametrize("text, message", [
    ('env = 5', r"env must be an env name.*got 5"),
    ('env = "CartPole-v1"\noptimizer = 5', r"optimizer must be an optimizer name or a list of names.*got 5"),
    ('env = "CartPole-v1"\nstrategy = [5]', r"strategy must be a strategy name or a list of names.*got \[5\]"),
    ('env = "CartPole-v1"\nconfig = [1, 2]', r"config must be a table of ESConfig fields.*got \[1, 2\]"),
    ('env = "CartPole-v1"\nout_dir = 5', r"out_dir must be a directory.*got 5"),
    ('env = "CartPole-v1"\npolicy = "gru"', r"policy must be a table of type, hidden and layers.*got 'gru'"),
    ('env = "CartPole-v1"\n[policy]\nhidden = "eight"', r"policy hidden must be a positive integer, got 'eight'"),
    ('env = "CartPole-v1"\n[policy]\nhidden = 2.7', r"policy hidden must be a positive integer, got 2.7"),
    ('env = "CartPole-v1"\n[policy]\nlayers = 0', r"policy layers must be a positive integer, got 0"),
    ('env = "CartPole-v1"\n[policy]\ntype = 3', r"policy type must be \"gru\" or \"mlp\", got 3"),
])
def test_a_sweep_file_value_of_the_wrong_type_is_named(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text + "\n")
    with pytest.raises(ValueError, match=rf"^sweep file {path}: {message}$"):
        jes_sweep.load_sweep_file(str(path))


@pytest.mark.hard_timeout(300)
def test_a_sweep_over_optax_objects_names_them_by_grid_index(tmp_path):
    """Folders were named by the objects' reprs: function reprs with memory addresses (another name in every
    process), past the 255-byte limit for inject_hyperparams (OSError after the configuration trained), and the
    table's rows told adam(0.01) from adam(0.05) by an address alone, labelled "optimizer default"."""
    import optax

    optimizers = [optax.adam(0.01), optax.inject_hyperparams(optax.adam)(learning_rate=0.05)]
    result = jes_sweep.sweep(jes.MLPPolicy((4,)), "CartPole-v1", None, config=BASE.replace(num_generations=1),
                             seeds=[0], grid={"optimizer": optimizers, "num_members": [16, 24]},
                             log_dir=str(tmp_path / "tb"), out_dir=str(tmp_path / "out"))
    names = ["optimizer=optax_0,num_members=16", "optimizer=optax_0,num_members=24",
             "optimizer=optax_1,num_members=16", "optimizer=optax_1,num_members=24"]
    assert sorted(os.listdir(tmp_path / "tb")) == names
    with open(result.csv_path) as f:
        table = list(csv.DictReader(f))
    assert [(r["optimizer"], r["num_members"]) for r in table] == [("optax_0", "16"), ("optax_0", "24"),
                                                                   ("optax_1", "16"), ("optax_1", "24")]
    assert {r["learning_rate_source"] for r in table} == {"optax object"}
    assert [r["learning_rate"] for r in result.rows] == [None, None, pytest.approx(0.05), pytest.approx(0.05)]


def test_value_names_are_short_stable_and_plain_values_keep_their_text():
    import optax

    schedule = optax.linear_schedule(0.1, 0.01, 3)
    values = [0.01, "adam", jes.LowRank(2), optax.sgd(0.1), schedule, lambda step: 0.1]
    assert [jes_sweep.value_name(v, values) for v in values] == [
        "0.01", "adam", "LowRank(rank=2)", "optax_3", "schedule_4", "function_5"]


def test_configuration_folder_names_are_checked_before_anything_trains(monkeypatch, tmp_path):
    """A name the file system refuses (longer than its limit) or two configurations in one folder are refused
    before the first configuration trains, not after it (its log lost, the rest never run)."""
    trained = _no_training(monkeypatch)
    monkeypatch.setattr(os, "pathconf", lambda path, name: 30)
    with pytest.raises(ValueError, match=r"folder name 'num_members=16,learning_rate=0.01' is 33 bytes, longer "
                                         r"than the 30 this file system takes"):
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE, seeds=[0], log_dir=str(tmp_path / "tb"),
                        grid={"num_members": [16, 24], "learning_rate": [0.01, 0.05]})
    monkeypatch.undo()
    trained = _no_training(monkeypatch)
    with pytest.raises(ValueError, match=r"\(learning_rate=0.01\) and \(learning_rate=0.01\) would both log into"):
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE, seeds=[0], log_dir=str(tmp_path / "tb"),
                        grid={"learning_rate": [0.01, 0.01]})
    assert not trained and not (tmp_path / "tb").exists()


def _same_bytes(swept, alone):
    """Parameters and every history column but times, byte for byte (the history as float64, jes.train's type)."""
    assert np.asarray(swept.flat_params).tobytes() == np.asarray(alone.flat_params).tobytes()
    for key in HISTORY_BITS:
        assert (np.asarray(swept.history[key], np.float64).tobytes()
                == np.asarray(alone.history[key], np.float64).tobytes()), key


def test_a_diverging_run_fails_alone_named_by_its_grid_point_and_the_sweep_goes_on(grid_result, tmp_path, capsys):
    """Finding: one run whose fitness went non-finite stopped its compile group and every later group, named only as
    "batch entry 1". Now it is a failed row naming its grid point and seed, and the others train as they would alone."""
    result = jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE, seeds=[0, 1], log_dir=str(tmp_path / "tb"),
                             grid={"learning_rate": [0.01, 1e38], "num_members": [16, 24]},
                             out_dir=str(tmp_path / "out"))
    err = capsys.readouterr().err
    assert "learning_rate=1e+38, num_members=16, seed 0 failed: non-finite" in err and "batch entry" not in err
    assert "4 of 8 runs failed (learning_rate=1e+38, num_members=16, seed 0; " in err
    assert [(r["learning_rate"], r["num_members"], r["status"]) for r in result.rows] == [
        (0.01, 16, "completed"), (0.01, 24, "completed"), (1e38, 16, "failed"), (1e38, 24, "failed")]
    failed = result.rows[2]
    assert failed["error"].startswith("seed 0: non-finite") and "; seed 1: " in failed["error"]
    assert 1 <= failed["generations"] < 3 and np.isnan(failed["final_centre_return_mean"])
    run = result.run(2, 0)
    assert run.status == "failed" and f"at generation {run.history['generation'].size + 1}," in run.error
    assert run.history["generation"].tolist() == list(range(1, run.history["generation"].size + 1))
    # The healthy rows of both groups (the first shares its program with the failures) are today's runs, bit for bit
    before = grid_result[0]  # the same configurations (num_members, learning_rate), their bits equal to jes.train's
    for (config, seed), (config_before, _) in {(0, 0): (0, 0), (0, 1): (0, 1), (1, 1): (2, 1)}.items():
        assert result.run(config, seed).config == before.run(config_before, seed).config
        _same_bytes(result.run(config, seed), before.run(config_before, seed))
        assert result.run(config, seed).status == "completed"
    with open(tmp_path / "out" / "sweep.json") as f:
        table = json.load(f)
    assert [r["status"] for r in table] == ["completed", "completed", "failed", "failed"]
    assert table[0]["error"] is None and table[2]["error"] == failed["error"]
    assert "sweep_complete" not in table[0]
    # The failed configuration's curves stop where its last seed did
    scalars = jes_logging.read_scalars(str(tmp_path / "tb" / "learning_rate=1e_38,num_members=16"))
    assert [s for s, _ in scalars["population/mean_return"]] == list(range(1, failed["generations"] + 1))


def test_a_failed_run_leaves_the_other_runs_of_a_vmapped_batch_bit_identical():
    """With vmap=True the failed entry stays in the batch, its state put back each generation: the others' bits are
    those of the same batch without a failure."""
    kwargs = dict(config=BASE.replace(num_generations=4), seeds=[0], vmap=True, log_dir=None)
    failing = jes_sweep.sweep(POLICY, "CartPole-v1", "adam", grid={"learning_rate": [0.05, 1e38]}, **kwargs)
    healthy = jes_sweep.sweep(POLICY, "CartPole-v1", "adam", grid={"learning_rate": [0.05, 0.2]}, **kwargs)
    assert [r["status"] for r in failing.rows] == ["completed", "failed"]
    assert failing.rows[0]["group_batch_size"] == healthy.rows[0]["group_batch_size"] == 2
    _same_bytes(failing.run(0, 0), healthy.run(0, 0))
    failed = failing.run(1, 0)
    assert failed.state.generation == failed.history["generation"].size
    assert failed.trained_policy().flat_params.tobytes() == failed.flat_params.tobytes()  # the run before it failed


def test_a_sweep_whose_policy_pickle_cannot_take_still_pickles_and_says_why_its_runs_have_no_policy():
    """A run's trained policy holds the policy's module; one with a lambda activation cannot be pickled, and a sweep
    result without the policy methods pickled whole: it still does, its runs saying what became of their policy."""
    import pickle

    policy = jes.MLPPolicy((4,), activation=lambda x: x)
    result = jes_sweep.sweep(policy, "CartPole-v1", "adam", config=BASE.replace(num_generations=1), seeds=[0],
                             log_dir=None, grid={"learning_rate": [0.05]})
    assert np.isfinite(result.run(0, 0).evaluate(2, key=0)).all()  # here it has one
    again = pickle.loads(pickle.dumps(result)).run(0, 0)
    assert again.flat_params.tobytes() == result.run(0, 0).flat_params.tobytes()
    with pytest.raises(ValueError, match=r"holds no trained policy: its policy could not be pickled with it "
                                         r"\(.*lambda.*\); apply run.params"):
        again.save_policy("never.policy")


def test_jes_sweep_writes_the_table_and_exits_1_when_runs_failed(tmp_path, capsys):
    from jes import cli

    path = tmp_path / "sweep.toml"
    path.write_text('env = "CartPole-v1"\noptimizer = "adam"\nseeds = [0]\nlog_dir = "none"\n'
                    '[policy]\ntype = "mlp"\nhidden = 4\nlayers = 1\n'
                    '[config]\nnum_members = 8\nnum_generations = 3\neval_episodes = 2\nmax_episode_steps = 20\n'
                    'learning_rate = [0.05, 1e38]\n')
    assert cli.main(["sweep", str(path), "--out-dir", str(tmp_path / "out")]) == 1
    out, err = capsys.readouterr()
    assert "\nlearning_rate=1e+38: failed (seed 0: non-finite" in "\n" + out, out
    # Said once (jes sweep said it again), naming the run by its swept values (not the file's fixed [config] values,
    # which a trial found repeated in every label) and where its reason is
    out_dir = tmp_path / "out"
    assert err.count("runs failed") == 1 and (
        f"sweep: 1 of 2 runs failed (learning_rate=1e+38, seed 0); the reasons are in the error column of their rows "
        f"in {out_dir / 'sweep.csv'} and {out_dir / 'sweep.json'}") in err, err
    assert "sweep: learning_rate=1e+38, seed 0 failed: non-finite" in err, err
    with open(tmp_path / "out" / "sweep.csv") as f:
        assert [r["status"] for r in csv.DictReader(f)] == ["completed", "failed"]


def test_a_callbacks_stop_training_ends_its_run_alone(grid_result):
    """Finding: sweep() took no callbacks. A StopTraining raised for one run ends that run after the generation it was
    given (as jes.train's), the others going on bit for bit; each record names its grid point and seed."""
    records = []

    def stop_one(record):
        records.append(record)
        if record["point"] == {"learning_rate": 0.05} and record["seed"] == 1 and record["generation"] == 1:
            raise jes.StopTraining("plateau")

    result = jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE, seeds=[0, 1], log_dir=None,
                             grid={"learning_rate": [0.01, 0.05]}, callbacks=[stop_one])
    first = records[0]
    assert (first["config_index"], first["point"], first["seed"], first["run"], first["generation"]) == (
        0, {"learning_rate": 0.01}, 0, "learning_rate=0.01, seed 0", 1)
    assert set(jes.loop.HISTORY_KEYS) <= set(first) and "env_steps_per_second" in first
    assert [(r["run"], r["generation"]) for r in records if r["seed"] == 1 and r["config_index"] == 1] == [
        ("learning_rate=0.05, seed 1", 1)]
    assert len(records) == 3 * 3 + 1
    stopped = result.run(1, 1)
    assert (stopped.status, stopped.stopped, stopped.history["generation"].tolist()) == ("stopped", "plateau", [1])
    assert (result.rows[1]["status"], result.rows[1]["stopped"]) == ("stopped", "seed 1 after generation 1: plateau")
    assert result.rows[0]["status"] == "completed" and result.rows[0]["stopped"] is None

    def stop_alone(record):
        if record["generation"] == 1:
            raise jes.StopTraining("plateau")

    alone = jes.train(POLICY, "CartPole-v1", "adam", key=1, config=stopped.config, log_dir=None,
                      checkpoint_path=None, progress=False, callbacks=[stop_alone])
    assert alone.stopped == "plateau"
    _same_bytes(stopped, alone)
    before = grid_result[0]  # configurations 0 and 1 there are (16, 0.01) and (16, 0.05), equal to jes.train's bits
    for config, seed in [(0, 0), (0, 1), (1, 0)]:
        _same_bytes(result.run(config, seed), before.run(config, seed))


def test_another_error_of_a_callback_stops_the_sweep_keeping_the_finished_rows(tmp_path, capsys):
    def broken(record):
        if record["point"]["num_members"] == 24:
            raise RuntimeError("a bug in my callback")

    with pytest.raises(RuntimeError, match="a bug in my callback") as caught:
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE.replace(num_generations=1), seeds=[0],
                        log_dir=None, out_dir=str(tmp_path / "out"), grid={"num_members": [16, 24]},
                        callbacks=[broken])
    assert "raised by a sweep callback for num_members=24, seed 0 at generation 1" in str(caught.value.__notes__)
    assert "sweep stopped by RuntimeError after 1 of 2 configurations finished" in capsys.readouterr().err
    with open(tmp_path / "out" / "sweep.json") as f:
        assert [(r["num_members"], r["sweep_complete"]) for r in json.load(f)] == [(16, False)]


def test_a_sequential_sweep_places_each_run_once_not_every_generation(monkeypatch):
    """Finding: on 2 CPU devices a sweep ran 3-4x slower per generation than on one: every generation sliced each run
    out of the stacked batch, placed it on the devices and stacked the results again. Each run's state now stays as
    the compiled step returns it."""
    placed = []
    real = jes.Trainer.place
    monkeypatch.setattr(jes.Trainer, "place", lambda self, state: placed.append(1) or real(self, state))
    jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE.replace(num_generations=4), seeds=[0, 1],
                    grid={"learning_rate": [0.01, 0.05]}, log_dir=None)
    assert len(placed) <= 4 + 1  # each run's state once (and the compile's); was 4 runs x (4 generations + 1)


def test_a_stopped_run_of_a_vmapped_batch_stays_where_it_stopped():
    """The vmapped batch steps every slot: a slot that a callback stopped went on training (its state at a later
    generation than its history), until its slot was put back each generation."""
    def stop_seed_1(record):
        if record["seed"] == 1 and record["generation"] == 1:
            raise jes.StopTraining("plateau")

    kwargs = dict(config=BASE, seeds=[0, 1], vmap=True, log_dir=None, grid={"learning_rate": [0.05]})
    stopped = jes_sweep.sweep(POLICY, "CartPole-v1", "adam", callbacks=[stop_seed_1], **kwargs)
    run = stopped.run(0, 1)
    assert (run.status, run.history["generation"].tolist(), int(run.state.generation)) == ("stopped", [1], 1)
    _same_bytes(stopped.run(0, 0), jes_sweep.sweep(POLICY, "CartPole-v1", "adam", **kwargs).run(0, 0))


def test_a_group_whose_every_run_fails_at_its_first_generation_gives_failed_rows():
    """No run of the group completed a generation: its history has no rows (the row's reductions raised on it)."""
    zero = lambda generation: 0.0 * generation  # a noise_std schedule at 0: the first update is not finite
    result = jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE.replace(noise_std=zero), seeds=[0, 1],
                             grid={"learning_rate": [0.05, 0.1]}, log_dir=None)
    assert [(r["status"], r["generations"]) for r in result.rows] == [("failed", 0), ("failed", 0)]
    assert all(r.status == "failed" and int(r.state.generation) == 0 and r.history["generation"].size == 0
               for r in result.runs)
    assert "a non-finite ES update at generation 1" in result.rows[0]["error"]


def _three_seeds_history():
    """4 generations of 3 seeds: seed 0 completed, seed 1 failed after generation 2 (diverging: huge returns before),
    seed 2 stopped by a callback after generation 3; as run_batch gives them (NaN after an end, the ints kept)."""
    generations, seeds = 4, 3
    history = {k: np.full((generations, seeds), np.nan) for k in jes.loop.HISTORY_KEYS}
    history["generation"] = np.repeat(np.arange(1, generations + 1)[:, None], seeds, axis=1)
    history["env_steps"] = np.cumsum(np.full((generations, seeds), 100, np.int64), axis=0)
    for b, (pop, last) in enumerate([(10.0, 4), (1000.0, 2), (30.0, 3)]):
        history["pop_mean"][:last, b] = history["pop_max"][:last, b] = pop
        history["centre_return"][:last, b] = [100.0, 200.0, 500.0, 300.0][:last] if b != 1 else pop
        for k in ("pop_min", "pop_std", "wall_time", "generation_time", "noise_std", "learning_rate", "grad_norm",
                  "update_norm", "param_norm"):
            history[k][:last, b] = 1.0
    ends = [jes_sweep.RunEnd("completed", 4), jes_sweep.RunEnd("failed", 2, "non-finite fitness at generation 3"),
            jes_sweep.RunEnd("stopped", 3, "enough")]
    return history, ends


def test_a_rows_aggregates_are_over_the_seeds_that_did_not_fail_and_it_counts_the_failed(tmp_path):
    """Finding: one failed seed made its row's means NaN (and a diverged seed's returns counted in best_pop_max).
    The means are over the seeds that finished; `failed` counts the others; solved_fraction is over every seed, a
    failed one unsolved; env_steps_per_seed is what every seed cost."""
    history, ends = _three_seeds_history()
    trainer = jes.Trainer(POLICY, "CartPole-v1", "adam", BASE)
    ran = jes_sweep._ran(history, ends)
    row = jes_sweep._row({}, [], [0, 1, 2], ran, ends, 0.0, 1.0, 3, trainer)
    assert row["status"] == "failed" and row["failed"] == 1
    assert row["final_centre_return_mean"] == 400.0 and row["final_centre_return_std"] == 100.0  # 300 and 500
    assert row["best_centre_return_mean"] == 500.0 and row["final_pop_mean_mean"] == 20.0
    assert row["best_pop_max"] == 30.0  # not the failed seed's 1000
    assert row["solved_fraction"] == pytest.approx(1 / 3)  # seed 2 (500 >= 475) of 3
    assert row["env_steps_per_seed"] == pytest.approx((400 + 200 + 300) / 3)
    every_seed_failed = [jes_sweep.RunEnd("failed", end.generation, "x") for end in ends]
    row = jes_sweep._row({}, [], [0, 1, 2], jes_sweep._ran(history, every_seed_failed), every_seed_failed, 0.0, 1.0,
                         3, trainer)
    assert row["failed"] == 3 and np.isnan(row["final_centre_return_mean"]) and row["solved_fraction"] == 0.0


def test_a_configurations_curves_leave_out_a_failed_seed_and_log_how_many_seeds_each_point_averages(tmp_path):
    """Finding: the mean curves over seeds jumped where a seed failed (the mean over the seeds still running). They
    are the mean over the seeds that did not fail, the row's seeds; sweep/seeds counts each point's."""
    history, ends = _three_seeds_history()
    trainer = jes.Trainer(POLICY, "CartPole-v1", "adam", BASE)
    ran = jes_sweep._ran(history, ends)
    jes_sweep._log_configuration(str(tmp_path / "tb"), ran, {}, BASE, trainer, [0, 1, 2], "adam", ends)
    scalars = jes_logging.read_scalars(str(tmp_path / "tb"))
    assert scalars["population/mean_return"] == [(1, 20.0), (2, 20.0), (3, 20.0), (4, 10.0)]
    assert scalars[jes_sweep.SEEDS_TAG] == [(1, 2.0), (2, 2.0), (3, 2.0), (4, 1.0)]  # seed 2 stopped after 3


@pytest.mark.hard_timeout(300)
def test_a_configurations_hparams_final_metrics_are_its_rows(tmp_path):
    # TensorBoard's HPARAMS view said another best centre return than sweep.csv for the same configuration (the best
    # of the mean curve, 73.0, beside the table's mean of each seed's best, 107.25), and another final population mean
    # once a seed had stopped early (the last seed still running's)
    def stop(record):
        if record["seed"] == 1 and record["generation"] == 2:
            raise jes.StopTraining("enough")

    result = jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE.replace(num_generations=4), seeds=[0, 1, 2],
                             grid={}, log_dir=str(tmp_path / "tb"), callbacks=[stop])
    row = result.rows[0]
    scalars = jes_logging.read_scalars(str(tmp_path / "tb" / "base"))
    assert scalars["hparams/best_centre_return"] == [(4, float(np.float32(row["best_centre_return_mean"])))]
    assert scalars["hparams/final_pop_mean"] == [(4, float(np.float32(row["final_pop_mean_mean"])))]
    assert scalars["hparams/generations"] == [(4, 4.0)] and row["generations"] == 4


def test_a_sweep_callback_that_returns_a_value_is_warned_once(recwarn):
    """The sweep's callbacks go through jes.train's own calling (StopTraining, errors, returned values)."""
    calls = []

    def sb3_style(record):
        calls.append(record["generation"])
        return True

    jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE.replace(num_generations=2), seeds=[0],
                    grid={"learning_rate": 0.05}, log_dir=None, callbacks=[sb3_style])
    assert calls == [1, 2]
    returned = [w for w in recwarn.list if "returned True: jes ignores what callbacks return" in str(w.message)]
    assert len(returned) == 1, [str(w.message) for w in recwarn.list]


def test_jes_sweep_exits_2_on_an_unexpected_error_not_the_1_of_failed_runs(tmp_path, monkeypatch, capsys):
    from jes import cli

    def broken(**kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(jes_sweep, "sweep", broken)
    path = tmp_path / "sweep.toml"
    path.write_text('env = "CartPole-v1"\n[config]\nlearning_rate = [0.05, 0.1]\n')
    assert cli.main(["sweep", str(path), "--out-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "jes sweep: unexpected RuntimeError: a bug" in err, err


# ------------------------------------------------------------- incremental tables, resume, SIGTERM
TIMES = ("compile_time", "group_run_time")  # wall-clock columns: the only ones two runs of a sweep may differ in


def _table_without_times(out_dir) -> tuple[list, list]:
    """``sweep.json``'s lines and ``sweep.csv``'s fields as written, less the wall-clock columns' values."""
    with open(os.path.join(out_dir, "sweep.json")) as f:
        json_lines = [line for line in f.read().split("\n") if line.strip().split(":")[0].strip('"') not in TIMES]
    with open(os.path.join(out_dir, "sweep.csv"), newline="") as f:
        table = list(csv.reader(f))
    keep = [c for c, name in enumerate(table[0]) if name not in TIMES]
    return json_lines, [[line[c] for c in keep] for line in table]


def _counting_batches(monkeypatch) -> list:
    real, batches = jes_sweep.run_batch, []

    def counted(trainer, states, *args, **kwargs):
        batches.append(kwargs["labels"])
        return real(trainer, states, *args, **kwargs)

    monkeypatch.setattr(jes_sweep, "run_batch", counted)
    return batches


def test_a_sweep_rewrites_its_table_after_each_compile_group(tmp_path):
    """Finding: the table was written only at the end (or on a Python exception): a sweep killed by SIGKILL or
    SIGTERM lost every finished run. While the second group runs, the first one's rows are on disk."""
    out_dir = str(tmp_path / "out")
    seen = []

    def look(record):
        if record["point"]["num_members"] == 24 and not seen:
            with open(os.path.join(out_dir, "sweep.json")) as f:
                seen.append(json.load(f))

    result = jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE.replace(num_generations=1), seeds=[0],
                             log_dir=None, out_dir=out_dir, grid={"num_members": [16, 24]}, callbacks=[look])
    assert [(r["num_members"], r["sweep_complete"]) for r in seen[0]] == [(16, False)]
    with open(result.json_path) as f:
        assert [r["num_members"] for r in json.load(f)] == [16, 24] and "sweep_complete" not in seen[0][1:]
    assert sorted(os.listdir(out_dir)) == ["sweep.csv", "sweep.json", "sweep.resume.json"]  # no temporary file left


def test_a_resumed_sweep_runs_only_the_unfinished_groups_and_writes_the_uninterrupted_table(
        grid_result, tmp_path, monkeypatch, capsys):
    """An interrupted sweep resumed (resume=True) skips the compile groups whose rows are written, reruns the
    others whole, and writes the table an uninterrupted sweep writes (grid_result's), wall-clock columns aside."""
    result, root = grid_result
    grid = {"num_members": [16, 24], "learning_rate": [0.01, 0.05]}
    out_dir, log_dir = str(tmp_path / "out"), str(tmp_path / "tb")

    def interrupt(record):
        if record["point"]["num_members"] == 24:
            raise KeyboardInterrupt

    kwargs = dict(config=BASE, seeds=[0, 1], grid=grid, log_dir=log_dir, out_dir=out_dir)
    with pytest.raises(KeyboardInterrupt):
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", callbacks=[interrupt], **kwargs)
    assert "resume=True (jes sweep --resume)" in capsys.readouterr().err
    logged = {name: sorted(os.listdir(os.path.join(log_dir, name))) for name in os.listdir(log_dir)}
    assert sorted(logged) == ["learning_rate=0.01,num_members=16", "learning_rate=0.05,num_members=16"] or \
        sorted(logged) == ["num_members=16,learning_rate=0.01", "num_members=16,learning_rate=0.05"]

    batches = _counting_batches(monkeypatch)
    with warnings.catch_warnings():  # no "log_dir already holds TensorBoard event files" for the groups kept
        warnings.simplefilter("error")
        resumed = jes_sweep.sweep(POLICY, "CartPole-v1", "adam", resume=True, **kwargs)
    assert len(batches) == 1 and all("num_members=24" in label for label in batches[0])
    assert _table_without_times(out_dir) == _table_without_times(root / "out")
    assert [r["num_members"] for r in resumed.rows] == [16, 16, 24, 24]
    assert {r.config_index for r in resumed.runs} == {2, 3}  # the runs this call ran
    # The kept groups' logs are left as they were; the rerun ones are written
    assert all(sorted(os.listdir(os.path.join(log_dir, name))) == files for name, files in logged.items())
    assert len(os.listdir(log_dir)) == 4


def test_a_sweep_resumed_from_another_directory_logs_in_the_folder_its_first_call_picked(tmp_path, monkeypatch,
                                                                                        capsys):
    """Review of the resume work: the default log folder (runs/sweep-...) was recorded relative to the first call's
    working directory, so a resume started elsewhere logged its rerun groups in a new folder there."""
    grid = {"num_members": [16, 24]}
    out_dir = str(tmp_path / "out")
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()

    def interrupt(record):
        if record["point"]["num_members"] == 24:
            raise KeyboardInterrupt

    monkeypatch.chdir(first)
    with pytest.raises(KeyboardInterrupt):
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE, seeds=[0], grid=grid, out_dir=out_dir,
                        callbacks=[interrupt])
    [picked] = os.listdir(first / "runs")
    monkeypatch.chdir(second)
    jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE, seeds=[0], grid=grid, out_dir=out_dir, resume=True)
    assert not (second / "runs").exists()
    assert len(os.listdir(first / "runs" / picked)) == 2, os.listdir(first / "runs" / picked)


def test_resuming_a_finished_sweep_runs_nothing_and_rewrites_its_table_byte_for_byte(grid_result, tmp_path,
                                                                                      monkeypatch):
    import shutil

    result, root = grid_result
    out_dir = str(tmp_path / "out")
    shutil.copytree(root / "out", out_dir)
    tables = ("sweep.csv", "sweep.json")
    before = {name: open(os.path.join(out_dir, name), "rb").read() for name in tables}
    trained = _no_training(monkeypatch)
    again = jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE, seeds=[0, 1], log_dir=None, resume=True,
                            grid={"num_members": [16, 24], "learning_rate": [0.01, 0.05]}, out_dir=out_dir)
    assert not trained and again.runs == [] and len(again.rows) == 4
    with pytest.raises(KeyError, match=r"its row was kept from the table of the sweep this result resumed"):
        again.run(0, 0)
    # Its seeds and failures are its rows' (it said "x 0 seed(s)"), and a seed the sweep never ran is not "kept"
    assert repr(again).startswith("SweepResult(4 configuration(s) x 2 seed(s): 0 runs; best: configuration ")
    with pytest.raises(KeyError, match=r"^'no run for configuration 0 and seed 7'$"):
        again.run(0, 7)
    assert {name: open(os.path.join(out_dir, name), "rb").read() for name in tables} == before


@pytest.mark.parametrize("change, differs", [
    (dict(seeds=[0]), r"its seeds differ \(\[0, 1\] there, \[0\] here\)"),
    (dict(config=BASE.replace(num_generations=4)), r"its config differs \(num_generations: 3 there, 4 here\)"),
    (dict(grid={"num_members": [16, 32], "learning_rate": [0.01, 0.05]}), r"its grid points differ"),
    (dict(optimizer="sgd"), r"its optimizer differs \('adam' there, 'sgd' here\)"),
    (dict(vmap=True), r"its vmap differs \(False there, True here\)"),
])
def test_resuming_another_sweeps_table_is_refused_naming_what_differs(grid_result, monkeypatch, change, differs):
    result, root = grid_result
    trained = _no_training(monkeypatch)
    table = open(result.json_path, "rb").read()
    kwargs = dict(dict(optimizer="adam", config=BASE, seeds=[0, 1], log_dir=None, out_dir=str(root / "out"),
                       grid={"num_members": [16, 24], "learning_rate": [0.01, 0.05]}), **change)
    with pytest.raises(ValueError, match=rf"cannot resume the sweep in out_dir '{root / 'out'}': its table is of "
                                         rf"another sweep: {differs}.*pass another out_dir"):
        jes_sweep.sweep(POLICY, "CartPole-v1", resume=True, **kwargs)
    assert not trained and open(result.json_path, "rb").read() == table


def test_resume_needs_an_out_dir_and_a_table_it_can_check(tmp_path, monkeypatch):
    trained = _no_training(monkeypatch)
    with pytest.raises(ValueError, match=r"resume=True needs the out_dir of the sweep to resume"):
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE, grid={}, log_dir=None, resume=True)
    (tmp_path / "sweep.json").write_text("[]")
    with pytest.raises(ValueError, match=r"holds a sweep table but no sweep.resume.json"):
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE, grid={}, log_dir=None, resume=True,
                        out_dir=str(tmp_path))
    assert not trained


def test_without_resume_a_table_in_out_dir_is_still_refused_and_the_message_names_resume(grid_result, monkeypatch):
    result, root = grid_result
    _no_training(monkeypatch)
    with pytest.raises(FileExistsError, match=r"which this sweep would overwrite: pass another out_dir.*resume=True "
                                              r"\(jes sweep --resume\)"):
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE, seeds=[0, 1], log_dir=None,
                        grid={"num_members": [16, 24], "learning_rate": [0.01, 0.05]}, out_dir=str(root / "out"))


def test_jes_sweep_resume_passes_resume_and_is_in_its_help(tmp_path, monkeypatch, capsys):
    from jes import cli

    calls = []
    monkeypatch.setattr(jes_sweep, "sweep", lambda **kwargs: calls.append(kwargs) or jes_sweep.SweepResult([], []))
    path = tmp_path / "sweep.toml"
    path.write_text('env = "CartPole-v1"\n[config]\nlearning_rate = [0.05, 0.1]\n')
    cli.main(["sweep", str(path), "--out-dir", str(tmp_path / "out"), "--resume"])
    assert calls[-1]["resume"] is True
    cli.main(["sweep", str(path), "--out-dir", str(tmp_path / "out")])
    assert calls[-1]["resume"] is False
    with pytest.raises(SystemExit):
        cli.main(["sweep", "--help"])
    assert "--resume" in capsys.readouterr().out


KILLED_SWEEP = r"""
import sys, time
import jes
from jes import sweep

out_dir, ready = sys.argv[1], sys.argv[2]


def wait_for_the_signal(record):
    if record["point"]["num_members"] == 24:  # the second group runs: the first one's rows are written
        open(ready, "w").close()
        while True:
            time.sleep(0.05)


sweep.sweep(jes.MLPPolicy((4,)), "CartPole-v1", "adam", seeds=[0], grid={"num_members": [16, 24]},
            config=jes.ESConfig(num_members=16, num_generations=1, eval_episodes=2), log_dir=None, out_dir=out_dir,
            callbacks=[wait_for_the_signal])
print("returned")
"""


@pytest.mark.hard_timeout(400)
@pytest.mark.parametrize("signum", ["SIGTERM", "SIGKILL"])
def test_a_sweep_killed_in_its_second_group_keeps_the_first_groups_rows(tmp_path, signum):
    """A script's sweep killed by a scheduler (SIGTERM), the OOM killer or a lost session (SIGKILL) lost every
    finished run. SIGTERM ends it as Ctrl-C does (rows written, said on stderr), then as SIGTERM (status -15)."""
    import signal
    import subprocess
    import sys

    from subprocess_for_tests import checkout_env, wait_for_file

    out_dir, ready, script = tmp_path / "out", tmp_path / "ready", tmp_path / "script.py"
    script.write_text(KILLED_SWEEP)
    child = subprocess.Popen([sys.executable, str(script), str(out_dir), str(ready)], env=checkout_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for_file(ready, child), f"the second group never ran (status {child.poll()}): {child.stderr.read()[-3000:]}"
        child.send_signal(getattr(signal, signum))
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == -getattr(signal, signum), err[-3000:]
    assert "returned" not in out and "Traceback" not in err, err[-3000:]
    if signum == "SIGTERM":
        assert "sweep interrupted after 1 of 2 configurations finished" in err, err[-3000:]
        assert "jes.sweep: terminated by SIGTERM" in err, err[-3000:]
    with open(out_dir / "sweep.json") as f:
        assert [(r["num_members"], r["sweep_complete"]) for r in json.load(f)] == [(16, False)]
    # (SIGKILL leaves the lock's file, not its lock: the next sweep takes the file over)
    assert sorted(os.listdir(out_dir)) == ["sweep.csv"] + ["sweep.jes-lock"] * (signum == "SIGKILL") + [
        "sweep.json", "sweep.resume.json"]


def _rows_without_training(monkeypatch, interrupt_after: bool = False) -> list:
    """Replace each compile group's runs by a row naming its grid point (``interrupt_after``: then Ctrl-C, as if it
    came after the group's rows, before the table was written); returns the groups' indices, one list a group."""
    groups = []

    def fake(trainer, indices, points, seeds, batched, shown, named, vmap, callbacks, base, swept, grid, optimizer,
             run_names, log_dir, rows, runs):
        groups.append(list(indices))
        for i in indices:
            rows[i] = dict(shown[i], status="completed")
        if interrupt_after:
            raise KeyboardInterrupt

    monkeypatch.setattr(jes_sweep, "_run_group", fake)
    return groups


def _cartpole_params(**fields):
    import gymnax

    return gymnax.make("CartPole-v1")[1].replace(**fields)


@pytest.mark.parametrize("first, then, differs", [
    (dict(env_params=_cartpole_params()), dict(env_params=_cartpole_params(max_steps_in_episode=100)),
     "its env_params differ"),
    (dict(strategy=jes.strategies.SNES(sigma_init=0.3)), dict(strategy=jes.strategies.SNES(sigma_init=0.5)),
     "its strategy differs"),
    (dict(grid={"strategy": [jes.strategies.SNES(sigma_init=0.3), jes.strategies.SNES(sigma_init=0.4)]}),
     dict(grid={"strategy": [jes.strategies.SNES(sigma_init=0.3), jes.strategies.SNES(sigma_init=0.5)]}),
     "its grid points differ"),
    (dict(policy=jes.MLPPolicy((4,))), dict(policy=jes.MLPPolicy((8,))), "its policy differs"),
])
def test_resuming_with_other_env_params_or_objects_with_other_fields_is_refused(tmp_path, monkeypatch, first, then,
                                                                                differs):
    """Finding: env_params, a strategy object and grid objects were known by value_name (EnvParams_0, SNES_1): a
    resume with other field values was taken as the same sweep, and its table mixed two sweeps' rows."""
    groups = _rows_without_training(monkeypatch)
    kwargs = dict(policy=jes.MLPPolicy((4,)), env="CartPole-v1", optimizer=None, config=BASE, seeds=[0],
                  log_dir=None, out_dir=str(tmp_path / "out"), grid={"num_members": [16]})
    jes_sweep.sweep(**dict(kwargs, **first))
    jes_sweep.sweep(**dict(kwargs, **first), resume=True)  # the same objects: the same sweep, nothing runs again
    assert len(groups) == len(dict(kwargs, **first)["grid"].get("strategy", [0]))
    with pytest.raises(ValueError, match=rf"its table is of another sweep: {differs}"):
        jes_sweep.sweep(**dict(kwargs, **then), resume=True)


def test_a_sweep_interrupted_between_its_rows_and_its_table_writes_a_resume_file_too(tmp_path, monkeypatch, capsys):
    """Finding: an interrupted sweep wrote its table but not sweep.resume.json: interrupted after its first group's
    rows (before the table's write), it left a table that a resume refused ("no sweep.resume.json")."""
    out_dir = str(tmp_path / "out")
    kwargs = dict(config=BASE, seeds=[0], log_dir=None, out_dir=out_dir, grid={"num_members": [16, 24]})
    _rows_without_training(monkeypatch, interrupt_after=True)
    with pytest.raises(KeyboardInterrupt):
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", **kwargs)
    assert "after 1 of 2 configurations finished" in capsys.readouterr().err
    groups = _rows_without_training(monkeypatch)
    resumed = jes_sweep.sweep(POLICY, "CartPole-v1", "adam", resume=True, **kwargs)
    assert [[r["num_members"] for r in resumed.rows]] == [[16, 24]] and len(groups) == 1  # the second group only


@pytest.mark.hard_timeout(600)
def test_a_group_interrupted_while_logging_keeps_no_rows_and_a_resume_reruns_it(tmp_path, monkeypatch, capsys):
    """Finding: Ctrl-C while a group wrote its configurations' TensorBoard runs left the rows of those logged so far
    in a table without sweep.resume.json, which a resume refused. A group's rows now count once its logs are
    written; a resume reruns it whole."""
    out_dir, log_dir = str(tmp_path / "out"), str(tmp_path / "tb")
    kwargs = dict(config=BASE.replace(num_generations=1), seeds=[0], log_dir=log_dir, out_dir=out_dir,
                  grid={"learning_rate": [0.01, 0.05]})  # one group: learning_rate is batched
    real, logged = jes_sweep._log_configuration, []

    def interrupted(*args, **kwargs):
        if logged:
            raise KeyboardInterrupt
        logged.append(real(*args, **kwargs))

    monkeypatch.setattr(jes_sweep, "_log_configuration", interrupted)
    with pytest.raises(KeyboardInterrupt):
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", **kwargs)
    assert "before any of its 2 configurations finished" in capsys.readouterr().err
    # (and the event files the group had written went with it: its rerun logged beside them, each configuration's
    # curve twice in TensorBoard, and the warning advised another log_dir, a review)
    assert len(logged) == 1 and not any(jes_logging.has_event_files(os.path.join(log_dir, name))
                                        for name in os.listdir(log_dir))
    monkeypatch.setattr(jes_sweep, "_log_configuration", real)
    batches = _counting_batches(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "already holds TensorBoard event files"
        resumed = jes_sweep.sweep(POLICY, "CartPole-v1", "adam", resume=True, **kwargs)
    assert len(batches) == 1 and [r["learning_rate"] for r in resumed.rows] == [0.01, 0.05]
    assert [len(jes_logging.event_files(os.path.join(log_dir, name))) for name in sorted(os.listdir(log_dir))] == [1, 1]


@pytest.mark.parametrize("field, value", [("rows", [[0, "a row"]]), ("log_dir", 5), ("identity", [])])
def test_a_resume_file_with_rows_or_a_log_dir_of_another_kind_is_refused_as_unreadable(tmp_path, monkeypatch,
                                                                                      field, value):
    _rows_without_training(monkeypatch)
    kwargs = dict(config=BASE, seeds=[0], log_dir=None, out_dir=str(tmp_path), grid={"num_members": [16]})
    jes_sweep.sweep(POLICY, "CartPole-v1", "adam", **kwargs)
    with open(tmp_path / "sweep.resume.json") as f:
        saved = json.load(f)
    with open(tmp_path / "sweep.resume.json", "w") as f:
        json.dump(dict(saved, **{field: value}), f)
    with pytest.raises(ValueError, match=r"its sweep.resume.json cannot be read \(TypeError"):
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", resume=True, **kwargs)


def test_jes_sweep_exits_1_for_a_failed_row_kept_from_the_table_it_resumed(tmp_path, monkeypatch, capsys):
    """A resumed sweep's result holds only the runs its call ran: the exit status reads the rows' failed counts."""
    from jes import cli

    row = dict(learning_rate=0.05, seeds="0 1", failed=1, error="non-finite update", final_centre_return_mean=9.0,
               final_centre_return_std=0.0)
    monkeypatch.setattr(jes_sweep, "sweep", lambda **kwargs: jes_sweep.SweepResult([row], []))
    path = tmp_path / "sweep.toml"
    path.write_text('env = "CartPole-v1"\n[config]\nlearning_rate = [0.05]\n')
    assert cli.main(["sweep", str(path), "--out-dir", str(tmp_path / "out"), "--resume"]) == 1
    assert "over 1 of 2 seeds (1 failed: non-finite update)" in capsys.readouterr().out


def test_a_second_sweep_on_the_same_out_dir_is_refused_while_the_first_runs(tmp_path, monkeypatch):
    """A review: two sweeps started on one out_dir both ran (the only guard was a table already there, checked at the
    start), and the last to write replaced the other's table: each reported a table of the other's rows. The sweep
    now holds out_dir/sweep.jes-lock while it runs (a second --resume of one sweep is refused alike)."""
    out_dir = tmp_path / "out"
    holder = jes.checkpoint.WriterLock(str(out_dir / "sweep")).acquire()  # another sweep, running
    _rows_without_training(monkeypatch)
    try:
        for resume in (False, True):
            with pytest.raises(jes.checkpoint.CheckpointInUseError,
                               match=rf"out_dir '{out_dir}' is in use: another sweep is running there \(pid "
                                     rf"{os.getpid()} on host .*give this sweep another out_dir"):
                jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE, seeds=[0], log_dir=None,
                                out_dir=str(out_dir), grid={"num_members": [16, 24]}, resume=resume)
    finally:
        holder.release()
    result = jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE, seeds=[0], log_dir=None,
                             out_dir=str(out_dir), grid={"num_members": [16, 24]})
    assert len(result.rows) == 2 and not (out_dir / "sweep.jes-lock").exists()  # released at its end
    assert jes.logging.claim_dir(str(tmp_path / "runs" / "s")) != jes.logging.claim_dir(str(tmp_path / "runs" / "s"))


def test_an_out_dir_or_log_dir_that_cannot_be_written_is_refused_before_anything_trains(tmp_path, monkeypatch):
    """A review: an out_dir under a file (or read-only, or on a full disk) was found after every group trained (the
    results lost, no note), and a log_dir so was reported as "stopped before any configuration finished"."""
    (tmp_path / "afile").write_text("")
    groups = _rows_without_training(monkeypatch)
    for where in ("out_dir", "log_dir"):
        kwargs = {"out_dir": str(tmp_path / "out"), "log_dir": None, where: str(tmp_path / "afile" / "x")}
        with pytest.raises(PermissionError, match=rf"{where} '.*afile/x' cannot be written: .* is a file, not a "
                                                  rf"folder; .*nothing has trained yet"):
            jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE, seeds=[0], grid={"num_members": [16, 24]},
                            **kwargs)
    assert groups == [] and not (tmp_path / "out").exists()


def test_a_table_that_cannot_be_written_at_the_end_keeps_the_runs_on_the_error(tmp_path, monkeypatch, capsys):
    """A review: the last table write (a full disk) was outside the handler that keeps what finished: the error
    carried no note and no result, and every run was lost to the caller."""
    _rows_without_training(monkeypatch)
    real = jes_sweep.write_table

    def full(rows, out_dir):
        if all(row.get("sweep_complete", True) for row in rows):  # the last, complete table
            raise OSError(28, "No space left on device")
        return real(rows, out_dir)

    monkeypatch.setattr(jes_sweep, "write_table", full)
    with pytest.raises(OSError, match="No space left") as raised:
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE, seeds=[0], log_dir=None,
                        out_dir=str(tmp_path / "out"), grid={"num_members": [16, 24]})
    assert [row["num_members"] for row in raised.value.sweep_result.rows] == [16, 24]
    assert "after 2 of 2 configurations finished: their rows are in" in raised.value.sweep_note
    assert "after 2 of 2 configurations finished" in capsys.readouterr().err


def test_a_sweep_killed_between_its_resume_file_and_its_table_can_be_resumed(tmp_path, monkeypatch):
    """A review: the table was written before sweep.resume.json, so a kill between the two left a table that a
    resume refused ("no sweep.resume.json") and a new sweep refused too ("already holds a table"). The resume file
    goes first now; a resume file alone is refused by a sweep that does not resume."""
    out_dir = str(tmp_path / "out")
    kwargs = dict(config=BASE, seeds=[0], log_dir=None, out_dir=out_dir, grid={"num_members": [16, 24]})
    _rows_without_training(monkeypatch)

    def killed(rows, out_dir):
        raise SystemExit("killed")  # as the process would be, after the resume file

    monkeypatch.setattr(jes_sweep, "write_table", killed)
    with pytest.raises(SystemExit):
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", **kwargs)
    assert os.listdir(out_dir) == [jes_sweep.RESUME_FILE]
    monkeypatch.undo()
    with pytest.raises(FileExistsError, match=r"already holds an earlier sweep's table \(sweep.resume.json\)"):
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", **kwargs)
    groups = _rows_without_training(monkeypatch)
    resumed = jes_sweep.sweep(POLICY, "CartPole-v1", "adam", resume=True, **kwargs)
    assert groups == [[1]] and [r["num_members"] for r in resumed.rows] == [16, 24]  # the first group kept


def test_a_resume_with_objects_known_by_name_or_other_versions_is_warned(tmp_path, monkeypatch):
    """A review: a sweep resumed with an edited lambda schedule (or another optax.adam rate) kept the rows of the
    first beside rows of the second with no word (they read the same once memory addresses are left out), and one
    resumed after a jes or jax upgrade was not told that its rerun groups may differ."""
    out_dir = str(tmp_path / "out")
    kwargs = dict(seeds=[0], log_dir=None, out_dir=out_dir, grid={"num_members": [16, 24]})
    _rows_without_training(monkeypatch, interrupt_after=True)
    with pytest.raises(KeyboardInterrupt):
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE.replace(learning_rate=lambda step: 0.01), **kwargs)
    _rows_without_training(monkeypatch)
    with pytest.warns(UserWarning, match=r"resuming the sweep in .* with learning_rate given as an optax object or a "
                                         r"function: jes knows it by name only"):
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE.replace(learning_rate=lambda step: 0.5),
                        resume=True, **kwargs)
    state = json.load(open(os.path.join(out_dir, jes_sweep.RESUME_FILE)))
    state["versions"]["jax"] = "0.0.1"
    with open(os.path.join(out_dir, jes_sweep.RESUME_FILE), "w") as f:
        json.dump(state, f)
    with pytest.warns(UserWarning, match=r"other versions than its kept rows ran with \(jax 0.0.1 there, "):
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE.replace(learning_rate=lambda step: 0.5),
                        resume=True, **kwargs)


def test_a_sweep_takes_config_fields_as_keywords_as_train_does(monkeypatch):
    """A trial: jes.train(..., perturbation=jes.LowRank(2)) works, jes.sweep(..., perturbation=...) was a TypeError
    ("unexpected keyword argument 'perturbation'"); config fields as keywords now replace config's, as train's do."""
    bases = []

    def fake(trainer, indices, points, seeds, batched, shown, named, vmap, callbacks, base, *rest):
        bases.append((base, trainer.config))
        for i in indices:
            rest[-2][i] = dict(shown[i], status="completed")

    monkeypatch.setattr(jes_sweep, "_run_group", fake)
    result = jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE, seeds=[0], log_dir=None,
                             grid={"num_members": [16, 24]}, perturbation=jes.LowRank(2), num_generations=2)
    assert [row["num_members"] for row in result.rows] == [16, 24] and len(bases) == 2
    for base, config in bases:
        assert (base.perturbation_rank, base.num_generations, config.perturbation_rank) == (2, 2, 2), (base, config)
    with pytest.raises(TypeError, match=r"jes.sweep\(\) got unknown keyword argument\(s\) 'num_member' \(did you mean "
                                        r"'num_members'\?\)"):
        jes_sweep.sweep(POLICY, "CartPole-v1", "adam", config=BASE, seeds=[0], log_dir=None,
                        grid={"num_members": [16]}, num_member=8)


@pytest.mark.parametrize("there", [{"config": "not a map"}, {"config": {"num_members": 8}, "grid points": 5}])
def test_a_resume_file_whose_parts_are_not_a_sweeps_is_said_to_be_unreadable(tmp_path, there):
    """A config that is not a map, or grid points that are not a list (an edited file, another tool's): a bare
    AttributeError or TypeError came while the message naming what differs was made."""
    (tmp_path / jes_sweep.RESUME_FILE).write_text(json.dumps({"rows": [], "identity": there, "log_dir": None}))
    identity = {"config": {"num_members": 8}, "grid points": [{"learning_rate": 0.1}]}
    with pytest.raises(ValueError, match=r"its sweep.resume.json cannot be read \(TypeError: its identity, rows or "
                                         r"log_dir are not what a sweep writes\)"):
        jes_sweep._resumed(str(tmp_path), identity)


def test_a_resume_file_without_a_config_names_what_differs(tmp_path):
    (tmp_path / jes_sweep.RESUME_FILE).write_text(json.dumps({"rows": [], "identity": {}, "log_dir": None}))
    with pytest.raises(ValueError, match=r"its table is of another sweep: its config differs \(num_members: None there, "
                                         r"8 here\)"):
        jes_sweep._resumed(str(tmp_path), {"config": {"num_members": 8}})
