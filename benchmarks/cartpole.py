"""portable-es CartPole table: GRU (367 params), 256 antithetic pairs, 25 generations, 5 optimizers x 5 seeds.

    python benchmarks/cartpole.py [--seeds 5] [--optimizers adam,novograd]
    (--seeds: a comma list of seeds as the other scripts take, 0,1,2, ranges too, 0-9; or a count N, seeds 0..N-1)

"Solved" is the centre policy's mean return over 64 fresh episodes reaching 475.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import jes  # noqa: E402
from portable_es import benchmark, parse_args  # noqa: E402

if __name__ == "__main__":
    benchmark("CartPole-v1", jes.GRUPolicy(hidden=5, layers=2), parse_args(__doc__))
