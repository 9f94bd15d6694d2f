"""Full-rank perturbations: the strategy's own dense members, each applied with its own parameters."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class FullRank:
    """Every member is a dense ``[P]`` parameter vector drawn by the strategy (``mean + sigma * eps_i`` for
    OpenAI-ES; per-parameter sigmas for PGPE, SNES, sep-CMA-ES) and applied with its own weights: the
    rollout vmaps the policy over per-member parameters. Works with every strategy and every policy."""

    name: ClassVar[str] = "full_rank"
    structured: ClassVar[bool] = False
    rank: ClassVar[int | None] = None

    # XLA:CPU's tree reduction rewriter stays on (jes.cpu.compiler_options): it decides the bits of pinned runs
    cpu_tree_reductions: ClassVar[bool] = True

    def cpu_fusion_emitters(self, layout: Any = None) -> bool:
        """False: the step compiles with jes's default XLA options (:func:`jes.cpu.compiler_options`)."""
        return False

    def member_fns(self, fns: Any, unravel: Callable, centre: jax.Array, layout: Any = None) -> "DenseMembers":
        """The rollout's view of members given as ``[C, P]`` flat vectors (``centre`` and ``layout`` unused)."""
        return DenseMembers(fns, unravel)


class DenseMembers:
    """``(params, carry, obs) -> (carry, out)`` of members that carry their own (unravelled) parameters."""

    def __init__(self, fns: Any, unravel: Callable):
        self.fns, self.unravel = fns, unravel

    def slot_params(self, members: jax.Array, episodes: int = 1) -> Any:
        """Per-slot pytree the rollout carries (and compacts): the unravelled parameters ``[C * episodes, ...]``
        (slot ``i * episodes + e`` is member ``i``'s episode ``e``)."""
        params = jax.vmap(self.unravel)(members)
        return jax.tree.map(lambda p: jnp.repeat(p, episodes, axis=0), params) if episodes > 1 else params

    def initial_carry(self) -> Any:
        return self.fns.initial_carry()

    def apply(self, params: Any, carry: Any, obs: jax.Array) -> tuple[Any, jax.Array]:
        return self.fns.apply(params, carry, obs)
