"""How far apart two float32 computations that sum the same terms in different orders may end: the bound the
equivalence tests (FSDP vs one process, 2 vs 1 process, accumulation vs one big batch) assert, instead of a
figure read off one run.

Derivation. Summing n float32 terms in any order gives the exact sum within (n - 1) * u * sum(|term|), u = eps/2
the unit roundoff (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., eq. 4.4). Two orders are
each that close to the exact sum, so they differ by at most (n - 1) * eps * sum(|term|). A gradient is a mean of
n per-example terms, so its rounding difference is at most (n - 1) * eps times the size of those terms. With SGD
(momentum included) the weight change is linear in the gradients, so the difference it leaves in the weights is
at most (n - 1) * eps times how far the weights moved (`scale`). SAFETY covers what the first-order argument
leaves out: terms that cancel (sum(|term|) above |sum|), each step's difference carried into the next gradient
(taken at slightly different weights), and the forward pass's own blockings differing with the batch size.

Adam is left out of such tests on purpose: it divides each gradient by its own running size, so a parameter whose
gradient is near zero (made of rounding noise) still moves by about the learning rate, in a direction the
summation order decides; the difference then no longer scales with (n - 1) * eps.
"""

from __future__ import annotations

import torch

FLOAT32_EPS = torch.finfo(torch.float32).eps  # 2**-23 ~ 1.19e-7

# 2 from the two orders and about 2 each for cancellation, carried steps and the forward pass. Measured far inside
# it (test_parallel.py: 2.4e-7 against a bound of 1.2e-4), while a real bug (a missed micro-batch, a gradient not
# averaged) moves the weights by a sizeable fraction of their whole movement, far above the bound.
SAFETY = 16.0


def reordered_sum_bound(n_terms: int, scale: float, safety: float = SAFETY) -> float:
    """The largest difference allowed between two float32 results that sum `n_terms` terms in different orders;
    `scale` is the size of what the sum produced (how far the weights moved, or the loss itself). n_terms is what
    one optimizer step sums: rows (or tokens) per micro-batch x accumulation steps x processes."""
    if n_terms < 1 or scale < 0:
        raise ValueError(f"n_terms must be >= 1 and scale >= 0, got n_terms={n_terms}, scale={scale}")
    return safety * max(n_terms - 1, 1) * FLOAT32_EPS * scale
