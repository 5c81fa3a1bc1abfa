"""Implementations of the KPool forward that the harness can name (``--kernel SPEC``).

Stage 2 of ``parity/`` (docs/design.md "Layout"): the forwards under test and how one is called:
the kinds below and their declared semantics (:mod:`.semantics`, interpreter round-to-nearest-even
:mod:`.interp_rne`), planted-fault copies of ``kpool`` (:mod:`.mutants`), calling a forward on a
device (:mod:`.forwards`) and recording its calls (:mod:`.recording`). May import the findings
folder only.

An :class:`Implementation` is a forward with ``kpool.indexer.forward``'s signature plus what the
harness must know about its semantics to judge it fairly (parity-contract.md §1-§5): the score
mode it computes, its top-k tie policy, whether it validates its own input, whether it can run
under the Triton interpreter, and the package whose kernel programs can be localised.

Kinds are registered by spec prefix (:func:`register_kind`); :func:`resolve` turns a spec into
an :class:`Implementation`:

* ``kpool``: this repository's kernels (:mod:`kpool.indexer`);
* ``mutant:NAME``: a planted fault (:mod:`parity.implementations.mutants`);
* ``git:REV``: this repository's kernels at a git revision (:mod:`.git_rev`);
* ``vllm-ascend:PATH``: vLLM-Ascend's two operators from a checkout (:mod:`.vllm_ascend`);
  ``vllm-ascend:PATH@REV``: from git revision REV of that checkout (:mod:`.checkout_rev`);
* ``package.module:function``: any function with ``kpool.indexer.forward``'s signature, or an
  :class:`Implementation` object (declared semantics: tie policy, ``supports``...).

Later kinds (a vendor checkout, a git revision of this repository) add a module here and call
:func:`register_kind`; nothing else in the harness changes.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Tuple

from .semantics import KPOOL_BITWISE

DEFAULT = "kpool"
"""The spec of the production kernels."""


@dataclass(frozen=True)
class Implementation:
    """One forward under test and its declared semantics.

    Attributes:
        spec: the name it was resolved from (``"kpool"``, ``"mutant:ape-reversed"``...).
        forward: callable with ``kpool.indexer.forward``'s keyword signature, returning int32
            ``[T, 1, W]`` (or ``None`` when ``compute_topk=False``), updating the caches in place.
        score_mode: the score mode it computes (``"relu"`` / ``"merged"``, kpool-algorithm.md
            §4.2), or ``None`` when it follows each case's configuration.
        tie_policy: ``"canonical"`` (exact ties lower id first, parity-contract.md §3.2) or
            ``"any"`` (a row passes when it is a valid top-k of its own scores).
        validates: it rejects bad input itself (kpool-algorithm.md §9); when ``False`` the
            harness validates for it (``--validate-with kpool``) or reports "not validated".
        interpreter_ok: it can run under ``TRITON_INTERPRET=1`` (CPU).
        package: the importable package whose ``ops`` kernels :mod:`parity.checking.programs` can
            localise (``"kpool"`` or a mutant copy), or ``None``.
        description: one line for ``python -m parity list``.
        supports: the optional modes of :data:`parity.implementations.semantics.MODES` it has
            (``"no-tail"``: ``always_select_tail=False``; ``"fixed-tail"``: ``pack_tail=False``;
            ``"output-buffer"``: a caller ``output_buffer``), or ``None`` for every mode. A step
            of any suite that needs another mode is reported ``unsupported`` ("unsupported by
            IMPL": counted, never a crash or a failure, ignored by the exit status; the operator
            is not called, :func:`parity.implementations.semantics.gated_by_modes`).
        interp_rne: its fp32 -> bf16 casts round to nearest even on the hardware, so a run under
            the interpreter emulates that (``--interp-rne``) unless ``--no-interp-rne`` is given.
        bitwise_outputs: the outputs it claims bitwise on every backend (a subset of
            :data:`parity.implementations.semantics.BITWISE_OUTPUTS`); the certificates of
            parity-contract.md §3 apply only to the others (issue 19 family 5). Default none:
            an operator with ``tl.exp`` or HF gets the rounding certificate on its cache.
        devices: the backends it runs on (``"cpu"`` = the Triton interpreter, ``"cuda"``,
            ``"npu"``), or ``None`` for all: a vLLM-Ascend revision that uses a triton-ascend
            language extension runs on an NPU or under the interpreter's emulation, never
            compiled by stock Triton (:func:`device_refusal`).
    """

    spec: str
    forward: Callable
    score_mode: Optional[str] = None
    tie_policy: str = "canonical"
    validates: bool = True
    interpreter_ok: bool = True
    package: Optional[str] = None
    description: str = ""
    supports: Optional[frozenset] = None
    interp_rne: bool = False
    bitwise_outputs: Tuple[str, ...] = ()
    devices: Optional[frozenset] = None

    def with_semantics(self, **changes) -> "Implementation":
        """A copy with some declared semantics overridden (the CLI's ``--score-mode``,
        ``--ties``...)."""
        return replace(self, **changes)


def device_refusal(implementation: Implementation, device: str) -> Optional[str]:
    """Why ``implementation`` cannot run on ``device`` (``"cpu"``, ``"cuda"``, ``"npu"``), or
    ``None`` when it can (:attr:`Implementation.devices`). The run refuses it once, as a usage
    error, instead of crashing on every step that reaches the kernel it cannot compile."""
    allowed = implementation.devices
    if allowed is None or str(device) in allowed:
        return None
    others = " or ".join(f"--device {d}" for d in sorted(allowed))
    return (f"{implementation.spec} cannot run on {device}: {implementation.description or 'it'} needs a backend "
            f"it declares ({', '.join(sorted(allowed))}); run it with {others}")


@dataclass(frozen=True)
class Kind:
    """A family of specs: ``prefix`` (``"mutant:"``; ``""`` for the exact spec ``name``), the
    factory ``fn(rest) -> Implementation`` and a usage line for ``list``."""

    name: str
    prefix: str
    factory: Callable[[str, str], Implementation] = field(repr=False)
    usage: str = ""


_KINDS: Dict[str, Kind] = {}


def register_kind(name: str, prefix: str, factory: Callable[[str, str], Implementation], usage: str = "") -> None:
    """Register a kind of spec. ``factory(spec, rest)`` gets the whole spec and what follows
    ``prefix``. A later registration of the same ``name`` replaces the earlier one."""
    _KINDS[name] = Kind(name, prefix, factory, usage)


def kinds() -> List[Kind]:
    """The registered kinds, in registration order."""
    return list(_KINDS.values())


def resolve(spec: str) -> Implementation:
    """The :class:`Implementation` a spec names.

    Raises:
        ValueError: the spec matches no kind (the message lists the kinds' usages).
        KeyError: unknown mutant; ImportError / AttributeError: a module or function that does
        not exist (raised by the kind's factory).
    """
    _builtin()
    for kind in _KINDS.values():
        if kind.prefix and spec.startswith(kind.prefix):
            return kind.factory(spec, spec[len(kind.prefix):])
    for kind in _KINDS.values():
        if not kind.prefix and spec == kind.name:
            return kind.factory(spec, "")
    if ":" in spec and not spec.startswith(":") and not spec.endswith(":"):
        return _module_function(spec, spec)
    raise ValueError(f"unknown implementation {spec!r}; known kinds: "
                     + "; ".join(k.usage or k.name for k in _KINDS.values()) + "; package.module:function")


def _kpool(spec: str, rest: str) -> Implementation:
    from kpool.indexer import forward
    return Implementation(spec, forward, package="kpool", description="this repository's Triton kernels",
                          bitwise_outputs=KPOOL_BITWISE)


def _mutant(spec: str, rest: str) -> Implementation:
    from .mutants import MUTANTS, load_mutant, package_name
    if rest not in MUTANTS:
        raise KeyError(f"unknown mutant {rest!r}; known: {', '.join(MUTANTS)}")
    return Implementation(spec, load_mutant(rest).forward, package=package_name(rest),
                          description=f"planted fault {rest}", bitwise_outputs=KPOOL_BITWISE)


def _module_function(spec: str, rest: str) -> Implementation:
    """``package.module:NAME``: a function with ``kpool.indexer.forward``'s signature (every
    semantics the default), or an :class:`Implementation` object (its declared semantics, e.g. a
    reduced ``supports``; the spec becomes ``spec``)."""
    module, name = rest.rsplit(":", 1)
    obj = getattr(importlib.import_module(module), name)
    if isinstance(obj, Implementation):
        return replace(obj, spec=spec, description=obj.description or f"{module}.{name}")
    return Implementation(spec, obj, description=f"{module}.{name}")


def _git_revision(spec: str, rest: str) -> Implementation:
    from .git_rev import load_revision, package_name, resolve_revision
    sha = resolve_revision(rest)
    return Implementation(spec, load_revision(sha).forward, package=package_name(sha),
                          description=f"this repository's kernels at {rest} ({sha[:12]})",
                          bitwise_outputs=KPOOL_BITWISE)


def _vllm_ascend(spec: str, rest: str) -> Implementation:
    from .checkout_rev import resolve_checkout
    from .vllm_ascend import declared, load
    path, at = resolve_checkout(rest)        # PATH@REV: a temporary worktree's copy (checkout_rev)
    forward, description = load(path)
    return Implementation(spec, forward, description=description + at, **declared(path))


def _builtin() -> None:
    if "kpool" not in _KINDS:
        register_kind("kpool", "", _kpool, "kpool")
        register_kind("mutant", "mutant:", _mutant, "mutant:NAME")
        register_kind("git", "git:", _git_revision, "git:REV")
        register_kind("vllm-ascend", "vllm-ascend:", _vllm_ascend,
                      "vllm-ascend:PATH[@REV] (a vLLM-Ascend checkout, or git revision REV of it; empty: installed)")


def usages() -> Tuple[str, ...]:
    """Usage lines of every kind, for ``--help`` and ``list`` (no torch import)."""
    _builtin()
    return tuple(k.usage or k.name for k in _KINDS.values()) + ("package.module:function",)
