"""Numerical certificates: the only non-bitwise passes (parity-contract.md §3; the derivations
are in docs/certificates.md).

Both are computed from float64 recomputations of the *same* fp32 / bf16 inputs the two sides
consumed, with bounds proven for any conforming fp32 implementation (faithful rounding, any
summation order, tensor-core block adders), never from a blanket ``atol``/``rtol``:

* **rounding boundary** (§3.1, compressed cache, bf16; :mod:`.rounding`): the two bf16 values
  are adjacent and the exact pooled value ``y64`` lies within the term-scaled fp32 error bound
  of their midpoint.
* **tie** (§3.2, index rows; :mod:`.ties`, bounds in :mod:`.scores`): each side's row is a
  valid top-k of scores within the any-order bound of its exact scores, the ``-1`` slots agree,
  and under the ``canonical`` tie policy exact ties keep the lower id first.

Exact-data cases (``Case.values == "exact"``) get no certificate under the ``canonical`` tie
policy: the runner passes no rounding context and, unless the tie policy is ``any``, no tie
context; every function here certifies nothing without one.

The contexts are plain dataclasses the runner builds per step (:class:`RoundingContext`,
:class:`TieContext`); nothing here imports Triton or the kernels. :mod:`.floats` holds the
error model both share.
"""
from __future__ import annotations

from .floats import (ETA, KAPPA_BLOCK, U_FAITHFUL, U_RNE, bf16_bits_to_f64, bf16_is_nan, bf16_order_key,
                     fp32_ulp, gamma, ordered_sum_magnitude, sum_error_bound)
from .rounding import (DEFAULT_BACKEND, EXP_DIV_ULPS, ROUNDING_BUDGET_ULPS, PoolWindow, RoundingContext,
                       certify_rounding_boundaries, operation_ulps, pooled_value_and_bound_f64, pooled_value_f64,
                       step_windows)
from .scores import ScoreBounds, score_bounds
from .ties import (TIE_POLICIES, TieContext, certify_tie_row, certify_ties, check_tie_policy, exact_tie_classes,
                   parse_row, row_scores_f64, valid_top_k, visible_keys_f64)

__all__ = [
    "ETA", "KAPPA_BLOCK", "U_FAITHFUL", "U_RNE", "bf16_bits_to_f64", "bf16_is_nan", "bf16_order_key", "fp32_ulp",
    "gamma", "ordered_sum_magnitude", "sum_error_bound",
    "DEFAULT_BACKEND", "EXP_DIV_ULPS", "ROUNDING_BUDGET_ULPS", "PoolWindow", "RoundingContext",
    "certify_rounding_boundaries", "operation_ulps", "pooled_value_and_bound_f64", "pooled_value_f64", "step_windows",
    "ScoreBounds", "score_bounds",
    "TIE_POLICIES", "TieContext", "certify_tie_row", "certify_ties", "check_tie_policy", "exact_tie_classes",
    "parse_row", "row_scores_f64", "valid_top_k", "visible_keys_f64",
]
