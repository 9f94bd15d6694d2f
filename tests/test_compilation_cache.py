import jax
import pytest

from jes.compilation_cache import enable_compilation_cache


@pytest.fixture
def restore_cache_config():
    before = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs,
              jax.config.jax_persistent_cache_min_entry_size_bytes)
    yield
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", before[2])
    jax.config.update("jax_compilation_cache_dir", before[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])


def test_enable_sets_jax_cache_dir(tmp_path, restore_cache_config):
    path = str(tmp_path / "xla")
    assert enable_compilation_cache(path) == path
    assert jax.config.jax_compilation_cache_dir == path
    assert (tmp_path / "xla").is_dir()
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
    assert jax.config.jax_persistent_cache_min_entry_size_bytes == -1


def test_off_and_unwritable_leave_jax_alone(tmp_path, monkeypatch, restore_cache_config):
    before = jax.config.jax_compilation_cache_dir
    monkeypatch.setenv("JES_COMPILATION_CACHE", "off")
    assert enable_compilation_cache() is None
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert enable_compilation_cache(str(blocker / "sub")) is None
    assert jax.config.jax_compilation_cache_dir == before
