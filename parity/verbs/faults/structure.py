"""Planted faults that only one input family of issue 19 catches (families 3-6: structure, the
unvalidated path, exactness per implementation, size), in the :data:`parity.implementations.mutants.MUTANTS`
format ``name -> (file relative to kpool/, old, new, expected finding class)``; ``old``/``new``
may be tuples (several edits of one file, one mistake).

:data:`STRUCTURE_FAMILY_OF` names the family whose cases or rules kill each fault; with that
family switched off (``PARITY_FAMILIES_OFF``, :mod:`cases.families`, used only by the self-test's
evidence and the tests) the fault survives every default suite (docs/validation.md, the kill
table). (Families 1-2 have their own faults module.)
"""
from __future__ import annotations

STRUCTURE_FAULTS = {
    # ---- family 3, structure --------------------------------------------------------------------
    # the prefill row blocks (found on the device from cum_query_lens) cached by the batch's
    # counts, as a captured plan would freeze them: a later batch with the same counts but another
    # arrangement (long request first, then last) scores the wrong rows
    "block-ends-cached-by-counts": (
        "ops/score.py",
        ("    block_ends = torch.empty(R + 2, dtype=torch.int32, device=q.device)\n",
         "    _prefill_blocks_kernel[(blocks.grid,)](cum_query_lens, block_ends, R, row_start, num_rows,\n"
         "                                           **blocks.constexprs, **blocks.options)\n"),
        ("    _key = (R, T, row_start, num_rows, str(q.device))\n"
         "    _cached = globals().setdefault('_BLOCK_ENDS_BY_COUNTS', {}).get(_key)\n"
         "    block_ends = torch.empty(R + 2, dtype=torch.int32, device=q.device) if _cached is None else _cached\n",
         "    if _cached is None:\n"
         "        _prefill_blocks_kernel[(blocks.grid,)](cum_query_lens, block_ends, R, row_start, num_rows,\n"
         "                                               **blocks.constexprs, **blocks.options)\n"
         "        globals()['_BLOCK_ENDS_BY_COUNTS'][_key] = block_ends\n"),
        "wrong-index"),
    # a decode / MTP request whose rows began in an earlier score chunk is skipped by the decode
    # kernel (its rows in this chunk keep the previous chunk's keys)
    "decode-chunk-straddle-skipped": (
        "ops/score.py", "        if (q_hi - q_lo <= DECODE_ROWS) & (lo < hi):",
        "        if (q_hi - q_lo <= DECODE_ROWS) & (lo < hi) & (q_lo >= row_start):", "wrong-index"),
    # the decode kernel's key low word from the lane of the pool block, not the pool: every pool
    # past the first block (4096 pools under the interpreter, 128 on CUDA) ties and decodes as a
    # pool of block 0
    "key-pool-id-from-lane": (
        "ops/score.py",
        "_store_keys(key_row + pools, pools, score_key_hi(score, pools >= vis), pools < max_pool_seq_len)",
        "_store_keys(key_row + pools, offs_n, score_key_hi(score, pools >= vis), pools < max_pool_seq_len)",
        "wrong-index"),
    # max_pool_seq_len bounded by the physical pages instead of the block table (M * B): rejects a
    # FULL-graph table wider than the page pool (prefix-shared pages: more logical pools than rows)
    "pool-bound-by-physical-pages": (
        "validation.py", "    if max_pool_seq_len < 0 or max_pool_seq_len > M * B:",
        "    if max_pool_seq_len < 0 or max_pool_seq_len > min(M, N) * B:", "crash"),
    # ---- family 4, the unvalidated path -------------------------------------------------------
    # a pool compressed wherever slot_mapping holds an in-range slot, not only on completing
    # positions (§3.2: the kernel decides from positions)
    "compress-wherever-slot": (
        "ops/compress.py", "valid = live & pos_ok & ((p + 1) % P == 0) & (slot >= 0) & (slot < num_slots)",
        "valid = live & pos_ok & (slot >= 0) & (slot < num_slots)", "cache-mismatch"),
    # ---- family 5, exactness per implementation ---------------------------------------------------
    # e_j * K_j divided by Z (multiply before divide): one rounding moved, the cache off by an ulp
    "compress-multiply-before-divide": (
        "ops/compress.py", "term = tl.math.div_rn(e, z) * kv", "term = tl.math.div_rn(e * kv, z)", "cache-mismatch"),
    # division by Z as a multiply by the reciprocal (what an approximate division amounts to)
    "compress-reciprocal-division": (
        "ops/compress.py", "term = tl.math.div_rn(e, z) * kv", "term = (e * (1.0 / z)) * kv", "cache-mismatch"),
    # Triton's default fp32 '/', an approximate division on CUDA (exact under the interpreter)
    "compress-approximate-division": (
        "ops/compress.py", "term = tl.math.div_rn(e, z) * kv", "term = (e / z) * kv", "cache-mismatch"),
    # FMA contraction allowed on CUDA (the products of pass 3 fuse with their adds)
    "cuda-fp-fusion": (
        "platform.py", '{"num_warps": 4, "enable_fp_fusion": False}', '{"num_warps": 4, "enable_fp_fusion": True}',
        "cache-mismatch"),
    # mode (M): qbar rounded toward zero to TF32 (10 mantissa bits) before its exact split, as a
    # TF32 dot of the fp32 qbar would
    "merged-qbar-tf32": (
        "ops/merged.py", "hi, mid, lo = split_bf16x3(tl.where(tiny[:, None], qbar * QBAR_SCALE, qbar))",
        "hi, mid, lo = split_bf16x3((tl.where(tiny[:, None], qbar * QBAR_SCALE, qbar).to(tl.int32, bitcast=True)"
        " & -8192).to(tl.float32, bitcast=True))", "wrong-index"),
    # ---- family 6, size and long context ----------------------------------------------------------
    # the expansion's row tiles on grid axis 1, one program each (CUDA: at most 65535 there)
    "expand-rows-on-grid-axis-1": (
        "ops/expand.py",
        ("    pid = tl.program_id(0)\n    nprog = tl.num_programs(0)\n", "_expand_kernel[(plan.grid,)]("),
        ("    pid = tl.program_id(1)\n    nprog = tl.num_programs(1)\n", "_expand_kernel[(1, plan.tiles)]("),
        "crash"),
}

