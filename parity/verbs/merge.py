"""``python -m parity merge REPORT_DIR...``: the reports of the shards of one run (``python -m
parity run --shard i/n --report DIR`` on each host of a CI matrix, :mod:`parity.selection.shard`) combined
into the report the unsharded run would have written.

Every shard directory holds ``shard.json`` (its shard, the whole run's unit list); the merge
checks that the shards are ``0 .. n-1`` of one run, then writes ``OUT/results.csv``,
``results.json``, ``summary.md``, ``timings.csv`` (corpus and seed cases), ``OUT/public/``
(public cases), ``OUT/generated/coverage.json`` (the generated kinds, coverage summed) and
``OUT/shard.json``: the rows of each table are the unsharded run's, in its order (rows are
sorted by their unit's position in the run, a stable sort, so the rows of one case keep their
order). Wall times are the sums of the shards'.

Exit status: 0 the merged run passes, 1 it has a failure (or a generated kind failed), 2 missing
or inconsistent shards.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Callable, Dict, List, Optional, Sequence

import pandas as pd

from ..sessions.commands import DEFAULT_OUT, EXIT_FAIL, EXIT_OK, EXIT_USAGE
from ..findings.vocabulary import FINDING_COLUMNS, LOCATION_COLUMNS, TEXT_LOCATION_COLUMNS
from ..selection.shard import read_manifest, write_manifest

_INT_COLUMNS = ("step", "mismatches", *[c for c in LOCATION_COLUMNS if c not in TEXT_LOCATION_COLUMNS])


def read_results(path: str) -> pd.DataFrame:
    """A ``results.csv`` read back with the column types it was written with (nullable integers,
    text), so that writing it again reproduces it."""
    text = [c for c in FINDING_COLUMNS if c not in _INT_COLUMNS] + ["first_mismatch", "worker_device"]
    return pd.read_csv(path, dtype={**{c: "Int64" for c in _INT_COLUMNS}, **{c: str for c in text}})


def _ordered(frames: List[pd.DataFrame], unit_of: Callable[[pd.Series], pd.Series], order: Dict[str, int]):
    """The rows of ``frames`` in run order: a stable sort on each row's unit index."""
    frames = [f for f in frames if f is not None]
    if not frames:
        return None
    df = pd.concat(frames, ignore_index=True)
    if not len(df):
        return df
    key = unit_of(df).map(order)
    if key.isna().any():
        raise ValueError(f"rows of units the run does not have: {sorted(set(unit_of(df)[key.isna()]))[:5]}")
    return df.iloc[key.argsort(kind="stable")].reset_index(drop=True)


def _json(path: str) -> Optional[dict]:
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def _check_shards(manifests: Sequence[dict], dirs: Sequence[str]) -> None:
    """Raises ValueError unless the manifests are shards ``0 .. n-1`` of one run, each once."""
    units = manifests[0]["units"]
    n = manifests[0]["shard"][1]
    for m, d in zip(manifests, dirs):
        if m["units"] != units or m["shard"][1] != n:
            raise ValueError(f"{d} is a shard of another run (its unit list or shard count differs from {dirs[0]}'s)")
    seen = sorted(m["shard"][0] for m in manifests)
    if seen != list(range(n)):
        raise ValueError(f"need shards 0..{n - 1} of {n} exactly once each, got {seen}")


def _merge_table(dirs, sub: str, unit_of, order, out: str, *, with_timings: bool):
    """Merge ``DIR/sub/results.csv`` (and timings) of every shard into ``out/sub``; returns the
    merged results frame or ``None`` when no shard has that table."""
    from ..reporting import report
    paths = [os.path.join(d, sub, "results.csv") for d in dirs]
    frames = [read_results(p) for p in paths if os.path.isfile(p)]
    df = _ordered(frames, unit_of, order)
    if df is None:
        return None
    infos = [_json(os.path.join(d, sub, "results.json")) or {} for d in dirs]
    infos = [i for i in infos if i]
    wall = sum(float((i.get("summary") or {}).get("wall_s") or 0.0) for i in infos)
    bundles = {}
    for i in infos:
        bundles.update(i.get("bundles") or {})
    timings = None
    if with_timings:
        tpaths = [os.path.join(d, sub, "timings.csv") for d in dirs]
        timings = _ordered([pd.read_csv(p) for p in tpaths if os.path.isfile(p)],
                           lambda t: t["case"].astype(str) + "[" + t["size"].astype(str) + "]", order)
    first = infos[0] if infos else {}
    report.write_report(df, os.path.join(out, sub) if sub else out, wall_s=wall, timings=timings,
                        environment=first.get("environment"), bundles=bundles or None, run=first.get("run"))
    return df


