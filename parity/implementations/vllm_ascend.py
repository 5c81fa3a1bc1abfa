"""``--kernel vllm-ascend:PATH``: vLLM-Ascend's two GLM-5.3 KPool operators as one KPool forward.

The adapter loads ``vllm_ascend/ops/triton/glm5_next_kpool_tail_compress.py`` and
``vllm_ascend/ops/triton/glm5_next_lightning_indexer.py`` from a checkout at ``PATH`` (or from an
installed ``vllm_ascend`` when ``PATH`` is empty or ``installed``) and maps
``kpool.indexer.forward``'s keyword signature onto them: the tail compression and cache write
first (kpool-algorithm.md §5), then the indexer (§4), ``output_buffer`` and ``pack_tail`` passed
through, the ``[T, K_tok + P - 1]`` result viewed as our ``[T, 1, W]``. Cache layouts and metadata
conventions are the same as ours, so nothing is converted.

Two revisions of the tail compression are recognised by their signature
(:func:`inspect.signature`): the current one takes ``tail_slot_mapping`` (§3.3 ring slots);
the older one has no such argument and addresses the ring by ``tail_block_table[r, 0]`` and
``p % C`` itself. ``seq_lens`` of the compression are raw token lengths (our ``raw_seq_lens``).

Off-NPU the two files are loaded with only what they need to import and run under the Triton
interpreter (:func:`vendor_stubs`): ``vllm.triton_utils`` (``tl``, ``triton``),
``vllm_ascend.ops.triton.triton_utils.get_vectorcore_num`` and triton-ascend's ``extract_slice``
module, as :data:`sys.modules` entries that exist only while the files are being loaded; real
modules win when they import. No vLLM-Ascend code lives in this repository.

Declared semantics (parity-contract.md §3.2, kpool-algorithm.md §4.2, §9): score mode ``merged``
(the head-merged query), tie policy ``any`` (``torch.topk`` orders exact ties arbitrarily), and
``validates=False`` (the operators trust their metadata: the harness validates for them with
``--validate-with kpool``).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
import os
import sys
import types
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional

PREFIX = "vllm-ascend:"
INDEXER_FILE = "vllm_ascend/ops/triton/glm5_next_lightning_indexer.py"
COMPRESS_FILE = "vllm_ascend/ops/triton/glm5_next_kpool_tail_compress.py"
INDEXER_FN = "glm5_next_lightning_indexer_triton"
COMPRESS_FN = "glm5_next_kpool_tail_compress_and_write_cache_triton"
STUBBED_MODULES = ("vllm", "vllm.triton_utils", "vllm_ascend", "vllm_ascend.ops", "vllm_ascend.ops.triton",
                   "vllm_ascend.ops.triton.triton_utils", "triton.language.extra.cann",
                   "triton.language.extra.cann.extension")
"""What :func:`vendor_stubs` may provide, and only when the real module does not import."""
DEFAULT_VECTOR_CORES = 1
"""``get_vectorcore_num()`` off the NPU: one core, so a persistent-grid launch is one program per
row block (the interpreter runs programs one after another anyway)."""


def _extract_slice(*args, **kwargs):
    """Stand-in for triton-ascend's ``extract_slice``, which has no portable equivalent: calling
    it (a kernel path that needs the NPU's slicing) fails loudly instead of computing anything.

    Raises:
        kpool.errors.KPoolUnsupportedError: always.
    """
    from kpool.errors import KPoolUnsupportedError
    raise KPoolUnsupportedError("triton-ascend's extract_slice is not available off the NPU "
                                "(parity.implementations.vllm_ascend provides only an import stub)")


def _stub_modules() -> Dict[str, types.ModuleType]:
    """The stub modules by name (built fresh; see :data:`STUBBED_MODULES`)."""
    import triton
    import triton.language as tl

    def package(name):
        mod = types.ModuleType(name)
        mod.__path__ = []           # a package, so that submodule imports resolve through sys.modules
        return mod
    mods = {n: package(n) for n in STUBBED_MODULES}
    mods["vllm.triton_utils"].tl = tl
    mods["vllm.triton_utils"].triton = triton
    mods["vllm.triton_utils"].HAS_TRITON = True
    mods["vllm_ascend.ops.triton.triton_utils"].get_vectorcore_num = lambda: DEFAULT_VECTOR_CORES
    mods["triton.language.extra.cann.extension"].extract_slice = _extract_slice
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
    """Install the stubs of :data:`STUBBED_MODULES` that do not import for real, for the duration
    of the block; yields the names installed. Every name is removed again afterwards (the loaded
    operator modules keep their references), so nothing leaks into the rest of the process."""
    installed = []
    stubs = _stub_modules()
    try:
        for name in STUBBED_MODULES:
            parent = name.rpartition(".")[0]
            if name in installed or (not (parent in installed) and _importable(name)):
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


@functools.lru_cache(maxsize=None)
def load_operators(path: str) -> tuple:
    """``(compress, indexer)``: the two operator functions of the checkout at ``path`` (``""`` or
    ``"installed"``: the installed ``vllm_ascend`` package).

    Calls :func:`kpool.platform.install_interpreter_compat` first (NumPy >= 2.3 runtime loops under
    the interpreter, platform-numerics.md §5), then loads the files inside :func:`vendor_stubs`;
    once per path and process.

    Raises:
        FileNotFoundError: an operator file is missing from the checkout.
        ImportError / AttributeError: a file does not import or lacks its function.
    """
    from kpool.platform import install_interpreter_compat
    install_interpreter_compat()
    if path in ("", "installed"):
        indexer = importlib.import_module(INDEXER_FILE[:-3].replace("/", "."))
        compress = importlib.import_module(COMPRESS_FILE[:-3].replace("/", "."))
        return getattr(compress, COMPRESS_FN), getattr(indexer, INDEXER_FN)
    root = Path(path).expanduser().resolve()
    files = [root / COMPRESS_FILE, root / INDEXER_FILE]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"not a vLLM-Ascend checkout with the KPool operators: missing {missing}")
    tag = f"_parity_vendor_{abs(hash(str(root))):x}"
    with vendor_stubs():
        compress = _load_file(files[0], f"{tag}_{Path(COMPRESS_FILE).stem}")
        indexer = _load_file(files[1], f"{tag}_{Path(INDEXER_FILE).stem}")
    return getattr(compress, COMPRESS_FN), getattr(indexer, INDEXER_FN)


def has_tail_slot_mapping(compress: Callable) -> bool:
    """Whether the tail compression is the current revision (takes ``tail_slot_mapping``) rather
    than the older one (ring row ``tail_block_table[r, 0] * C + p % C`` computed inside)."""
    return "tail_slot_mapping" in inspect.signature(compress).parameters


def make_forward(compress: Callable, indexer: Callable) -> Callable:
    """A forward with ``kpool.indexer.forward``'s keyword signature on the two vendor operators.

    Shapes and dtypes as :func:`kpool.indexer.forward` (k, gate fp32 ``[T, D]``, q bf16 ``[T, H,
    D]``, weights ``[T, H]``, compressed_cache bf16 ``[N, B, 1, D]``, tail_cache fp32 ``[blocks, 2,
    C, D]``, metadata of :class:`kpool.metadata.KPoolMetadata`). ``validate`` and
    ``max_score_rows`` are accepted and ignored (the operators neither validate nor chunk on
    request); validation is the harness's (``--validate-with kpool``).

    Returns of the forward: int32 ``[T, 1, W]`` (a view of ``output_buffer`` when given), or
    ``None`` with ``compute_topk=False``.

    ``always_select_tail=False`` (HF's rows without the tail, kpool-algorithm.md §10) is the
    indexer's fixed-tail layout (``pack_tail=False``) cut to its ``K_tok`` history columns.

    Raises of the forward:
        kpool.errors.KPoolUnsupportedError: ``score_mode="relu"`` with ``compute_topk`` (the
        operators score head-merged only), before any launch; whatever the operators raise.
    """
    new_signature = has_tail_slot_mapping(compress)

    def forward(*, k, gate, q, weights, ape, compressed_cache, tail_cache, positions, cum_query_lens,
                raw_seq_lens, seq_lens, block_table, slot_mapping, tail_block_table, tail_slot_mapping,
                max_pool_seq_len: int, index_topk: int, index_kpool: int, score_mode: str = "merged",
                pack_tail: bool = True, compute_topk: bool = True, output_buffer=None, validate: bool = True,
                max_score_rows: Optional[int] = None, always_select_tail: bool = True):
        from kpool.errors import KPoolUnsupportedError
        if compute_topk and score_mode != "merged":
            raise KPoolUnsupportedError(f"vllm-ascend scores with the head-merged query only (score_mode='merged', "
                                        f"kpool-algorithm.md §4.2); got {score_mode!r}: run with --score-mode merged")
        ring = dict(tail_slot_mapping=tail_slot_mapping) if new_signature else {}
        compress(tail_cache, compressed_cache, k, gate, ape, positions, cum_query_lens, raw_seq_lens,
                 *ring.values(), tail_block_table, slot_mapping, index_kpool)
        if not compute_topk:
            return None
        select = dict(index_topk=index_topk, index_kpool=index_kpool, max_pool_seq_len=max_pool_seq_len)
        if not always_select_tail:
            # HF's no-tail rows are the history columns of the fixed-tail layout (§4.5, §10)
            out = indexer(q, compressed_cache, weights, cum_query_lens, seq_lens, block_table, positions,
                          **select, output_buffer=None, pack_tail=False)[:, :index_topk]
            if output_buffer is None:
                return out.contiguous().unsqueeze(1)
            T = out.shape[0]
            output_buffer[:T, :index_topk].copy_(out)
            output_buffer[:T, index_topk:] = -1
            return output_buffer[:T, :index_topk].unsqueeze(1)
        out = indexer(q, compressed_cache, weights, cum_query_lens, seq_lens, block_table, positions, **select,
                      output_buffer=output_buffer, pack_tail=pack_tail)
        return out[:, :index_topk + index_kpool - 1].unsqueeze(1)

    forward.__doc__ = (f"vllm-ascend forward ({'tail_slot_mapping' if new_signature else 'older ring'} "
                       "signature); see parity.implementations.vllm_ascend.make_forward")
    return forward


DECLARED = dict(score_mode="merged", tie_policy="any", validates=False, interpreter_ok=True, package=None)
"""The declared semantics of the kind (module docstring), the fields of its
:class:`parity.implementations.Implementation` besides the forward."""


def load(path: str) -> tuple:
    """``(forward, description)`` of ``vllm-ascend:PATH`` (the factory in
    :mod:`parity.implementations` builds the :class:`~parity.implementations.Implementation`
    from them and :data:`DECLARED`; this module does not import that package: no cycle).

    Raises:
        FileNotFoundError / ImportError / AttributeError: see :func:`load_operators`.
    """
    compress, indexer = load_operators(path)
    where = path or "installed vllm_ascend"
    revision = "tail_slot_mapping" if has_tail_slot_mapping(compress) else "older ring-addressing"
    return make_forward(compress, indexer), f"vLLM-Ascend operators at {os.fspath(where)} ({revision} tail compression)"
