"""Usage errors exit 2 with a message that says what is known, and never run anything."""
import pytest

from parity.cli import main


@pytest.mark.parametrize("argv, needle", [
    (["run", "--suite", "public", "--case", "nosuch"], "unknown public case"),
    (["run", "--kernel", "mutant:nope", "--case", "decode-tail"], "known: visible-off-by-one"),
    (["run", "--suite", "seed", "--case", "C05"], "need --suite public"),
    (["run", "--size", "small", "--case", "decode-tail[glm5.3-flash]"], "needs that size selected"),
])
def test_usage_errors_exit_2_and_name_the_alternatives(argv, needle, capsys, device):
    assert main([argv[0], "--device", device, *argv[1:]]) == 2
    captured = capsys.readouterr()
    assert needle in captured.out + captured.err


def test_replay_command_uses_this_interpreter():
    import sys
    from parity.sessions.bundle import replay_command
    assert replay_command("bundles/x").startswith(sys.executable)


@pytest.mark.integration
def test_record_says_which_suites_it_bundles(tmp_path, capsys, device):
    """``record --suite public`` runs the case but writes no bundle, and says so."""
    out = tmp_path / "b"
    assert main(["record", "--device", device, "--suite", "public", "--case", "C09", "--bundle-dir", str(out)]) == 0
    captured = capsys.readouterr()
    assert "record writes bundles for corpus and seed cases only" in captured.out
    assert not out.exists()


@pytest.mark.integration
def test_public_suite_runs_the_kernel_under_test(tmp_path, capsys, device):
    """``--kernel`` reaches the public cases (it used to be dropped: a planted fault passed), and
    ``--junit`` writes the public part next to the given path."""
    junit = tmp_path / "junit.xml"
    assert main(["run", "--device", device, "--suite", "public", "--case", "C09",
                 "--kernel", "mutant:visible-off-by-one", "--junit", str(junit)]) == 1
    assert "kernel=mutant:visible-off-by-one" in capsys.readouterr().out
    assert (tmp_path / "junit-public.xml").is_file()
    assert main(["run", "--device", device, "--suite", "public", "--case", "C09", "--junit", str(junit)]) == 0


def test_case_with_suite_all_is_a_usage_error(capsys, device):
    assert main(["run", "--device", device, "--suite", "all", "--case", "decode-tail"]) == 2
    assert "--case needs one suite" in capsys.readouterr().err


# ---- what make parity and the workflows run (issue 9 point 3) ------------------------------------

import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKFLOWS = os.path.join(ROOT, ".github", "workflows")


def _make_parity_args(*variables, env=None):
    """The ``python -m parity run`` arguments ``make -n parity VARIABLES`` renders (the recipe is
    printed, not run), parsed by the CLI's own parser."""
    from parity.cli import build_parser
    base = {k: v for k, v in os.environ.items() if k not in ("PARITY_ARGS", "SUITE", "SIZE", "KERNEL", "DEVICE",
                                                             "PROFILE", "REPORT", "JUNIT", "PARITY_EXTRA")}
    proc = subprocess.run(["make", "-n", "-s", "parity", *variables], cwd=ROOT, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    line = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith('"$PY" -m parity run')][-1]
    argv = shlex.split(line.split("-m parity", 1)[1])
    return build_parser().parse_args(argv)


def _workflow(name):
    """``(env, make variables)`` of a workflow: its top-level ``env:`` block and the variables of its
    ``make parity`` line (a tiny reader for these two files: no YAML library is a dependency)."""
    text = open(os.path.join(WORKFLOWS, name)).read()
    env, block = {}, re.search(r"^env:\n((?:  .*\n|\n)*)", text, re.M)
    for ln in (block.group(1) if block else "").splitlines():
        m = re.match(r"  ([A-Z_]+):\s*(\S+)", ln)
        if m:
            env[m.group(1)] = m.group(2).strip('"')
    (make,) = re.findall(r"^\s*make parity(.*)$", text, re.M)
    return text, env, shlex.split(make)


@pytest.mark.parametrize("name, device", [("parity-nvidia.yml", "cuda"), ("parity-ascend.yml", "npu")])
def test_device_workflow_runs_all_four_suites(name, device):
    """The device job's command, rendered by make with the workflow's env, selects corpus, seed,
    public and generated at both sizes with the device profile (PARITY_ARGS used to replace it and
    the job ran the seed suite only)."""
    from parity.selection.suites import PARTS, suite_parts
    text, env, variables = _workflow(name)
    assert "PARITY_ARGS" not in text
    args = _make_parity_args(*variables, env=env)
    assert suite_parts(args.suite) == list(PARTS) == ["corpus", "seed", "public", "generated"]
    assert args.size == "all" and args.device == device and args.profile == "device"
    assert args.report == "reports" and args.junit == "reports/junit.xml" and args.kernel == "kpool"


def test_cli_defaults_equal_make_defaults():
    from parity.selection.suites import suite_parts
    from parity.cli import DEFAULT_SIZE, DEFAULT_SUITE, build_parser
    made = _make_parity_args()
    cli = build_parser().parse_args(["run"])
    assert made.suite == DEFAULT_SUITE == "all" and made.size == cli.size == DEFAULT_SIZE == "all"
    assert cli.suite is None      # resolved to DEFAULT_SUITE, or to the suite of --case
    assert suite_parts(made.suite) == ["corpus", "seed", "public", "generated"]