STRUCTURE_FAMILY_OF = {
    "block-ends-cached-by-counts": "structure", "decode-chunk-straddle-skipped": "structure",
    "key-pool-id-from-lane": "structure", "pool-bound-by-physical-pages": "structure",
    "compress-wherever-slot": "unvalidated",
    "compress-multiply-before-divide": "exactness", "compress-reciprocal-division": "exactness",
    "compress-approximate-division": "exactness", "cuda-fp-fusion": "exactness", "merged-qbar-tf32": "exactness",
    "expand-rows-on-grid-axis-1": "size",
}
"""Fault -> the family that catches it (:data:`cases.families.SWITCHABLE`)."""

STRUCTURE_STAGES = {
    "block-ends-cached-by-counts": "launch-state", "decode-chunk-straddle-skipped": "chunked-scoring",
    "key-pool-id-from-lane": "topk-order", "pool-bound-by-physical-pages": "rules",
    "compress-wherever-slot": "completing-row", "compress-multiply-before-divide": "compress-rounding",
    "compress-reciprocal-division": "compress-rounding", "compress-approximate-division": "compress-rounding",
    "cuda-fp-fusion": "compress-rounding", "merged-qbar-tf32": "score-precision",
    "expand-rows-on-grid-axis-1": "launch-geometry",
}

STRUCTURE_DEVICE_ONLY = {
    "compress-approximate-division": "the interpreter's fp32 '/' is an exact (numpy) division; CUDA's is approximate",
    "cuda-fp-fusion": "the interpreter never contracts a*b+c into an FMA; the CUDA compiler does when allowed",
    "expand-rows-on-grid-axis-1": "the interpreter has no grid limits; CUDA's axis 1 holds at most 65535 programs: "
                                  "the long-context case (> 65535 rows in one launch) of the device profile",
}
"""Faults no CPU-interpreter case can reach, with the reason."""
