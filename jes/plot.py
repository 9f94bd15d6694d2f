"""Learning curves of one or several runs from their TensorBoard logs, drawn into one PNG.

``jes plot RUN_DIR... -o curves.png``: two panels, the centre return and the population mean
+- std against generations and against env steps, one colour per run.
"""
from __future__ import annotations

import os
import warnings
from typing import Sequence

import numpy as np

from jes.atomic import check_writable, write_atomically
from jes.logging import LIVE_FLUSH_SECONDS, SCALAR_TAGS, read_runs

VIZ_HINT = "pip install 'jax-jes[viz]'"


def _series(scalars: dict, key: str) -> dict[int, float]:
    return {step: value for step, value in scalars.get(SCALAR_TAGS[key], [])}


def load_runs(run_dir: str) -> list[dict[str, np.ndarray]]:
    """The curves of each run in ``run_dir`` (:func:`jes.logging.read_runs`), oldest first, as :func:`load_curves`
    gives one: a resumed run is one run; a fresh run logged into a folder that held another is a run of its own.

    Raises:
        FileNotFoundError: ``run_dir`` does not exist or holds no event files.
        ValueError: its event files hold no generation yet (a run in its first seconds), or no jes scalars.
    """
    runs = read_runs(run_dir)
    if not runs:
        raise ValueError(f"{run_dir!r} has logged no generation yet: its TensorBoard event files hold none (a run "
                         f"writes its first generations to them within about {LIVE_FLUSH_SECONDS:.0f} s of "
                         f"training, and always before its first checkpoint; a run stopped before that leaves none)")
    curves = []
    for scalars in runs:
        pop_mean = _series(scalars, "pop_mean")
        if not pop_mean:
            raise ValueError(f"{run_dir!r} has TensorBoard events but no {SCALAR_TAGS['pop_mean']!r} scalars; "
                             f"is it a jes run directory?")
        generations = sorted(pop_mean)
        columns = {key: _series(scalars, key) for key in ("pop_std", "centre_return", "env_steps")}
        run = {"generation": np.array(generations, float), "pop_mean": np.array([pop_mean[g] for g in generations])}
        for key, series in columns.items():
            run[key] = np.array([series.get(g, np.nan) for g in generations])
        curves.append(run)
    return curves


def load_curves(run_dir: str) -> dict[str, np.ndarray]:
    """``{generation, env_steps, pop_mean, pop_std, centre_return}`` arrays (NaN where a generation lacks one) of
    the run in ``run_dir`` (a resumed run's sessions joined).

    Raises:
        ValueError: ``run_dir`` holds separate runs (:func:`load_runs` gives each), or no generation yet.
        FileNotFoundError: as :func:`load_runs`.
    """
    runs = load_runs(run_dir)
    if len(runs) > 1:
        raise ValueError(f"{run_dir!r} holds {len(runs)} separate runs (a fresh run logged into a folder that held "
                         f"another): jes.plot.load_runs gives the curves of each")
    return runs[0]


def default_labels(run_dirs: Sequence[str]) -> list[str]:
    """Each run directory's legend label: its folder's name, with as many folders above it as tell it apart from the
    others' (two sweeps' ``learning_rate=0.01`` are ``sweep-a/learning_rate=0.01`` and ``sweep-b/learning_rate=0.01``,
    not two curves of one name)."""
    parts = [os.path.normpath(os.path.abspath(d)).split(os.sep) for d in run_dirs]
    depth = [1] * len(parts)
    while True:
        labels = ["/".join(p[-n:]) for p, n in zip(parts, depth)]
        # (the same folder given twice keeps its name: nothing tells it apart)
        clashing = [i for i, label in enumerate(labels)
                    if any(other == label and parts[j] != parts[i] for j, other in enumerate(labels))]
        if not clashing:
            return labels
        for i in clashing:
            depth[i] += 1


