"""The semantics a run judges an implementation by (``--score-mode``, ``--ties``,
``--validate-with``, ``--interp-rne``), from the CLI's flags or the implementation's declared
defaults (:class:`parity.implementations.Implementation`).

* score mode (kpool-algorithm.md §4.2): every case's ``config.score_mode`` is replaced
  (:func:`with_score_mode`), so both sides, the oracle and the public cases' stated values follow
  the implementation's mode;
* tie policy (parity-contract.md §3.2): handed to :func:`parity.running.runner.run_case`;
* validation outside the operator (kpool-algorithm.md §9, parity-contract.md §5):
  :func:`validated_by` runs :func:`kpool.validation.validate_forward` before the operator, and
  marks what it raises so the bad-input checks say "not validated by the operator";
* ``--interp-rne``: the forward runs inside :func:`parity.implementations.interp_rne.round_to_nearest_even`;
* declared modes (:data:`MODES`, ``Implementation.supports``): a call that needs a mode the
  implementation does not have raises :class:`UnsupportedModeError` before the operator is asked
  (:func:`gated_by_modes`); the runner reports that step as ``unsupported`` ("unsupported by
  IMPL", :data:`parity.findings.vocabulary.UNSUPPORTED`), never as a crash or a failure.

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
MODES = ("no-tail", "fixed-tail", "output-buffer", "requestless-rows")
"""Optional modes of ``kpool.indexer.forward`` an implementation may lack: ``no-tail``
(``always_select_tail=False``, kpool-algorithm.md §10), ``fixed-tail`` (``pack_tail=False``,
§4.5), ``output-buffer`` (a caller ``output_buffer``, §4.6), ``requestless-rows`` (a selection
over token rows with no request at all: ``R = 0``, ``T > 0``, a FULL-mode replay of padding
only; §5.5 and §9 item 3 make it an empty batch, every row ``-1``)."""


class UnsupportedModeError(Exception):
    """A forward call needs modes the implementation under test declares it does not support.

    Attributes:
        modes: the needed, unsupported modes (subset of :data:`MODES`), sorted.
        implementation: the implementation's spec (``"vllm-ascend:PATH"``...).
    """

    def __init__(self, modes, implementation: str = ""):
        self.modes = tuple(sorted(modes))
        self.implementation = implementation
        super().__init__(f"unsupported by {implementation or 'the implementation'}: the step needs "
                         f"{', '.join(self.modes)} ({', '.join(MODE_ARGUMENTS[m] for m in self.modes)}), "
                         "which it declares it does not support")


MODE_ARGUMENTS = {"no-tail": "always_select_tail=False", "fixed-tail": "pack_tail=False",
                  "output-buffer": "a caller output_buffer",
                  "requestless-rows": "token rows but no request: cum_query_lens empty"}
"""The forward argument behind each mode of :data:`MODES`."""


def modes_needed(kwargs: dict) -> frozenset:
    """The modes of :data:`MODES` a forward call with keyword arguments ``kwargs`` needs."""
    needed = set()
    if kwargs.get("always_select_tail", True) is False:
        needed.add("no-tail")
    if kwargs.get("pack_tail", True) is False:
        needed.add("fixed-tail")
    if kwargs.get("output_buffer") is not None:
        needed.add("output-buffer")
    if requestless_rows(kwargs):
        needed.add("requestless-rows")
    return frozenset(needed)


def requestless_rows(kwargs: dict) -> bool:
    """Whether a forward call asks for a selection over token rows with no request (``R = 0``,
    ``T > 0``: ``cum_query_lens`` empty, ``positions`` not)."""
    cum, positions = kwargs.get("cum_query_lens"), kwargs.get("positions")
    return (kwargs.get("compute_topk", True) is not False and cum is not None and positions is not None
            and cum.numel() == 0 and positions.numel() > 0)


def check_modes(supports) -> Optional[frozenset]:
    """``supports`` as a frozenset of :data:`MODES` (``None`` stays ``None``: every mode).

    Raises:
        ValueError: a name outside :data:`MODES`.
    """
    if supports is None:
        return None
    supports = frozenset(supports)
    unknown = sorted(supports - set(MODES))
    if unknown:
        raise ValueError(f"unknown mode(s) {unknown}; known: {list(MODES)}")
    return supports


def gated_by_modes(forward: Callable, supports, implementation: str = "") -> Callable:
    """``forward`` preceded by a check of :func:`modes_needed` against ``supports`` (``None``:
    ``forward`` itself).

    Raises (of the returned forward): :class:`UnsupportedModeError` when the call needs a mode
    outside ``supports``; the operator is then not called.
    """
    supports = check_modes(supports)
    if supports is None:
        return forward

    @functools.wraps(forward)
    def gated(**kwargs):
        missing = modes_needed(kwargs) - supports
        if missing:
            REFUSED[0] += 1
            raise UnsupportedModeError(missing, implementation)
        return forward(**kwargs)
    return gated


REFUSED = [0]
"""Forward calls refused by :func:`gated_by_modes` in this process so far (the generated suite,
whose examples are not tabled, reports the calls refused during its run)."""


def is_unsupported(exc: Optional[BaseException]) -> bool:
    """Whether ``exc`` is an :class:`UnsupportedModeError` (the step's outcome is ``unsupported``)."""
    return isinstance(exc, UnsupportedModeError)
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
        supports: the modes of :data:`MODES` the implementation has (sorted tuple), or ``None``
            (every mode); steps needing another are ``unsupported`` (:func:`gated_by_modes`).
        implementation: the spec named in "unsupported by IMPL" messages.
        bitwise_outputs: outputs (of :data:`BITWISE_OUTPUTS`) the implementation claims bitwise:
            no certificate applies to them (parity-contract.md §3; issue 19 family 5).
    """

    score_mode: Optional[str] = None
    tie_policy: str = "canonical"
    validate_with: Optional[str] = None
    interp_rne: bool = False
    supports: Optional[tuple] = None
    implementation: str = dataclasses.field(default="", compare=False)
    bitwise_outputs: Tuple[str, ...] = KPOOL_BITWISE

    def case(self, case):
        """``case`` with :attr:`score_mode` applied (:func:`with_score_mode`)."""
        return with_score_mode(case, self.score_mode)

    def forward(self, forward: Callable) -> Callable:
        """``forward`` wrapped for this run: validated first (``validate_with``), then gated by
        the declared modes (``supports``), under RNE casts (``interp_rne``); ``forward`` itself
        when none is set."""
        forward = gated_by_modes(forward, self.supports, self.implementation)
        if self.validate_with == "kpool":
            forward = validated_by(forward)
        if self.interp_rne:
            forward = under_interp_rne(forward)
        return forward

    def text(self) -> str:
        """One line for the run header."""
        return (f"score_mode={self.score_mode or 'per case'} ties={self.tie_policy} "
                f"validate_with={self.validate_with or 'operator'} interp_rne={'on' if self.interp_rne else 'off'} "
                f"bitwise={','.join(self.bitwise_outputs) or 'none'}"
                + ("" if self.supports is None else f" supports={','.join(self.supports) or 'none'}"))


def from_options(options) -> RunSemantics:
    """The :class:`RunSemantics` recorded in a :class:`parity.sessions.session.RunOptions`."""
    supports = getattr(options, "supports", None)
    return RunSemantics(score_mode=getattr(options, "score_mode", None),
                        tie_policy=getattr(options, "tie_policy", "canonical"),
                        validate_with=getattr(options, "validate_with", None),
                        interp_rne=bool(getattr(options, "interp_rne", False)),
                        supports=None if supports is None else tuple(sorted(supports)),
                        implementation=getattr(options, "implementation", "") or getattr(options, "kernel", "") or "",
                        bitwise_outputs=tuple(getattr(options, "bitwise_outputs", KPOOL_BITWISE)))


def resolve_semantics(implementation, *, score_mode: Optional[str] = None, ties: Optional[str] = None,
                      validate_with: Optional[str] = None, interp_rne: Optional[bool] = None,
                      supports=None) -> RunSemantics:
    """Flags over the implementation's declared defaults: ``score_mode`` (else its declared mode,
    else per case), ``ties`` (else its ``tie_policy``), ``validate_with`` (``"none"`` = off; else
    ``kpool`` for an implementation that does not validate itself), ``interp_rne`` (``None``: its
    declared ``interp_rne``); the modes are the
    implementation's ``supports`` (``None``: every mode), unless ``supports`` (``--supports``)
    names them: a list of :data:`MODES`, or ``["all"]`` for every mode.

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
                        interp_rne=bool(getattr(implementation, "interp_rne", False) if interp_rne is None
                                        else interp_rne),
                        supports=_supports(implementation, supports),
                        implementation=getattr(implementation, "spec", ""),
                        bitwise_outputs=tuple(getattr(implementation, "bitwise_outputs", ())))


def _supports(implementation, flag) -> Optional[tuple]:
    """The modes a run assumes: the ``--supports`` flag (``["all"]``: ``None``), else declared."""
    if flag is not None:
        return None if "all" in flag else tuple(sorted(check_modes(flag)))
    declared = getattr(implementation, "supports", None)
    return None if declared is None else tuple(sorted(check_modes(declared)))


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
    """``forward`` run inside :func:`parity.implementations.interp_rne.round_to_nearest_even` (a no-op outside the
    interpreter)."""
    @functools.wraps(forward)
    def rne(**kwargs):
        from .interp_rne import round_to_nearest_even
        with round_to_nearest_even():
            return forward(**kwargs)
    return rne


def validation_note(exc: Optional[BaseException]) -> str:
    """:data:`NOT_VALIDATED_NOTE` when ``exc`` came from the harness's validation, else ``""``."""
    return NOT_VALIDATED_NOTE if exc is not None and getattr(exc, VALIDATED_BY, None) else ""
