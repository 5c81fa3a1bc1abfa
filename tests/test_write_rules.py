"""One writer per cache row and slots that follow from the tables and positions
(kpool-algorithm.md §3.2, §3.3, §5.4; issue 9 point 6): each was accepted before, and wrote the
caches. Every rejection happens before any launch with every tensor byte-identical; the legal
neighbours of each rule (FULL-mode stale padding slots, padded requests on ring block 0, shared
read-only prefix pages) stay accepted."""
import pytest

from kpool import SMALL
from kpool import errors
from kpool.indexer import forward
from kpool.metadata import BatchSpec, RequestSpec
from kpool.validation import validate_forward
from tests.helpers import small_batch
from tests.rejection import assert_corrupted_small_batch_rejected, assert_rejected, batch_kwargs

pytestmark = pytest.mark.interpreter_ok

# small_batch(SMALL): P = C = 4, B = 2, 16 pages, ring blocks 2, 1, 0 for requests
# (0, 7) rows 0-6, (0, 10) rows 7-16, (3, 6) rows 17-22 (positions 3..8); block 3 is unused.
C = SMALL.ring_capacity


def _validate(kw):
    return validate_forward(**{"score_mode": "relu", "compute_topk": True, "output_buffer": None, **kw})


def _set(kw, name, index, value):
    kw[name] = kw[name].clone()
    kw[name][index] = value


def _unused_slot(kw):
    N, B = kw["compressed_cache"].shape[:2]
    used = set(kw["slot_mapping"].tolist())
    return next(s for s in range(N * B) if s not in used)


def _ring_block_shared(kw):
    """request 1 gets request 0's ring block; its ring slots follow (consistent, in range)."""
    _set(kw, "tail_block_table", (1, 0), int(kw["tail_block_table"][0, 0]))
    _set(kw, "tail_slot_mapping", slice(7, 17), int(kw["tail_block_table"][0, 0]) * C + kw["positions"][7:17] % C)


def _slot_copied_from_another_row(kw):
    _set(kw, "slot_mapping", 14, int(kw["slot_mapping"][10]))


def _slot_moved(kw):
    _set(kw, "slot_mapping", 3, _unused_slot(kw))


def _slot_on_non_completing_row(kw):
    _set(kw, "slot_mapping", 4, _unused_slot(kw))            # position 4 completes no pool


def _slot_missing_on_completing_row(kw):
    _set(kw, "slot_mapping", 3, -1)                          # pool 0 of request 0 would never be written


def _block_table_changed_under_slots(kw):
    used = set(kw["block_table"].flatten().tolist())
    _set(kw, "block_table", (0, 0), next(p for p in range(16) if p not in used))


def _positions_moved_under_slots(kw):
    """request 2's positions, raw and pool lengths shifted by one: slots are another step's."""
    _set(kw, "positions", slice(17, 23), kw["positions"][17:23] + 1)
    _set(kw, "raw_seq_lens", 2, int(kw["raw_seq_lens"][2]) + 1)
    kw["seq_lens"] = kw["raw_seq_lens"] // SMALL.index_kpool


def _tail_slot_in_another_block(kw):
    _set(kw, "tail_slot_mapping", 0, 3 * C + 0)


def _tail_slot_wrong_ring_row(kw):
    _set(kw, "tail_slot_mapping", 8, 1 * C + (int(kw["positions"][8]) + 1) % C)


def _tail_slot_missing(kw):
    _set(kw, "tail_slot_mapping", 5, -1)


def _tail_block_table_changed_under_slots(kw):
    _set(kw, "tail_block_table", (0, 0), 3)


CORRUPTIONS = [
    (_ring_block_shared, errors.KPoolWriteConflictError, "ring-block-shared"),
    (_slot_copied_from_another_row, errors.KPoolWriteConflictError, "slot-duplicate"),
    (_slot_moved, errors.KPoolSlotMappingError, "slot-mapping-mismatch"),
    (_slot_on_non_completing_row, errors.KPoolSlotMappingError, "slot-mapping-mismatch"),
    (_slot_missing_on_completing_row, errors.KPoolSlotMappingError, "slot-mapping-mismatch"),
    (_block_table_changed_under_slots, errors.KPoolSlotMappingError, "slot-mapping-mismatch"),
    (_positions_moved_under_slots, errors.KPoolSlotMappingError, "slot-mapping-mismatch"),
    (_tail_slot_in_another_block, errors.KPoolSlotMappingError, "tail-slot-mapping-mismatch"),
    (_tail_slot_wrong_ring_row, errors.KPoolSlotMappingError, "tail-slot-mapping-mismatch"),
    (_tail_slot_missing, errors.KPoolSlotMappingError, "tail-slot-mapping-mismatch"),
    (_tail_block_table_changed_under_slots, errors.KPoolSlotMappingError, "tail-slot-mapping-mismatch"),
]


