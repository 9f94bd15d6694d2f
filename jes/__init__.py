"""jes: JAX-accelerated, vectorized Evolution Strategies (OpenAI-ES, PGPE, SNES, sep-CMA-ES, ARS)."""
from jes import compilation_cache, cpu, strategies
from jes.blackbox import AskTell, OptimizeResult, optimize
from jes.compilation_cache import enable_compilation_cache
from jes.config import ESConfig
from jes.cpu import use_cpu_cores
from jes.envs import EnvSpec, make_env, registered_env_names
from jes.generation import ChunkResults, Trainer, TrainState
from jes.loop import NonFiniteFitnessError, NonFiniteUpdateError, TrainResult, run, train
from jes.optimizers import make_optimizer, optimizer_names
from jes.policies import GRUPolicy, MLPPolicy, TorchGRUCell

__version__ = "0.2.0"

__all__ = [
    "AskTell", "ChunkResults", "ESConfig", "EnvSpec", "GRUPolicy", "MLPPolicy", "NonFiniteFitnessError",
    "NonFiniteUpdateError", "OptimizeResult", "TorchGRUCell", "TrainResult", "TrainState", "Trainer", "compilation_cache",
    "cpu", "enable_compilation_cache", "make_env", "make_optimizer", "optimize", "optimizer_names",
    "registered_env_names", "run", "strategies", "train", "use_cpu_cores",
]
