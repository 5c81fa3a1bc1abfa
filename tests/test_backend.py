"""Backend construction: hardware gate, PCP/DCP rejection, lazy kernel import
(kpool-algorithm.md §6; platform-numerics.md §2.2, §3)."""
import subprocess
import sys

import pytest

from kpool import SMALL
from kpool.backend import KPoolIndexerBackend, check_context_parallel
from kpool.errors import (KPoolConfigError, KPoolMetadataError, KPoolShapeError, KPoolTypeError,
                          KPoolUnsupportedError)
from kpool.hardware import ascend_family
from kpool.metadata import KPoolMetadata
from tests.helpers import small_batch
from tests.rejection import assert_rejected
from parity.checking.compare import assert_bitwise_equal


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
    with pytest.raises(KPoolUnsupportedError, match=flag) as info:
        KPoolIndexerBackend(SMALL, **kwargs)
    assert info.value.rule == "context-parallel-unsupported"


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


# ---- bad parallel sizes and a config that disagrees with the call (issue 9 point 6) --------------

@pytest.mark.parametrize("kwargs, error, rule", [
    (dict(decode_context_parallel_size=-1), KPoolConfigError, "context-parallel-size"),
    (dict(dcp_world_size=0), KPoolConfigError, "context-parallel-size"),
    (dict(prefill_context_parallel_size=-2), KPoolConfigError, "context-parallel-size"),
    (dict(decode_context_parallel_size=1.0), KPoolTypeError, "scalar-int-type"),
    (dict(pcp_world_size=True), KPoolTypeError, "scalar-int-type"),
    (dict(decode_context_parallel_size=2), KPoolUnsupportedError, "context-parallel-unsupported"),
])
def test_bad_parallel_sizes_are_rejected_by_name(kwargs, error, rule):
    """A negative DCP size used to pass as "no DCP"."""
    with pytest.raises(error) as info:
        KPoolIndexerBackend(SMALL, **kwargs)
    assert info.value.rule == rule


def test_backend_config_must_be_a_kpool_config():
    with pytest.raises(KPoolTypeError, match="KPoolConfig") as info:
        KPoolIndexerBackend(dict(index_kpool=4))
    assert info.value.rule == "argument-type"


def _call(data_cfg, device):
    """caches, metadata and inputs built for ``data_cfg`` (small_batch's three requests)."""
    caches, kw = small_batch(data_cfg, device=device)
    tensors = {n: kw[n] for n in ("positions", "cum_query_lens", "raw_seq_lens", "seq_lens", "block_table",
                                  "slot_mapping", "tail_block_table", "tail_slot_mapping")}
    meta = KPoolMetadata(max_pool_seq_len=kw["max_pool_seq_len"], **tensors)
    inputs = {n: kw[n] for n in ("k", "gate", "q", "weights", "ape")}
    return caches, meta, inputs


def _p2(kw):
    kw["ape"] = kw["ape"][:2]


def _d32(kw):
    """inputs widened to D = 32 (the backend's), caches left at 16"""
    kw.update(k=kw["k"].repeat(1, 2), gate=kw["gate"].repeat(1, 2), q=kw["q"].repeat(1, 1, 2),
              ape=kw["ape"].repeat(1, 2))


# (backend config, call data config, input edit, error, rule)
MISMATCHES = {
    "ring-capacity-larger": (SMALL.with_(num_speculative_tokens=1), SMALL, None, KPoolShapeError,
                             "config-ring-capacity"),
    "ring-capacity-smaller": (SMALL, SMALL.with_(num_speculative_tokens=3), None, KPoolShapeError,
                              "config-ring-capacity"),
    "head-dim": (SMALL.with_(index_head_dim=32), SMALL, None, KPoolShapeError, "config-head-dim"),
    "cache-head-dim": (SMALL.with_(index_head_dim=32), SMALL, _d32, KPoolShapeError, "config-head-dim"),
    "k-head-dim": (SMALL, SMALL, lambda kw: kw.update(k=kw["k"][:, :8]), KPoolShapeError, "config-head-dim"),
    "heads": (SMALL.with_(index_n_heads=4), SMALL, None, KPoolShapeError, "config-heads"),
    # P: the backend's P = 2 (same C = 4) on data built for P = 4
    "pool-size-ape": (SMALL.with_(index_kpool=2, tail_ring_capacity=4), SMALL, None, KPoolShapeError, "shape"),
    "pool-size-metadata": (SMALL.with_(index_kpool=2, tail_ring_capacity=4), SMALL, _p2, KPoolMetadataError,
                           "seq-lens-pools"),
}


@pytest.mark.parametrize("name", sorted(MISMATCHES))
def test_backend_rejects_a_call_its_config_disagrees_with(name, device, torch_device):
    backend_cfg, data_cfg, edit, error, rule = MISMATCHES[name]
    backend = KPoolIndexerBackend(backend_cfg, device=device)
    caches, meta, inputs = _call(data_cfg, torch_device)
    if edit is not None:
        edit(inputs)
    watched = {**inputs, **meta.tensors()}
    assert_rejected(lambda: backend.forward(**inputs, caches=caches, metadata=meta), error, rule, watched,
                    (caches.compressed_backing, caches.tail_backing))


@pytest.mark.parametrize("what", ["caches", "metadata"])
def test_backend_arguments_must_be_caches_and_metadata(what, device, torch_device):
    backend = KPoolIndexerBackend(SMALL, device=device)
    caches, meta, inputs = _call(SMALL, torch_device)
    args = dict(caches=caches, metadata=meta)
    args[what] = meta.forward_kwargs() if what == "metadata" else (caches.compressed_cache, caches.tail_cache)
    assert_rejected(lambda: backend.forward(**inputs, **args), KPoolTypeError, "argument-type", inputs,
                    (caches.compressed_backing, caches.tail_backing))


@pytest.mark.interpreter_ok
def test_backend_with_a_matching_config_runs_the_forward(device, torch_device):
    """The checks above are not vacuous: the same call with the data's own config is accepted
    and gives kpool.indexer.forward's result."""
    from kpool.indexer import forward
    caches, meta, inputs = _call(SMALL, torch_device)
    twin = caches.clone()
    got = KPoolIndexerBackend(SMALL, device=device).forward(**inputs, caches=caches, metadata=meta)
    want = forward(**inputs, compressed_cache=twin.compressed_cache, tail_cache=twin.tail_cache,
                   index_topk=SMALL.index_topk, index_kpool=SMALL.index_kpool, **meta.forward_kwargs())
    assert_bitwise_equal(got, want)
    assert_bitwise_equal(caches.tail_backing, twin.tail_backing)
