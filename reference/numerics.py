"""Canonical fp32 arithmetic of the KPool indexer, in plain PyTorch (kpool-algorithm.md §11,
parity-contract.md §7).

Every function here fixes one rounding order; the Triton kernels follow the same order, so
the two agree bit for bit on every platform that does IEEE-754 fp32 ``+ - * /`` without
fused multiply-add (CUDA with ``enable_fp_fusion=False``, the CPU interpreter; NPU: to verify).

The only transcendental, ``exp``, is :func:`exp_fp32`: a fixed sequence of fp32 operations
(Cody-Waite reduction, degree-7 Taylor polynomial in Horner form, exponent built from bits),
because ``torch.exp``, ``numpy.exp``, CUDA ``ex2.approx`` and the NPU vector unit all round
differently (platform-numerics.md §4.1). It is within 2 fp32 ulp of the exact value (tested
against float64 in ``tests/test_numerics.py``); results that would be subnormal are computed
with one extra exact power-of-two scaling.
"""
from __future__ import annotations

import torch

F32 = torch.float32
LOWEST = torch.finfo(torch.float32).min
"""``float32.min`` = -3.4028235e38: the sanitized score of an invalid pool (§4.3)."""
FLT_MAX = torch.finfo(torch.float32).max

# exp_fp32 constants (all exactly representable in fp32; the kernel uses the same literals).
EXP_LOG2E = 1.44269504088896341        # rounds to fp32 0x3FB8AA3B
EXP_LN2_HI = 0.693359375               # 355/512: 9 significant bits, so n * LN2_HI is exact
EXP_LN2_LO = -2.12194440e-4            # ln2 - LN2_HI, rounded to fp32
EXP_ROUND_MAGIC = 12582912.0           # 1.5 * 2**23: x + MAGIC - MAGIC rounds x to an integer (RNE)
EXP_X_MIN = -104.0                     # below: result rounds to 0
EXP_X_MAX = 89.0                       # above: result overflows to +inf
EXP_POLY = (1.0, 1.0, 0.5, 1.0 / 6.0, 1.0 / 24.0, 1.0 / 120.0, 1.0 / 720.0, 1.0 / 5040.0)
"""Taylor coefficients 1/k!, k = 0..7, each rounded to fp32."""
EXP_SUBNORMAL_SHIFT = 64               # n < -126 is scaled as 2**(n+64) * 2**-64


def _f32(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=F32)


def exp_fp32(x: torch.Tensor) -> torch.Tensor:
    """``exp(x)`` for fp32 ``x`` (any shape) by a fixed fp32 operation sequence.

    Steps (each an IEEE fp32 op, no FMA): clamp x to [-104, 89];
    ``n = rne(x * LOG2E)`` via the 1.5*2^23 trick; ``r = (x - n*LN2_HI) - n*LN2_LO``;
    ``p = Horner(r, 1/7!, ..., 1/1!, 1)``; ``exp = p * 2^n`` with the power built from exponent
    bits (split into ``2^(n+64) * 2^-64`` when ``n < -126``). NaN in -> NaN out.

    Returns an fp32 tensor of ``x``'s shape. Source: kpool-algorithm.md §5.3 step 3 (the math),
    platform-numerics.md §4.3 (why a software exp).
    """
    x = x.to(F32)
    xc = torch.clamp(x, EXP_X_MIN, EXP_X_MAX)
    t = xc * _f32(EXP_LOG2E)
    n = (t + _f32(EXP_ROUND_MAGIC)) - _f32(EXP_ROUND_MAGIC)
    r = (xc - n * _f32(EXP_LN2_HI)) - n * _f32(EXP_LN2_LO)
    p = torch.full_like(r, EXP_POLY[7])
    for c in EXP_POLY[6::-1]:
        p = p * r + _f32(c)
    ni = n.to(torch.int32)
    tiny = ni < -126
    ni = torch.where(tiny, ni + EXP_SUBNORMAL_SHIFT, ni)
    # 2^n for n in [-126, 127]; n = 128 (x near 89) is split as 2^127 * 2.
    big = ni > 127
    ni = torch.where(big, ni - 1, ni)
    scale = ((ni + 127) << 23).view(F32)
    y = p * scale
    y = torch.where(big, y * _f32(2.0), y)
    y = torch.where(tiny, y * _f32(2.0 ** -EXP_SUBNORMAL_SHIFT), y)
    return torch.where(torch.isnan(x), x, y)


