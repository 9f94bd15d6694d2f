import faulthandler
import os
import shutil
import signal
import sys
import tempfile
import threading

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from jes.compilation_cache import ENV_DIR, enable_compilation_cache  # noqa: E402

# One persistent XLA compilation cache for the session, shared by this process and by every process the
# tests start (`jes` CLI calls enable it themselves; worker processes and device scripts are started with
# `enable_compilation_cache()` first): the suite builds the same small programs many times over (a master
# and each of its workers compile one chunk program; several tests train the same small configuration),
# and on a 2-core machine compiling is most of the suite's time. A fresh directory per session (unless
# JES_COMPILATION_CACHE names one), so every run compiles everything at least once; out of the user's home.
_OWN_CACHE_DIR = None if os.environ.get(ENV_DIR) else tempfile.mkdtemp(prefix="jes-xla-")
if _OWN_CACHE_DIR:
    os.environ[ENV_DIR] = _OWN_CACHE_DIR
enable_compilation_cache()

# Hard timeouts for end-to-end tests, without a plugin: SIGALRM raises HardTimeout in the test's
# thread at the deadline (pyzmq polls and time.sleep are interrupted by it); if the test is stuck
# where Python cannot run the handler (inside one long native call), faulthandler dumps every
# thread's traceback and exits the session a while later. Either way: a message, never a hang.
HARD_TIMEOUT_GRACE = 120.0


class HardTimeout(BaseException):
    """A test ran past its ``hard_timeout``. A BaseException, so that no ``except Exception`` swallows it."""


def pytest_unconfigure(config):
    if _OWN_CACHE_DIR:
        shutil.rmtree(_OWN_CACHE_DIR, ignore_errors=True)


def pytest_configure(config):
    config.addinivalue_line("markers", "hard_timeout(seconds): fail the test with HardTimeout after this many "
                                       "seconds (end-to-end tests must never hang)")


@pytest.fixture(autouse=True)
def _hard_timeout(request):
    marker = request.node.get_closest_marker("hard_timeout")
    if marker is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    seconds = float(marker.args[0])

    def expire(signum, frame):
        raise HardTimeout(f"{request.node.nodeid} ran past its hard timeout of {seconds:.0f}s: failing it "
                          f"instead of hanging (see the log above for what it waited on)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(seconds + HARD_TIMEOUT_GRACE, exit=True)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture(autouse=True)
def _work_in_tmp_dir(tmp_path, monkeypatch):
    """jes.train logs to ./runs by default: keep tests from writing into the repository."""
    monkeypatch.chdir(tmp_path)
