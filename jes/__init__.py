"""jes: JAX-accelerated, vectorized Evolution Strategies (OpenAI-ES, PGPE, SNES, sep-CMA-ES, ARS)."""
from jes import compilation_cache, cpu, strategies
from jes.blackbox import AskTell, OptimizeResult, optimize
from jes.compilation_cache import enable_compilation_cache
from jes.config import ESConfig
from jes.cpu import use_cpu_cores
from jes.envs import EnvSpec, make_env, registered_env_names
from jes.generation import ChunkResults, Trainer, TrainState
from jes.loop import BestMember, NonFiniteFitnessError, NonFiniteUpdateError, TrainResult, run, train
from jes.optimizers import make_optimizer, optimizer_names
from jes.policies import GRUPolicy, MLPPolicy, TorchGRUCell
from jes.trained import TrainedPolicy, load_policy, save_policy

__version__ = "0.2.0"

__all__ = [
    "AskTell", "BestMember", "TrainedPolicy", "load_policy", "save_policy", "sweep", "ChunkResults", "ESConfig", "EnvSpec", "GRUPolicy", "MLPPolicy", "NonFiniteFitnessError",
    "NonFiniteUpdateError", "OptimizeResult", "TorchGRUCell", "TrainResult", "TrainState", "Trainer", "compilation_cache",
    "cpu", "enable_compilation_cache", "make_env", "make_optimizer", "optimize", "optimizer_names",
    "registered_env_names", "run", "strategies", "train", "use_cpu_cores",
]


def __getattr__(name: str):
    # jes.sweep is imported on first use so that `import jes` does not pay for it.
    if name == "sweep":
        import importlib

        return importlib.import_module("jes.sweep")
    raise AttributeError(f"module 'jes' has no attribute {name!r}")
