"""Planted faults in the kernels and the orchestration of ``kpool`` beyond :data:`parity.implementations.mutants.MUTANTS`
(issue 13): ``name -> (file relative to kpool/, exact old text, new text, expected finding class)``,
the :data:`parity.implementations.mutants.MUTANTS` format, each with the spec section it breaks. Targets are
local expressions and orchestration lines (not kernel argument lists), so a renaming of kernel
arguments rarely moves them; ``tests/test_selftest.py`` checks that every one still applies.
"""
from __future__ import annotations

KERNEL_FAULTS = {
    # ---- window assembly and ring reads (§5.2) ------------------------------------------------
    # the first query row of a chunk read from the ring instead of the inputs
    "window-first-row-from-ring": ("ops/compress.py", "from_in = w >= qs_pos", "from_in = w > qs_pos",
                                   "cache-mismatch"),
    # the window starts one position early: pool j compresses positions jP-1 .. jP+P-2
    "window-shifted": ("ops/compress.py", "w0 = p - (P - 1)", "w0 = p - P", "cache-mismatch"),
    # k read from the gate plane of the ring (planes swapped for the keys), §3.3
    "ring-read-k-from-gate-plane": ("ops/compress.py", "tail_ptr, 0, w0, qs_pos",
                                    "tail_ptr, stride_tail_plane, w0, qs_pos", "cache-mismatch"),
    # ---- softmax order (§5.3 steps 2-5) -------------------------------------------------------
    # the normalizer Z leaves out slot 0 (a running max that skips a slot changes the fp32 result
    # by a few ulps on close logits; faults.families "softmax-max-skips-slot" needs far-apart ones)
    "softmax-normalizer-skips-slot": ("ops/compress.py",
                                      "z = _sum_into(_negative_zeros_like(m), e0, e1, e2, e3, 0, SLOTS)",
                                      "z = _sum_into(_negative_zeros_like(m), e0, e1, e2, e3, 1, SLOTS)",
                                      "cache-mismatch"),
    # ---- bf16 rounding (§5.3 step 6) ---------------------------------------------------------
    "bf16-truncate": ("ops/_portable.py", "rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536",
                      "rounded = bits & -65536", "cache-mismatch"),
    # ---- ring write span and planes (§5.4) ------------------------------------------------------
    # the gate written into the k plane (the ring's k rows then hold the gate)
    "ring-write-gate-into-k-plane": ("ops/compress.py", "tl.store(tail_ptr + (dst + stride_tail_plane)[:, None]",
                                     "tl.store(tail_ptr + (dst + 0)[:, None]", "ring-mismatch"),
    # only the last C - 1 rows of a request stashed (span one short)
    "ring-write-span-short": ("ops/compress.py", "first = tl.maximum(span_start, span_end - ring_capacity)",
                              "first = tl.maximum(span_start, span_end - ring_capacity + 1)", "ring-mismatch"),
    # ---- request of a row (§3.4) ----------------------------------------------------------------
    # the first row of every request after the first attributed to the previous request
    "request-boundary": ("ops/_portable.py", "right = (lo < hi) & (end <= rows)",
                         "right = (lo < hi) & (end < rows)", "cache-mismatch"),
    # ---- completing-row rule, fast path (§5.1) ----------------------------------------------------
    # the single-request tile starts at the wrong completing row
    "completing-row-offset": ("ops/compress.py", "first = (P - 1) - (pos0 % P)",
                              "first = (P - 1) - ((pos0 + 1) % P)", "cache-mismatch"),
    # ---- head reduction (§4.2) ------------------------------------------------------------------
    # relu dropped in the prefill score kernel (relu mode scored as merged)
    "prefill-relu-dropped": ("ops/score.py", "acc = acc + tl.where(s < 0, (w_h * 0.0)[:, None], w_h[:, None] * s)",
                             "acc = acc + w_h[:, None] * s", "wrong-index"),
    # the last head left out of the decode kernel's head sum
    "decode-last-head-dropped": ("ops/score.py", "score = tl.sum(tl.where((heads < H)[None, :], term, 0.0), axis=1)",
                                 "score = tl.sum(tl.where((heads < H - 1)[None, :], term, 0.0), axis=1)",
                                 "wrong-index"),
    # ---- sanitization (§4.3) --------------------------------------------------------------------
    # NaN scores not mapped to LOWEST (the positive canonical NaN then ranks first)
    "nan-not-sanitized": ("ops/_portable.py", "low = invisible | (score != score) | (score <= LOWEST_C)",
                          "low = invisible | (score <= LOWEST_C)", "wrong-index"),
    # negative scores keep their raw bits as key (their order is reversed)
    "negative-key-image": ("ops/_portable.py", "return tl.where(bits < 0, -1 - (bits & 0x7FFFFFFF), bits)",
                           "return bits", "wrong-index"),
    # ---- canonical top-k order and ties (§4.4) ----------------------------------------------------
    # keys' low word the pool id itself: ties go to the higher pool and the ids decode wrong
    "key-low-word-pool": ("ops/score.py", "key = (key_hi.to(tl.int64) << 32) | ((-1 - pools).to(tl.int64) & 0xFFFFFFFF)",
                          "key = (key_hi.to(tl.int64) << 32) | (pools.to(tl.int64) & 0xFFFFFFFF)", "wrong-index"),
    # ---- expansion (§4.5) --------------------------------------------------------------------
    # invalid (LOWEST) selected keys expanded as if valid: pools a row cannot see appear
    "expand-invalid-kept": ("ops/expand.py", "val = tl.where(hist & (high > KEY_LOWEST_C), pool * P + (cols % P)[None, :], -1)",
                            "val = tl.where(hist, pool * P + (cols % P)[None, :], -1)", "wrong-index"),
    # ---- packed and fixed tail (§4.5 step 2) --------------------------------------------------
    "tail-misses-current-token": ("ops/expand.py", "tail_count = pos + 1 - tail_start",
                                  "tail_count = pos - tail_start", "wrong-tail"),
    "fixed-tail-packed": ("ops/expand.py", "tail_col = tl.zeros_like(tail_start) + index_topk",
                          "tail_col = tl.minimum(tail_start, index_topk)", "wrong-tail"),
    # ---- padding rows and alignment columns (§4.5 step 4, §4.6) ----------------------------------
    "padding-rows-not-cleared": ("ops/expand.py", "val = tl.where(live[:, None] & (cols < out_width)[None, :], val, -1)",
                                 "val = tl.where((cols < out_width)[None, :], val, -1)", "wrong-index"),
    # columns >= W of a wider caller buffer left unwritten (stale)
    "alignment-columns-unwritten": ("ops/expand.py", "mask=(rows < num_rows)[:, None] & (cols < width)[None, :])",
                                    "mask=(rows < num_rows)[:, None] & (cols < out_width)[None, :])",
                                    "stray-write"),
    # ---- paging through block_table (§3.1) -----------------------------------------------------------
    # pool j read from page j % B of the table instead of j // B
    "paging-page-index": ("ops/score.py", "page_idx = pools // page_size", "page_idx = pools % page_size",
                          "wrong-index"),
    # ---- selection width and chunked scoring (§4.4, §4.6) -------------------------------------------
    "selected-one-short": ("indexer.py", "selected = min(index_topk // P, max_pool_seq_len)",
                           "selected = min(index_topk // P - 1, max_pool_seq_len)", "wrong-index"),
    # the last score chunk skipped (a step scored in one chunk is unaffected)
    "chunk-last-skipped": ("indexer.py", "for row_start in range(0, T, rows_per_chunk):",
                           "for row_start in (range(0, T, rows_per_chunk)[:-1] or range(1)):", "wrong-index"),
    # ---- launch geometry: grid-stride iterations ----------------------------------------------
    # the ring-write kernel walks only its first pass of tiles (CPU: 2 programs, a tile of 8
    # lanes covers 8 // C requests' last C rows: any batch of more than 4 requests at C = 4; a
    # device grid of 8 programs an SM covers every drawn batch in one pass: the CPU legs catch it)
    "ring-write-one-pass": ("ops/compress.py", "for tile in range(pid, tl.cdiv(num_requests, reqs) * chunks, nprog):",
                            "for tile in range(pid, tl.minimum(tl.cdiv(num_requests, reqs) * chunks, nprog), nprog):",
                            "missing-write"),
    # the expansion kernel walks only its first pass (its CPU grid covers every tile: device only)
    "expand-one-pass": ("ops/expand.py", "for tile in range(pid, n_row_blocks * n_col_blocks, nprog):",
                        "for tile in range(pid, tl.minimum(n_row_blocks * n_col_blocks, nprog), nprog):",
                        "wrong-index"),
    # ---- int64 offsets (caches of >= 2**31 elements) ---------------------------------------------
    # the compressed-cache store offset computed in int32
    "compress-store-int32": ("ops/compress.py", "dst = page.to(tl.int64) * stride_cache_n + prow.to(tl.int64) * stride_cache_b",
                             "dst = page * stride_cache_n + prow * stride_cache_b", "missing-write"),
}

DEVICE_ONLY = {
    "completing-row-offset": "the CPU plan compresses a tile's rows at once (rows_at_once=True in kpool/ops/plan.py); "
                             "the per-group path that uses the first completing row runs on devices only, in "
                             "launches of more than latency_rows rows (the glm5.3-flash seed cases' long steps)",
    "expand-one-pass": "the CPU plan caps the expansion grid at GRID_LIMIT programs (kpool/ops/plan.py: one "
                       "pass covers every tile); a device grid is cores-capped, so a GLM-size step iterates",
    "compress-store-int32": "needs a compressed cache of >= 2**31 elements (4 GiB of bf16): "
                            "tests/test_int64_addressing.py on the device",
}
"""Faults no CPU-interpreter case can reach, with the reason (excluded from the CPU kill rate)."""
