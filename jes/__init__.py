"""jes: JAX-accelerated, vectorized OpenAI Evolution Strategies."""
from jes import compilation_cache, cpu
from jes.compilation_cache import enable_compilation_cache
from jes.config import ESConfig
from jes.cpu import use_cpu_cores
from jes.envs import EnvSpec, make_env, registered_env_names
from jes.optimizers import make_optimizer, optimizer_names
from jes.policies import GRUPolicy, MLPPolicy, TorchGRUCell
from jes.trainer import NonFiniteFitnessError, NonFiniteUpdateError, TrainResult, Trainer, TrainState, run, train

__version__ = "0.1.0"

__all__ = [
    "ESConfig", "EnvSpec", "GRUPolicy", "MLPPolicy", "NonFiniteFitnessError", "NonFiniteUpdateError", "TorchGRUCell",
    "TrainResult", "TrainState", "Trainer", "compilation_cache", "cpu", "enable_compilation_cache", "make_env", "make_optimizer",
    "optimizer_names", "registered_env_names", "run", "train", "use_cpu_cores",
]
