"""``--kernel vllm-ascend:PATH``: vLLM-Ascend's GLM-5.3 KPool operators as one KPool forward.

The adapter loads the compression (``glm5_next_kpool_tail_compress.py``, else the older
``glm5_next_kpool_state_compress.py``) and ``glm5_next_lightning_indexer.py`` from a checkout at
``PATH`` (or from an installed ``vllm_ascend`` when ``PATH`` is empty or ``installed``) and maps
``kpool.indexer.forward``'s keyword signature onto them: the compression and cache writes first
(kpool-algorithm.md §5), then the indexer (§4). Every public revision is recognised by the real
signatures of its functions (:func:`describe`, docs/vendor-revisions.md):

* compression: the tail ring with ``tail_slot_mapping`` (12 arguments), the tail ring addressed
  by ``tail_block_table[r, 0]`` and ``p % C`` (11 arguments), or the paged state cache
  ``[blocks, block_size, 2D]`` (:mod:`.vendor_state` converts our ring to it and back, bit-exactly);
* indexer: with ``output_buffer``/``pack_tail`` (returns ``[T, 1, W]`` or ``[T, W]``), with
  ``compact_indices`` (its packed layout, padding rows masked), or the older one that writes the
  fixed layout only (tail at column ``K_tok``): the adapter then moves the tail to the packed
  column by §4.5's rule (the era's separate post-processing step), so the packed contract of the
  harness is compared on the operator's own values.

Off-NPU the files are loaded with stand-ins for exactly the names they import
(:data:`parity.implementations.vendor_manifest.STANDINS`), as :data:`sys.modules` entries that
exist only while the files load and only for modules that do not import for real; triton-ascend's
language extensions run under the interpreter (:mod:`.vendor_ascend_ext`). No vLLM-Ascend code
lives in this repository.

Declared semantics (parity-contract.md §3.2, kpool-algorithm.md §4.2, §9; :func:`declared`):
score mode ``merged`` (the head-merged query), tie policy ``any`` (``torch.topk`` orders exact ties
arbitrarily), ``validates=False`` (the operators trust their metadata: the harness validates for
them with ``--validate-with kpool``), ``interp_rne=True`` (their fp32 -> bf16 cache store rounds to
nearest even on the hardware; the interpreter truncates), and ``supports``: ``fixed-tail`` always
(every indexer revision can write the fixed layout), ``output-buffer`` only where the indexer takes
one; never ``no-tail`` (HF's ``always_select_tail=False``: no revision has it).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
import os
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional

from .vendor_manifest import COMPRESS_FILES, EXTENSIONS, INDEXER_FILE, INDEXER_FN, STANDINS, stub_module_names

PREFIX = "vllm-ascend:"
DEFAULT_VECTOR_CORES = 1
"""``get_vectorcore_num()`` off the NPU: one core, so a persistent-grid launch is one program
(the interpreter runs programs one after another anyway)."""


def next_power_of_2(n: int) -> int:
    """vLLM's ``vllm.utils.math_utils.next_power_of_2``: the smallest power of two ``>= n``; 1 for
    ``n < 1``."""
    return 1 if n < 1 else 1 << (int(n) - 1).bit_length()


def _stub_values() -> Dict[str, Dict[str, object]]:
    """The stand-in value of every name of :data:`STANDINS`, by module."""
    import triton
    import triton.language as tl

    from . import vendor_ascend_ext
    values = {"vllm.triton_utils": dict(tl=tl, triton=triton),
              "vllm.utils.math_utils": dict(next_power_of_2=next_power_of_2),
              "vllm_ascend.ops.triton.triton_utils": dict(
                  get_vectorcore_num=lambda: DEFAULT_VECTOR_CORES,
                  init_device_properties_triton=lambda: None,
                  **{name: getattr(vendor_ascend_ext, name) for name in EXTENSIONS})}
    assert {m: tuple(sorted(v)) for m, v in values.items()} == {m: tuple(sorted(n)) for m, n in STANDINS.items()}
    return values


def _stub_modules() -> Dict[str, types.ModuleType]:
    """Fresh stand-in modules for :func:`stub_module_names` (parents are empty packages)."""
    values = _stub_values()
    mods = {}
    for name in stub_module_names():
        mod = types.ModuleType(name)
        mod.__path__ = []           # a package, so that submodule imports resolve through sys.modules
        for attr, value in values.get(name, {}).items():
            setattr(mod, attr, value)
        mods[name] = mod
    return mods


def _importable(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@contextlib.contextmanager
def vendor_stubs() -> Iterator[list]:
    """Install the stand-ins of :func:`stub_module_names` that do not import for real, for the
    duration of the block; yields the names installed. Every name is removed again afterwards (the
    loaded operator modules keep their references), so nothing leaks into the rest of the process."""
    installed = []
    stubs = _stub_modules()
    try:
        for name in stub_module_names():
            parent = name.rpartition(".")[0]
            if not (parent in installed) and _importable(name):
                continue
            sys.modules[name] = stubs[name]
            installed.append(name)
        yield installed
    finally:
        for name in installed:
            sys.modules.pop(name, None)


def _load_file(path: Path, name: str) -> types.ModuleType:
    """Import the Python file ``path`` as module ``name`` (registered while it executes, as Triton's
    ``@jit`` needs its module in :data:`sys.modules`)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod


