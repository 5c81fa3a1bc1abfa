"""Planted faults that only one input family of issue 19 catches (the :data:`parity.implementations.mutants.MUTANTS`
format: ``name -> (file relative to kpool/, exact old text, new text, expected finding class)``).

Each is a plausible single edit of a kernel engineer, invisible on N(0, a few) values and
contiguous inputs: with the family's cases (:mod:`cases.ranges`, :mod:`cases.layouts`, the seed
scenarios of :mod:`cases.scenarios_range`) the self-test catches it, with the family switched off
(``python -m parity selftest --without-family NAME``, :mod:`cases.families`) it survives every
suite. :data:`FAMILY_OF` names the family, :data:`FAMILY_STAGES` the stage it breaks.
"""
from __future__ import annotations

FAMILY_FAULTS = {
    # ---- family 1: values from the whole finite range ----------------------------------------
    # dot operands rounded to fp16 (exact on every bf16 value within fp16's normal range):
    # q or pooled keys beyond 65504 become inf, below 2^-14 lose bits or vanish (§4.2)
    "dot-operands-fp16": ("ops/_portable.py", "    return load_f32(ptrs, mask, DOT_F32)\n",
                          "    return load_f32(ptrs, mask, DOT_F32).to(tl.float16).to(tl.float32)\n", "wrong-index"),
    # the running max of the pool softmax skips slot 1 (§5.3 step 2): the same value up to
    # rounding while the logits are close; exp overflows once slot 1 is far above the max
    "softmax-max-skips-slot": ("ops/compress.py", "m = _max_into(s0, s0, s1, s2, s3, 1, SLOTS)",
                               "m = _max_into(s0, s0, s1, s2, s3, 2, SLOTS)",
                               "cache-mismatch"),
    # a -1e30 threshold in place of the LOWEST handling (§4.3): finite scores below -1e30 are
    # treated as invalid (a public fix replaced such a threshold)
    "lowest-threshold-1e30": ("ops/_portable.py", "low = invisible | (score != score) | (score <= LOWEST_C)",
                              "low = invisible | (score != score) | (score <= -1e30)", "wrong-index"),
    # ---- family 2: strided layouts -------------------------------------------------------------
    # the score kernels assume a unit head stride of weights (an [H, T] buffer viewed as [T, H]
    # is then read across rows)
    "weights-head-stride-ignored": ("ops/score.py", "w_arg, weights.stride(0), weights.stride(1),",
                                    "w_arg, weights.stride(0), 1,", "wrong-index"),
    # the score kernels assume q rows are packed (row stride = heads x head stride)
    "q-rows-assumed-packed": ("ops/score.py", "launch_plan.vector_view(q_arg, (q.stride(0), q.stride(1)), 8)",
                              "launch_plan.vector_view(q_arg, (q.shape[1] * q.stride(1), q.stride(1)), 8)",
                              "wrong-index"),
    # the compression assumes contiguous k rows (the ring write still honours the strides)
    "compress-k-contiguous": ("ops/compress.py",
                              "k.stride(0), k.stride(1), gate.stride(0), gate.stride(1), ape.stride(0), ape.stride(1),",
                              "D, 1, gate.stride(0), gate.stride(1), ape.stride(0), ape.stride(1),",
                              "cache-mismatch"),
    # the score kernels assume unpadded compressed-cache rows (row stride = D)
    "cache-rows-assumed-packed": ("ops/score.py",
                                  "cache_arg, (compressed_cache.stride(0), compressed_cache.stride(1)), 8)",
                                  "cache_arg, (compressed_cache.stride(0), compressed_cache.shape[3]), 8)",
                                  "wrong-index"),
}

FAMILY_OF = {"dot-operands-fp16": "values", "softmax-max-skips-slot": "values", "lowest-threshold-1e30": "values",
             "weights-head-stride-ignored": "layouts", "q-rows-assumed-packed": "layouts",
             "compress-k-contiguous": "layouts", "cache-rows-assumed-packed": "layouts"}
"""Fault -> the one family (:data:`cases.families.SWITCHABLE`) that catches it."""

FAMILY_STAGES = {"dot-operands-fp16": "score-operands", "softmax-max-skips-slot": "softmax",
                 "lowest-threshold-1e30": "sanitization", "weights-head-stride-ignored": "strides",
                 "q-rows-assumed-packed": "strides", "compress-k-contiguous": "strides",
                 "cache-rows-assumed-packed": "strides"}
