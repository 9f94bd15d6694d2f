"""A fresh Python for a test: this checkout's jes (and, when asked, the tests folder) importable from any folder."""
import os
import subprocess
import sys
import time

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)


def checkout_env(*, tests: bool = False, **overrides: str) -> dict:
    """``os.environ`` with this checkout (and the tests folder if ``tests``) first on PYTHONPATH, then ``overrides``."""
    paths = (ROOT, TESTS if tests else None, os.environ.get("PYTHONPATH"))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p), **overrides)


def run_script(script, *args: str, timeout: float = 600, tests: bool = False) -> subprocess.CompletedProcess:
    """``python SCRIPT ARGS`` with :func:`checkout_env`; past ``timeout`` seconds the test fails with its output."""
    try:
        return subprocess.run([sys.executable, str(script), *args], env=checkout_env(tests=tests),
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{os.path.basename(str(script))} ran past {timeout} s:\n{e.stdout}\n{e.stderr}")


def wait_for_file(path, child: subprocess.Popen, timeout: float = 300) -> bool:
    """Wait until ``path`` exists, ``child`` has ended or ``timeout`` seconds passed; whether ``path`` exists."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return os.path.exists(path)