@dataclass(frozen=True)
class Operators:
    """The loaded operators of one checkout: ``compress`` (of kind ``compress_kind``: ``"tail"`` /
    ``"state"``), ``indexer``, and the modules they came from."""

    compress: Callable
    compress_kind: str
    indexer: Callable
    compress_module: types.ModuleType
    indexer_module: types.ModuleType


@functools.lru_cache(maxsize=None)
def load_operators(path: str) -> Operators:
    """The operators of the checkout at ``path`` (``""`` or ``"installed"``: the installed
    ``vllm_ascend`` package), loaded inside :func:`vendor_stubs`, once per path and process.

    Calls :func:`kpool.platform.install_interpreter_compat` first (NumPy >= 2.3 runtime loops
    under the interpreter, platform-numerics.md §5).

    Raises:
        FileNotFoundError: the checkout lacks the indexer or every compression file.
        ImportError / AttributeError: a file does not import or lacks its function.
    """
    from kpool.platform import install_interpreter_compat
    install_interpreter_compat()
    if path in ("", "installed"):
        def module_of(file):
            return importlib.import_module(file[:-3].replace("/", "."))

        def has(file):
            return _importable(file[:-3].replace("/", "."))
    else:
        root = Path(path).expanduser().resolve()
        tag = f"_parity_vendor_{abs(hash(str(root))):x}"

        def module_of(file):
            return _load_file(root / file, f"{tag}_{Path(file).stem}")

        def has(file):
            return (root / file).is_file()
    kind = next(((k, f, fn) for k, f, fn in COMPRESS_FILES if has(f)), None)
    if kind is None or not has(INDEXER_FILE):
        missing = [f for _, f, _ in COMPRESS_FILES] if kind is None else []
        missing += [] if has(INDEXER_FILE) else [INDEXER_FILE]
        raise FileNotFoundError(f"not a vLLM-Ascend checkout with the KPool operators: missing {missing} in {path!r}")
    with vendor_stubs():
        compress_module, indexer_module = module_of(kind[1]), module_of(INDEXER_FILE)
    return Operators(getattr(compress_module, kind[2]), kind[0], getattr(indexer_module, INDEXER_FN),
                     compress_module, indexer_module)


@dataclass(frozen=True)
class Revision:
    """What the adapter knows of a revision, from its functions' real signatures and imports.

    Attributes:
        compress: ``"tail-slots"`` (12 arguments, ``tail_slot_mapping``), ``"tail-ring"`` (11,
            ring addressed by ``tail_block_table[r, 0]``) or ``"state"`` (state cache).
        pack_flag: the indexer's layout switch, ``"pack_tail"`` or ``"compact_indices"`` (True:
            packed), or ``None`` (it writes the fixed layout only).
        output_buffer: the indexer takes ``output_buffer``.
        extensions: the triton-ascend extensions its files import (:data:`EXTENSIONS`).
        requestless_rows: the indexer accepts token rows with no request (``cum_query_lens``
            empty); False where its source raises on that before any launch (5a705b99:
            ``ValueError("... nonempty queries require request boundaries.")``).
    """

    compress: str
    pack_flag: Optional[str]
    output_buffer: bool
    extensions: tuple
    requestless_rows: bool = True

    @property
    def supports(self) -> frozenset:
        """The optional modes of ``parity.implementations.semantics.MODES`` it has."""
        return frozenset({"fixed-tail"} | ({"output-buffer"} if self.output_buffer else set())
                         | ({"requestless-rows"} if self.requestless_rows else set()))

    def text(self) -> str:
        """One line: compression kind, indexer layout, extensions."""
        ext = f", triton-ascend {'+'.join(self.extensions)}" if self.extensions else ""
        layout = (f"{self.pack_flag}/output_buffer" if self.output_buffer else self.pack_flag) if self.pack_flag \
            else "fixed tail layout"
        return f"{self.compress} compression, indexer with {layout}{ext}"


