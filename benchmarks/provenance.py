"""What a benchmark prints beside its table: the command that reproduces it, the seeds, when and under what load.

Every published figure names its seeds and command (benchmarks/README.md); timings also need the date and
the machine's load, since these VMs are shared. ``print_provenance(seeds)`` at the start of a script and
``print_load()`` at its end give both.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import sys


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository: benchmarks/ is in it


def command_line() -> str:
    """The command as a reader would retype it from the repository root (wherever it was run from)."""
    script = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)
    return " ".join(["python", script, *sys.argv[1:]])


def seeds_text(seeds) -> str:
    """"0-9" for a contiguous run of seeds, else the comma list."""
    seeds = [int(s) for s in seeds]
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(str(s) for s in seeds)


def median_text(values) -> str:
    """A median as a table prints it: 6.5 stays 6.5 (``:.0f`` printed it as 6, rounding half to even), 50 prints 50."""
    import numpy as np

    return f"{float(np.median(values)):.1f}".removesuffix(".0")


def seeds_or_count(text: str) -> list[int]:
    """``--seeds`` of the scripts whose ``--seeds`` was a count (memory, cartpole/acrobot, startup, sweep), as an
    argparse ``type``: a comma list of seeds as the other scripts take (``0,1,2``; here ranges too: ``0-9``, ``5-5``
    for seed 5 alone), or a plain number N, the count it always was there: seeds 0..N-1 (``--seeds 10`` is 0-9, as
    the published commands mean it)."""
    text = text.strip()
    if re.fullmatch(r"\d+", text):
        seeds = list(range(int(text)))
    elif re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", text):
        seeds = []
        for part in text.split(","):
            low, _, high = part.partition("-")
            seeds.extend(range(int(low), int(high or low) + 1))
    else:
        raise argparse.ArgumentTypeError(f"{text!r}: give a comma list of seeds (0,1,2 or 0-9) or a count N "
                                         f"(seeds 0..N-1)")
    if not seeds:  # "0": a count of none here, where the comma-list scripts read seed 0
        why = "a plain number is a count, seeds 0..N-1: for seed N alone give N-N" if text.isdigit() else \
            "a range runs from low to high"
        raise argparse.ArgumentTypeError(f"{text!r} names no seed ({why})")
    return seeds


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} on {os.cpu_count()} CPUs"


def print_provenance(seeds=None) -> None:
    """Print the command, the seeds, the date, the load and the machine (one block of '# ' lines)."""
    print(f"# command: {command_line()}")
    if seeds is not None:
        print(f"# seeds: {seeds_text(seeds)} ({len(list(seeds))})")
    print(f"# started {now()}, {load()}; {platform.machine()}, Python {platform.python_version()}", flush=True)


def print_load() -> None:
    print(f"# finished {now()}, {load()}", flush=True)
