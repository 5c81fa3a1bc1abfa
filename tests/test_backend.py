"""Backend construction: hardware gate, PCP/DCP rejection, lazy kernel import
(kpool-algorithm.md §6; platform-numerics.md §2.2, §3)."""
import subprocess
import sys

import pytest

from kpool import SMALL
from kpool.backend import KPoolIndexerBackend, check_context_parallel
from kpool.errors import KPoolUnsupportedError
from kpool.hardware import ascend_family


@pytest.mark.parametrize("soc, family", [(220, "A2"), (223, "A2"), (225, "A2"), (250, "A3"), (255, "A3"), (260, "A5")])
def test_ascend_families_accepted(soc, family):
    assert ascend_family(soc) == family


@pytest.mark.parametrize("soc, label", [(200, "310P"), (206, "310P"), (100, "910 (A1)"), (104, "910 (A1)"),
                                        (240, "310B"), (243, "310B"), (226, "unknown"), (261, "unknown"), (0, "unknown")])
def test_other_socs_rejected_with_name(soc, label):
    with pytest.raises(KPoolUnsupportedError, match="requires Ascend A2, A3 or A5") as info:
        ascend_family(soc, "AscendX")
    assert label in str(info.value) and f"soc_version={soc}" in str(info.value)


@pytest.mark.parametrize("kwargs, flag", [
    (dict(prefill_context_parallel_size=2), "prefill_context_parallel_size"),
    (dict(decode_context_parallel_size=2), "decode_context_parallel_size"),
    (dict(pcp_world_size=4), "prefill-context-parallel-size"),
    (dict(dcp_world_size=2), "decode-context-parallel-size"),
])
def test_context_parallel_rejected_at_construction(kwargs, flag):
    with pytest.raises(KPoolUnsupportedError, match=flag):
        KPoolIndexerBackend(SMALL, **kwargs)


def test_no_context_parallel_passes():
    check_context_parallel()
    backend = KPoolIndexerBackend(SMALL)
    assert backend.supports_pcp is False and backend.can_return_lse_for_decode is False
    assert backend.profile.device in ("cpu", "cuda", "npu")


def _fresh_modules(code: str) -> set:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True, cwd=str(__import__("pathlib").Path(__file__).parents[1]))
    return set(out.stdout.split())


def test_metadata_import_does_not_load_triton():
    mods = _fresh_modules("import kpool.metadata, kpool.cache, kpool.config, kpool.backend")
    assert "kpool.metadata" in mods
    assert not any(m == "triton" or m.startswith("triton.") for m in mods)
    assert "kpool.ops.compress" not in mods


def test_backend_construction_imports_kernels():
    """The negative test above is meaningful: constructing the backend does load Triton."""
    mods = _fresh_modules("import os; os.environ['KPOOL_DEVICE']='cpu'\n"
                          "from kpool.backend import KPoolIndexerBackend; from kpool import SMALL; KPoolIndexerBackend(SMALL)")
    assert "triton" in mods and "kpool.ops.compress" in mods
