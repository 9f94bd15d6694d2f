"""ES algorithms behind one seam (:class:`~jes.strategies.base.Strategy`).

``jes.strategies.names()`` lists them; ``jes.strategies.get("pgpe")`` or
``jes.strategies.PGPE(stdev_lr=0.2)`` gives one for ``jes.train(..., strategy=...)``
and ``jes.optimize``; ``jes.AskTell`` drives one from your own evaluation loop.
"""
from __future__ import annotations

from typing import Any

from jes.optimizers import optimizer_names
from jes.strategies.ars import ARS, ARSState
from jes.strategies.base import Context, Strategy
from jes.strategies.cma_es import CMAES, CMAState
from jes.strategies.openai_es import OpenAIES, OpenAIESState
from jes.strategies.pgpe import PGPE, PGPEState
from jes.strategies.sep_cma_es import SepCMAES, SepCMAState
from jes.strategies.snes import SNES, SNESState

REGISTRY: dict[str, type[Strategy]] = {cls.name: cls for cls in (OpenAIES, PGPE, SNES, SepCMAES, ARS, CMAES)}
ALIASES = {"openai-es": "openai_es", "openes": "openai_es", "sep-cma-es": "sep_cma_es", "sepcma": "sep_cma_es",
           "cma-es": "cma_es", "cmaes": "cma_es"}


def names() -> list[str]:
    """Registered strategy names."""
    return list(REGISTRY)


def canonical_name(name: str) -> str | None:
    """The registered name ``name`` stands for (any case, aliases included), or ``None``."""
    key = ALIASES.get(name.lower(), name.lower())
    return key if key in REGISTRY else None


def get(strategy: "str | Strategy", **hyperparameters: Any) -> Strategy:
    """A strategy by name (with its hyperparameters) or the strategy object itself.

    Raises:
        ValueError: an unknown name (the message lists the valid ones).
        TypeError: something that is neither a name nor a :class:`Strategy`.
    """
    if isinstance(strategy, Strategy):
        if hyperparameters:
            raise TypeError("pass hyperparameters to the strategy's constructor, not alongside a strategy object")
        return strategy
    if isinstance(strategy, str):
        key = canonical_name(strategy)
        if key is None:
            from_optax = strategy.lower() in optimizer_names()
            raise ValueError(f"unknown strategy {strategy!r}; valid names are: {', '.join(names())}"
                             + (f" ({strategy!r} is an optimizer: pass it as optimizer=, e.g. jes.train(policy, env, "
                                f"{strategy!r}))" if from_optax else ""))
        return REGISTRY[key](**hyperparameters)
    raise TypeError(f"strategy must be a name ({', '.join(names())}) or a jes.strategies.Strategy, "
                    f"got {type(strategy).__name__}")


__all__ = ["ARS", "ARSState", "CMAES", "CMAState", "Context", "OpenAIES", "OpenAIESState", "PGPE", "PGPEState",
           "SNES", "SNESState", "SepCMAES", "SepCMAState", "Strategy", "get", "names"]
