"""jes: JAX-accelerated, vectorized OpenAI Evolution Strategies."""
from jes.config import ESConfig
from jes.envs import EnvSpec, make_env, registered_env_names
from jes.optimizers import make_optimizer, optimizer_names
from jes.policies import GRUPolicy, MLPPolicy, TorchGRUCell
from jes.trainer import NonFiniteFitnessError, TrainResult, Trainer, TrainState, train

__version__ = "0.1.0"

__all__ = [
    "ESConfig", "EnvSpec", "GRUPolicy", "MLPPolicy", "NonFiniteFitnessError", "TorchGRUCell", "TrainResult",
    "TrainState", "Trainer", "make_env", "make_optimizer", "optimizer_names", "registered_env_names", "train",
]
