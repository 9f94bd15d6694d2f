"""What a benchmark prints beside its table: the command that reproduces it, the seeds, when and under what load.

Every published figure names its seeds and command (benchmarks/README.md); timings also need the date and
the machine's load, since these VMs are shared. ``print_provenance(seeds)`` at the start of a script and
``print_load()`` at its end give both.
"""
from __future__ import annotations

import datetime
import os
import platform
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
