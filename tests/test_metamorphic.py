"""Metamorphic relations (parity/checking/metamorphic.py): each holds bitwise on the real kernels, and each
catches a kernel that breaks it (stand-in forwards built on the reference, one planted fault per
relation).

Run: ``TRITON_INTERPRET=1 python -m pytest -q tests/test_metamorphic.py``.
"""
from __future__ import annotations

import pytest

from parity.checking import metamorphic as mm


def _case():
    """full-padding[small]: FULL-mode replays with padding rows, 2-3 requests, an output buffer."""
    from cases.scenarios import full_padding
    return full_padding("small")


def _reference():
    from reference.stateful import forward
    return forward


def _verdicts(df):
    return {(o.split(":", 1)[1], v) for o, v in zip(df["output"], df["verdict"])}


def test_every_relation_holds_on_the_kernels(device):
    from kpool.platform import resolve_device
    resolve_device(device)
    df = mm.run_relations(_case(), device=device, steps=[1, 2])
    assert _verdicts(df) == {(name, "exact") for name in mm.RELATIONS}, df[["step", "output", "verdict", "detail"]]
    # captured-replay of step s replays it over the captured step s - 1 (pairs 0->1, 1->2)
    assert set(df.loc[df["output"] == "metamorphic:captured-replay", "step"]) == {1, 2}
    assert set(df.loc[df["output"] == "metamorphic:batch-permutation", "step"]) == {1, 2}


def test_relations_hold_for_the_reference_too(device):
    # the reference has no max_score_rows: score-chunking does not apply to it; it is host code,
    # so on a device a graph cannot capture it (captured-replay is the kernels' relation there)
    names = [n for n in mm.RELATIONS if n != "score-chunking" and (device == "cpu" or n != "captured-replay")]
    df = mm.run_relations(_case(), names, device=device, kernel_forward=_reference(), steps=[1, 2])
    assert _verdicts(df) == {(name, "exact") for name in names}


# --------------------------------------------------------------------------- planted faults

def _order_dependent(**kw):
    """Breaks batch-permutation: the first row of the batch gets one wrong history column."""
    out = _reference()(**kw)
    if out is not None and int(kw["positions"][0]) >= 7:
        out[0, 0, 0] = out[0, 0, 0] + 4
    return out


def _leaks_into_padding(**kw):
    """Breaks padding-rows: padding rows come out 0 instead of -1."""
    out = _reference()(**kw)
    if out is not None:
        out[int(kw["cum_query_lens"][-1]):] = 0
    return out


def _dirty_alignment(**kw):
    """Breaks output-width: a caller buffer's first alignment column and the row after T are written."""
    out = _reference()(**kw)
    buf = kw["output_buffer"]
    if buf is not None:
        T, W = out.shape[0], out.shape[2]
        buf[0, W] = 5
        buf[T, 0] = 5
    return out


def _chunk_sensitive(max_score_rows=None, **kw):
    """Breaks score-chunking: the last live row changes when the scratch is chunked."""
    out = _reference()(**kw)
    if max_score_rows is not None and out is not None:
        out[int(kw["cum_query_lens"][-1]) - 1, 0, 0] += 4
    return out


def _stale_metadata_forward(base=None):
    """Breaks captured-replay: metadata memoized per tensor (a host-side cache keyed by buffer),
    so a replay with new metadata written in place reuses the captured step's positions. ``base``:
    the forward it wraps (default the reference; on a device the production kernels, since a graph
    cannot capture the reference's host code)."""
    seen = {}
    base = base or _reference()

    def forward(**kw):
        key = kw["positions"].data_ptr()
        if key in seen:
            kw = dict(kw, positions=seen[key][1].clone())
        else:
            seen[key] = (kw["positions"], kw["positions"].clone())   # keeps the buffer alive
        return base(**kw)
    return forward


@pytest.mark.parametrize("relation, fault, verdicts", [
    ("batch-permutation", _order_dependent, {"wrong-index"}),
    ("padding-rows", _leaks_into_padding, {"padding-leak"}),
    ("output-width", _dirty_alignment, {"padding-leak", "stray-write"}),
    ("score-chunking", _chunk_sensitive, {"wrong-index"}),
    ("captured-replay", None, {"wrong-index"}),
])
def test_each_relation_catches_its_fault(relation, fault, verdicts, device):
    if fault is None:
        import functools

        from kpool.indexer import forward      # captured as a serving engine runs it: no host validation
        fault = _stale_metadata_forward(functools.partial(forward, validate=False) if device != "cpu" else None)
    df = mm.run_relations(_case(), [relation], device=device, kernel_forward=fault, steps=[1, 2])
    bad = df[df["verdict"] != "exact"]
    assert set(bad["output"]) == {f"metamorphic:{relation}"}
    assert verdicts <= set(bad["verdict"]), bad[["step", "verdict", "detail"]]
    first = bad.iloc[0]
    assert first["step"] in (1, 2)
    if "wrong-index" in set(bad["verdict"]):
        wi = bad[bad["verdict"] == "wrong-index"].iloc[0]
        assert wi["row"] >= 0 and wi["column"] >= 0


def test_unknown_relation_and_inapplicable_steps(device):
    with pytest.raises(ValueError, match="unknown metamorphic relation"):
        mm.run_relations(_case(), ["nope"], device=device, kernel_forward=_reference())
    from cases.scenarios import prefill_topk
    case = prefill_topk("small")
    # chunk-1 is one request: no permutation finding for that step
    df = mm.run_relations(case, ["batch-permutation"], device=device, kernel_forward=_reference(), steps=[1])
    assert len(df) == 0


@pytest.mark.integration
def test_cli_metamorphic_option(tmp_path, device):
    """``python -m parity run --metamorphic RELATION`` adds the relation's rows to the results."""
    import json

    from kpool.platform import resolve_device
    from parity.cli import main
    resolve_device(device)
    rep = tmp_path / "rep"
    assert main(["run", "--device", device, "--size", "small", "--case", "prefill-topk", "--repeat", "1", "--no-oracle",
                 "--metamorphic", "padding-rows", "--decode-relations", "--report", str(rep), "--no-bundles"]) == 0
    rows = json.load(open(rep / "results.json"))["results"]
    meta = [r for r in rows if r["output"].startswith("metamorphic:")]
    assert {r["output"] for r in meta} == {"metamorphic:padding-rows"} and len(meta) == 4
    assert all(r["verdict"] == "exact" for r in meta)
    assert main(["run", "--device", device, "--case", "prefill-topk", "--metamorphic", "nope"]) == 2
