"""The one list of what ``--kernel vllm-ascend:PATH`` may stand in for: every name the public
vLLM-Ascend KPool operator files import from outside themselves, by module (docs/vendor-revisions.md
records which revision imports which).

:func:`parity.implementations.vllm_ascend.vendor_stubs` provides a module of :data:`STANDINS` only
while the real module does not import, and only for the duration of loading the files; the
stand-in vendor checkouts of ``tests/vendor_standin`` import exactly these names (a test checks
them against this list). Nothing here is vLLM or vLLM-Ascend code.
"""
from __future__ import annotations

from typing import Dict, Tuple

STANDINS: Dict[str, Tuple[str, ...]] = {
    # every revision: ``from vllm.triton_utils import tl, triton``
    "vllm.triton_utils": ("tl", "triton"),
    # 3ebb4fc4, e11eaf0c, 91a8e97e, 5a705b99: ``from vllm.utils.math_utils import next_power_of_2``
    "vllm.utils.math_utils": ("next_power_of_2",),
    # 5a705b99 (shared-query decode kernel): extract_slice, get_vectorcore_num,
    # init_device_properties_triton; the earliest indexer (per-dimension loop): get_element
    "vllm_ascend.ops.triton.triton_utils": ("extract_slice", "get_element", "get_vectorcore_num",
                                            "init_device_properties_triton"),
}
"""Module -> the names the public files import from it."""

EXTENSIONS: Tuple[str, ...] = ("extract_slice", "get_element")
"""The triton-ascend language extensions among :data:`STANDINS` (``triton.language.extra.cann
.extension`` ops that ``vllm_ascend.ops.triton.triton_utils`` re-exports); emulated under the
Triton interpreter by :mod:`parity.implementations.vendor_ascend_ext`."""

COMPRESS_FILES: Tuple[Tuple[str, str, str], ...] = (
    ("tail", "vllm_ascend/ops/triton/glm5_next_kpool_tail_compress.py",
     "glm5_next_kpool_tail_compress_and_write_cache_triton"),
    ("state", "vllm_ascend/ops/triton/glm5_next_kpool_state_compress.py",
     "glm5_next_kpool_state_compress_and_write_cache_triton"),
)
"""``(kind, file, function)`` of the compression operator, newest first: a checkout is loaded with
the first of them it has (the tail ring, 11 or 12 arguments; else the older state cache)."""

INDEXER_FILE = "vllm_ascend/ops/triton/glm5_next_lightning_indexer.py"
INDEXER_FN = "glm5_next_lightning_indexer_triton"


def parents(module: str) -> Tuple[str, ...]:
    """``"a.b.c"`` -> ``("a", "a.b")``: the packages a stand-in module needs above it."""
    parts = module.split(".")
    return tuple(".".join(parts[:i]) for i in range(1, len(parts)))


def stub_module_names() -> Tuple[str, ...]:
    """Every module name a stand-in may provide (the :data:`STANDINS` modules and their parent
    packages), parents first."""
    names = []
    for module in STANDINS:
        for name in parents(module) + (module,):
            if name not in names:
                names.append(name)
    return tuple(names)
