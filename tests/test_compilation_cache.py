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


def test_a_cache_folder_others_can_write_is_left_off_with_a_warning(tmp_path, monkeypatch, restore_cache_config):
    """A security review: JAX runs the compiled native code it finds in its cache, whoever wrote it; a folder every
    user can write (or another user's) let them plant a program under the key of a run of yours."""
    import os

    from jes import compilation_cache

    before = jax.config.jax_compilation_cache_dir
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.warns(UserWarning, match=r"is writable by every user: its entries are compiled native code"):
        assert enable_compilation_cache(str(shared)) is None
    os.chmod(shared, 0o775)  # a group-writable folder of one's own: one's to share
    mine = os.geteuid()
    monkeypatch.setattr(compilation_cache.os, "geteuid", lambda: mine + 1)  # the same folder, as another user sees it
    with pytest.warns(UserWarning, match=r"is owned by another user"):
        assert enable_compilation_cache(str(shared)) is None
    assert jax.config.jax_compilation_cache_dir == before
    monkeypatch.setattr(compilation_cache.os, "geteuid", lambda: mine)
    assert enable_compilation_cache(str(shared)) == str(shared)
