"""Reports and run modes (parity-contract.md §1, §3, §6): JUnit XML with one testcase per case x
step x output, the certified-exception table of summary.md, resync mode pinning a planted
multi-step fault to its first step, the progress bar.

Run: ``TRITON_INTERPRET=1 python -m pytest -q tests/test_reports.py``.
"""
from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET

import pandas as pd

from cases.spec import CacheGeometry, Case, Step
from kpool.config import SMALL
from kpool.metadata import BatchSpec, RequestSpec
from parity.checking import compare as cmp
from parity.checking.compare import bits
from parity.reporting import report

P = SMALL.index_kpool
FAULT_POSITIONS = (7, 11)
"""The planted fault fires in the steps whose rows complete the pools ending at these positions."""


def planted_fault(**kw):
    """The reference forward, then the compressed row of every pool ending at a position in
    :data:`FAULT_POSITIONS` gets a wrong channel 2 (a high bit flipped): a fault that fires in
    steps 1 and 3 of :func:`multi_step_case` only. Stateless, so repeats agree."""
    from reference.stateful import forward
    out = forward(**kw)
    cc = kw["compressed_cache"]
    B = cc.shape[1]
    t_live = int(kw["cum_query_lens"][-1])
    for t in range(t_live):
        p, s = int(kw["positions"][t]), int(kw["slot_mapping"][t])
        if p in FAULT_POSITIONS and s >= 0:
            bits(cc)[s // B, s % B, 0, 2] ^= 0x0400
    return out


def multi_step_case(values: str = "random") -> Case:
    """Five steps over two requests; steps 1 (p = 7) and 3 (p = 11) complete request 0's pools 1
    and 2."""
    geo = CacheGeometry(num_pages=8, page_size=2, num_tail_blocks=4, page_padding=2, guard=8)
    r0, r1 = [4, 1], [2, 6]
    steps = [Step("prefill", BatchSpec([RequestSpec(0, 7, r0, 1), RequestSpec(0, 5, r1, 2)]), [0, 1], seed=1),
             Step("decode-1", BatchSpec([RequestSpec(7, 1, r0, 1)]), [0], seed=2),
             Step("decode-2", BatchSpec([RequestSpec(5, 1, r1, 2), RequestSpec(8, 1, r0, 1)]), [1, 0], seed=3),
             Step("chunk", BatchSpec([RequestSpec(9, 3, r0, 1)]), [0], seed=4),
             Step("decode-3", BatchSpec([RequestSpec(12, 1, r0, 1), RequestSpec(6, 1, r1, 2)]), [0, 1], seed=5)]
    return Case("multi-step", "small", SMALL, geo, steps, seed=8, values=values)


def _device() -> str:
    """The session's kernel device (conftest.py exports it as KPOOL_DEVICE)."""
    return os.environ.get("KPOOL_DEVICE", "cpu")


def _run(case, kernel, **kw):
    from parity.running.runner import run_case
    return run_case(case, device=_device(), kernel_forward=kernel, **kw)


# --------------------------------------------------------------------------- resync

def test_resync_names_the_first_divergent_step_of_a_multi_step_fault():
    lock = _run(multi_step_case(), planted_fault, check_oracle=False)
    resync = _run(multi_step_case(), planted_fault, check_oracle=False, mode="resync")
    # lockstep: the wrong pool stays in the kernel's cache, so every later step fails too
    assert lock.failing_steps == [1, 2, 3, 4] and lock.first_divergent_step == 1
    # resync: only the steps that produce a divergence
    assert resync.failing_steps == [1, 3] and resync.first_divergent_step == 1
    first = resync.failures[resync.failures["step"] == 1]
    (row,) = first[first["output"] == "compressed_cache"].to_dict("records")
    assert (row["verdict"], row["page"], row["page_row"], row["channel"], row["position"], row["pool_id"]) == \
        ("cache-mismatch", 4, 1, 2, 7, 1)           # pool 1 of request 0: page r0[1 // B] = 4, row 1 % B = 1
    table = report.first_divergence(report.results_table(resync.findings))
    assert table.to_dict("records") == [{"case": "multi-step", "size": "small", "step": 1, "step_name": "decode-1",
                                         "outputs": "compressed_cache", "failing_steps": "1 3"}]


def test_resync_is_clean_without_fault():
    from reference.stateful import forward
    res = _run(multi_step_case(), forward, mode="resync", repeat=2)
    assert res.ok and res.first_divergent_step is None and res.failing_steps == []


# --------------------------------------------------------------------------- JUnit

def _two_case_findings():
    from reference.stateful import forward
    good = _run(multi_step_case(), forward, repeat=2)
    bad = _run(multi_step_case(), planted_fault, repeat=2)
    bad.findings["case"] = "multi-step-faulty"
    return pd.concat([good.findings, bad.findings], ignore_index=True)


def test_junit_has_one_testcase_per_case_step_output(tmp_path):
    df = report.results_table(_two_case_findings())
    path = report.write_junit(df, tmp_path / "out" / "junit.xml", bundles={"multi-step-faulty[small]": "b/x"})
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    cases = [(tc.get("classname"), tc.get("name")) for tc in root.iter("testcase")]
    expected = {(f"{c}[{s}]", f"{st}:{n}:{o}") for c, s, st, n, o in
                df[["case", "size", "step", "step_name", "output"]].itertuples(index=False)}
    assert len(cases) == len(set(cases)) == len(expected) and set(cases) == expected
    assert int(root.get("tests")) == len(expected)
    failing = {(f"{c}[{s}]", f"{st}:{n}:{o}") for c, s, st, n, o, v in
               df[["case", "size", "step", "step_name", "output", "verdict"]].itertuples(index=False)
               if cmp.is_failure(v)}
    got_failing = {(tc.get("classname"), tc.get("name")) for tc in root.iter("testcase") if tc.find("failure") is not None}
    assert got_failing == failing and len(failing) > 0 and int(root.get("failures")) == len(failing)
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert set(suites) == {"multi-step[small]", "multi-step-faulty[small]"}
    assert suites["multi-step[small]"].get("failures") == "0"
    for s in suites.values():
        assert int(s.get("tests")) == len(s.findall("testcase"))
    fail = next(f for f in root.iter("failure"))
    assert fail.get("message") in cmp.VERDICTS and f"-m parity replay {os.path.abspath('b/x')}" in fail.text
    # the determinism check is a testcase of every step
    assert ("multi-step[small]", "0:prefill:determinism") in set(cases)


# --------------------------------------------------------------------------- summary.md

def _certified_findings():
    rows = [cmp.finding("compressed_cache", "rounding-boundary", 2, page=1, page_row=0, channel=3),
            cmp.finding("indices", "exact"), cmp.finding("tail_ring", "exact")]
    step1 = [cmp.finding("compressed_cache", "rounding-boundary", 3, page=1, page_row=0, channel=3),
             cmp.finding("indices", "tie-equivalent", 8, row=4), cmp.finding("tail_ring", "exact")]
    return pd.concat([cmp.findings_frame(rows, case="c", size="small", step=0, step_name="a"),
                      cmp.findings_frame(step1, case="c", size="small", step=1, step_name="b")], ignore_index=True)


def test_certified_counts_per_output_in_summary_and_json(tmp_path):
    df = _certified_findings()
    counts = report.certified_counts(df)
    assert counts.to_dict("records") == [
        {"output": "indices", "certificate": "tie-equivalent", "steps": 1, "elements": 8, "max_per_step": 8},
        {"output": "compressed_cache", "certificate": "rounding-boundary", "steps": 2, "elements": 5, "max_per_step": 3}]
    paths = report.write_report(df, tmp_path, wall_s=1.0, environment={"device": "cpu", "git": {"revision": "abc"}},
                                run={"mode": "lockstep"})
    md = open(paths["markdown"]).read()
    assert "## Certified exceptions per output" in md
    assert "| compressed_cache | rounding-boundary | 2 | 5 | 3 |" in md
    assert "| indices | tie-equivalent | 1 | 8 | 8 |" in md
    assert "git: abc" in md and "No divergence." in md
    data = json.load(open(paths["json"]))
    assert data["certified"][1]["elements"] == 5 and data["summary"]["certified"] == {
        "rounding-boundary": 5, "tie-equivalent": 8}
    assert data["summary"]["failures"] == 0
    assert "certified elements: 5 rounding-boundary, 8 tie-equivalent" in report.summary_line(data["summary"])
    # zero counts still list every certifiable output (comparable run to run)
    zero = report.certified_counts(df[df["verdict"] == "exact"])
    assert list(zero["elements"]) == [0, 0] and list(zero["output"]) == ["indices", "compressed_cache"]


def test_first_divergence_table_in_summary(tmp_path):
    resync = _run(multi_step_case(), planted_fault, check_oracle=False, mode="resync")
    paths = report.write_report(resync.findings, tmp_path)
    md = open(paths["markdown"]).read()
    assert "| multi-step | small | 1 | decode-1 |" in md and "| 1 3 |" in md


# --------------------------------------------------------------------------- progress bar

def test_progress_bar_only_on_a_terminal():
    from rich.console import Console

    from parity.sessions.session import RunOptions, _progress, run_cases
    assert _progress(Console(file=open("/dev/null", "w"), force_terminal=False), 5) is None
    tty = Console(force_terminal=True, record=True, width=120)
    assert _progress(tty, 5) is not None
    seen = []
    from reference.stateful import forward
    results = run_cases([multi_step_case()], RunOptions(device=_device(), repeat=1), console=tty,
                        kernel_forward=forward, on_case=lambda c, r: seen.append(r.case_id))
    assert seen == ["multi-step[small]"] and results[0].ok and results[0].steps_run == 5


def test_resync_does_not_blame_the_reference_for_the_kernels_caches():
    """In resync mode the reference runs on the kernel's caches, so it is not compared with the
    whole-history oracle (which would report the kernel's fault as reference-vs-oracle)."""
    res = _run(multi_step_case(), planted_fault, check_oracle=True, mode="resync")
    assert res.failing_steps == [1, 3]
    assert not (res.findings["output"] == "reference-vs-oracle").any()
    lock = _run(multi_step_case(), planted_fault, check_oracle=True)
    assert (lock.findings["output"] == "reference-vs-oracle").any()     # lockstep still checks it
