"""pytest set-up shared by every test (platform-numerics.md §6.3).

The device is resolved once, before any test module imports a kernel: ``--device`` (or
``KPOOL_DEVICE``) in {auto, npu, cuda, cpu}; ``cpu`` turns on the Triton interpreter. Markers
``cuda``/``npu``/``cpu`` skip tests meant for another device; ``slow`` marks GLM-size tests.
Hypothesis profiles are registered here too (``HYPOTHESIS_PROFILE`` selects one).
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
                         ("interpreter_ok", "kernel parity test that also runs under triton-ascend's interpreter")):
        config.addinivalue_line("markers", f"{marker}: {text}")
    try:
        from hypothesis import settings
        settings.register_profile("ci", max_examples=20, deadline=None, derandomize=True)
        settings.register_profile("dev", max_examples=50, deadline=None)
        settings.register_profile("device", max_examples=300, deadline=None)
        settings.register_profile("nightly", max_examples=2000, deadline=None)
        settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
    except ImportError:  # pragma: no cover - hypothesis is a core dependency
        pass


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
