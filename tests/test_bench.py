"""``make bench`` (python -m parity.bench) times every step of the chosen cases."""
import pandas as pd

from parity import bench


def test_bench_times_every_step(tmp_path, capsys):
    out = tmp_path / "bench.csv"
    assert bench.main(["--size", "small", "--repeat", "1", "--case", "pool-boundary-decode", "--csv", str(out)]) == 0
    table = pd.read_csv(out)
    from cases.scenarios import SCENARIOS
    assert len(table) == len(SCENARIOS["pool-boundary-decode"]("small").steps)
    assert (table["median_ms"] > 0).all() and (table["rows"] > 0).all()
    assert "median_ms" in capsys.readouterr().out


def test_bench_unknown_case_is_a_usage_error():
    assert bench.main(["--case", "no-such-case"]) == 2
