"""Multi-worker parity runs (``python -m parity run --jobs N``, :mod:`parity.running.parallel`).

* device pinning: worker ``i`` gets physical device ``i % n`` of the parent's visible list via
  ``CUDA_VISIBLE_DEVICES`` / ``ASCEND_RT_VISIBLE_DEVICES``, in the environment it is spawned
  with (checked in real spawned processes, before they import torch); cpu is not pinned;
* merging: a ``--jobs 2`` run on the CPU interpreter gives the same results table, row for row,
  as ``--jobs 1``, plus the ``worker`` / ``worker_device`` columns (both workers used);
* failures: a worker that raises aborts the run with a message naming the worker and the case;
  a worker that dies (``BrokenProcessPool``) is a crash finding of its case, the other cases
  still run.
"""
import os
import types

os.environ.setdefault("KPOOL_DEVICE", "cpu")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from parity.running import parallel  # noqa: E402
from parity.running.parallel import ParallelRunError, worker_environment  # noqa: E402

CASES = ["prefill-topk[small]", "full-padding[small]"]   # the two fastest seed cases


# ----------------------------------------------------------------------------- pinning (pure)

def test_visible_devices_from_env_or_device_count(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3")
    assert parallel.visible_devices("cuda") == ["2", "3"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert parallel.visible_devices("cuda") == ["0", "1"]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert parallel.visible_devices("cuda") == ["0"]
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "4,5,6")
    assert parallel.visible_devices("npu") == ["4", "5", "6"]
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES")
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(device_count=lambda: 8), raising=False)
    assert parallel.visible_devices("npu") == [str(i) for i in range(8)]
    assert parallel.visible_devices("cpu") == []


@pytest.mark.parametrize("device, devices, jobs, expected", [
    ("cuda", ["0", "1"], 2, ["0", "1"]),                 # two GPUs: one each
    ("cuda", ["2", "3"], 4, ["2", "3", "2", "3"]),       # round robin over the parent's list
    ("cuda", ["0"], 2, ["0", "0"]),                      # one GPU: shared
    ("npu", ["0", "1", "2"], 3, ["0", "1", "2"]),
])
def test_worker_environment_round_robin(device, devices, jobs, expected):
    var = parallel.VISIBLE_DEVICES_ENV[device]
    other = ({"cuda", "npu"} - {device}).pop()
    envs = [worker_environment(w, device, devices, jobs, base={}) for w in range(jobs)]
    assert [e[var] for e in envs] == expected
    assert all(parallel.VISIBLE_DEVICES_ENV[other] not in e for e in envs)
    assert all(e["KPOOL_DEVICE"] == device for e in envs)
    assert [parallel.worker_device_label(device, e) for e in envs] == [f"{device}:{d}" for d in expected]


def test_worker_environment_cpu_and_threads(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 32)
    env = worker_environment(1, "cpu", [], 2, base={})
    assert env == {"KPOOL_DEVICE": "cpu", "OMP_NUM_THREADS": "16"}
    assert parallel.worker_device_label("cpu", env) == "cpu"
    assert "OMP_NUM_THREADS" not in worker_environment(0, "cuda", ["0"], 2, base={"OMP_NUM_THREADS": "3"})


def test_cost_order_puts_large_cases_first():
    cases = [types.SimpleNamespace(size=s) for s in ("small", "glm5.3-flash", "small", "glm5.3-flash")]
    assert parallel.case_cost_order(cases) == [1, 3, 0, 2]