def test_make_kernel_knob_reaches_the_cli_and_parity_args_is_refused():
    assert _make_parity_args("KERNEL=mutant:ape-reversed").kernel == "mutant:ape-reversed"
    assert _make_parity_args("PARITY_EXTRA=--no-oracle --all-rows").no_oracle
    proc = subprocess.run(["make", "-n", "parity"], cwd=ROOT, env=dict(os.environ, PARITY_ARGS="--suite seed"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "PARITY_ARGS" in proc.stderr and "KERNEL=" in proc.stderr


# ---- triage output (issue 9 point 7) -------------------------------------------------------------

def test_help_answers_without_importing_torch():
    code = ("import sys\nfrom parity.cli import main\n"
            "for argv in (['--help'], ['run', '--help'], ['replay', '--help'], ['corpus', 'add', '--help'],"
            " ['list', '--help']):\n    assert main(argv) == 0, argv\n"
            "heavy = [m for m in ('torch', 'pandas', 'triton', 'numpy') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "usage: python -m parity" in proc.stdout and "--all-rows" in proc.stdout and "--expect" in proc.stdout


def test_list_prints_what_can_be_selected(capsys):
    from parity.sessions.session import RELATION_NAMES
    assert main(["list", "mutants"]) == 0
    out = capsys.readouterr().out
    assert "mutant:chunk-offset" in out and "mutant:visible-off-by-one" in out and "wrong-index" in out
    assert main(["list", "relations"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in RELATION_NAMES) and "default on cuda/npu" in out
    assert main(["list", "cases"]) == 0
    out = capsys.readouterr().out
    assert "prefill-topk" in out and "C09" in out and "planted-visible-off-by-one" in out
    assert main(["list", "nothing"]) == 2


def test_relation_names_match_the_relations():
    from parity.checking.metamorphic import RELATIONS
    from parity.sessions.session import RELATION_NAMES
    assert tuple(RELATIONS) == RELATION_NAMES


def exploding_kernel(**kwargs):
    """A stand-in kernel that raises from a helper (tests the crash traceback)."""
    return _explode_inside(kwargs["k"].shape[0])


def _explode_inside(rows):
    raise RuntimeError(f"boom at {rows} rows")


@pytest.mark.integration
def test_kernel_crash_keeps_its_full_traceback(tmp_path, capsys, device):
    """A kernel exception is a ``crash`` finding whose traceback (file, line, function) is printed
    in the console and kept in the report and the bundle (it was cut to 300 characters)."""
    rep = tmp_path / "rep"
    assert main(["run", "--device", device, "--suite", "seed", "--size", "small", "--case", "prefill-topk",
                 "--kernel", "tests.test_cli_usage:exploding_kernel", "--report", str(rep)]) == 1
    out = capsys.readouterr().out
    for text in (out, (rep / "summary.md").read_text(),
                 (rep / "bundles" / "prefill-topk-small" / "README.md").read_text(),
                 (rep / "bundles" / "prefill-topk-small" / "findings.csv").read_text()):
        assert "Traceback (most recent call last)" in text and "_explode_inside" in text
        assert "test_cli_usage.py" in text and "RuntimeError: boom at" in text


def test_decode_relations_default_on_devices_and_off_on_the_interpreter(device):
    """``captured-replay`` runs by default on the seed cases' decode steps on cuda/npu, not on the
    CPU interpreter, and the run header says which."""
    import argparse

    from cases.scenarios import decode_tail
    from parity.sessions import commands
    from parity.cli import build_parser
    from parity.sessions.session import case_relations, decode_steps
    args = build_parser().parse_args(["run"])
    case = decode_tail("small")
    assert decode_steps(case) == [2, 3, 4, 5]
    for dev, want in (("cuda", ["captured-replay"]), ("npu", ["captured-replay"]), ("cpu", [])):
        options = commands.run_options(argparse.Namespace(**vars(args)), dev, "test")
        assert options.decode_relations == want and options.metamorphic == []
        assert case_relations(case, options) == ([(want, [2, 3, 4, 5])] if want else [])
        text = commands.relations_text(options)
        assert ("captured-replay on the seed cases' decode steps (device default)" in text) == bool(want)
        assert ("captured-replay off (cpu interpreter" in text) == (not want)
    corpus_like = __import__("dataclasses").replace(case, tags=())
    assert case_relations(corpus_like, commands.run_options(args, "cuda", "test")) == []
    off = commands.run_options(build_parser().parse_args(["run", "--decode-relations"]), "cuda", "test")
    assert off.decode_relations == []


@pytest.mark.integration
def test_decode_relations_run_on_decode_steps_only(tmp_path, device):
    import json
    rep = tmp_path / "rep"
    assert main(["run", "--device", device, "--suite", "seed", "--size", "small", "--case", "decode-tail",
                 "--decode-relations", "captured-replay", "--report", str(rep), "--no-oracle"]) == 0
    rows = json.load(open(rep / "results.json"))["results"]
    steps = sorted({r["step"] for r in rows if r["output"] == "metamorphic:captured-replay"})
    assert steps == [2, 3, 4, 5]
    assert "captured-replay" in json.load(open(rep / "results.json"))["run"]["decode_relations"]