def describe(ops: Operators) -> Revision:
    """The :class:`Revision` of loaded operators."""
    compress_params = inspect.signature(ops.compress).parameters
    if ops.compress_kind == "state":
        compress = "state"
    else:
        compress = "tail-slots" if "tail_slot_mapping" in compress_params else "tail-ring"
    indexer_params = inspect.signature(ops.indexer).parameters
    used = tuple(n for n in EXTENSIONS if any(getattr(m, n, None) is not None for m in (ops.indexer_module,
                                                                                         ops.compress_module)))
    pack_flag = next((f for f in ("pack_tail", "compact_indices") if f in indexer_params), None)
    return Revision(compress, pack_flag, "output_buffer" in indexer_params, used,
                    requestless_rows=not REJECTS_REQUESTLESS.search(_source(ops.indexer)))


REJECTS_REQUESTLESS = re.compile(r"cum_query_lens\.numel\(\)\s*==\s*0\s*:\s*\n\s*raise\b")
"""An indexer that raises, before any launch, when it gets token rows but an empty
``cum_query_lens`` (the check of lijiahang226@5a705b99)."""


def _source(fn) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def packed_from_fixed(rows, positions, index_topk: int, index_kpool: int):
    """§4.5's packed row from the fixed one: history columns ``[0, K_tok)`` kept, the tail's
    ``P - 1`` columns moved from ``K_tok`` to ``min(tail_start, K_tok)`` (overwriting what is
    there), the columns freed at the end ``-1``. int32 ``[T, W]`` from int32 ``[T, W]``."""
    import torch
    K, P = index_topk, index_kpool
    out = torch.full_like(rows, -1)
    out[:, :K] = rows[:, :K]
    if P > 1 and rows.shape[0]:
        tail_start = (positions.to(torch.int64).clamp(min=-1) + 1) // P * P
        cols = tail_start.clamp(max=K)[:, None] + torch.arange(P - 1, device=rows.device)[None, :]
        out.scatter_(1, cols, rows[:, K:K + P - 1])
    return out


