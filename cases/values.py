"""Step inputs of the parity cases: deterministic generators and the exact-logit helper.

Two value families (``Case.values``):

* ``"random"``: model-like data. Raw keys are LayerNorm outputs, so ``k ~ N(0, 1)`` rounded to
  bf16 and widened back to fp32 (the ring then holds bf16-valued fp32, as it does in the model
  where K comes from a bf16 checkpoint); gate logits ``~ N(0, 2^2)`` (std 2) in fp32; queries
  ``~ N(0, 1)`` in bf16; head weights ``~ N(0, 1) / 64`` in fp32 (the folded
  ``softmax_scale * H^-0.5 = 2^-6`` of kpool-algorithm.md §1.1, §2 step 6); APE ``~ N(0, 1)`` fp32.
* ``"exact"``: every value is a small dyadic number generated directly (no rounding anywhere):
  ``k = i / 4`` with ``i`` in ``[-4, 4]``, ``q`` integers in ``[-4, 4]``, weights ``i / 64`` with
  ``i`` in ``[-4, 4]``, gate = 0 and APE = 0. With gate = APE = 0 the pool softmax weights are
  exactly 1/4 (``exp_fp32(0) = 1``, ``Z = 4``), so each pooled key is the exact mean of four
  multiples of 1/4: a multiple of 1/16 in ``[-1, 1]``, exactly representable in bf16. Every score
  partial sum is then a multiple of ``2^-10`` below ``2^24`` units for any ``H <= 32``,
  ``D <= 128`` (see :func:`exact_score_bound`), so the scores are bit-identical in any summation
  order (kpool-algorithm.md §11 "exact-data parity cases"; parity-contract.md §3.2 last line).

* ``"nonfinite"``: ``"random"`` with sparse NaN, +inf and -inf planted at fixed places in the
  live rows of ``k``, ``gate``, ``q``, ``weights`` and ``-inf`` in one APE element
  (:func:`_plant_nonfinite`): pooled keys and scores that become NaN or infinite, which the
  kernels and the reference must treat alike (kpool-algorithm.md §4.3 sanitization, §5.3: NaN
  propagates through the pool softmax; a -inf logit weighs 0).

Rows at or beyond ``T_live`` (FULL-mode padding) also get values, deliberately garbage-like and
large, so any leak of a padding row into a pool, the ring or a score is visible.

The inputs are a pure function of ``(case.seed, step.seed)`` through a CPU ``torch.Generator``;
the harness moves them to the device.
"""
from __future__ import annotations

import hashlib
from typing import Mapping, Sequence, Union

import torch

from kpool.config import KPoolConfig
from kpool.metadata import KPoolMetadata

VALUE_FAMILIES = ("random", "exact", "nonfinite")

EXACT_K_SCALE = 0.25          # exact keys: i * 2^-2, |i| <= 4
EXACT_INT_RANGE = 4           # exact integers are drawn from [-4, 4]
EXACT_W_SCALE = 2.0 ** -6     # exact head weights: i * 2^-6, |i| <= 4
RANDOM_GATE_STD = 2.0
RANDOM_W_SCALE = 1.0 / 64.0   # exactly 2^-6

# Padding-row garbage: bf16-exact, large, obviously wrong if it leaks anywhere.
PAD_K = 96.0
PAD_GATE = 24.0
PAD_Q = 64.0
PAD_W = 1.0


def _generator(*seeds: int) -> torch.Generator:
    """A CPU generator seeded by a hash of ``seeds``.

    Why a hash: the CPU generator's Mersenne Twister keeps only the low 32 bits of its seed, so
    packing two seeds side by side would silently drop one of them.
    """
    digest = hashlib.blake2b(repr(tuple(int(s) for s in seeds)).encode(), digest_size=4).digest()
    return torch.Generator(device="cpu").manual_seed(int.from_bytes(digest, "little"))


def _check_family(values: str) -> None:
    if values not in VALUE_FAMILIES:
        raise ValueError(f"values must be one of {VALUE_FAMILIES}, got {values!r}")


def make_ape(config: KPoolConfig, seed: int, values: str = "random") -> torch.Tensor:
    """The per-slot position embedding of a case (kpool-algorithm.md §1.2, §5.3 step 1).

    Args:
        config: gives ``P`` and ``D``.
        seed: the case seed.
        values: ``"random"`` (``N(0, 1)``) or ``"exact"`` (all zeros, so pooling is an exact mean).

    Returns:
        fp32 ``[P, D]`` on the CPU.

    Raises:
        ValueError: unknown value family.
    """
    _check_family(values)
    P, D = config.index_kpool, config.index_head_dim
    if values == "exact":
        return torch.zeros(P, D, dtype=torch.float32)
    # A distinct second word so the APE stream never equals a step's stream.
    ape = torch.randn(P, D, generator=_generator(seed, 0xA9E), dtype=torch.float32)
    if values == "nonfinite" and P > 1:
        # -inf only: a +inf or NaN APE element would make that channel NaN in every pool, and so
        # every score NaN, which would hide the selection
        ape[1, min(2, D - 1)] = float("-inf")
    return ape


