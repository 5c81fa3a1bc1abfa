"""The prefill kernel's row blocks (``kpool.ops.score._prefill_blocks_kernel``) against their
definition (kpool-algorithm.md §4.1 tiling, §3.4 request of a row): every prefill-sized request
(more than ``DECODE_ROWS`` rows) is cut into ``BLOCK_M``-row blocks from its start; entry ``r``
is the count of blocks of requests ``<= r``, and the two chunk entries are the first block that
holds a chunk row and one past the last. Drawn over batches with zero-length requests, decode-
sized requests, more requests than one ``BLOCK_R`` sweep, and chunks that start or end in padding
rows. Runs on the resolved device (the CPU interpreter by default, ``--device cuda`` on the H200).
"""
import os

os.environ.setdefault("KPOOL_DEVICE", "cpu")
from kpool.platform import resolve_device, torch_device  # noqa: E402

DEVICE = resolve_device()
DEV = torch_device(DEVICE)

import pytest  # noqa: E402
import torch  # noqa: E402

from kpool.ops import plan, score  # noqa: E402

pytestmark = pytest.mark.interpreter_ok


def _want(qlens, row_start, num_rows, block_m):
    """Per request the inclusive count of blocks, then the chunk's first block (blocks wholly
    before ``row_start``) and one past its last (blocks starting at or before its last row)."""
    ends, blocks, start = [], [], 0
    for n in qlens:                                   # (first row, last row + 1) of every block
        if n > plan.DECODE_ROWS:
            blocks += [(start + j, min(start + j + block_m, start + n)) for j in range(0, n, block_m)]
        ends.append(len(blocks))
        start += n
    last = row_start + num_rows - 1
    first = sum(1 for _, hi in blocks if hi <= row_start)
    return ends + [first, sum(1 for lo, _ in blocks if lo <= last)]


def _batches():
    gen = torch.Generator().manual_seed(20)
    yield [1]
    yield [0, 0, 40]                                  # zero-length requests first
    yield [9, 8, 0, 200, 1, 65]                       # decode-sized, prefill-sized, empty between
    for R in (3, 127, 128, 129, 300):                 # one sweep of BLOCK_R = 128, and several
        kinds = torch.randint(0, 4, (R,), generator=gen).tolist()
        yield [(0, 1, 8, 9 + 37 * i % 300)[k] for i, k in enumerate(kinds)]


@pytest.mark.parametrize("qlens", list(_batches()), ids=lambda q: f"R{len(q)}")
def test_block_ends_match_their_definition(qlens):
    prefill = plan.score_prefill_plan(sum(qlens) + 5, len(qlens), sum(qlens) + 5, 1024, 128, DEV)
    blocks = plan.prefill_blocks_plan(prefill, DEV)
    block_m = prefill.constexprs["BLOCK_M"]
    cum = torch.tensor(qlens, dtype=torch.int32).cumsum(0).to(torch.int32).to(DEV)
    T_live = sum(qlens)
    gen = torch.Generator().manual_seed(len(qlens))
    # chunks at the batch edges, inside it, and reaching into padding rows (T > T_live)
    chunks = {(0, max(1, T_live)), (0, T_live + 5), (max(0, T_live - 1), 6)}
    starts = torch.tensor([0] + qlens[:-1]).cumsum(0).tolist()
    for s in starts[:: max(1, len(starts) // 8)]:     # chunks that start, or end, on a request's first row
        chunks |= {(s, 3), (max(0, s - 3), min(s, 3) + 1)}
    for _ in range(6):
        lo = int(torch.randint(0, T_live + 5, (1,), generator=gen))
        chunks.add((lo, int(torch.randint(1, T_live + 6 - lo, (1,), generator=gen))))
    for row_start, num_rows in sorted(chunks):
        out = torch.full((len(qlens) + 2,), -7, dtype=torch.int32, device=DEV)
        score._prefill_blocks_kernel[(blocks.grid,)](cum, out, len(qlens), row_start, num_rows,
                                                     **blocks.constexprs, **blocks.options)
        assert out.cpu().tolist() == _want(qlens, row_start, num_rows, block_m), (row_start, num_rows)