BF16_CANONICAL_NAN = 0x7FC0
"""Every NaN is stored as this quiet NaN (torch's own fp32->bf16 NaN bits differ by platform:
0xFFFF on CPU, 0x7FFF on CUDA; the kernels store 0x7FC0 everywhere)."""


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 with round-to-nearest-even (``bf16(x)`` of kpool-algorithm.md notation);
    NaN becomes the canonical quiet NaN :data:`BF16_CANONICAL_NAN`."""
    y = x.to(F32).to(torch.bfloat16)
    nan = torch.full_like(y.view(torch.int16), BF16_CANONICAL_NAN).view(torch.bfloat16)
    return torch.where(torch.isnan(y), nan, y)


def compress_pools(k_window: torch.Tensor, gate_window: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:
    """Pooled keys of complete pools (kpool-algorithm.md §5.3, canonical order of §11).

    Args:
        k_window: fp32 ``[n, P, D]`` raw keys of each pool's P slots (slot j = position ``j*P+j``).
        gate_window: fp32 ``[n, P, D]`` raw gate logits (before APE).
        ape: fp32 ``[P, D]`` per-slot position embedding.

    Returns:
        bf16 ``[n, D]``: per channel ``bf16(sum_j (e_j / Z) * K_j)`` with ``s_j = g_j + ape_j``,
        ``m = max_j s_j`` (sequential), ``e_j = exp_fp32(s_j - m)``, ``Z`` a left-to-right sum,
        each product rounded before its left-to-right add, one RNE rounding at the end.
    """
    return round_bf16(pooled_fp32(k_window, gate_window, ape))


def pooled_fp32(k_window: torch.Tensor, gate_window: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:
    """fp32 ``[n, D]``: :func:`compress_pools` before its final bf16 rounding (same arguments,
    same operation order)."""
    P = k_window.shape[1]
    s = [gate_window[:, j].to(F32) + ape[j].to(F32) for j in range(P)]
    m = s[0]
    for j in range(1, P):
        m = torch.maximum(m, s[j])
    e = [exp_fp32(s[j] - m) for j in range(P)]
    z = e[0]
    for j in range(1, P):
        z = z + e[j]
    out = (e[0] / z) * k_window[:, 0].to(F32)
    for j in range(1, P):
        out = out + (e[j] / z) * k_window[:, j].to(F32)
    return out


def relu_fp32(x: torch.Tensor) -> torch.Tensor:
    """Canonical ReLU: ``0 if x < 0 else x`` (NaN stays NaN, so a NaN score is sanitized to
    LOWEST; ``tl.maximum`` would drop it on CUDA)."""
    return torch.where(x < 0, torch.zeros_like(x), x)


def pool_scores(q: torch.Tensor, weights: torch.Tensor, pools: torch.Tensor, score_mode: str = "relu") -> torch.Tensor:
    """Raw fp32 scores of every pool for every query row (kpool-algorithm.md §4.2, order of §11).

    Args:
        q: bf16 ``[rows, H, D]`` queries.
        weights: fp32 or bf16 ``[rows, H]`` head weights (upcast to fp32).
        pools: bf16 ``[rows, n, D]`` or ``[n, D]`` compressed keys (upcast to fp32).
        score_mode: ``"relu"``: ``sum_h w_h * relu(sum_d q_hd c_d)``, d then h sequential;
            ``"merged"``: ``sum_d qbar_d c_d`` with ``qbar_d = sum_h w_h q_hd`` (h then d sequential).

    Returns:
        fp32 ``[rows, n]`` (not sanitized).
    """
    qf = q.to(F32)
    wf = weights.to(F32)
    cf = pools.to(F32)
    if cf.dim() == 2:
        cf = cf.unsqueeze(0).expand(qf.shape[0], -1, -1)
    rows, H, D = qf.shape
    n = cf.shape[1]
    if score_mode == "relu":
        dots = torch.zeros(rows, n, H, dtype=F32)
        for d in range(D):
            dots = dots + cf[:, :, d, None] * qf[:, None, :, d]
        score = torch.zeros(rows, n, dtype=F32)
        for h in range(H):
            score = score + wf[:, h, None] * relu_fp32(dots[:, :, h])
        return score
    if score_mode == "merged":
        qbar = torch.zeros(rows, D, dtype=F32)
        for h in range(H):
            qbar = qbar + wf[:, h, None] * qf[:, h, :]
        score = torch.zeros(rows, n, dtype=F32)
        for d in range(D):
            score = score + qbar[:, d, None] * cf[:, :, d]
        return score
    raise ValueError(f"unknown score_mode {score_mode!r}")


# ---- visibility and the causal tail (kpool-algorithm.md §4.1, §4.5) -----------------------------
# The one harness-side home of these two formulas: the stateful reference, the certificates, the
# comparators, the coverage account, the public cases' checks and the case statistics call them.
# Deliberate independent copies (so that one slip cannot make both sides agree): the Triton
# kernels (kpool/ops/indexer.py, the score and expand kernels) and the whole-history oracle
# (reference/oracle.py) restate them.

def tail_start(position, index_kpool: int):
    """First position of row ``p``'s causal tail: ``(p + 1) // P * P`` (kpool-algorithm.md §4.5
    step 2: the tokens ``tail_start .. p`` of the row's own incomplete pool).

    Args:
        position: int or int tensor of positions ``p >= 0``.
        index_kpool: ``P``.
    Returns:
        the same kind (int or int64 tensor) as ``position``.
    """
    if isinstance(position, torch.Tensor):
        position = position.to(torch.int64)
    return (position + 1) // index_kpool * index_kpool


def visible_pools(position, pool_len, index_kpool: int):
    """Visible pool count of a row: ``min((p + 1) // P, seq_lens[r])``, never below 0
    (kpool-algorithm.md §4.1: the row's complete pools, capped by its request's pool length).

    Args:
        position: int or int tensor of positions.
        pool_len: the request's ``seq_lens[r]`` (int, or an int tensor broadcastable to
            ``position``).
        index_kpool: ``P``.
    Returns:
        int for int arguments, else an int64 tensor of ``position``'s shape.
    """
    if isinstance(position, torch.Tensor) or isinstance(pool_len, torch.Tensor):
        pos = torch.as_tensor(position).to(torch.int64)
        cap = torch.as_tensor(pool_len).to(torch.int64)
        return torch.clamp(torch.minimum((pos + 1) // index_kpool, cap), min=0)
    return max(0, min((int(position) + 1) // index_kpool, int(pool_len)))


def sanitize_scores(scores: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """kpool-algorithm.md §4.3: invisible (``j >= visible[row]``), NaN and ``<= LOWEST`` cells
    become LOWEST; ``+inf`` becomes FLT_MAX.

    Args:
        scores: fp32 ``[rows, n]``.
        visible: int ``[rows]`` visible pool counts.
    Returns:
        fp32 ``[rows, n]``.
    """
    n = scores.shape[1]
    j = torch.arange(n)[None, :]
    low = torch.full_like(scores, LOWEST)
    out = torch.where(j < visible[:, None].to(torch.int64), scores, low)
    out = torch.where(torch.isnan(out) | (out <= LOWEST), low, out)
    return torch.where(out > FLT_MAX, torch.full_like(out, FLT_MAX), out)


def canonical_topk(scores: torch.Tensor, selected: int):
    """Canonical top-k over sanitized scores (parity-contract.md §2, kpool-algorithm.md §4.4, §11):
    descending score, ties to the lower pool id; ``-0.0 == +0.0`` ties.

    Args:
        scores: fp32 ``[rows, n]`` sanitized scores.
        selected: ``min(K_pool, max_pool_seq_len)``.
    Returns:
        ``(pool_ids int64 [rows, selected], valid bool [rows, selected])``; ``valid`` is
        ``score > LOWEST``.
    """
    import numpy as np
    rows, n = scores.shape
    ids = torch.zeros(rows, selected, dtype=torch.int64)
    valid = torch.zeros(rows, selected, dtype=torch.bool)
    pool_ids = np.arange(n)
    for r in range(rows):
        s = scores[r].numpy().astype(np.float64)
        order = np.lexsort((pool_ids, -s))[:selected]
        ids[r] = torch.from_numpy(order.astype(np.int64))
        valid[r] = torch.from_numpy(s[order] > float(LOWEST))
    return ids, valid


def expand_row(pool_ids, valid, position: int, *, index_topk: int, index_kpool: int,
               pack_tail: bool, width: int, always_select_tail: bool = True) -> list:
    """One output row (kpool-algorithm.md §4.5 steps 1-3, §7).

    Args:
        pool_ids / valid: the row's selection (sequences of length ``selected``).
        position: the row's absolute position ``p`` (>= 0).
        index_topk / index_kpool: ``K_tok`` / ``P``.
        pack_tail: packed (column ``min(tail_start, K_tok)``) or fixed (column ``K_tok``) tail.
        width: the buffer width (>= W); columns >= W are -1.
        always_select_tail: ``False`` writes no tail (HF ``index_kpool_always_select_tail=False``,
            kpool-algorithm.md §10): the row is the history columns only, ``W = K_tok``.
    Returns:
        list of ``width`` ints.
    """
    K, P = index_topk, index_kpool
    row = [-1] * width
    for c in range(K):
        slot, lane = divmod(c, P)
        if slot < len(pool_ids) and bool(valid[slot]):
            row[c] = int(pool_ids[slot]) * P + lane
    if P > 1 and always_select_tail:
        first = tail_start(position, P)
        tail_count = position + 1 - first
        tail_col = min(first, K) if pack_tail else K
        for i in range(P - 1):
            row[tail_col + i] = first + i if i < tail_count else -1
    return row


def index_rows(scores: torch.Tensor, visible: torch.Tensor, positions, *, selected: int, index_topk: int,
               index_kpool: int, pack_tail: bool, width: int, always_select_tail: bool = True) -> torch.Tensor:
    """Output rows of scored query rows: :func:`sanitize_scores`, :func:`canonical_topk`, then
    :func:`expand_row` per row (kpool-algorithm.md §4.3-§4.5).

    Args:
        scores: fp32 ``[rows, n]`` raw scores; visible: int ``[rows]`` visible pool counts;
        positions: the rows' absolute positions (``rows`` ints); the rest (``always_select_tail``
        included) as :func:`expand_row`.
    Returns:
        int32 ``[rows, width]``.
    """
    pool_ids, valid = canonical_topk(sanitize_scores(scores, visible), selected)
    pool_ids, valid = pool_ids.tolist(), valid.tolist()  # lists: expand_row indexes per column
    rows = [expand_row(pool_ids[i], valid[i], int(positions[i]), index_topk=index_topk,
                       index_kpool=index_kpool, pack_tail=pack_tail, width=width,
                       always_select_tail=always_select_tail)
            for i in range(len(pool_ids))]
    return torch.tensor(rows, dtype=torch.int32).reshape(len(rows), width)
