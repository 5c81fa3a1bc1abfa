"""pytest set-up shared by every test (platform-numerics.md §6.3).

The device is resolved once, before any test module imports a kernel: ``--device`` (or
``KPOOL_DEVICE``) in {auto, npu, cuda, cpu}; ``cpu`` turns on the Triton interpreter. Markers
``cuda``/``npu``/``cpu`` skip tests meant for another device; ``slow`` marks GLM-size tests;
``integration`` marks hypothesis searches, end-to-end CLI runs (subprocesses and in-process
``python -m parity run/record/replay``) and multi-worker runs: ``make test`` runs the unit tier
(``-m "not integration and not slow"``), then the integration tier (``-m "integration or slow"``).
Hypothesis profiles come from :mod:`cases.profiles` (``HYPOTHESIS_PROFILE`` selects one, default
``ci``); the ``warm_kernels`` fixture runs every kernel once before the generated tests.
"""
import os

import pytest


def pytest_addoption(parser):
    parser.addoption("--device", action="store", default=None,
                     help="kernel device: auto (default), npu, cuda or cpu (Triton interpreter)")


def pytest_configure(config):
    from kpool.platform import resolve_device

    requested = config.getoption("--device") or os.environ.get("KPOOL_DEVICE")
    device = resolve_device(requested)
    os.environ["KPOOL_DEVICE"] = device  # xdist workers and subprocesses resolve the same way
    config._kpool_device = device
    for marker, text in (("slow", "GLM-5.3-Flash-size or otherwise long test"),
                         ("cuda", "needs the CUDA device"), ("npu", "needs an Ascend NPU"),
                         ("cpu", "runs only under the CPU interpreter"),
                         ("interpreter_ok", "kernel parity test that also runs under triton-ascend's interpreter"),
                         ("integration", "hypothesis search, end-to-end CLI run or multi-worker run: the second "
                                         "tier of make test (with the slow tests)")):
        config.addinivalue_line("markers", f"{marker}: {text}")
    # Hypothesis profiles ci/dev/device/nightly live in cases/profiles.py (shared with
    # `python -m parity run --suite generated`); HYPOTHESIS_PROFILE selects one, default ci.
    try:
        from cases.profiles import load_profile
    except ImportError:  # pragma: no cover - hypothesis is a core dependency
        return
    load_profile()


def pytest_collection_modifyitems(config, items):
    device = config._kpool_device
    for item in items:
        for other in ("cuda", "npu", "cpu"):
            if other != device and other in item.keywords:
                item.add_marker(pytest.mark.skip(reason=f"needs device {other}, running on {device}"))


@pytest.fixture(scope="session")
def device(request):
    """The resolved kernel backend name: ``"npu"``, ``"cuda"`` or ``"cpu"``."""
    return request.config._kpool_device


@pytest.fixture(scope="session")
def torch_device(device):
    """The torch device tensors for the kernels must live on."""
    from kpool.platform import torch_device as to_torch_device
    return to_torch_device(device)


@pytest.fixture(scope="session")
def warm_kernels(device):
    """Run every kernel once on the session device before the generated tests
    (:func:`parity.running.generated.warm_kernels`); returns its :class:`parity.running.generated.WarmUp`,
    which must have passed."""
    from parity.running.generated import warm_kernels as warm
    done = warm(device)
    assert done.ok, [res.failures for _, res in done.failed]
    return done


# ---- test bodies on a shallow stack -----------------------------------------------------------
# CPython 3.11 keeps the frames' data in 16 KiB chunks and frees a chunk (munmap) as soon as its
# first frame returns. Under pytest (and more under an xdist worker) a test body starts some 60-90
# frames deep, which can put a hot call of the Triton interpreter exactly on a chunk boundary: every
# call then maps and unmaps a chunk (strace: 1,684,000 16 KiB munmaps in
# tests/test_engine.py::test_undersized_ring_found_only_by_the_oracle, 71 s, against 5,000 and 39 s
# when the same body runs in a fresh thread). So every test function runs in a fresh thread that
# starts with an empty frame stack; fixtures stay on the main thread and the test's exception (or
# pytest.skip / xfail / exit) is re-raised there unchanged.

@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    import threading
    from _pytest.python import pytest_pyfunc_call as call_test

    raised = []

    def body():
        try:
            call_test(pyfuncitem)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the main thread below
            raised.append(exc)

    thread = threading.Thread(target=body, name=f"test:{pyfuncitem.name}", daemon=True)
    thread.start()
    thread.join()
    if raised:
        raise raised[0]
    return True
