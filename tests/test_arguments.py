"""Python scalar arguments of the wrong type (issue 9 point 6 "type confusion"): non-bool flags,
bools and floats where ints are needed, numpy integers where the kernels need a Python int, and
the builders' counts and lengths. Each raises a named error before anything is written."""
import numpy as np
import pytest
import torch

from kpool import SMALL
from kpool import errors
from kpool.cache import allocate_caches
from kpool.config import KPoolConfig
from kpool.indexer import forward
from kpool.metadata import BatchSpec, RequestSpec, build_metadata
from kpool.validation import validate_forward
from tests.helpers import small_batch
from tests.rejection import assert_rejected

pytestmark = pytest.mark.interpreter_ok

# (forward keyword, bad value, error, rule)
FORWARD_ARGS = [
    ("compute_topk", "no", errors.KPoolTypeError, "scalar-bool-type"),
    ("compute_topk", None, errors.KPoolTypeError, "scalar-bool-type"),
    ("compute_topk", 1, errors.KPoolTypeError, "scalar-bool-type"),
    ("index_kpool", True, errors.KPoolTypeError, "scalar-int-type"),
    ("index_kpool", 4.0, errors.KPoolTypeError, "scalar-int-type"),
    ("index_topk", np.int64(8), errors.KPoolTypeError, "scalar-int-type"),
    ("index_topk", 8.0, errors.KPoolTypeError, "scalar-int-type"),
    ("max_pool_seq_len", np.int32(5), errors.KPoolTypeError, "scalar-int-type"),
    ("max_pool_seq_len", None, errors.KPoolTypeError, "scalar-int-type"),
    ("score_mode", None, errors.KPoolConfigError, "score-mode"),
]


@pytest.mark.parametrize("name, value, error, rule", FORWARD_ARGS,
                         ids=[f"{n}={v!r}" for n, v, _, _ in FORWARD_ARGS])
def test_forward_scalar_of_the_wrong_type_is_rejected(name, value, error, rule, torch_device):
    caches, kw = small_batch(SMALL, device=torch_device)
    kw[name] = value
    assert_rejected(lambda: forward(**kw), error, rule, kw, (caches.compressed_backing, caches.tail_backing))


def test_numpy_index_topk_message_says_what_to_do(torch_device):
    """Numpy integers reach the kernels as they are and fail there (Triton cannot take a
    numpy.int64), so forward asks for a Python int by name; KPoolConfig converts them."""
    caches, kw = small_batch(SMALL, device=torch_device)
    kw["index_topk"] = np.int64(8)
    exc = assert_rejected(lambda: forward(**kw), errors.KPoolTypeError, "scalar-int-type", kw)
    assert "index_topk must be a Python int" in str(exc) and "numpy" in str(exc) and "int(index_topk)" in str(exc)
    assert isinstance(exc, TypeError) and isinstance(exc, ValueError)
    cfg = KPoolConfig(index_n_heads=np.int64(2), index_head_dim=np.int32(16), index_kpool=np.int64(4),
                      index_topk=np.int64(8), num_speculative_tokens=np.int8(1))
    assert cfg == SMALL.with_(num_speculative_tokens=1)
    assert all(type(getattr(cfg, f)) is int for f in ("index_n_heads", "index_head_dim", "index_kpool", "index_topk",
                                                       "num_speculative_tokens"))


@pytest.mark.parametrize("name, value", [("index_topk", "8"), ("index_kpool", "4")])
def test_string_ints_are_rejected_by_validate_forward(name, value, torch_device):
    """(forward computes ``W = index_topk + P - 1`` before it validates, so a str fails there with
    a bare TypeError: reported to the lead; the rule itself is here.)"""
    caches, kw = small_batch(SMALL, device=torch_device)
    kw.update(score_mode="relu", compute_topk=True, output_buffer=None, **{name: value})
    assert_rejected(lambda: validate_forward(**kw), errors.KPoolTypeError, "scalar-int-type", kw)


@pytest.mark.parametrize("value", ["no", None, 0])
def test_pack_tail_must_be_bool(value, torch_device):
    """validate_forward checks pack_tail; KPoolConfig (the backend's path) too."""
    caches, kw = small_batch(SMALL, device=torch_device)
    kw.update(score_mode="relu", compute_topk=True, output_buffer=None, pack_tail=value)
    assert_rejected(lambda: validate_forward(**kw), errors.KPoolTypeError, "scalar-bool-type", kw)
    with pytest.raises(errors.KPoolTypeError, match="pack_tail"):
        SMALL.with_(pack_tail=value)


def test_forward_rejects_a_non_bool_pack_tail(torch_device):
    caches, kw = small_batch(SMALL, device=torch_device)
    kw["pack_tail"] = "no"
    assert_rejected(lambda: forward(**kw), errors.KPoolTypeError, "scalar-bool-type", kw,
                    (caches.compressed_backing, caches.tail_backing))


