"""The ``max_query_len`` launch hint (``kpool.indexer.forward``, ``KPoolMetadata.max_query_len``;
kpool-algorithm.md §4.1 tiling, §6): a batch of more than ``DECODE_ROWS`` rows whose requests are
all decode-sized (decode, MTP verify) skips the prefill score kernel and its row-block helper when
the hint says so, with the same rows and caches bit for bit; a long request keeps them; the
metadata builder sets the hint, a captured hint cannot grow on replay, and the backend passes it.
Runs on the resolved device (the CPU interpreter by default)."""
import os

os.environ.setdefault("KPOOL_DEVICE", "cpu")
from kpool.platform import resolve_device, torch_device  # noqa: E402

DEV = torch_device(resolve_device())

import pytest  # noqa: E402
import torch  # noqa: E402

from kpool import SMALL, errors  # noqa: E402
from kpool.indexer import forward  # noqa: E402
from kpool.metadata import BatchSpec, RequestSpec, build_metadata  # noqa: E402
from kpool.ops import compress, plan, score  # noqa: E402
from parity.checking.compare import bits, same_bits  # noqa: E402
from tests.helpers import small_batch  # noqa: E402

pytestmark = pytest.mark.interpreter_ok
PREFILL_KERNELS = {"_prefill_blocks_kernel", "_score_prefill_kernel"}
CACHE_KERNELS = {"_compress_kernel", "_ring_write_kernel", "_update_kernel"}
MTP3 = SMALL.with_(num_speculative_tokens=3)        # ring capacity C = P + 3: one cache launch up to 4 rows
BATCHES = {   # (cached_len, query_len) per request; every batch has T > DECODE_ROWS rows
    "decode-12": ((5,) * 12, (1,) * 12),
    "mtp-3x4": ((2, 9, 4), (4, 4, 4)),
    "decode-and-empty": ((7, 3, 0, 6), (8, 0, 0, 2)),
}


def _launched(fn, names=PREFILL_KERNELS) -> list:
    """Names of the prefill score kernels (or ``names``) that ``fn()`` launches, in order (the
    modules' kernel objects wrapped: any interpreter or backend launches them through
    ``kernel[grid](...)``)."""
    launched, saved = [], {n: (module, getattr(module, n)) for module in (score, compress)
                           for n in names if hasattr(module, n)}

    class Spy:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            launched.append(self.name)
            return saved[self.name][1][grid]
    try:
        for n, (module, _) in saved.items():
            setattr(module, n, Spy(n))
        fn()
    finally:
        for n, (module, kernel) in saved.items():
            setattr(module, n, kernel)
    return launched


def _batch(cached, qlens, config=SMALL):
    caches, kw = small_batch(config, device=DEV, requests=tuple(zip(cached, qlens)), num_pages=64)
    return caches, kw


def _run(caches, kw, **extra):
    """Rows and both caches' bits of one forward on a copy of ``caches``."""
    work = caches.clone()
    out = forward(**dict(kw, compressed_cache=work.compressed_cache, tail_cache=work.tail_cache), **extra)
    return out.cpu(), bits(work.compressed_backing).cpu(), bits(work.tail_backing).cpu()


@pytest.mark.parametrize("name", list(BATCHES))
def test_decode_sized_batch_skips_the_prefill_launches_with_the_same_result(name):
    cached, qlens = BATCHES[name]
    assert sum(qlens) > plan.DECODE_ROWS and max(qlens) <= plan.DECODE_ROWS
    caches, kw = _batch(cached, qlens)
    plain, hinted = {}, {}
    plain_names = _launched(lambda: plain.update(r=_run(caches, kw)))
    hinted_names = _launched(lambda: hinted.update(r=_run(caches, kw, max_query_len=max(qlens))))
    assert sorted(plain_names) == sorted(PREFILL_KERNELS) and hinted_names == []
    for a, b in zip(plain["r"], hinted["r"]):
        assert same_bits(a, b)


def test_a_long_request_keeps_the_prefill_launches():
    caches, kw = _batch((0, 4, 3), (10, 1, 1))
    plain, hinted = {}, {}
    _launched(lambda: plain.update(r=_run(caches, kw)))
    names = _launched(lambda: hinted.update(r=_run(caches, kw, max_query_len=10)))
    assert sorted(names) == sorted(PREFILL_KERNELS)
    for a, b in zip(plain["r"], hinted["r"]):
        assert same_bits(a, b)


@pytest.mark.parametrize("hint, error, rule", [
    (9, errors.KPoolMetadataError, "max-query-len-range"),      # the batch's longest query is 10
    (-1, errors.KPoolMetadataError, "max-query-len-range"),
    (10.0, errors.KPoolTypeError, "scalar-int-type"),
    (True, errors.KPoolTypeError, "scalar-int-type"),
])
def test_a_wrong_hint_is_rejected_before_any_launch(hint, error, rule):
    from tests.rejection import assert_rejected
    caches, kw = _batch((0, 4, 3), (10, 1, 1))
    kw["max_query_len"] = hint
    assert_rejected(lambda: forward(**kw), error, rule, kw, (caches.compressed_backing, caches.tail_backing))