@pytest.mark.parametrize("corrupt, error, rule", CORRUPTIONS, ids=[c.__name__.strip("_") for c, _, _ in CORRUPTIONS])
def test_bad_write_metadata_is_rejected_before_any_launch(corrupt, error, rule, torch_device):
    assert_corrupted_small_batch_rejected(corrupt, error, rule, torch_device)


# Block tables that make two consistent slots collide: the builder's slots are exactly §3.2's.
SHARED_PAGE_BATCHES = {
    # two fresh requests whose tables both start with page 3 and both complete pool 0 there
    "across-requests": (BatchSpec([RequestSpec(0, 4, [3], 0), RequestSpec(0, 4, [3], 1)]), 2),
    # one request whose table lists page 5 twice and completes a pool in each (B = 1)
    "within-request": (BatchSpec([RequestSpec(0, 8, [5, 5], 0)]), 1),
}


@pytest.mark.parametrize("name", sorted(SHARED_PAGE_BATCHES))
def test_two_live_rows_writing_one_compressed_slot_are_rejected(name, torch_device):
    batch, B = SHARED_PAGE_BATCHES[name]
    caches, kw = batch_kwargs(SMALL, batch, page_size=B, num_pages=8, num_tail_blocks=2, device=torch_device)
    assert_rejected(lambda: forward(**kw), errors.KPoolWriteConflictError, "slot-duplicate", kw,
                    (caches.compressed_backing, caches.tail_backing), match="both write compressed slot")


def test_full_mode_padding_keeps_its_legal_stale_values(torch_device):
    """FULL mode: padding rows with stale positive ring slots and positions 0, padded requests
    on ring block 0 (request 2's block) with a stale length (C17 (c): 11 tokens, 2 pools) are all accepted."""
    _, kw = small_batch(SMALL, device=torch_device)
    T = kw["k"].shape[0]
    batch = BatchSpec([RequestSpec(0, 7, [0], 2), RequestSpec(0, 10, [1, 2], 1), RequestSpec(3, 6, [3, 4], 0)],
                      num_tokens=T + 3, full_mode=True, num_padded_requests=2, block_table_width=3,
                      stale_tail_slots=True)
    _, kw = batch_kwargs(SMALL, batch, page_size=2, num_pages=16, num_tail_blocks=4, device=torch_device)
    assert bool((kw["tail_slot_mapping"][T:] >= 0).all())
    assert kw["tail_block_table"][3:, 0].tolist() == [0, 0] == kw["tail_block_table"][2:3, 0].tolist() * 2
    _set(kw, "raw_seq_lens", slice(3, 5), 11)
    kw["seq_lens"] = kw["raw_seq_lens"] // SMALL.index_kpool
    assert _validate(kw) == T


def test_shared_read_only_prefix_pages_are_accepted(torch_device):
    """Prefix caching: two requests read the same complete page 3 (pools 0, 1); only one of them
    completes a pool this step, on its own page 5."""
    batch = BatchSpec([RequestSpec(8, 4, [3, 5], 0), RequestSpec(8, 1, [3, 6], 1)])
    _, kw = batch_kwargs(SMALL, batch, page_size=2, num_pages=8, num_tail_blocks=2, device=torch_device)
    assert _validate(kw) == 5


def test_the_device_path_reads_the_same_metadata(torch_device):
    """Device metadata is copied to the host in one transfer (one sync); it must give the same
    arrays as reading CPU tensors in place (here both paths on the same tensors)."""
    from kpool.metadata_checks import _host_copy, one_transfer
    _, kw = small_batch(SMALL, device=torch_device)
    names = ("cum_query_lens", "raw_seq_lens", "positions", "slot_mapping", "block_table")
    tensors = [kw[n].cpu() for n in names] + [kw["tail_block_table"].cpu()[:, 0]]
    for a, b in zip(_host_copy(tensors), one_transfer(tensors)):
        assert a.dtype == b.dtype and a.tolist() == b.tolist()
