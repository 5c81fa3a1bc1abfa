"""The lightning-indexer kernels in one namespace (kpool-algorithm.md §4): scoring with the fused
selection key (:mod:`kpool.ops.score`), the exact canonical top-k (:mod:`kpool.ops.topk`) and the
index expansion (:mod:`kpool.ops.expand`). ``kpool.indexer.forward`` calls them through this
module, so a test can replace one step here.
"""
from __future__ import annotations

from .expand import expand_indices
from .score import SCORE_MODES, score_keys, score_pools
from .topk import canonical_keys, key_pool_ids, key_scores, key_valid, select_topk

__all__ = ["SCORE_MODES", "score_keys", "score_pools", "select_topk", "expand_indices", "canonical_keys",
           "key_pool_ids", "key_scores", "key_valid"]