def test_builder_sets_the_hint_and_copies_keep_it():
    specs = [RequestSpec(3, 5, [0, 1], 0), RequestSpec(0, 2, [2], 1), RequestSpec(8, 0, [3, 4], 2)]
    meta = build_metadata(BatchSpec(specs, num_tokens=12), index_kpool=4, ring_capacity=8, page_size=2)
    assert meta.max_query_len == 5
    assert meta.clone().max_query_len == 5 and meta.to("cpu").max_query_len == 5
    empty = build_metadata(BatchSpec([]), index_kpool=4, ring_capacity=8, page_size=2)
    assert empty.max_query_len == 0
    assert "max_query_len" not in meta.forward_kwargs()      # the reference's keywords stay the math's


def _meta(qlens):
    specs = [RequestSpec(4, q, [i], i) for i, q in enumerate(qlens)]
    return build_metadata(BatchSpec(specs, num_tokens=8, full_mode=True, block_table_width=2), index_kpool=4,
                          ring_capacity=8, page_size=4)


def test_a_captured_hint_cannot_grow_on_replay():
    captured = _meta((2, 2))
    captured.copy_(_meta((1, 1)))                              # a shorter step fits the graph
    assert captured.max_query_len == 2 and captured.cum_query_lens.tolist() == [1, 2]
    with pytest.raises(errors.KPoolMetadataError, match="max_query_len"):
        captured.copy_(_meta((3, 1)))
    unknown = _meta((1, 1))
    unknown.max_query_len = None
    with pytest.raises(errors.KPoolMetadataError, match="max_query_len"):
        captured.copy_(unknown)
    captured.max_query_len = None                              # captured without the hint: anything fits
    captured.copy_(_meta((3, 1)))
    assert captured.cum_query_lens.tolist() == [3, 4]


def test_backend_passes_the_metadata_hint(monkeypatch):
    from kpool import indexer
    from kpool.backend import KPoolIndexerBackend
    from kpool.cache import allocate_caches
    seen = {}
    monkeypatch.setattr(indexer, "forward", lambda **kw: seen.update(kw))
    backend = KPoolIndexerBackend(SMALL, device=resolve_device())
    caches = allocate_caches(SMALL, num_pages=4, page_size=4, num_tail_blocks=2, device=DEV)
    meta = _meta((2, 1)).to(DEV)
    backend.forward(k=None, gate=None, q=None, weights=None, ape=None, caches=caches, metadata=meta,
                    validate=False)
    assert seen["max_query_len"] == 2


@pytest.mark.parametrize("config, cached, qlens, fused", [
    (SMALL, (5,) * 12, (1,) * 12, True),            # decode: C - P + 1 = 1
    (SMALL, (2, 9, 4), (4, 4, 4), False),           # MTP rows, but a ring of C = P: two launches
    (MTP3, (2, 9, 4), (4, 4, 4), True),             # MTP=3 verify with its ring of P + 3
    (MTP3, (3, 0, 6), (5, 1, 0), False),            # a 5-row query: beyond C - P + 1 = 4
], ids=["decode", "mtp-small-ring", "mtp3", "mtp3-long"])
def test_one_cache_launch_when_no_ring_write_reaches_a_read_row(config, cached, qlens, fused):
    caches, kw = _batch(cached, qlens, config)
    plain, hinted = {}, {}
    assert _launched(lambda: plain.update(r=_run(caches, kw)), CACHE_KERNELS) == ["_compress_kernel",
                                                                                   "_ring_write_kernel"]
    names = _launched(lambda: hinted.update(r=_run(caches, kw, max_query_len=max(qlens))), CACHE_KERNELS)
    fused = fused and plan.fused_update(DEV)                   # a backend may ship it off (plan.TUNING)
    assert names == (["_update_kernel"] if fused else ["_compress_kernel", "_ring_write_kernel"])
    for a, b in zip(plain["r"], hinted["r"]):
        assert same_bits(a, b)


def _ring_overlap(cached: int, q: int, P: int, C: int) -> bool:
    """Whether a request with ``cached`` rows before a ``q``-row step writes a ring slot that its
    compression reads (kpool-algorithm.md §5.1, §5.4): reads are the pre-step positions of the
    windows of pools completed in the step, writes its last ``C`` positions, slot ``p % C``."""
    reads = {p for j in range(cached // P + 1) if cached <= j * P + P - 1 <= cached + q - 1
             for p in range(j * P, cached)}
    writes = range(max(cached, cached + q - C), cached + q)
    return any(w != r and (w - r) % C == 0 for w in writes for r in reads)


@pytest.mark.parametrize("P, C", [(4, 4), (4, 7), (1, 1), (1, 3), (16, 18), (3, 8)])
def test_the_one_launch_bound_is_the_ring_disjointness_bound(P, C):
    """The fused launch's condition holds exactly for the query lengths whose ring writes never
    meet a ring read, at every start position: the bound is safe and tight."""
    for q in range(0, C + 3):
        safe = not any(_ring_overlap(cached, q, P, C) for cached in range(0, 4 * (C + P)))
        assert compress.one_cache_launch(q, C, P) == safe, (q, safe)
    assert not compress.one_cache_launch(None, C, P)


def test_a_refused_copy_writes_nothing():
    """A shape mismatch in a later tensor is found before the earlier ones are written."""
    captured = _meta((2, 2))
    before = {n: t.clone() for n, t in captured.tensors().items()}
    other = _meta((1, 1))
    other.tail_slot_mapping = other.tail_slot_mapping[:-1]
    with pytest.raises(errors.KPoolMetadataError, match="tail_slot_mapping"):
        captured.copy_(other)
    assert all(torch.equal(before[n], t) for n, t in captured.tensors().items())
