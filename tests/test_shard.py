"""Sharded runs (``python -m parity run --shard i/n``, :mod:`parity.selection.shard`) and their merge
(``python -m parity merge``, :mod:`parity.verbs.merge`).

* ``--shard i/n`` keeps the units ``k`` with ``k % n == i``: every unit in exactly one shard;
* the merge of the shards' reports has the unsharded report's rows, in its order (results.csv
  text identical), for the corpus/seed and the public tables;
* missing, repeated or foreign shards are usage errors; generated coverage is summed.
"""
import argparse
import json
import os

import pandas as pd
import pytest

from parity.selection.shard import in_shard, parse_shard, shard_units, write_manifest


def test_parse_shard():
    assert parse_shard("0/1") == (0, 1) and parse_shard("3/4") == (3, 4)
    for bad in ("4/4", "-1/2", "1", "a/b", "0/0"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_shard(bad)


def test_shards_partition_the_units_in_order():
    units = [f"u{k}" for k in range(11)]
    parts = [shard_units(units, (i, 3)) for i in range(3)]
    assert parts[0] == ["u0", "u3", "u6", "u9"] and parts[2] == ["u2", "u5", "u8"]
    assert sorted(sum(parts, [])) == sorted(units)                # each unit exactly once
    assert shard_units(units, None) == units and all(in_shard(k, None) for k in range(3))


def _run(report, *args):
    from parity.cli import main
    return main(["run", "--no-bundles", "--report", str(report), *args])


@pytest.mark.integration
@pytest.mark.parametrize("selection", [
    # three of the cheapest small seed cases (each is run twice): kernel outputs, sentinels and
    # oracle rows (prefill-topk-no-tail) and many-step rejection rows (bad-metadata, bad-arguments)
    ["--suite", "seed", "--size", "small", "--case", "prefill-topk-no-tail", "bad-metadata", "bad-arguments"],
    ["--suite", "public", "--case", "C09", "C13", "C07"],
])
def test_merged_shards_equal_the_unsharded_report(tmp_path, device, selection):
    from kpool.platform import resolve_device
    from parity.cli import main
    resolve_device(device)
    common = ["--device", device, *selection]
    assert _run(tmp_path / "whole", *common) == 0
    for i in range(2):
        assert _run(tmp_path / f"shard{i}", *common, "--shard", f"{i}/2") == 0
    ran = [json.load(open(tmp_path / f"shard{i}" / "shard.json"))["ran"] for i in range(2)]
    assert ran[0] and ran[1] and not set(ran[0]) & set(ran[1])       # both shards ran something
    out = tmp_path / "merged"
    assert main(["merge", str(tmp_path / "shard1"), str(tmp_path / "shard0"), "--out", str(out),
                 "--junit", str(out / "junit.xml")]) == 0
    sub = "public" if "public" in selection else ""
    whole, merged = tmp_path / "whole" / sub / "results.csv", out / sub / "results.csv"
    assert merged.read_text() == whole.read_text()                   # same rows, same order, same text
    assert len(pd.read_csv(merged)) > 10
    if not sub:
        assert len(pd.read_csv(out / "timings.csv")) == len(pd.read_csv(tmp_path / "whole" / "timings.csv"))
    assert os.path.isfile(out / ("junit-public.xml" if sub else "junit.xml"))


def _shard_dir(root, name, shard, units, parts=None):
    d = root / name
    write_manifest(str(d), shard=shard, units=units, ran=shard_units(units, shard), suite="all",
                   parts=parts or {u: "seed" for u in units})
    return str(d)


def test_merge_refuses_missing_repeated_or_foreign_shards(tmp_path, capsys):
    from parity.cli import main
    units = ["a[small]", "b[small]", "c[small]"]
    s0 = _shard_dir(tmp_path, "s0", (0, 2), units)
    s1 = _shard_dir(tmp_path, "s1", (1, 2), units)
    other = _shard_dir(tmp_path, "other", (1, 2), units[:2])
    for dirs, reason in (([s0], "need shards 0..1"), ([s0, s0], "need shards 0..1"),
                         ([s0, other], "shard of another run"), ([s0, str(tmp_path / "nope")], "no readable")):
        capsys.readouterr()
        assert main(["merge", *dirs, "--out", str(tmp_path / "m")]) == 2
        assert reason in capsys.readouterr().err, reason
    assert main(["merge", s0, s1, "--out", str(tmp_path / "m")]) == 0  # nothing ran: an empty pass


def test_merge_sums_generated_coverage(tmp_path):
    from parity.findings.coverage import Coverage
    from parity.verbs.merge import merge_reports
    units = ["generated:batch", "generated:engine"]
    parts = {u: "generated" for u in units}
    dirs = []
    for i, kind in enumerate(("batch", "engine")):
        cov = Coverage()
        cov.cases, cov.classes["visible=K"], cov.tails[4] = 3 + i, 2 + i, {i, 2}
        d = _shard_dir(tmp_path, f"s{i}", (i, 2), units, parts)
        os.makedirs(os.path.join(d, "generated"))
        with open(os.path.join(d, "generated", "coverage.json"), "w") as f:
            json.dump({"profile": "ci", "warm_up_ok": True, "coverage": cov.to_dict(),
                       "runs": {kind: {"passed_examples": 5, "examples": 5, "ok": True}}}, f)
        dirs.append(d)
    merged = merge_reports(dirs, str(tmp_path / "m"))["generated"]
    assert set(merged["runs"]) == {"batch", "engine"}
    assert merged["coverage"]["cases"] == 7 and merged["coverage"]["classes"]["visible=K"] == 5
    assert merged["coverage"]["tail_lengths"] == {"4": [0, 1, 2]}
    assert json.load(open(tmp_path / "m" / "generated" / "coverage.json")) == merged
