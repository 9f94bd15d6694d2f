"""jes: JAX-accelerated, vectorized Evolution Strategies (OpenAI-ES, PGPE, SNES, sep-CMA-ES, ARS).

Public names are imported on first use (PEP 562), so ``import jes.distributed``,
``jes-worker --help`` and ``jes --help`` do not pay for importing JAX, and
``jes.use_cpu_cores()`` can still run before JAX initialises its backends.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

# name -> module that defines it
_EXPORTS = {
    "ESConfig": "jes.config",
    "EnvSpec": "jes.envs", "make_env": "jes.envs", "registered_env_names": "jes.envs",
    "make_optimizer": "jes.optimizers", "optimizer_names": "jes.optimizers",
    "GRUPolicy": "jes.policies", "MLPPolicy": "jes.policies", "TorchGRUCell": "jes.policies",
    "ChunkResults": "jes.generation", "Trainer": "jes.generation", "TrainState": "jes.generation",
    "NonFiniteFitnessError": "jes.loop", "NonFiniteUpdateError": "jes.loop", "TrainResult": "jes.loop",
    "run": "jes.loop", "train": "jes.loop",
    "AskTell": "jes.blackbox", "OptimizeResult": "jes.blackbox", "optimize": "jes.blackbox",
    "enable_compilation_cache": "jes.compilation_cache",
    "use_cpu_cores": "jes.cpu",
}
_SUBMODULES = ("compilation_cache", "cpu", "strategies", "sweep", "checkpoint")

__all__ = sorted(set(_EXPORTS) | set(_SUBMODULES))

if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from jes import checkpoint, compilation_cache, cpu, strategies, sweep
    from jes.blackbox import AskTell, OptimizeResult, optimize
    from jes.compilation_cache import enable_compilation_cache
    from jes.config import ESConfig
    from jes.cpu import use_cpu_cores
    from jes.envs import EnvSpec, make_env, registered_env_names
    from jes.generation import ChunkResults, Trainer, TrainState
    from jes.loop import NonFiniteFitnessError, NonFiniteUpdateError, TrainResult, run, train
    from jes.optimizers import make_optimizer, optimizer_names
    from jes.policies import GRUPolicy, MLPPolicy, TorchGRUCell


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