def _merge_generated(dirs, out: str) -> Optional[dict]:
    """Merge ``DIR/generated/coverage.json``: runs united, coverage summed."""
    from ..findings.coverage import Coverage
    docs = [d for d in (_json(os.path.join(x, "generated", "coverage.json")) for x in dirs) if d]
    if not docs:
        return None
    total = Coverage()
    runs = {}
    for doc in docs:
        total.merge(Coverage.from_dict(doc["coverage"]))
        runs.update(doc["runs"])
    merged = {"profile": docs[0]["profile"], "warm_up_ok": all(d["warm_up_ok"] for d in docs), "runs": runs,
              "coverage": total.to_dict()}
    os.makedirs(os.path.join(out, "generated"), exist_ok=True)
    with open(os.path.join(out, "generated", "coverage.json"), "w") as f:
        json.dump(merged, f, indent=1)
    return merged


def merge_reports(dirs: Sequence[str], out: str, *, junit: Optional[str] = None) -> dict:
    """Merge the shard reports ``dirs`` into ``out`` (module docstring).

    Returns:
        ``{"main": frame or None, "public": frame or None, "generated": dict or None,
        "parts": {unit: suite}, "units": [...]}``.
    Raises:
        ValueError: a directory without a manifest, shards of different runs, a missing or
        repeated shard, rows of units the run does not have.
    """
    from ..reporting import report
    manifests = [read_manifest(d) for d in dirs]
    _check_shards(manifests, dirs)
    units = manifests[0]["units"]
    order = {u: k for k, u in enumerate(units)}
    main = _merge_table(dirs, "", lambda df: df["case"].astype(str) + "[" + df["size"].astype(str) + "]", order, out,
                        with_timings=True)
    public = _merge_table(dirs, "public", lambda df: df["case"].astype(str).str.split(":").str[0], order, out,
                          with_timings=False)
    generated = _merge_generated(dirs, out)
    write_manifest(out, shard=None, units=units, ran=units, suite=manifests[0]["suite"],
                   parts=manifests[0]["parts"])
    if junit:
        if main is not None:
            report.write_junit(main, junit)
        if public is not None:
            report.write_junit(public, report.part_path(junit, "public"))
    return {"main": main, "public": public, "generated": generated, "parts": manifests[0]["parts"], "units": units}


def merge_main(args) -> int:
    """``python -m parity merge``: merge, print one summary line per suite, exit as the module
    docstring says."""
    from rich.markup import escape

    from ..reporting.report import make_console, summarize, summary_line
    out = args.out or DEFAULT_OUT
    try:
        merged = merge_reports(args.reports, out, junit=args.junit)
    except (ValueError, KeyError, OSError) as exc:
        print(f"python -m parity merge: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    console = make_console()
    console.print(f"merged {len(args.reports)} shards of {len(merged['units'])} units into {escape(out)}")
    failed = False
    parts = merged["parts"]
    for part, df in (("corpus", merged["main"]), ("seed", merged["main"]), ("public", merged["public"])):
        if df is None:
            continue
        ids = df["case"].astype(str) + "[" + df["size"].astype(str) + "]" if part != "public" else \
            df["case"].astype(str).str.split(":").str[0]
        sub = df[ids.map(lambda u: parts.get(u) == part)]
        if not len(sub):
            continue
        summary = summarize(sub)
        failed |= bool(summary["failures"])
        console.print(escape(f"  {part:<10} {summary_line(summary)}"))
    if merged["generated"] is not None:
        runs = merged["generated"]["runs"]
        ok = merged["generated"]["warm_up_ok"] and all(r["ok"] for r in runs.values())
        failed |= not ok
        line = "; ".join(f"{k} {r['passed_examples']}/{r['examples']} examples passed" for k, r in runs.items())
        console.print(escape(f"  {'generated':<10} {'PASS' if ok else 'FAIL'}: {line}"))
    return EXIT_FAIL if failed else EXIT_OK
