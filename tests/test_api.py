"""parity.api (the public API) and parity.pytest_plugin (pytest --kpool-kernel) on real cases:
the production kernels pass, a planted fault fails with an expected-vs-actual message and a replay
command that reproduces it."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from parity import api

ROOT = Path(__file__).resolve().parents[1]
PUBLIC_NAMES = ("CaseRef", "Outcome", "ParityFailure", "list_cases", "resolve_implementation", "run_case",
                "assert_parity", "SUITES", "SIZES")


def test_every_public_name_exists():
    # a name that disappears (or leaves __all__) breaks every script written against the API
    assert set(PUBLIC_NAMES) <= set(api.__all__)
    for name in api.__all__:
        assert getattr(api, name) is not None, name


def test_list_cases_is_the_cli_selection(device):
    from cases.scenarios import SCENARIOS
    seed = api.list_cases("seed", "small", device=device)
    assert [c.key for c in seed] == [f"{name}[small]" for name in SCENARIOS]
    assert all(c.suite == "seed" and c.test_id == f"seed/{c.key[:-7]}/small" for c in seed)
    one = api.list_cases("seed", "all", ["decode-tail"], device=device)
    assert [c.test_id for c in one] == ["seed/decode-tail/small", "seed/decode-tail/glm5.3-flash"]
    public = api.list_cases("public", "small", ["C09"], device=device)
    assert public and all(c.key.startswith("C09:") and c.suite == "public" for c in public)


@pytest.mark.parametrize("kwargs, error", [(dict(suite="seeds"), ValueError), (dict(size="large"), ValueError),
                                           (dict(names=["no-such-case"]), KeyError),
                                           (dict(suite="all", names=["decode-tail"]), ValueError)])
def test_bad_selection_is_a_named_error(kwargs, error, device):
    with pytest.raises(error):
        api.list_cases(**kwargs, device=device)


def test_run_case_passes_on_kpool_and_counts_checks(device):
    case = api.list_cases("seed", "small", ["cache-only"], device=device)[0]
    outcome = api.run_case(case, "kpool", device=device)
    assert outcome.ok and outcome.implementation == "kpool"
    assert len(outcome.checks) > 0 and set(outcome.checks["verdict"]) <= {"exact", "rounding-boundary",
                                                                         "tie-equivalent"}
    assert api.assert_parity(case, "kpool", device=device).ok


def test_assert_parity_names_the_fault_and_its_replay(device, tmp_path):
    case = api.list_cases("seed", "small", ["decode-tail"], device=device)[0]
    with pytest.raises(api.ParityFailure) as info:
        api.assert_parity(case, "mutant:tail-wrong-column", device=device, bundle_dir=str(tmp_path))
    failure = info.value
    message = str(failure)
    assert "mutant:tail-wrong-column disagrees with the reference on decode-tail[small]" in message
    assert "wrong-tail" in message and "expected 0, got -1" in message
    assert failure.bundle is not None and Path(failure.bundle).parent == tmp_path
    assert message.rstrip().endswith(f"replay: {failure.replay}") and "parity replay" in failure.replay
    assert not failure.outcome.ok and (failure.outcome.failures["verdict"] == "wrong-tail").any()


def _seed_count(device) -> int:
    return len(api.list_cases("seed", "small", device=device))


def _plugin_args() -> list:
    """The plugin loaded by its module name whether or not the installed package's ``pytest11``
    entry point (``kpool``) would load it too (loading it twice is a pytest error)."""
    return ["-p", "no:kpool", "-p", "parity.pytest_plugin"]


def _pytest(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pytest", *_plugin_args(), "-p", "no:cacheprovider",
                           "-q", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.integration
def test_plugin_collects_the_cases_as_items(tmp_path, device):
    done = _pytest(tmp_path, "--kpool-kernel", "kpool", "--kpool-device", device, "-k", "cache-only or decode-tail",
                   "--junitxml", str(tmp_path / "junit.xml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"2 passed, {_seed_count(device) - 2} deselected" in done.stdout
    listed = _pytest(tmp_path, "--kpool-kernel", "kpool", "--kpool-device", device, "--collect-only")
    assert f"{_seed_count(device)} tests collected" in listed.stdout, listed.stdout   # counted, not "no tests"
    junit = (tmp_path / "junit.xml").read_text()       # JUnit spells the id's slashes as dots
    for name in ("decode-tail", "cache-only"):
        assert re.search(rf'name="kpool\[seed[./]{name}[./]small\]"', junit), junit


@pytest.mark.integration
def test_plugin_fails_a_planted_fault_with_the_message(tmp_path, device):
    done = _pytest(tmp_path, "--kpool-kernel", "mutant:tail-wrong-column", "--kpool-device", device,
                   "-k", "decode-tail", "--kpool-bundles", str(tmp_path / "bundles"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED kpool[seed/decode-tail/small]" in done.stdout
    assert "expected 0, got -1" in done.stdout and "replay:" in done.stdout
    assert (tmp_path / "bundles" / "decode-tail-small").is_dir()


@pytest.mark.integration
def test_three_line_test_file_in_another_repository(tmp_path, device):
    (tmp_path / "test_vendor_kpool.py").write_text(
        "from parity.pytest_plugin import parity_test\n"
        f"test_kpool_parity = parity_test('mutant:tail-wrong-column', suite='seed', size='small', device='{device}')\n")
    done = _pytest(tmp_path, "-k", "decode-tail")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"1 failed, {_seed_count(device) - 1} deselected" in done.stdout
    assert "test_kpool_parity[seed/decode-tail/small]" in done.stdout


def test_plugin_is_inert_without_its_option(tmp_path):
    # every pytest session of an environment with this package loads the plugin: it must add nothing
    (tmp_path / "test_plain.py").write_text("import sys\n\ndef test_one():\n"
                                            "    assert 'torch' not in sys.modules and 'kpool' not in sys.modules\n")
    done = _pytest(tmp_path)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
