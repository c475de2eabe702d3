"""tests/tolerances.py: the bound holds for float32 sums taken in different orders, with safety 1 (the bare
rounding-error bound), and it refuses sizes that mean nothing."""

from __future__ import annotations

import numpy as np
import pytest

from tolerances import FLOAT32_EPS, reordered_sum_bound


@pytest.mark.parametrize("n_terms", [2, 64, 4096])
def test_reordered_means_stay_within_the_bare_bound(n_terms):
    """A float32 mean summed in three orders (forward, backward, two halves) stays within the bound at safety=1."""
    terms = np.random.default_rng(n_terms).standard_normal(n_terms).astype(np.float32)
    forward = np.cumsum(terms, dtype=np.float32)[-1] / np.float32(n_terms)  # one term after another
    backward = np.cumsum(terms[::-1], dtype=np.float32)[-1] / np.float32(n_terms)
    halves = (np.cumsum(terms[::2], dtype=np.float32)[-1] + np.cumsum(terms[1::2], dtype=np.float32)[-1]) / np.float32(
        n_terms)  # 2 processes' shares, then their sum
    # Scale: the mean size of the terms (what the rounding scales with when they cancel), plus one rounding of
    # the division itself.
    bound = reordered_sum_bound(n_terms, float(np.abs(terms).mean()), safety=1.0) + FLOAT32_EPS * abs(float(forward))
    assert abs(float(forward) - float(backward)) <= bound
    assert abs(float(forward) - float(halves)) <= bound


def test_sizes_that_mean_nothing_are_refused():
    with pytest.raises(ValueError, match="n_terms must be >= 1"):
        reordered_sum_bound(0, 1.0)
    with pytest.raises(ValueError, match="scale >= 0"):
        reordered_sum_bound(4, -1.0)
    assert reordered_sum_bound(1, 1.0) == reordered_sum_bound(2, 1.0)  # one term: nothing reordered but its rounding
