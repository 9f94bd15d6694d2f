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
from jes.perturbations.low_rank import LowRank, LowRankFallbackWarning, LowRankWarning

_REGISTRY = {"full_rank": FullRank, "low_rank": LowRank}


def names() -> list[str]:
    """Registered perturbation names."""
    return list(_REGISTRY)


def get(name: Any = "full_rank", rank: int | None = None) -> Any:
    """A perturbation from its name (``"full_rank"``, ``"low_rank"``) and rank (low rank's; default 1), or the
    object itself (``rank``, if given, must be its own).

    Raises:
        ValueError: an unknown name, an invalid rank, or a rank that full rank or the given object does not have.
    """
    if isinstance(name, (FullRank, LowRank)):
        own = getattr(name, "rank", 1)
        if rank is not None and rank != own:
            raise ValueError(f"get({name!r}, rank={rank!r}): the object's rank is {own}; give the rank once")
        return name
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"unknown perturbation {name!r}; choose one of {', '.join(_REGISTRY)} "
                         f"(or pass jes.FullRank() / jes.LowRank(rank=r))")
    if name == "full_rank":
        if rank not in (None, 1):
            raise ValueError(f"rank={rank!r} is the rank of low-rank perturbations, but the name is 'full_rank': "
                             f"get('low_rank', rank={rank!r}), or drop the rank")
        return FullRank()
    return LowRank(rank=1 if rank is None else rank)