@pytest.mark.integration
def test_spawned_workers_start_pinned_before_torch(monkeypatch):
    """Real spawned processes: each sees only its device in its start-up environment."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    seen = parallel.probe_workers("cuda", 2)
    assert [s["CUDA_VISIBLE_DEVICES"] for s in seen] == ["5", "7"]
    assert all(s["KPOOL_DEVICE"] == "cuda" and not s["torch_imported_at_start"] for s in seen)
    assert len({s["pid"] for s in seen}) == 2
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5,7"   # the parent's own pin is restored


# ----------------------------------------------------------------------------- merged runs

def _cli_report(tmp_path, jobs, device):
    from parity.cli import main
    out = tmp_path / f"jobs{jobs}"
    rc = main(["run", "--device", device, "--size", "small", "--case", *CASES, "--jobs", str(jobs),
               "--report", str(out)])
    return rc, pd.read_csv(out / "results.csv"), pd.read_csv(out / "timings.csv")


@pytest.mark.integration
def test_two_workers_merge_into_the_single_worker_report(tmp_path, device):
    """On the CPU interpreter with two cores the two-worker run is ``--jobs auto`` (make parity's
    default), which must then use two workers for this checkout's kernels: one run checks both
    the merge and the auto worker count (test_jobs_auto_... checks the one-worker side)."""
    from parity.sessions.session import AUTO_CPU_JOBS
    devices = parallel.visible_devices(device)

    def label(w):   # what worker w is pinned to: round robin over the visible devices (cpu: none)
        return device if device == "cpu" else f"{device}:{devices[w % len(devices)]}"

    rc1, one, t1 = _cli_report(tmp_path, 1, device)
    auto = device == "cpu" and AUTO_CPU_JOBS == 2 and (os.cpu_count() or 1) >= 2
    rc2, two, t2 = _cli_report(tmp_path, "auto" if auto else 2, device)
    assert rc1 == rc2 == 0
    assert set(one["worker"]) == {0} and set(one["worker_device"]) == {label(0)}
    assert set(two["worker"]) == {0, 1} and set(two["worker_device"]) == {label(0), label(1)}   # both ran cases
    keep = [c for c in one.columns if c not in parallel.WORKER_COLUMNS]
    pd.testing.assert_frame_equal(one[keep], two[keep])            # same rows, same order, same values
    assert list(dict.fromkeys(two["case"] + "[" + two["size"] + "]")) == CASES   # case order kept
    assert len(t1) == len(t2) and set(t2["worker"]) == {0, 1}
    # a case runs on exactly one worker
    assert (two.groupby(["case", "size"])["worker"].nunique() == 1).all()


@pytest.mark.integration
@pytest.mark.cpu        # an in-process --device cpu run: a compiled session imported the kernels compiled
def test_jobs_auto_uses_two_cpu_workers_for_kpool_and_one_elsewhere(tmp_path, capsys):
    """``--jobs auto`` (make parity's default): one worker and no note for an implementation that
    cannot use more (isolated). Its two interpreter workers for this checkout's kernels on the CPU
    are checked by test_two_workers_merge_into_the_single_worker_report, whose two-worker run on
    the CPU is ``--jobs auto`` (the same kpool run this test made, once less)."""
    from parity.cli import main
    from parity.sessions.session import AUTO_CPU_JOBS
    if (os.cpu_count() or 1) < AUTO_CPU_JOBS:
        pytest.skip("needs two cores")
    rc = main(["run", "--device", "cpu", "--size", "small", "--case", CASES[0], "--jobs", "auto",
               "--kernel", "tests.standin_impls:no_modes", "--report", str(tmp_path / "standin")])
    out = capsys.readouterr().out
    assert "jobs=auto" in out and "--jobs" not in out          # no "--jobs N needs ..." note
    assert set(pd.read_csv(tmp_path / "standin" / "results.csv")["worker"]) == {0}


def _die_on_case_named_die(case, run_kwargs):
    """A pool task that kills its worker process on the case named ``die`` (a planted OOM kill)."""
    if case.name == "die":
        os._exit(9)
    return parallel._run_one(case, run_kwargs)


def _seed_case(name="prefill-topk"):
    from cases.scenarios import SCENARIOS
    return SCENARIOS[name]("small")


@pytest.mark.integration
def test_dead_worker_is_a_finding_and_the_other_cases_still_run(device):
    """A worker that dies (BrokenProcessPool) is reported as a crash finding of its case; the
    cases it took down with it rerun in fresh workers and pass."""
    import dataclasses
    from kpool.platform import resolve_device
    resolve_device(device)
    good = _seed_case()
    die = dataclasses.replace(good, name="die")
    out = parallel.run_cases([die, good], device=device, jobs=2, task=_die_on_case_named_die)
    assert [r.case_id for r in out] == [die.case_id, good.case_id]
    dead = out[0].findings
    assert list(dead["output"]) == [parallel.WORKER_OUTPUT] and list(dead["verdict"]) == ["crash"]
    assert "died twice" in dead["detail"].iloc[0] and out[0].steps_run == 0
    assert out[1].ok and out[1].steps_run == len(good.steps)


@pytest.mark.integration
def test_worker_exception_names_the_worker_and_the_case(device):
    """A run_case that raises in a worker (a harness bug) aborts the run with the case's name and
    the worker's traceback."""
    from kpool.platform import resolve_device
    resolve_device(device)
    with pytest.raises(ParallelRunError, match=r"worker [01] \(cpu\) failed on (prefill-topk|decode-tail)"
                                               r"\[small\]:\n[\s\S]*ValueError: mode must be"):
        parallel.run_cases([_seed_case(), _seed_case("decode-tail")], device="cpu", jobs=2, mode="sideways")


def test_dead_worker_result_is_one_crash_finding():
    res = parallel.dead_worker_result(_seed_case(), "gone")
    assert res.case_id == "prefill-topk[small]" and not res.ok and res.steps_run == 0
    assert res.failures[["output", "verdict", "mismatches", "detail"]].values.tolist() == [["worker", "crash", 1, "gone"]]


def test_jobs_must_be_positive():
    with pytest.raises(ValueError):
        parallel.run_cases([], device="cpu", jobs=0)
