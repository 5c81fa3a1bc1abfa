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
    from parity.bundle import replay_command
    assert replay_command("bundles/x").startswith(sys.executable)


def test_record_says_which_suites_it_bundles(tmp_path, capsys, device):
    """``record --suite public`` runs the case but writes no bundle, and says so."""
    out = tmp_path / "b"
    assert main(["record", "--device", device, "--suite", "public", "--case", "C09", "--bundle-dir", str(out)]) == 0
    captured = capsys.readouterr()
    assert "record writes bundles for corpus and seed cases only" in captured.out
    assert not out.exists()


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
