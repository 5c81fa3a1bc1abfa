"""The worked example of kpool-algorithm.md §4.5 (P = 4, K_tok = 8, W = 11, pool logits
``[1, 4, 2, 3]``, all pools cached), once: the expected rows of five positions, packed and fixed
tail, and the three implementations checked against them (the canonical row expansion of
:mod:`reference.numerics`, the stateful reference end to end, the kernels' expansion launch).
"""
from __future__ import annotations

import pytest
import torch

from reference.numerics import LOWEST, expand_row
from tests.reference_harness import exact_harness, exact_inputs

P, K_TOK, W = 4, 8, 11
POOL_LOGITS = (1.0, 4.0, 2.0, 3.0)
"""Logits of pools 0..3 (pool 4, incomplete at position 18, gets 1000: it must never be chosen)."""
n = -1
ROWS = (
    # position, selected pools in rank order, packed row, fixed-tail row
    (2, (), [0, 1, 2, n, n, n, n, n, n, n, n], [n, n, n, n, n, n, n, n, 0, 1, 2]),
    (3, (0,), [0, 1, 2, 3, n, n, n, n, n, n, n], [0, 1, 2, 3, n, n, n, n, n, n, n]),
    (6, (0,), [0, 1, 2, 3, 4, 5, 6, n, n, n, n], [0, 1, 2, 3, n, n, n, n, 4, 5, 6]),
    (10, (1, 0), [4, 5, 6, 7, 0, 1, 2, 3, 8, 9, 10], [4, 5, 6, 7, 0, 1, 2, 3, 8, 9, 10]),
    (18, (1, 3), [4, 5, 6, 7, 12, 13, 14, 15, 16, 17, 18], [4, 5, 6, 7, 12, 13, 14, 15, 16, 17, 18]),
)
"""The §4.5 rows: p=2 tail only; p=3 a pool boundary (pool 0 visible, tail empty); p=6 pool 0 and
the tail; p=10 both visible pools by score, tail at column 8 = K_tok; p=18 the best two of four."""


def _want(pack_tail: bool):
    return {p: (packed if pack_tail else fixed) for p, _, packed, fixed in ROWS}


@pytest.mark.parametrize("pack_tail", [True, False])
def test_canonical_expansion(pack_tail):
    for p, pools, packed, fixed in ROWS:
        got = expand_row(list(pools), [True] * len(pools), p, index_topk=K_TOK, index_kpool=P, pack_tail=pack_tail,
                         width=W)
        assert got == (packed if pack_tail else fixed), p


@pytest.mark.parametrize("pack_tail", [True, False])
def test_stateful_reference(pack_tail):
    """A 19-token prefill of exact logits: the reference's rows (checked against the oracle)."""
    h = exact_harness()
    h.add_request("r", max_len=20, ring_block=0)
    v = list(POOL_LOGITS) + [1000.0]
    step = h.check(h.step([("r", 0, 19)], inputs=exact_inputs(h, lambda r, p: v[p // 4]), pack_tail=pack_tail))
    out = step.out[:, 0, :].tolist()
    assert {p: out[p] for p in _want(pack_tail)} == _want(pack_tail)


@pytest.mark.parametrize("pack_tail", [True, False])
def test_kernel_expansion(pack_tail, torch_device):
    """The kernels' expansion launch given the selection of every row (rank order, scores)."""
    from kpool.ops.indexer import canonical_keys, expand_indices
    positions = torch.tensor([p for p, *_ in ROWS])
    ids = torch.zeros(len(ROWS), 2, dtype=torch.int64)
    scores = torch.full((len(ROWS), 2), LOWEST)
    for i, (_, pools, _, _) in enumerate(ROWS):
        for j, pool in enumerate(pools):
            ids[i, j], scores[i, j] = pool, POOL_LOGITS[pool]
    # the selection's int64 keys: the score's order image above, the complemented pool id below
    keys = ((canonical_keys(scores) >> 32) << 32) | (0xFFFFFFFF - ids)
    buf = torch.full((len(ROWS), W), -777, dtype=torch.int32, device=torch_device)
    expand_indices(top_keys=keys.to(torch_device), positions=positions.to(torch_device),
                   cum_query_lens=torch.tensor([len(ROWS)], dtype=torch.int32, device=torch_device),
                   index_topk=K_TOK, index_kpool=P, pack_tail=pack_tail, out=buf)
    assert dict(zip(_want(pack_tail), buf.cpu().tolist())) == _want(pack_tail)
