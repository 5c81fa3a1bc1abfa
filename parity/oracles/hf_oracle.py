"""Hugging Face transformers' ``Glm5NextTextIndexer`` driven with a case's own inputs: a third,
independent implementation of the KPool indexer (kpool-algorithm.md §4, §5, §10; derivation and
recipe: docs/hf-oracle.md).

HF has no compressed cache and no ring: every call recomputes all pools of the request from its
packed ``[k, gate, valid]`` cache (``DynamicIndexedLayer``). :class:`HFIndexer` builds one
indexer layer whose projections reproduce our step inputs exactly:

* hidden state of a token = ``[k | gate | w * sqrt(H) * sqrt(D)]`` (fp32, width ``2D + H``);
* ``wk`` and ``index_kpool_compress_gate`` select the ``k`` and ``gate`` columns (selector
  matrices: a finite fp32 value times 1 plus zeros is exact), ``k_norm`` is an identity;
* ``weights_proj`` selects the ``w'`` columns; HF multiplies by ``H^-0.5`` outside and by
  ``softmax_scale = D^-0.5`` inside the ReLU, so ``w' = w sqrt(H D)`` gives our folded weight ``w``;
* ``wq_b`` is an identity (``q_resid`` is our bf16 query, widened to fp32 exactly).

:meth:`HFIndexer.run` checks those claims on every call (the packed cache must hold our
``k``/``gate`` bits, ``weights_proj`` must return ``w'``) and captures what HF's own ``topk``
ranked (its fp32 pool scores) and its fp32 pooled keys, which :mod:`parity.oracles.hf_classify` needs.

transformers is optional (``pip install '.[hf]'``): :func:`hf_status` says whether it is usable.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

HF_VERSION = "5.24.0"
"""The pinned transformers release (pyproject ``[hf]`` extra); older releases lack glm5_next."""
HF_MODULE = "transformers.models.glm5_next.modeling_glm5_next"


def _version_tuple(text: str) -> Tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def hf_status() -> Tuple[bool, str]:
    """``(usable, reason)``: transformers imports, is at least :data:`HF_VERSION` and has
    ``Glm5NextTextIndexer``; ``reason`` says why not (``"not installed"``, ``"too old"``...)."""
    try:
        from importlib.metadata import PackageNotFoundError, version
        try:
            have = version("transformers")
        except PackageNotFoundError:
            return False, "transformers not installed (pip install '.[hf]')"
        if _version_tuple(have) < _version_tuple(HF_VERSION):
            return False, f"transformers {have} too old (need >= {HF_VERSION}: pip install '.[hf]')"
        import importlib
        mod = importlib.import_module(HF_MODULE)
        getattr(mod, "Glm5NextTextIndexer")
    except Exception as exc:   # a broken install is a stated reason, never a traceback
        return False, f"transformers unusable: {type(exc).__name__}: {exc}"
    return True, f"transformers {have}"


@dataclass
class HFCall:
    """One HF indexer call for the last ``n`` positions of a request of ``S`` tokens.

    Attributes:
        indices: int32 ``[n, W_hf]`` HF's rows (``W_hf = K_tok + P - 1``, or ``K_tok`` without
            the tail); ``-1`` = unused.
        scores: fp32 ``[n, n_pools]`` what HF's ``topk`` ranked: its pool scores with invisible
            pools at ``finfo(float32).min``.
        pool_keys: fp32 ``[n_pools, D]`` HF's pooled keys (``n_pools = S // P``).
        finite_tokens: bool ``[S]`` tokens whose whole hidden row is finite (a non-finite value
            anywhere in the row reaches all of HF's k, gate and w of that token through the
            selector matmuls: ``0 * inf`` is NaN).
    """

    indices: torch.Tensor
    scores: torch.Tensor
    pool_keys: torch.Tensor
    finite_tokens: torch.Tensor


class _TopkCapture(torch.overrides.TorchFunctionMode):
    """Records the input of every ``Tensor.topk`` / ``torch.topk`` call inside the mode."""

    def __init__(self):
        super().__init__()
        self.inputs = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.topk, torch.topk):
            self.inputs.append(args[0].detach().clone())
        return func(*args, **kwargs)


class HFRecipeError(RuntimeError):
    """HF's projections did not reproduce our inputs bit for bit (the driver's recipe is wrong
    for this transformers release); nothing HF returned may be compared."""


class HFIndexer:
    """One fp32 ``Glm5NextTextIndexer`` layer configured like a :class:`kpool.config.KPoolConfig`
    (``H``, ``D``, ``P``, ``K_tok``, ``always_select_tail``) with the module docstring's recipe.

    Args:
        config: the case's :class:`kpool.config.KPoolConfig` (``score_mode`` must be ``"relu"``:
            HF implements kpool-algorithm.md §4.2 (R) only).
        ape: fp32 ``[P, D]`` the case's APE (``index_kpool_compress_ape``).

    Raises:
        RuntimeError: transformers unusable (:func:`hf_status`).
        ValueError: ``score_mode`` other than ``"relu"``.
    """

    def __init__(self, config, ape: torch.Tensor):
        ok, why = hf_status()
        if not ok:
            raise RuntimeError(why)
        if config.score_mode != "relu":
            raise ValueError(f"HF implements score_mode 'relu' only, not {config.score_mode!r}")
        from torch import nn
        from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig
        from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextIndexer
        H, D, P = config.index_n_heads, config.index_head_dim, config.index_kpool
        self.H, self.D, self.P, self.K = H, D, P, config.index_topk
        self.hidden = 2 * D + H
        self.hf_config = Glm5NextTextConfig(
            hidden_size=self.hidden, q_lora_rank=H * D, index_n_heads=H, index_head_dim=D,
            index_topk=config.index_topk, index_kpool=P,
            index_kpool_always_select_tail=bool(config.always_select_tail), num_hidden_layers=1,
            layer_types=["indexed_attention"], mlp_layer_types=["dense"], indexer_types=["full"],
            num_attention_heads=1, num_key_value_heads=1, pad_token_id=None)
        ix = Glm5NextTextIndexer(self.hf_config, layer_idx=0).to(torch.float32).eval()
        eye = torch.eye(D, dtype=torch.float32)
        with torch.no_grad():
            ix.wk.weight.zero_()
            ix.wk.weight[:, :D] = eye
            ix.index_kpool_compress_gate.zero_()
            ix.index_kpool_compress_gate[:, D:2 * D] = eye
            ix.weights_proj.weight.zero_()
            ix.weights_proj.weight[:, 2 * D:] = torch.eye(H, dtype=torch.float32)
            ix.index_kpool_compress_ape.copy_(ape.detach().cpu().to(torch.float32))
        ix.wq_b = nn.Identity()
        ix.k_norm = nn.Identity()
        self.indexer = ix
        self.weight_scale = math.sqrt(H) * math.sqrt(D)

    def hidden_states(self, k: torch.Tensor, gate: torch.Tensor, weights: Optional[torch.Tensor]) -> torch.Tensor:
        """fp32 ``[S, 2D + H]`` hidden rows ``[k | gate | w sqrt(H) sqrt(D)]`` (``w'`` in float64
        then one fp32 rounding; zeros where ``weights`` is ``None``).

        Args:
            k, gate: fp32 ``[S, D]``; weights: fp32/bf16 ``[S, H]`` or ``None``.
        """
        S = k.shape[0]
        w = torch.zeros(S, self.H, dtype=torch.float32) if weights is None else \
            (weights.to(torch.float64) * self.weight_scale).to(torch.float32)
        return torch.cat([k.to(torch.float32), gate.to(torch.float32), w], dim=1)

    def _packed(self, hidden: torch.Tensor) -> torch.Tensor:
        """HF's packed indexer state ``[k_norm(wk(x)), gate(x), valid]`` of earlier tokens, made with
        the layer's own modules (what its earlier calls would have cached)."""
        ix = self.indexer
        k = ix.k_norm(ix.wk(hidden))
        g = torch.nn.functional.linear(hidden, ix.index_kpool_compress_gate)
        return torch.cat([k, g, torch.ones_like(k[..., :1])], dim=-1)

    @torch.no_grad()
    def run(self, k: torch.Tensor, gate: torch.Tensor, q: torch.Tensor, weights: torch.Tensor) -> HFCall:
        """HF's rows for the last ``n = q.shape[0]`` positions of a request whose whole history is
        ``k``/``gate`` (positions ``0 .. S-1``), through HF's cache path: the main cache holds
        ``S`` tokens, the indexer cache the first ``S - n`` packed states, and the forward appends
        the ``n`` new ones (kpool-algorithm.md §10 "ring: none").

        Args:
            k, gate: fp32 ``[S, D]``; q: bf16 ``[n, H, D]``; weights: fp32/bf16 ``[n, H]``.

        Returns:
            :class:`HFCall`.

        Raises:
            HFRecipeError: HF's packed cache or head weights are not our inputs bit for bit
                (finite tokens only: a non-finite value spreads through the selector matmul).
        """
        from transformers.cache_utils import DynamicCache
        S, n = int(k.shape[0]), int(q.shape[0])
        hidden = self.hidden_states(k, gate, None)
        w_rows = self.hidden_states(k[S - n:], gate[S - n:], weights)
        hidden[S - n:] = w_rows
        cache = DynamicCache(config=self.hf_config)
        cache.update(torch.zeros(1, 1, S, 1), torch.zeros(1, 1, S, 1), 0)
        if S > n:
            cache.update_indexer(self._packed(hidden[None, :S - n]), 0)
        ix = self.indexer
        captured = {}
        original = ix.get_pooled_states

        def pooled(*args, **kwargs):
            out = original(*args, **kwargs)
            captured["pool_keys"] = out[0].detach().clone()
            return out
        ix.get_pooled_states = pooled
        try:
            with _TopkCapture() as topk:
                out = ix(hidden_states=hidden[None, S - n:], q_resid=q.to(torch.float32).reshape(1, n, -1),
                         attention_mask=torch.ones(1, n, dtype=torch.bool), cache=cache)
        finally:
            del ix.get_pooled_states
        finite = torch.isfinite(hidden).all(1)
        self._check_recipe(cache, k, gate, w_rows, weights, finite)
        n_pools = S // self.P
        scores = topk.inputs[0][0] if topk.inputs else torch.zeros(n, 0)
        keys = captured.get("pool_keys", torch.zeros(1, 0, self.D))[0]
        if scores.shape != (n, n_pools) or keys.shape != (n_pools, self.D):
            raise HFRecipeError(f"HF ranked {tuple(scores.shape)} scores over {tuple(keys.shape)} pooled keys; "
                                f"expected [{n}, {n_pools}] over [{n_pools}, {self.D}]")
        return HFCall(indices=out[0].to(torch.int32), scores=scores, pool_keys=keys, finite_tokens=finite)

    def _check_recipe(self, cache, k, gate, w_rows, weights, finite) -> None:
        """Raise :class:`HFRecipeError` unless HF cached our ``k`` and ``gate`` and its
        ``weights_proj`` returns ``w'`` bit for bit on every token whose hidden row is finite."""
        packed = cache.layers[0].indexer_keys[0]                     # [S, 2D + 1]
        D = self.D
        for name, ours, theirs in (("k", k, packed[:, :D]), ("gate", gate, packed[:, D:2 * D])):
            bad = (ours.to(torch.float32) != theirs) & finite[:, None]
            if bad.any():
                raise HFRecipeError(f"HF's packed cache holds another {name} than ours at "
                                    f"{int(bad.any(1).sum())} finite tokens")
        proj = self.indexer.weights_proj(w_rows)
        expect = (weights.to(torch.float64) * self.weight_scale).to(torch.float32)
        rows = torch.isfinite(w_rows).all(1)
        if ((proj != expect) & rows[:, None]).any():
            raise HFRecipeError("HF's weights_proj does not return w * sqrt(H) * sqrt(D) bit for bit")