@pytest.mark.parametrize("field, value, error", [
    ("num_speculative_tokens", 1.0, errors.KPoolTypeError), ("num_speculative_tokens", 1.5, errors.KPoolTypeError),
    ("num_speculative_tokens", None, errors.KPoolTypeError), ("index_kpool", True, errors.KPoolTypeError),
    ("index_topk", "8", errors.KPoolTypeError), ("tail_ring_capacity", 4.0, errors.KPoolTypeError),
    ("index_n_heads", 2.0, errors.KPoolTypeError), ("score_mode", ["relu"], errors.KPoolConfigError),
    ("num_speculative_tokens", -1, errors.KPoolConfigError), ("index_head_dim", 0, errors.KPoolConfigError),
])
def test_config_field_of_the_wrong_type_is_rejected(field, value, error):
    with pytest.raises(error, match=field if field != "score_mode" else "score_mode"):
        SMALL.with_(**{field: value})


def _spec(**kw):
    base = dict(cached_len=0, query_len=5, block_table=[0, 1], ring_block=0)
    return RequestSpec(**{**base, **kw})


# (batch, error, rule): today a bare TypeError / IndexError / RuntimeError for most of them
BUILDER_CASES = {
    "float-cached-len": (BatchSpec([_spec(cached_len=2.0)]), errors.KPoolTypeError, "scalar-int-type"),
    "float-query-len": (BatchSpec([_spec(query_len=1.5)]), errors.KPoolTypeError, "scalar-int-type"),
    "float-page-id": (BatchSpec([_spec(block_table=[0.0, 1])]), errors.KPoolTypeError, "scalar-int-type"),
    "str-ring-block": (BatchSpec([_spec(ring_block="0")]), errors.KPoolTypeError, "scalar-int-type"),
    "negative-query-len": (BatchSpec([_spec(query_len=-1)]), errors.KPoolMetadataError, "builder-count"),
    "negative-padded-requests": (BatchSpec([_spec()], num_padded_requests=-1), errors.KPoolMetadataError,
                                 "builder-count"),
    "negative-num-tokens": (BatchSpec([], num_tokens=-1), errors.KPoolMetadataError, "builder-count"),
    "float-num-tokens": (BatchSpec([_spec()], num_tokens=8.0), errors.KPoolTypeError, "scalar-int-type"),
    "negative-table-width": (BatchSpec([_spec()], block_table_width=-1), errors.KPoolMetadataError, "builder-count"),
    "num-tokens-below-live": (BatchSpec([_spec()], num_tokens=4), errors.KPoolMetadataError, "builder-count"),
    "str-full-mode": (BatchSpec([_spec()], full_mode="yes"), errors.KPoolTypeError, "scalar-bool-type"),
    "short-table": (BatchSpec([_spec(cached_len=16, block_table=[0])]), errors.KPoolMetadataError,
                    "builder-block-table"),
    "narrow-width": (BatchSpec([_spec()], block_table_width=1), errors.KPoolMetadataError, "builder-block-table"),
    "not-a-batch": ([_spec()], errors.KPoolTypeError, "argument-type"),
    "not-a-request": (BatchSpec([(0, 5, [0], 0)]), errors.KPoolTypeError, "argument-type"),
}


@pytest.mark.parametrize("name", sorted(BUILDER_CASES))
def test_build_metadata_rejects_bad_counts_and_lengths(name):
    batch, error, rule = BUILDER_CASES[name]
    with pytest.raises(error) as info:
        build_metadata(batch, index_kpool=4, ring_capacity=4, page_size=2)
    assert info.value.rule == rule


@pytest.mark.parametrize("kw, error, rule", [
    (dict(index_kpool=4.0), errors.KPoolTypeError, "scalar-int-type"),
    (dict(page_size=0), errors.KPoolMetadataError, "builder-count"),
    (dict(ring_capacity=3), errors.KPoolMetadataError, "builder-count"),
    (dict(page_size=np.int64(2)), None, None),                      # numpy integers are ints
])
def test_build_metadata_geometry_arguments(kw, error, rule):
    args = {**dict(index_kpool=4, ring_capacity=4, page_size=2), **kw}
    batch = BatchSpec([_spec(cached_len=np.int64(3))])
    if error is None:
        meta = build_metadata(batch, **args)
        assert meta.positions.tolist() == [3, 4, 5, 6, 7] and meta.slot_mapping.tolist() == [0, -1, -1, -1, 1]
        return
    with pytest.raises(error) as info:
        build_metadata(batch, **args)
    assert info.value.rule == rule


@pytest.mark.parametrize("kw, error, rule", [
    (dict(num_pages=-1), errors.KPoolShapeError, "allocation-size"),
    (dict(num_tail_blocks=0), errors.KPoolShapeError, "allocation-size"),
    (dict(guard=-1), errors.KPoolShapeError, "allocation-size"),
    (dict(num_pages=2.0), errors.KPoolTypeError, "scalar-int-type"),
    (dict(page_size="2"), errors.KPoolTypeError, "scalar-int-type"),
    (dict(page_padding=0.5), errors.KPoolTypeError, "scalar-int-type"),
    (dict(config=None), errors.KPoolTypeError, "argument-type"),
])
def test_allocate_caches_rejects_bad_sizes(kw, error, rule):
    args = {**dict(config=SMALL, num_pages=2, page_size=2, num_tail_blocks=1), **kw}
    config = args.pop("config")
    with pytest.raises(error) as info:
        allocate_caches(config, **args)
    assert info.value.rule == rule
    caches = allocate_caches(SMALL, num_pages=np.int64(2), page_size=2, num_tail_blocks=1)
    assert tuple(caches.compressed_cache.shape) == (2, 2, 1, SMALL.index_head_dim)
    assert isinstance(caches.compressed_cache, torch.Tensor)
