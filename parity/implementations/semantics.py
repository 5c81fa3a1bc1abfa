"""The semantics a run judges an implementation by (``--score-mode``, ``--ties``,
``--validate-with``, ``--interp-rne``), from the CLI's flags or the implementation's declared
defaults (:class:`parity.implementations.Implementation`).

* score mode (kpool-algorithm.md §4.2): every case's ``config.score_mode`` is replaced
  (:func:`with_score_mode`), so both sides, the oracle and the public cases' stated values follow
  the implementation's mode;
* tie policy (parity-contract.md §3.2): handed to :func:`parity.runner.run_case`;
* validation outside the operator (kpool-algorithm.md §9, parity-contract.md §5):
  :func:`validated_by` runs :func:`kpool.validation.validate_forward` before the operator, and
  marks what it raises so the bad-input checks say "not validated by the operator";
* ``--interp-rne``: the forward runs inside :func:`parity.interp_rne.round_to_nearest_even`.

Imports no torch at module import (the CLI's ``--help`` reads the choices here).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

SCORE_MODES = ("relu", "merged")
TIE_POLICIES = ("canonical", "any")
VALIDATORS = ("kpool", "none")
"""``--validate-with`` choices: ``kpool`` (:func:`kpool.validation.validate_forward` before the
operator) or ``none`` (the operator's own validation only)."""
VALIDATED_BY = "parity_validated_by"
"""Attribute set on an exception raised by the harness's validation, not by the operator."""
NOT_VALIDATED_NOTE = "not validated by the operator: rejected by the harness's kpool validation (--validate-with kpool)"
BITWISE_OUTPUTS = ("indices", "compressed_cache", "tail_ring")
"""Outputs an implementation can claim bitwise (:attr:`parity.implementations.Implementation.bitwise_outputs`)."""
KPOOL_BITWISE = ("compressed_cache", "tail_ring")
"""What this repository's kernels claim bitwise on every backend (docs/kernels.md "Compression
without spills": software exp, ``div_rn``, no FMA, RNE; the ring is a copy). Their index rows
are not claimed: the score's d-order differs from the reference's (random data: tie certificate)."""


@dataclass(frozen=True)
class RunSemantics:
    """What a run assumes of the implementation under test.

    Attributes:
        score_mode: ``"relu"`` / ``"merged"`` forced on every case, or ``None`` (each case's own).
        tie_policy: ``"canonical"`` or ``"any"``.
        validate_with: ``"kpool"`` or ``None``.
        interp_rne: emulate round-to-nearest-even fp32 -> bf16 casts under the interpreter.
        bitwise_outputs: outputs (of :data:`BITWISE_OUTPUTS`) the implementation claims bitwise:
            no certificate applies to them (parity-contract.md §3; issue 19 family 5).
    """

    score_mode: Optional[str] = None
    tie_policy: str = "canonical"
    validate_with: Optional[str] = None
    interp_rne: bool = False
    bitwise_outputs: Tuple[str, ...] = KPOOL_BITWISE

    def case(self, case):
        """``case`` with :attr:`score_mode` applied (:func:`with_score_mode`)."""
        return with_score_mode(case, self.score_mode)

    def forward(self, forward: Callable) -> Callable:
        """``forward`` wrapped for this run: validated first (``validate_with``), under RNE casts
        (``interp_rne``); ``forward`` itself when neither is set."""
        if self.validate_with == "kpool":
            forward = validated_by(forward)
        if self.interp_rne:
            forward = under_interp_rne(forward)
        return forward

    def text(self) -> str:
        """One line for the run header."""
        return (f"score_mode={self.score_mode or 'per case'} ties={self.tie_policy} "
                f"validate_with={self.validate_with or 'operator'} interp_rne={'on' if self.interp_rne else 'off'} "
                f"bitwise={','.join(self.bitwise_outputs) or 'none'}")


def from_options(options) -> RunSemantics:
    """The :class:`RunSemantics` recorded in a :class:`parity.session.RunOptions`."""
    return RunSemantics(score_mode=getattr(options, "score_mode", None),
                        tie_policy=getattr(options, "tie_policy", "canonical"),
                        validate_with=getattr(options, "validate_with", None),
                        interp_rne=bool(getattr(options, "interp_rne", False)),
                        bitwise_outputs=tuple(getattr(options, "bitwise_outputs", KPOOL_BITWISE)))


def resolve_semantics(implementation, *, score_mode: Optional[str] = None, ties: Optional[str] = None,
                      validate_with: Optional[str] = None, interp_rne: bool = False) -> RunSemantics:
    """Flags over the implementation's declared defaults: ``score_mode`` (else its declared mode,
    else per case), ``ties`` (else its ``tie_policy``), ``validate_with`` (``"none"`` = off; else
    ``kpool`` for an implementation that does not validate itself).

    Raises:
        ValueError: a value outside :data:`SCORE_MODES`, :data:`TIE_POLICIES`, :data:`VALIDATORS`.
    """
    for value, allowed, flag in ((score_mode, SCORE_MODES, "--score-mode"), (ties, TIE_POLICIES, "--ties"),
                                 (validate_with, VALIDATORS, "--validate-with")):
        if value is not None and value not in allowed:
            raise ValueError(f"{flag} must be one of {allowed}, got {value!r}")
    if validate_with is None:
        validate_with = None if implementation.validates else "kpool"
    return RunSemantics(score_mode=score_mode or implementation.score_mode,
                        tie_policy=ties or implementation.tie_policy,
                        validate_with=None if validate_with == "none" else validate_with,
                        interp_rne=bool(interp_rne),
                        bitwise_outputs=tuple(getattr(implementation, "bitwise_outputs", ())))


def with_score_mode(case, score_mode: Optional[str]):
    """``case`` with ``config.score_mode`` replaced (``None``: unchanged)."""
    if score_mode is None or case.config.score_mode == score_mode:
        return case
    return dataclasses.replace(case, config=dataclasses.replace(case.config, score_mode=score_mode))


_VALIDATE_ARGS = ("k", "gate", "q", "weights", "ape", "compressed_cache", "tail_cache", "positions", "cum_query_lens",
                  "raw_seq_lens", "seq_lens", "block_table", "slot_mapping", "tail_block_table", "tail_slot_mapping",
                  "max_pool_seq_len", "index_topk", "index_kpool", "score_mode", "compute_topk", "output_buffer",
                  "pack_tail", "always_select_tail")
_VALIDATE_DEFAULTS = dict(score_mode="relu", compute_topk=True, output_buffer=None, pack_tail=True,
                          always_select_tail=True)


def validated_by(forward: Callable) -> Callable:
    """``forward`` preceded by :func:`kpool.validation.validate_forward` on its keyword arguments
    (the caller's validation, as vLLM's attention backend does before the operators).

    An exception of the validation gets the attribute :data:`VALIDATED_BY` = ``"kpool"`` (the
    runner then says :data:`NOT_VALIDATED_NOTE`); the operator is not called. A call with
    ``validate=False`` (a captured graph's launch) skips the validation, like ours does.

    Raises: what :func:`validate_forward` raises (the :mod:`kpool.errors` exceptions), marked.
    """
    @functools.wraps(forward)
    def checked(**kwargs):
        if kwargs.get("validate", True):
            from kpool.validation import validate_forward
            args = {**_VALIDATE_DEFAULTS, **{n: kwargs[n] for n in _VALIDATE_ARGS if n in kwargs}}
            try:
                validate_forward(**args)
            except Exception as exc:
                setattr(exc, VALIDATED_BY, "kpool")
                raise
        return forward(**kwargs)
    return checked


def under_interp_rne(forward: Callable) -> Callable:
    """``forward`` run inside :func:`parity.interp_rne.round_to_nearest_even` (a no-op outside the
    interpreter)."""
    @functools.wraps(forward)
    def rne(**kwargs):
        from ..interp_rne import round_to_nearest_even
        with round_to_nearest_even():
            return forward(**kwargs)
    return rne


def validation_note(exc: Optional[BaseException]) -> str:
    """:data:`NOT_VALIDATED_NOTE` when ``exc`` came from the harness's validation, else ``""``."""
    return NOT_VALIDATED_NOTE if exc is not None and getattr(exc, VALIDATED_BY, None) else ""