def make_forward(ops: Operators, rev: Optional[Revision] = None) -> Callable:
    """A forward with ``kpool.indexer.forward``'s keyword signature on the vendor operators.

    Shapes and dtypes as :func:`kpool.indexer.forward` (k, gate fp32 ``[T, D]``, q bf16 ``[T, H,
    D]``, weights ``[T, H]``, compressed_cache bf16 ``[N, B, 1, D]``, tail_cache fp32 ``[blocks, 2,
    C, D]``, metadata of :class:`kpool.metadata.KPoolMetadata`). ``validate`` and
    ``max_score_rows`` are accepted and ignored (the operators neither validate nor chunk on
    request).

    Returns of the forward: int32 ``[T, 1, W]`` (a view of ``output_buffer`` when given), or
    ``None`` with ``compute_topk=False``.

    Raises of the forward, before any launch: kpool.errors.KPoolUnsupportedError for
    ``score_mode="relu"`` with ``compute_topk`` (the operators score head-merged only) and for a
    mode outside :attr:`Revision.supports` (the harness reports those ``unsupported`` before it
    calls); then whatever the operators raise.
    """
    from .semantics import requestless_rows
    from .vendor_state import compress_through_state
    rev = rev or describe(ops)
    compress, indexer = ops.compress, ops.indexer

    def forward(*, k, gate, q, weights, ape, compressed_cache, tail_cache, positions, cum_query_lens,
                raw_seq_lens, seq_lens, block_table, slot_mapping, tail_block_table, tail_slot_mapping,
                max_pool_seq_len: int, index_topk: int, index_kpool: int, score_mode: str = "merged",
                pack_tail: bool = True, compute_topk: bool = True, output_buffer=None, validate: bool = True,
                max_score_rows: Optional[int] = None, always_select_tail: bool = True):
        from kpool.errors import KPoolUnsupportedError
        if compute_topk and score_mode != "merged":
            raise KPoolUnsupportedError(f"vllm-ascend scores with the head-merged query only (score_mode='merged', "
                                        f"kpool-algorithm.md §4.2); got {score_mode!r}: run with --score-mode merged")
        # §4.6 gives the operators' 1-D metadata as plain [R] / [T] tensors (only the block table
        # has "any strides"): a vLLM caller hands them contiguous, so the adapter does too
        positions, cum_query_lens, raw_seq_lens, seq_lens, slot_mapping, tail_slot_mapping = (
            None if t is None else t.contiguous()
            for t in (positions, cum_query_lens, raw_seq_lens, seq_lens, slot_mapping, tail_slot_mapping))
        needs = {"no-tail": not always_select_tail, "output-buffer": output_buffer is not None and compute_topk,
                 "requestless-rows": requestless_rows(dict(compute_topk=compute_topk, cum_query_lens=cum_query_lens,
                                                           positions=positions))}
        missing = sorted(m for m, needed in needs.items() if needed and m not in rev.supports)
        if missing:
            raise KPoolUnsupportedError(f"unsupported by this vllm-ascend revision: {', '.join(missing)}")
        if rev.compress == "state":
            compress_through_state(compress, k=k, gate=gate, ape=ape, compressed_cache=compressed_cache,
                                   tail_cache=tail_cache, positions=positions, cum_query_lens=cum_query_lens,
                                   raw_seq_lens=raw_seq_lens, tail_block_table=tail_block_table,
                                   tail_slot_mapping=tail_slot_mapping, slot_mapping=slot_mapping,
                                   index_kpool=index_kpool)
        else:
            ring = (tail_slot_mapping,) if rev.compress == "tail-slots" else ()
            compress(tail_cache, compressed_cache, k, gate, ape, positions, cum_query_lens, raw_seq_lens, *ring,
                     tail_block_table, slot_mapping, index_kpool)
        if not compute_topk:
            return None
        W = index_topk + index_kpool - 1
        args = (q, compressed_cache, weights, cum_query_lens, seq_lens, block_table, positions)
        select = dict(index_topk=index_topk, index_kpool=index_kpool, max_pool_seq_len=max_pool_seq_len)
        if rev.pack_flag:
            buffer = dict(output_buffer=output_buffer) if rev.output_buffer else {}
            out = indexer(*args, **select, **buffer, **{rev.pack_flag: pack_tail})
        else:
            out = indexer(*args, **select)
            if pack_tail:
                out = packed_from_fixed(out.flatten(1)[:, :W], positions, index_topk, index_kpool)   # T may be 0
        out = out if out.dim() == 3 else out[:, :W].unsqueeze(1)
        return out[:, :, :W]

    forward.__doc__ = f"vllm-ascend forward ({rev.text()}); see parity.implementations.vllm_ascend.make_forward"
    return forward


def declared(path: str) -> dict:
    """The declared semantics of the checkout at ``path`` (module docstring): the fields of its
    :class:`parity.implementations.Implementation` besides the forward."""
    rev = describe(load_operators(path))
    # stock Triton cannot compile a triton-ascend language extension: NPU, or the interpreter's emulation
    devices = frozenset({"cpu", "npu"}) if rev.extensions else None
    return dict(score_mode="merged", tie_policy="any", validates=False, interpreter_ok=True, package=None,
                interp_rne=True, supports=rev.supports, devices=devices)


def load(path: str) -> tuple:
    """``(forward, description)`` of ``vllm-ascend:PATH`` (the factory in
    :mod:`parity.implementations` builds the :class:`~parity.implementations.Implementation`
    from them and :func:`declared`; this module does not import that package: no cycle).

    Raises:
        FileNotFoundError / ImportError / AttributeError: see :func:`load_operators`.
    """
    ops = load_operators(path)
    rev = describe(ops)
    where = path or "installed vllm_ascend"
    return make_forward(ops, rev), f"vLLM-Ascend operators at {os.fspath(where)} ({rev.text()})"
