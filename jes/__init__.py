"""jes: JAX-accelerated, vectorized OpenAI Evolution Strategies.

Public names are imported on first use (PEP 562), so ``import jes.distributed``,
``jes-worker --help`` and ``jes --help`` do not pay for importing JAX, and
``jes.use_cpu_cores()`` can still run before JAX initialises its backends.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> module that defines it
_EXPORTS = {
    "ESConfig": "jes.config",
    "EnvSpec": "jes.envs", "make_env": "jes.envs", "registered_env_names": "jes.envs",
    "make_optimizer": "jes.optimizers", "optimizer_names": "jes.optimizers",
    "GRUPolicy": "jes.policies", "MLPPolicy": "jes.policies", "TorchGRUCell": "jes.policies",
    "NonFiniteFitnessError": "jes.trainer", "NonFiniteUpdateError": "jes.trainer", "TrainResult": "jes.trainer",
    "Trainer": "jes.trainer", "TrainState": "jes.trainer", "run": "jes.trainer", "train": "jes.trainer",
    "enable_compilation_cache": "jes.compilation_cache",
    "use_cpu_cores": "jes.cpu",
}
_SUBMODULES = ("compilation_cache", "cpu")

__all__ = [
    "ESConfig", "EnvSpec", "GRUPolicy", "MLPPolicy", "NonFiniteFitnessError", "NonFiniteUpdateError", "TorchGRUCell",
    "TrainResult", "TrainState", "Trainer", "compilation_cache", "cpu", "enable_compilation_cache", "make_env", "make_optimizer",
    "optimizer_names", "registered_env_names", "run", "train", "use_cpu_cores",
]

if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from jes import compilation_cache, cpu
    from jes.compilation_cache import enable_compilation_cache
    from jes.config import ESConfig
    from jes.cpu import use_cpu_cores
    from jes.envs import EnvSpec, make_env, registered_env_names
    from jes.optimizers import make_optimizer, optimizer_names
    from jes.policies import GRUPolicy, MLPPolicy, TorchGRUCell
    from jes.trainer import NonFiniteFitnessError, NonFiniteUpdateError, TrainResult, Trainer, TrainState, run, train


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"jes.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'jes' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
