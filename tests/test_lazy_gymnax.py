"""jes imports gymnax without running its plotting imports, and gymnax's plotting still works afterwards."""
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import sys
    import jes
    spec = jes.make_env("CartPole-v1")
    assert spec.obs_shape == (4,), spec.obs_shape
    # gymnax's env modules imported matplotlib/seaborn, but none of their code ran (so no scipy, pandas).
    from jes.lazy_gymnax import _LazyModule
    for name in ("matplotlib.pyplot", "seaborn"):
        assert type(sys.modules[name]) is _LazyModule, (name, type(sys.modules[name]))
    for name in ("scipy.stats", "pandas"):
        assert name not in sys.modules, name
    import gymnax
    env, params = gymnax.make("CartPole-v1")
    import jax
    # A user's own plotting imports and gymnax's renderers and visualizer work as before.
    import matplotlib.pyplot as plt
    from matplotlib import colors
    fig, ax = plt.subplots()
    assert colors.ListedColormap is not None
    import seaborn as sns
    assert len(sns.color_palette("cubehelix", 3)) == 3
    assert type(sys.modules["matplotlib"]) is type(sys)
    from gymnax.visualize import Visualizer
    env, params = gymnax.make("Pong-misc")
    obs, state = env.reset(jax.random.key(0), params)
    env.render(state, params)
    print("OK")
""")


def test_gymnax_plotting_is_lazy_and_still_works():
    from subprocess_for_tests import checkout_env

    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300,
                          env=checkout_env())
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr
