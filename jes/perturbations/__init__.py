"""The perturbation seam: how a member's parameters are formed from keys and applied in the forward pass.

The strategy decides the search distribution (its mean, its sigma, how fitness moves them); the
perturbation decides the *shape* of a member's deviation from the mean:

* :class:`FullRank` (default): the strategy's own dense ``[C, P]`` members, each applied with its own
  parameters (every strategy; today's bits).
* :class:`LowRank` (EGGROLL, Sarkar et al. 2025): every weight matrix ``W (m x n)`` of a member is
  ``W + sigma / sqrt(r) * A_i B_i^T`` with ``A_i (m x r)``, ``B_i (n x r)`` regenerated from
  ``(run key, generation, member)``; the forward pass computes the shared product once for all members
  (a GEMM) plus a rank-``r`` correction, so no member materialises its matrices. Strategies with one
  sigma for all parameters (``openai_es``, ``ars``) support it.

``ESConfig(perturbation="low_rank", perturbation_rank=4)`` or ``jes.train(..., perturbation=jes.LowRank(4))``.
"""
from __future__ import annotations

from typing import Any

from jes.perturbations.full_rank import FullRank
from jes.perturbations.low_rank import LowRank, LowRankFallbackWarning

_REGISTRY = {"full_rank": FullRank, "low_rank": LowRank}


def names() -> list[str]:
    """Registered perturbation names."""
    return list(_REGISTRY)


def get(name: Any = "full_rank", rank: int = 1) -> Any:
    """A perturbation from its name (``"full_rank"``, ``"low_rank"``) and rank, or the object itself.

    Raises:
        ValueError: an unknown name or an invalid rank.
    """
    if isinstance(name, (FullRank, LowRank)):
        return name
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"unknown perturbation {name!r}; choose one of {', '.join(_REGISTRY)} "
                         f"(or pass jes.FullRank() / jes.LowRank(rank=r))")
    return FullRank() if name == "full_rank" else LowRank(rank=rank)
