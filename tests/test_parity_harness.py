"""Tests of the parity harness itself (parity/): sentinels and write sets, comparators and their
triage classes, reports, the CLI, the runner with stand-in forwards, and planted kernel faults.

Run: ``TRITON_INTERPRET=1 python -m pytest -q tests/test_parity_harness.py``.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pandas as pd
import pytest
import torch

from cases.spec import Case, CacheGeometry, OutputBufferSpec, Step
from kpool.cache import allocate_caches
from kpool.config import SMALL
from kpool.errors import KPoolBlockIdError, KPoolMetadataError
from kpool.metadata import BatchSpec, RequestSpec, build_metadata
from parity import compare as cmp
from parity import report
from parity import sentinel as sen

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
P, K, W, D = SMALL.index_kpool, SMALL.index_topk, SMALL.output_width, SMALL.index_head_dim  # 4, 8, 11, 16
C = SMALL.ring_capacity  # 4


def _have(*modules: str) -> bool:
    try:
        return all(importlib.util.find_spec(m) is not None for m in modules)
    except ModuleNotFoundError:
        return False


NEEDS_REFERENCE = pytest.mark.skipif(
    not _have("reference.stateful", "reference.oracle", "cases.values"),
    reason="reference.stateful / reference.oracle / cases.values not written yet")
NEEDS_KERNELS = pytest.mark.skipif(
    not _have("kpool.ops.compress", "kpool.ops.indexer", "reference.stateful", "cases.values"),
    reason="kpool.ops kernels (or the reference) not written yet")


# --------------------------------------------------------------------------- fixtures

def _batch(num_tokens=12, stale=True):
    """Request 0: positions 0..6 (pages [3, 5], ring block 1); request 1: positions 2..4 (page
    [1], ring block 0); FULL-mode padding rows 10, 11 with stale positive ring slots."""
    return BatchSpec([RequestSpec(0, 7, [3, 5], ring_block=1), RequestSpec(2, 3, [1], ring_block=0)],
                     num_tokens=num_tokens, full_mode=True, stale_tail_slots=stale)


def _meta(batch=None):
    return build_metadata(batch or _batch(), index_kpool=P, ring_capacity=C, page_size=2)


def _caches():
    caches = allocate_caches(SMALL, num_pages=6, page_size=2, num_tail_blocks=2, page_padding=3,
                             ring_block_padding=5, guard=7)
    sen.lay_cache_sentinels(caches)
    return caches


def _write_set(meta=None, compute_topk=True):
    return sen.compute_write_set(meta or _meta(), index_kpool=P, ring_capacity=C, page_size=2,
                                 num_pages=6, num_tail_blocks=2, compute_topk=compute_topk)


def _fake_forward(caches, ws, skip_compressed=None, skip_ring=None):
    """Write 1.0 into every write-set element (what a correct kernel's writes look like), except
    channel 5 of compressed row ``skip_compressed`` and plane 1 of ring row ``skip_ring``."""
    for page, row in ws.compressed_rows:
        if skip_compressed == (page, row):
            caches.compressed_cache[page, row, 0, :5] = 1.0
            caches.compressed_cache[page, row, 0, 6:] = 1.0
        else:
            caches.compressed_cache[page, row, 0] = 1.0
    for block, slot in ws.ring_rows:
        caches.tail_cache[block, 0 if skip_ring == (block, slot) else slice(None), slot] = 1.0


# --------------------------------------------------------------------------- sentinels

def test_write_set_follows_metadata():
    ws = _write_set()
    # §5.1: p=3 of request 0 -> pool 0 -> page 3 row 0; p=3 of request 1 -> page 1 row 0.
    assert ws.compressed_rows == ((3, 0), (1, 0))
    # §5.4: last min(C, ql) rows; stale padding slots (rows 10, 11) are not in the set.
    assert ws.ring_rows == ((1, 3), (1, 0), (1, 1), (1, 2), (0, 2), (0, 3), (0, 0))
    assert ws.output_rows == 12
    assert _write_set(compute_topk=False).output_rows == 0
    # a planted out-of-range slot and a negative position write nothing
    meta = _meta()
    meta.slot_mapping[3] = 6 * 2
    meta.positions[8] = -1
    ws = _write_set(meta)
    assert ws.compressed_rows == ()
    assert (0, 3) not in ws.ring_rows


def test_sentinel_patterns_are_laid_everywhere():
    caches = _caches()
    assert torch.all(caches.compressed_backing.view(torch.int16) == 0x7FA5)
    assert torch.all(caches.tail_backing.view(torch.int32) == 0x7FA5A5A5)
    assert torch.isnan(caches.compressed_cache).all() and torch.isnan(caches.tail_cache).all()


def test_correct_writes_pass_sentinel_check():
    caches, ws = _caches(), _write_set()
    sen.relay_compressed_rows(caches, ws)
    before = sen.backing_bits(caches)
    _fake_forward(caches, ws)
    checks = sen.check_caches(caches, before, ws)
    assert [c.buffer for c in checks] == ["compressed_cache", "tail_ring"]
    assert all(c.ok for c in checks), checks


@pytest.mark.parametrize("plant, buffer, where", [
    (lambda c: c.compressed_backing.view(torch.int16).__setitem__(0, 0),
     "compressed_cache", {"region": "guard-before"}),
    (lambda c: c.compressed_backing.view(torch.int16).__setitem__(7 + 2 * D + 1, 0),  # page 0 padding
     "compressed_cache", {"region": "page-padding", "page": 0}),
    (lambda c: c.compressed_cache.view(torch.int16).__setitem__((2, 1, 0, 9), 0),    # not written
     "compressed_cache", {"region": "view", "page": 2, "page_row": 1, "channel": 9}),
    (lambda c: c.compressed_backing.view(torch.int16).__setitem__(-1, 0),
     "compressed_cache", {"region": "guard-after"}),
    (lambda c: c.tail_cache.view(torch.int32).__setitem__((0, 1, 1, 4), 0),         # ring slot 1 of block 0
     "tail_ring", {"region": "view", "block": 0, "plane": 1, "slot": 1, "channel": 4}),
    (lambda c: c.tail_backing.view(torch.int32).__setitem__(7 + 2 * C * D, 0),       # block 0 padding
     "tail_ring", {"region": "block-padding", "block": 0}),
])
def test_sentinel_catches_stray_write(plant, buffer, where):
    caches, ws = _caches(), _write_set()
    sen.relay_compressed_rows(caches, ws)
    before = sen.backing_bits(caches)
    _fake_forward(caches, ws)
    plant(caches)
    checks = {c.buffer: c for c in sen.check_caches(caches, before, ws)}
    assert checks[buffer].stray == 1 and checks[buffer].missing == 0
    assert checks[buffer].first_stray == where
    other = "tail_ring" if buffer == "compressed_cache" else "compressed_cache"
    assert checks[other].ok
    rows = cmp.sentinel_findings(checks.values(), "kernel")
    assert {(r["output"], r["verdict"]) for r in rows} == {
        (f"sentinel:{buffer}[kernel]", "stray-write"), (f"sentinel:{other}[kernel]", "exact")}


def test_sentinel_catches_missing_write():
    caches, ws = _caches(), _write_set()
    # an old value in the compressed row must not hide a skipped write: re-laying makes it visible
    caches.compressed_cache[1, 0, 0] = 2.0
    sen.relay_compressed_rows(caches, ws)
    before = sen.backing_bits(caches)
    _fake_forward(caches, ws, skip_compressed=(1, 0), skip_ring=(0, 3))
    checks = {c.buffer: c for c in sen.check_caches(caches, before, ws)}
    assert checks["compressed_cache"].stray == 0 and checks["compressed_cache"].missing == 1
    assert checks["compressed_cache"].first_missing == {"region": "view", "page": 1, "page_row": 0, "channel": 5}
    assert checks["tail_ring"].missing == D
    assert checks["tail_ring"].first_missing == {"region": "view", "block": 0, "plane": 1, "slot": 3, "channel": 0}
    verdicts = {r["verdict"] for r in cmp.sentinel_findings(checks.values(), "reference")}
    assert verdicts == {"missing-write"}


def test_output_buffer_guards():
    buf = sen.allocate_output_buffer(OutputBufferSpec(capacity=5, width=13, row_step=2))
    assert buf.view.shape == (5, 13) and buf.view.stride() == (2 * (13 + sen.DEFAULT_GUARD_COLS), 1)
    before = buf.backing.clone()
    buf.view[:3] = -1                       # a correct T=3 step
    assert buf.check(before, 3).ok
    for brow, bcol, region in ((0, 0, "guard-rows-before"), (sen.DEFAULT_GUARD_ROWS + 1, 4, "between-rows"),
                               (sen.DEFAULT_GUARD_ROWS + 2, 13, "guard-columns"),
                               (sen.DEFAULT_GUARD_ROWS + 6, 2, "view"), (buf.backing.shape[0] - 1, 0, "guard-rows-after")):
        planted = buf.backing.clone()
        buf.backing[brow, bcol] = 5
        chk = buf.check(before, 3)
        assert chk.stray == 1 and chk.first_stray["region"] == region, (region, chk)
        buf.backing.copy_(planted)
    assert buf.check(before, 3).first_stray is None
    buf.view[2, 12] = sen.INT32_SENTINEL    # missing write in a written row
    chk = buf.check(before, 3)
    assert chk.missing == 1 and chk.first_missing == {"region": "view", "row": 2, "column": 12}


# --------------------------------------------------------------------------- comparators

def _index_rows():
    """Rows of one 7-token request (positions 0..6) and 2 padding rows, arbitrary values."""
    meta = build_metadata(BatchSpec([RequestSpec(0, 7, [0, 1], 0)], num_tokens=9),
                          index_kpool=P, ring_capacity=C, page_size=2)
    ref = torch.arange(9 * W, dtype=torch.int32).reshape(9, 1, W) % 50
    ref[7:] = -1
    return meta, ref


def _cmp_idx(kernel, ref, meta, pack_tail=True, **kw):
    return cmp.compare_indices(kernel, ref, positions=meta.positions, cum_query_lens=meta.cum_query_lens,
                               index_topk=K, index_kpool=P, pack_tail=pack_tail, compute_topk=True, **kw)


def test_indices_exact_and_padding_leak():
    meta, ref = _index_rows()
    assert [r["verdict"] for r in _cmp_idx(ref.clone(), ref, meta)] == ["exact"]
    kern = ref.clone()
    kern[7, 0, 3] = 12
    rows = _cmp_idx(kern, ref, meta)
    assert [(r["verdict"], r["mismatches"], r["row"], r["column"], r["request"]) for r in rows] == [
        ("padding-leak", 1, 7, 3, 1)]


def test_indices_tail_column_is_wrong_tail():
    meta, ref = _index_rows()
    kern = ref.clone()
    kern[6, 0, 5] += 1     # p=6: tail_start 4, packed tail columns 4..6
    rows = _cmp_idx(kern, ref, meta)
    assert [(r["verdict"], r["row"], r["position"], r["column"]) for r in rows] == [("wrong-tail", 6, 6, 5)]
    for col, verdict in ((3, "wrong-index"), (4, "wrong-tail"), (6, "wrong-tail"), (7, "wrong-index")):
        edge = ref.clone()
        edge[6, 0, col] += 1
        assert [r["verdict"] for r in _cmp_idx(edge, ref, meta)] == [verdict], col
    # fixed layout: the tail is at K_tok=8, so column 5 is history and column 9 is tail
    assert [r["verdict"] for r in _cmp_idx(kern, ref, meta, pack_tail=False)] == ["wrong-index"]
    kern = ref.clone()
    kern[6, 0, 9] += 1
    assert [r["verdict"] for r in _cmp_idx(kern, ref, meta, pack_tail=False)] == ["wrong-tail"]


def test_indices_history_is_wrong_index_with_location():
    meta, ref = _index_rows()
    kern = ref.clone()
    kern[5, 0, 1] += 1     # p=5: tail columns 4..6, column 1 is history
    kern[7, 0, 0] = 3      # plus a padding leak: one finding per class
    rows = {r["verdict"]: r for r in _cmp_idx(kern, ref, meta)}
    assert set(rows) == {"wrong-index", "padding-leak"}
    hist = rows["wrong-index"]
    assert (hist["row"], hist["position"], hist["request"], hist["column"], hist["pool_id"], hist["mismatches"]) == \
        (5, 5, 0, 1, int(ref[5, 0, 1]) // P, 1)


def test_indices_alignment_columns_and_none():
    meta, ref = _index_rows()
    kbuf = torch.full((10, 13), -1, dtype=torch.int32)
    rbuf = kbuf.clone()
    kbuf[:9, :W] = ref[:, 0]
    rbuf[:9, :W] = ref[:, 0]
    kbuf[2, 12] = 0        # alignment column >= W
    rows = _cmp_idx(kbuf[:9, :W].unsqueeze(1), rbuf[:9, :W].unsqueeze(1), meta, kernel_buffer=kbuf, reference_buffer=rbuf)
    assert [(r["verdict"], r["row"], r["column"]) for r in rows] == [("padding-leak", 2, 12)]
    none = dict(positions=meta.positions, cum_query_lens=meta.cum_query_lens, index_topk=K, index_kpool=P,
                pack_tail=True, compute_topk=False)
    assert [r["verdict"] for r in cmp.compare_indices(None, None, **none)] == ["exact"]
    assert [r["verdict"] for r in cmp.compare_indices(ref, None, **none)] == ["wrong-index"]
    assert [r["verdict"] for r in cmp.compare_indices(ref[:5], ref, **{**none, "compute_topk": True})] == ["wrong-index"]


def test_cache_comparator_bitwise_with_location():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(3, 2, 1, D, generator=g).to(torch.bfloat16)
    assert [r["verdict"] for r in cmp.compare_compressed(ref.clone(), ref)] == ["exact"]
    kern = ref.clone()
    kern.view(torch.int16)[2, 1, 0, 5] ^= 1   # one bf16 ulp
    (row,) = cmp.compare_compressed(kern, ref)
    assert (row["verdict"], row["mismatches"], row["page"], row["page_row"], row["channel"]) == \
        ("cache-mismatch", 1, 2, 1, 5)
    # bitwise, not by value: -0.0 vs +0.0 is a mismatch
    kern, ref0 = ref.clone(), ref.clone()
    ref0[0, 0, 0, 3], kern[0, 0, 0, 3] = 0.0, -0.0
    assert [r["verdict"] for r in cmp.compare_compressed(kern, ref0)] == ["cache-mismatch"]
    kern = ref.clone()
    kern[1, 0, 0, 2] = float("nan")
    kern.view(torch.int16)[0, 1, 0, 0] ^= 4
    rows = {r["verdict"]: r for r in cmp.compare_compressed(kern, ref)}
    assert set(rows) == {"nan-introduced", "cache-mismatch"}
    assert (rows["nan-introduced"]["page"], rows["nan-introduced"]["channel"]) == (1, 2)


def test_ring_comparator_bitwise_with_location():
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(2, 2, C, D, generator=g)
    kern = ref.clone()
    kern.view(torch.int32)[1, 1, 3, 7] += 1
    (row,) = cmp.compare_ring(kern, ref)
    assert (row["verdict"], row["block"], row["plane"], row["slot"], row["channel"]) == ("ring-mismatch", 1, 1, 3, 7)
    kern = ref.clone()
    kern[0, 0, 2, 0] = float("nan")
    assert [r["verdict"] for r in cmp.compare_ring(kern, ref)] == ["nan-introduced"]
    # NaN on both sides with the same payload is exact; a different payload is not
    ref[0, 0, 2, 0] = float("nan")
    assert [r["verdict"] for r in cmp.compare_ring(ref.clone(), ref)] == ["exact"]


def test_compare_errors():
    exp = KPoolMetadataError
    ok = cmp.compare_errors(KPoolBlockIdError("x"), ValueError("y"), exp)   # reference: builtin base
    assert [r["verdict"] for r in ok] == ["exact"]
    assert cmp.compare_errors(None, ValueError("y"), exp)[0]["verdict"] == "not-rejected"
    assert cmp.compare_errors(KPoolMetadataError("x"), None, exp)[0]["verdict"] == "not-rejected"
    assert cmp.compare_errors(TypeError("x"), TypeError("y"), exp)[0]["verdict"] == "crash"
    assert cmp.compare_errors(KPoolMetadataError("x"), KeyError("y"), exp)[0]["verdict"] == "crash"


def test_findings_frame_columns():
    df = cmp.findings_frame([cmp.finding("indices", "exact")], case="c", size="small", step=0, step_name="s")
    assert tuple(df.columns) == cmp.FINDING_COLUMNS
    with pytest.raises(ValueError):
        cmp.finding("indices", "almost-exact")


# --------------------------------------------------------------------------- report, CLI

def _sample_findings():
    meta, ref = _index_rows()
    kern = ref.clone()
    kern[5, 0, 1] += 1
    rows = _cmp_idx(kern, ref, meta) + cmp.compare_ring(torch.zeros(1, 2, C, D), torch.zeros(1, 2, C, D))
    return cmp.findings_frame(rows, case="demo|case", size="small", step=0, step_name="prefill")


def test_write_report_outputs_parse(tmp_path):
    df = _sample_findings()
    paths = report.write_report(df, tmp_path / "rep", wall_s=1.5)
    csv = pd.read_csv(paths["csv"])
    assert len(csv) == 2 and list(csv["verdict"]) == ["wrong-index", "exact"]
    assert csv.loc[0, "first_mismatch"].startswith("row=5 pos=5 req=0 col=1 pool=")
    data = json.load(open(paths["json"]))
    assert data["summary"]["failures"] == 1 and data["summary"]["checks"] == 2
    assert data["results"][0]["row"] == 5 and data["results"][1]["row"] is None
    md = open(paths["markdown"]).read()
    assert md.startswith("# KPool parity report") and "FAIL: 1 cases, 1 steps, 2 checks" in md
    assert "| demo\\|case | small | 0 | indices | wrong-index |" in md
    junit = ET.parse(report.write_junit(df, tmp_path / "j" / "junit.xml")).getroot()
    suite = junit.find("testsuite")
    assert suite.get("failures") == "1" and suite.get("tests") == "2"


def test_print_results_summary_line():
    """The console shows the summary, the non-exact rows and the first failures' expected and
    actual values; ``all_rows`` shows the exact rows too."""
    from rich.console import Console
    console = Console(record=True, width=200)
    summary = report.print_results(_sample_findings(), wall_s=2.0, console=console)
    text = console.export_text()
    assert summary["failures"] == 1 and "FAIL: 1 cases, 1 steps, 2 checks, 1 findings, 1 failures" in text
    assert "wrong-index" in text and "tail_ring" not in text
    assert "expected 6, got 7" in text
    console = Console(record=True, width=200)
    report.print_results(_sample_findings(), console=console, all_rows=True)
    assert "tail_ring" in console.export_text()


@pytest.mark.integration
def test_cli_help_and_usage_errors():
    env = dict(os.environ, PYTHONPATH=ROOT)
    for args in (["--help"], ["run", "--help"]):
        proc = subprocess.run([sys.executable, "-m", "parity", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "usage: python -m parity" in proc.stdout
    from parity.cli import main
    assert main(["run", "--size", "huge"]) == 2
    assert main([]) == 2


def test_cli_import_does_not_load_kernels():
    code = ("import sys, parity.cli, parity.runner, parity.report, parity.compare, parity.mutants; "
            "bad = [m for m in ('triton', 'kpool.ops.compress', 'kpool.ops.indexer', 'cases.scenarios') "
            "if m in sys.modules]; assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_seed_offset_and_case_selection():
    from parity.suites import offset_seeds, select_cases
    case = _tiny_case()
    shifted = offset_seeds(case, 10)
    assert shifted.seed == case.seed + 10 and [s.seed for s in shifted.steps] == [s.seed + 10 for s in case.steps]
    assert select_cases([case], ["tiny[small]"]) == [case]
    with pytest.raises(KeyError):
        select_cases([case], ["nope"])


# --------------------------------------------------------------------------- runner

def _tiny_case(**changes):
    """Prefill of two requests (7 and 10 tokens, permuted pages), then a FULL-mode decode with
    stale positive ring slots in the padding rows and a strided, wider output buffer."""
    geo = CacheGeometry(num_pages=8, page_size=2, num_tail_blocks=3, page_padding=3, ring_block_padding=5, guard=16)
    steps = [
        Step("prefill", BatchSpec([RequestSpec(0, 7, [4, 1], 0), RequestSpec(0, 10, [2, 6], 1)]),
             request_ids=[0, 1], seed=1),
        Step("decode-padded", BatchSpec([RequestSpec(7, 1, [4, 1], 0), RequestSpec(10, 1, [2, 6], 1)],
                                        num_tokens=4, full_mode=True, stale_tail_slots=True),
             request_ids=[0, 1], seed=2, output_buffer=OutputBufferSpec(capacity=6, width=13, row_step=2)),
    ]
    return dataclasses.replace(Case("tiny", "small", SMALL, geo, steps, seed=5), **changes)


def _reference_forward():
    from reference.stateful import forward
    return forward


def _outputs(res):
    return set(res.findings["output"])


@NEEDS_REFERENCE
def test_run_case_reference_against_itself_is_exact():
    res = run_case_cpu(_tiny_case(), kernel_forward=_reference_forward())
    assert res.ok, res.failures
    assert res.steps_run == 2 and set(res.findings["verdict"]) == {"exact"}
    assert {"indices", "compressed_cache", "tail_ring", "reference-vs-oracle",
            "sentinel:compressed_cache[kernel]", "sentinel:tail_ring[reference]",
            "sentinel:output_buffer[kernel]"} <= _outputs(res)
    assert set(res.timings["side"]) == {"kernel", "reference", "oracle"}


def run_case_cpu(case, **kw):
    """Run on the session's device (the CPU interpreter unless pytest ran with --device)."""
    import os
    from parity.runner import run_case
    return run_case(case, device=os.environ.get("KPOOL_DEVICE", "cpu"), **kw)


@NEEDS_REFERENCE
def test_run_case_reports_stray_write_into_guard():
    ref = _reference_forward()

    def leaky(**kw):
        out = ref(**kw)
        cc = kw["compressed_cache"]
        torch.as_strided(cc, (1,), (1,), 3).view(torch.int16).fill_(0)   # guard band before page 0
        return out
    res = run_case_cpu(_tiny_case(), kernel_forward=leaky, check_oracle=False)
    bad = res.failures
    assert set(bad["verdict"]) == {"stray-write"} and set(bad["output"]) == {"sentinel:compressed_cache[kernel]"}
    assert set(bad["region"]) == {"guard-before"}


@NEEDS_REFERENCE
def test_run_case_reports_missing_write_and_lockstep_vs_resync():
    ref = _reference_forward()
    calls = []

    def forgetful(**kw):   # step 0 computes on a copy and never writes the compressed cache back
        calls.append(1)
        if len(calls) == 1:
            return ref(**{**kw, "compressed_cache": kw["compressed_cache"].clone()})
        return ref(**kw)
    res = run_case_cpu(_tiny_case(), kernel_forward=forgetful, check_oracle=False)
    step0 = res.failures[res.failures["step"] == 0]
    assert {("sentinel:compressed_cache[kernel]", "missing-write"), ("compressed_cache", "nan-introduced")} <= \
        set(zip(step0["output"], step0["verdict"]))
    # lockstep: the kernel's caches stay wrong in step 1; resync hands them to the reference
    assert (res.failures["step"] == 1).any()
    calls.clear()
    res = run_case_cpu(_tiny_case(), kernel_forward=forgetful, check_oracle=False, mode="resync")
    assert not (res.failures["step"] == 1).any() and (res.failures["step"] == 0).any()
    with pytest.raises(ValueError):
        run_case_cpu(_tiny_case(), mode="sideways")


@NEEDS_REFERENCE
def test_run_case_expected_error_and_crash():
    def bad_blocks(meta):
        meta.block_table[0, 0] = 99
        return meta
    step = Step("bad-block", BatchSpec([RequestSpec(0, 8, [0, 1], 0)]), request_ids=[0],
                patch_metadata=bad_blocks, expect_error=KPoolBlockIdError)
    case = _tiny_case(steps=[step])

    def rejecting(**kw):
        raise KPoolBlockIdError("block 99 out of range")

    def rejecting_ref(**kw):
        raise ValueError("block 99 out of range")

    def writes_then_raises(**kw):
        kw["tail_cache"].fill_(0.0)
        raise KPoolBlockIdError("too late")
    res = run_case_cpu(case, kernel_forward=rejecting, reference_forward=rejecting_ref)
    assert res.ok and res.findings.loc[res.findings["output"] == "error", "verdict"].tolist() == ["exact"]
    res = run_case_cpu(case, kernel_forward=_reference_forward(), reference_forward=rejecting_ref)
    assert "not-rejected" in set(res.failures["verdict"])
    res = run_case_cpu(case, kernel_forward=writes_then_raises, reference_forward=rejecting_ref)
    assert {"stray-write", "ring-mismatch"} <= set(res.failures["verdict"])

    def boom(**kw):
        raise RuntimeError("kernel exploded")
    res = run_case_cpu(_tiny_case(), kernel_forward=boom, check_oracle=False)
    assert res.steps_run == 1 and "crash" in set(res.failures["verdict"])
    assert "forward[kernel]" in set(res.failures["output"])


# --------------------------------------------------------------------------- mutants

def test_mutation_substrings_occur_once():
    from parity.mutants import MUTANTS, apply_mutation
    import kpool
    base = os.path.dirname(kpool.__file__)
    for name, (rel, old, new, verdict) in MUTANTS.items():
        path = os.path.join(base, rel)
        if not os.path.exists(path):
            pytest.skip(f"{rel} not written yet")
        assert apply_mutation(open(path).read(), old, new) != old
        assert verdict in cmp.VERDICTS and cmp.is_failure(verdict)
    with pytest.raises(AssertionError):
        apply_mutation("a a", "a", "b")
    with pytest.raises(AssertionError):
        apply_mutation("abc", "x", "y")


def test_load_mutant_mechanism_with_metadata_mutation():
    from parity.mutants import load_mutant
    mutation = ("metadata.py", "tail_slot_mapping[row] = req.ring_block * C + p % C",
                "tail_slot_mapping[row] = req.ring_block * C + (p + 1) % C", None)
    mod = load_mutant("test-ring-slot", mutation=mutation, module="metadata")
    assert mod.__name__ == "kpool_mutant_test_ring_slot.metadata"
    batch = _batch()
    good = build_metadata(batch, index_kpool=P, ring_capacity=C, page_size=2)
    bad = mod.build_metadata(batch, index_kpool=P, ring_capacity=C, page_size=2)
    assert torch.equal(good.slot_mapping, bad.slot_mapping)
    assert not torch.equal(good.tail_slot_mapping, bad.tail_slot_mapping)
    # the unmutated package is untouched
    assert "(p + 1) % C" not in open(sys.modules["kpool.metadata"].__file__).read()


@NEEDS_KERNELS
@pytest.mark.interpreter_ok
def test_kernels_match_reference_on_tiny_case():
    res = run_case_cpu(_tiny_case())
    assert res.ok, report.results_table(res.failures)[["step", "output", "verdict", "first_mismatch", "detail"]]


@NEEDS_KERNELS
@pytest.mark.interpreter_ok
@pytest.mark.parametrize("name", ["visible-off-by-one", "ape-reversed", "tail-wrong-column", "padding-row-writes"])
def test_planted_kernel_fault_is_caught(name):
    from parity.mutants import expected_verdict, load_mutant
    mutant = load_mutant(name)
    # One padded prefill step covers all four faults (keeps the interpreter time down). Ring block
    # 0 belongs to no request, so the padding rows' stale slots (block 0) are outside the write set.
    step = Step("prefill-padded", BatchSpec([RequestSpec(0, 7, [4, 1], 1), RequestSpec(0, 10, [2, 6], 2)],
                                            num_tokens=20, full_mode=True, stale_tail_slots=True),
                request_ids=[0, 1], seed=1, output_buffer=OutputBufferSpec(capacity=21, width=12, row_step=1))
    res = run_case_cpu(_tiny_case(steps=[step]), kernel_forward=mutant.forward, check_oracle=False)
    assert expected_verdict(name) in set(res.failures["verdict"]), res.failures


# ---- blind spots found by an adversarial trial ---------------------------------------------------

def _full_padding_small():
    from cases.scenarios import full_padding
    return full_padding("small")


def test_result_that_is_not_the_output_buffer_is_wrong_index():
    """A forward that returns correct rows but leaves other values in the caller's buffer fails."""
    from parity.runner import run_case
    from reference.stateful import forward

    def returns_a_copy(**kw):
        out = forward(**kw)
        if kw.get("output_buffer") is None or out is None:
            return out
        copy = out.clone()
        kw["output_buffer"][0, 0] += 1          # the buffer no longer holds what was returned
        return copy

    case = _full_padding_small()
    assert any(s.output_buffer for s in case.steps)
    res = run_case(case, device=os.environ.get("KPOOL_DEVICE", "cpu"), kernel_forward=returns_a_copy,
                   check_oracle=False)
    bad = res.failures[res.failures["output"] == "indices"]
    assert not bad.empty and set(bad["verdict"]) == {"wrong-index"}
    first = bad.iloc[0]
    assert "output_buffer" in first["detail"] and first["row"] == 0 and first["column"] == 0


def test_forward_that_writes_its_inputs_is_a_stray_write():
    """Inputs (and the metadata every layer shares) are read-only: an in-place write is reported."""
    from parity.runner import run_case
    from reference.stateful import forward

    def clobbers_inputs(**kw):
        out = forward(**kw)
        kw["positions"].zero_()
        kw["k"][0, 0] = float("nan")
        return out

    res = run_case(_full_padding_small(), device=os.environ.get("KPOOL_DEVICE", "cpu"),
                   kernel_forward=clobbers_inputs, check_oracle=False)
    bad = res.failures[res.failures["output"] == "inputs[kernel]"]
    assert set(bad["verdict"]) == {"stray-write"} and set(bad["region"]) == {"positions", "k"}
    assert (res.findings["output"] == "inputs[reference]").sum() == 0