def case_ape(case) -> torch.Tensor:
    """``case.ape`` if set, else :func:`make_ape` with the case's seed and value family.

    Returns fp32 ``[P, D]``.
    """
    if case.ape is not None:
        return case.ape
    return make_ape(case.config, case.seed, case.values)


def make_inputs(case, step, metadata: KPoolMetadata) -> dict:
    """Inputs of one step (the ``k, gate, q, weights`` of the forward signature, docs/design.md).

    If ``step.inputs`` is set, it is called as ``step.inputs(case, step, metadata)`` and its dict is
    returned unchanged. Otherwise values follow ``case.values`` (module docstring) from a generator
    seeded by ``(case.seed, step.seed)``; rows ``t >= metadata.num_live_tokens`` get garbage.

    Args:
        case: a :class:`cases.spec.Case`.
        step: a :class:`cases.spec.Step` of that case.
        metadata: the step's built metadata (gives ``T`` and ``T_live``).

    Returns:
        ``dict(k=fp32 [T, D], gate=fp32 [T, D], q=bf16 [T, H, D], weights=fp32 [T, H])`` on the CPU.
        ``q`` and ``weights`` are produced for ``compute_topk=False`` steps too (the forward ignores
        them there).

    Raises:
        ValueError: unknown value family.
    """
    if step.inputs is not None:
        return step.inputs(case, step, metadata)
    _check_family(case.values)
    cfg = case.config
    T, T_live = metadata.num_tokens, metadata.num_live_tokens
    H, D = cfg.index_n_heads, cfg.index_head_dim
    g = _generator(case.seed, step.seed)
    if case.values in ("random", "nonfinite"):
        k = torch.randn(T, D, generator=g).to(torch.bfloat16).to(torch.float32)
        gate = torch.randn(T, D, generator=g) * RANDOM_GATE_STD
        q = torch.randn(T, H, D, generator=g).to(torch.bfloat16)
        weights = torch.randn(T, H, generator=g) * RANDOM_W_SCALE
    else:
        n = EXACT_INT_RANGE
        k = torch.randint(-n, n + 1, (T, D), generator=g).to(torch.float32) * EXACT_K_SCALE
        gate = torch.zeros(T, D, dtype=torch.float32)
        q = torch.randint(-n, n + 1, (T, H, D), generator=g).to(torch.bfloat16)
        weights = torch.randint(-n, n + 1, (T, H), generator=g).to(torch.float32) * EXACT_W_SCALE
    if case.values == "nonfinite":
        _plant_nonfinite(T_live, k, gate, q, weights, step.seed)
    _fill_padding(T_live, k, gate, q, weights, g)
    return dict(k=k, gate=gate, q=q, weights=weights)


NAN, INF = float("nan"), float("inf")


