import os
import sys

sys.path.insert(0, os.path.dirname(__file__))


import pytest


@pytest.fixture(autouse=True)
def _work_in_tmp_dir(tmp_path, monkeypatch):
    """jes.train logs to ./runs by default: keep tests from writing into the repository."""
    monkeypatch.chdir(tmp_path)