def plot_runs(run_dirs: Sequence[str] | str, path: str, labels: Sequence[str] | None = None,
              size: tuple[float, float] = (10, 4), dpi: int = 100) -> str:
    """Draw the learning curves of ``run_dirs`` (a list of run directories, or one) into the PNG ``path``; the image
    is ``size * dpi`` pixels.

    Without ``labels``, each run is labelled by its directory's name, with the folders above it where two runs'
    names are the same (:func:`default_labels`). A resumed run's sessions are one curve. A directory that holds separate runs (a fresh run logged into a folder
    that held another, which TensorBoard would draw as one line) gets a curve per run, labelled ``name (run 1)``,
    ``name (run 2)``... oldest first, with a warning.

    Raises:
        ValueError: ``path`` does not end in ``.png``, ``labels`` is not one name per run directory, or a directory
            holds no generation yet.
        FileNotFoundError: a directory that does not exist or holds no TensorBoard event files.
        OSError: ``path`` cannot be written (found before anything is read).
        ImportError: matplotlib missing (the message names the extra to install).
    """
    # One path: not its characters, one run directory each ("no TensorBoard event files in 'r'")
    run_dirs = [run_dirs] if isinstance(run_dirs, (str, os.PathLike)) else list(run_dirs)  # a generator too
    if not run_dirs:
        raise ValueError("give at least one run directory (e.g. runs/CartPole-v1-GRUPolicy-adam-...)")
    if os.path.splitext(path)[1].lower() != ".png":  # PNG bytes under another name would not open as that format
        raise ValueError(f"learning curves are written as a PNG image: give a path ending in .png, not {path!r}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError as err:
        raise ImportError(f"jes plot needs matplotlib: {VIZ_HINT}") from err
    if isinstance(labels, str):
        raise ValueError(f"labels must be a list of names, one per run, not the string {labels!r}")
    labels = None if labels is None else list(labels)  # a generator too
    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"labels: {len(labels)} for {len(run_dirs)} run directories; give one label per run "
                         f"(or none: each run is labelled by its directory's name)")
    labels = labels if labels else default_labels(run_dirs)
    check_writable(path)
    curves, curve_labels = [], []
    for run_dir, label in zip(run_dirs, labels):
        runs = load_runs(run_dir)
        if len(runs) > 1:
            names = [f"{label} (run {number})" for number in range(1, len(runs) + 1)]
            warnings.warn(f"{run_dir!r} holds {len(runs)} separate runs (a fresh run logged into a folder that held "
                          f"another; TensorBoard draws them as one line): drawn as {', '.join(map(repr, names))}, "
                          f"oldest first", stacklevel=2)
        else:
            names = [label]
        curves += runs
        curve_labels += names
    labels = curve_labels
    fig, axes = plt.subplots(1, 2, figsize=size, dpi=dpi)
    for (ax, x_key, x_label) in zip(axes, ("generation", "env_steps"), ("generation", "env steps")):
        for index, (label, c) in enumerate(zip(labels, curves)):
            colour = f"C{index % 10}"
            x = c[x_key]
            std = np.nan_to_num(c["pop_std"])
            ax.plot(x, c["pop_mean"], color=colour, alpha=0.6, linestyle="--", label=f"{label}: population mean ± std",
                    marker="o" if len(x) == 1 else None)  # one generation: a dashed line of one point draws nothing
            ax.fill_between(x, c["pop_mean"] - std, c["pop_mean"] + std, color=colour, alpha=0.15, linewidth=0)
            centre = np.isfinite(c["centre_return"])
            if centre.any():
                ax.plot(x[centre], c["centre_return"][centre], color=colour, marker=".", label=f"{label}: centre")
        ax.set_xlabel(x_label)
        ax.set_ylabel("return")
        ax.set_title(f"return vs {x_label}")
        if x_key == "generation":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    fig.tight_layout()
    try:  # written whole or not at all: an interrupt keeps the picture that was there
        write_atomically(path, lambda f: fig.savefig(f, format="png", dpi=dpi))
    finally:
        plt.close(fig)
    return path