def _plant_nonfinite(T_live: int, k, gate, q, weights, salt: int) -> None:
    """Sparse NaN / +inf / -inf in the live rows (in place), at places that move with ``salt``
    (the step seed): about one row in 5 gets one special value in one tensor. A NaN or +inf key
    or a +inf gate logit makes its pool's key NaN (every score of that pool NaN: sanitized to
    LOWEST, §4.3); a -inf gate logit weighs its token 0; a NaN / inf query or head weight makes
    that row's scores NaN or infinite (+inf ranks like FLT_MAX, -inf like LOWEST)."""
    D, H = k.shape[1], q.shape[1]
    plan = ((k, NAN), (gate, -INF), (q, INF), (weights, NAN), (k, INF), (gate, INF), (q, -INF), (weights, -INF),
            (q, NAN), (weights, INF))
    for t in range(T_live):
        if (t + salt) % 5:
            continue
        target, value = plan[((t + salt) // 5) % len(plan)]
        if target is weights:
            target[t, (t + salt) % H] = value
        elif target is q:
            target[t, (t + salt) % H, (3 * t + salt) % D] = value
        else:
            target[t, (3 * t + salt) % D] = value


def _fill_padding(T_live: int, k, gate, q, weights, g: torch.Generator) -> None:
    """Overwrite rows ``>= T_live`` with large bf16-exact garbage (in place)."""
    T = k.shape[0]
    if T <= T_live:
        return
    n_pad = T - T_live
    # Small integer jitter keeps padding rows distinct from each other (still bf16-exact).
    jitter = torch.randint(0, 8, (n_pad, k.shape[1]), generator=g).to(torch.float32)
    k[T_live:] = PAD_K + jitter
    gate[T_live:] = PAD_GATE + jitter
    q[T_live:] = PAD_Q
    weights[T_live:] = PAD_W


def exact_score_bound(config: KPoolConfig) -> int:
    """Worst-case magnitude, in units of the finest term, of any score partial sum on exact data.

    Both score orders of kpool-algorithm.md §4.2 are bounded: (R) ``|w| |q| |c| D H`` and
    (M) the same product, each in units of ``2^-6 * 2^-4`` (weights' and pooled keys' steps).
    Exact data is order-independent while the result is below ``2^24`` (fp32 significand).

    Returns:
        int: the bound in units (``< 2**24`` means exact).
    """
    n = EXACT_INT_RANGE
    c_units = 16                      # |pooled key| <= 1 in steps of 1/16
    w_units = n                       # |w| <= 4 * 2^-6 in steps of 2^-6
    return w_units * n * c_units * config.index_head_dim * config.index_n_heads


# ---- exact-logit trick (public-cases.md "Conventions") ---------------------------------------

def row_requests(metadata: KPoolMetadata) -> torch.Tensor:
    """Request index of every row (kpool-algorithm.md §3.4: ``#{i : cum[i] <= t}``).

    Returns:
        int64 ``[T]``; padding rows (``t >= T_live``) get ``R`` (the number of requests).
    """
    T = metadata.num_tokens
    cum = metadata.cum_query_lens.to("cpu", torch.int64)
    t = torch.arange(T, dtype=torch.int64)
    return (cum[None, :] <= t[:, None]).sum(dim=1)


PoolValues = Union[Mapping[int, Sequence[float]], Sequence[float]]


def exact_logit_tensors(config: KPoolConfig, metadata: KPoolMetadata, request_ids: Sequence[int],
                        pool_values: PoolValues, *, default: float = 0.0) -> dict:
    """Inputs that force every pool logit (public-cases.md, "Exact-logit trick").

    Every token at position ``p`` of request ``r`` gets the key ``v[p // P] * e0`` (so all P
    tokens of pool ``j`` share ``v_j * e0``), gate 0; head 0 has query ``e0`` and weight 1, every
    other head has query 0 and weight 0. The pooled key is then exactly ``v_j * e0`` (softmax
    weights sum to 1 and one bf16 rounding restores ``v_j``) and the relu-mode logit of pool ``j``
    is ``ReLU(v_j)`` (merged mode: ``v_j``), kpool-algorithm.md §4.2, §5.3.

    Args:
        config: gives ``P``, ``H``, ``D``.
        metadata: the step's metadata (positions, request of each row).
        request_ids: case-level id of each live request (``Step.request_ids``).
        pool_values: ``{request_id: [v_0, v_1, ...]}`` or one sequence used for every request;
            each ``v_j`` must be exactly representable in bf16. Pools past the list get ``default``.
        default: value of pools without an entry.

    Returns:
        ``dict(k=fp32 [T, D], gate=fp32 [T, D], q=bf16 [T, H, D], weights=fp32 [T, H])``;
        padding rows get the same garbage as :func:`make_inputs`.

    Raises:
        ValueError: a value is not bf16-exact, or ``request_ids`` does not match the live requests.
    """
    P, H, D = config.index_kpool, config.index_n_heads, config.index_head_dim
    T, T_live = metadata.num_tokens, metadata.num_live_tokens
    req_of_row = row_requests(metadata)
    num_requests = int(metadata.cum_query_lens.shape[0])   # padded requests included
    if len(request_ids) > num_requests:
        raise ValueError(f"{len(request_ids)} request ids for {num_requests} requests")
    values_of = _pool_value_lookup(pool_values)
    positions = metadata.positions.to("cpu", torch.int64)
    k = torch.zeros(T, D, dtype=torch.float32)
    for t in range(T_live):
        r = int(req_of_row[t])
        if r >= len(request_ids):
            raise ValueError(f"row {t} belongs to request {r}, which has no request id")
        vals = values_of(request_ids[r])
        j = int(positions[t]) // P
        k[t, 0] = _bf16_exact(vals[j] if j < len(vals) else default)
    gate = torch.zeros(T, D, dtype=torch.float32)
    q = torch.zeros(T, H, D, dtype=torch.bfloat16)
    q[:, 0, 0] = 1.0
    weights = torch.zeros(T, H, dtype=torch.float32)
    weights[:, 0] = 1.0
    _fill_padding(T_live, k, gate, q, weights, _generator(0xE1, T))
    return dict(k=k, gate=gate, q=q, weights=weights)


def exact_logit_inputs(pool_values: PoolValues, *, default: float = 0.0):
    """A ``Step.inputs`` callable built on :func:`exact_logit_tensors`.

    Args:
        pool_values / default: as in :func:`exact_logit_tensors`.

    Returns:
        ``fn(case, step, metadata) -> dict`` (shapes and dtypes of :func:`make_inputs`). Use it with
        a zero APE (or any APE: the bf16 rounding of the pooled key still restores ``v_j``).
    """
    def inputs(case, step, metadata):
        return exact_logit_tensors(case.config, metadata, step.request_ids, pool_values, default=default)
    return inputs


def _pool_value_lookup(pool_values: PoolValues):
    if isinstance(pool_values, Mapping):
        return lambda rid: pool_values.get(rid, ())
    shared = list(pool_values)
    return lambda rid: shared


def _bf16_exact(v: float) -> float:
    x = torch.tensor(float(v), dtype=torch.float32)
    if not torch.equal(x.to(torch.bfloat16).to(torch.float32), x) or float(x) != float(v):
        raise ValueError(f"pool value {v!r} is not exactly representable in bf16")
    return float(v)
