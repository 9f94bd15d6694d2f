"""jes: JAX-accelerated, vectorized Evolution Strategies (OpenAI-ES, PGPE, SNES, sep-CMA-ES, ARS, CMA-ES).

Public names are imported on first use (PEP 562), so ``import jes``, ``import jes.distributed``,
``jes-worker --help`` and ``jes --help`` do not pay for JAX and Flax until something needs them, and
``jes.use_cpu_cores()`` can still run before JAX initialises its backends.
"""
from __future__ import annotations

import importlib
import time
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"
# When this process imported jes: files of jes and its dependencies changed after this may differ from the
# code this process runs, so jes.program_cache keys nothing on them (see there).
IMPORTED_AT_NS = time.time_ns()

# public name -> module that defines it
_EXPORTS = {
    "CheckpointInUseError": "jes.checkpoint",
    "AskTell": "jes.blackbox", "NonFiniteValueError": "jes.blackbox", "OptimizeResult": "jes.blackbox",
    "StopCriteria": "jes.blackbox",
    "optimize": "jes.blackbox",
    "enable_compilation_cache": "jes.compilation_cache",
    "ESConfig": "jes.config",
    "use_cpu_cores": "jes.cpu",
    "EnvSpec": "jes.envs", "make_env": "jes.envs", "registered_env_names": "jes.envs",
    "ChunkResults": "jes.generation", "Trainer": "jes.generation", "TrainState": "jes.generation",
    "BestMember": "jes.loop", "CheckpointSaveError": "jes.loop", "NonFiniteFitnessError": "jes.loop", "NonFiniteUpdateError": "jes.loop",
    "StopTraining": "jes.loop", "TrainResult": "jes.loop", "run": "jes.loop", "train": "jes.loop",
    "make_optimizer": "jes.optimizers", "optimizer_names": "jes.optimizers",
    "FullRank": "jes.perturbations", "LowRank": "jes.perturbations",
    "GRUPolicy": "jes.policies", "MLPPolicy": "jes.policies", "TorchGRUCell": "jes.policies",
    "TrainedPolicy": "jes.trained", "load_policy": "jes.trained", "save_policy": "jes.trained",
}
_SUBMODULES = ("compilation_cache", "cpu", "perturbations", "strategies", "sweep")

__all__ = sorted([*_EXPORTS, *_SUBMODULES])

if TYPE_CHECKING:  # for type checkers and IDEs; at run time these resolve through __getattr__
    from jes import compilation_cache, cpu, perturbations, strategies, sweep  # noqa: F401
    from jes.blackbox import AskTell, NonFiniteValueError, OptimizeResult, StopCriteria, optimize  # noqa: F401
    from jes.checkpoint import CheckpointInUseError  # noqa: F401
    from jes.compilation_cache import enable_compilation_cache  # noqa: F401
    from jes.config import ESConfig  # noqa: F401
    from jes.cpu import use_cpu_cores  # noqa: F401
    from jes.envs import EnvSpec, make_env, registered_env_names  # noqa: F401
    from jes.generation import ChunkResults, Trainer, TrainState  # noqa: F401
    from jes.loop import BestMember, CheckpointSaveError, NonFiniteFitnessError, NonFiniteUpdateError, StopTraining, TrainResult, run, train  # noqa: F401
    from jes.optimizers import make_optimizer, optimizer_names  # noqa: F401
    from jes.perturbations import FullRank, LowRank  # noqa: F401
    from jes.policies import GRUPolicy, MLPPolicy, TorchGRUCell  # noqa: F401
    from jes.trained import TrainedPolicy, load_policy, save_policy  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif not name.startswith("__"):
        try:  # any submodule: jes.sweep, jes.checkpoint, jes.logging, ...
            value = importlib.import_module(f"jes.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"jes.{name}":
                raise
            raise AttributeError(f"module 'jes' has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module 'jes' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
