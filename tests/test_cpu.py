import subprocess
import sys
import textwrap

import pytest


def devices_in_fresh_process(code: str, **env) -> str:
    import os

    full_env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JES_CPU_DEVICES")}
    full_env.update(env, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1]


def test_use_cpu_cores_splits_the_cpu_before_jax_starts():
    out = devices_in_fresh_process("""
        import jax, jes
        from jes.cpu import use_cpu_cores
        asked = use_cpu_cores(3)
        print(asked, len(jax.devices()))
    """)
    assert out == "3 3"


def test_respects_user_settings_and_a_running_backend():
    out = devices_in_fresh_process("""
        import jax
        from jes.cpu import use_cpu_cores
        print(use_cpu_cores(), len(jax.devices()))
    """, JES_CPU_DEVICES="1")
    assert out == "None 1"
    out = devices_in_fresh_process("""
        import jax
        from jes.cpu import use_cpu_cores
        print(use_cpu_cores(4), len(jax.devices()))
    """, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    assert out == "None 2"
    out = devices_in_fresh_process("""
        import jax, jax.numpy as jnp
        jnp.zeros(1).block_until_ready()          # backend already running
        from jes.cpu import use_cpu_cores
        print(use_cpu_cores(4), len(jax.devices()))
    """)
    assert out == "None 1"


def test_bad_env_value_is_explained(monkeypatch):
    from jes.cpu import use_cpu_cores

    monkeypatch.setenv("JES_CPU_DEVICES", "two")
    with pytest.raises(ValueError, match="JES_CPU_DEVICES must be an integer"):
        use_cpu_cores()
