import os
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(__file__))

# `jes` CLI subprocesses use a persistent compilation cache; keep it out of the user's home.
os.environ.setdefault("JES_COMPILATION_CACHE", tempfile.mkdtemp(prefix="jes-xla-"))


@pytest.fixture(autouse=True)
def _work_in_tmp_dir(tmp_path, monkeypatch):
    """jes.train logs to ./runs by default: keep tests from writing into the repository."""
    monkeypatch.chdir(tmp_path)
