"""pytest plugin: every selected parity case as a pytest item (entry point ``pytest11``, so
``pip install`` of this package is enough). Built on :mod:`parity.api` only.

    pytest --kpool-kernel vllm-ascend:/src/vllm-ascend --kpool-suite seed --kpool-size small

collects ``kpool[seed/decode-tail/small]``, ``kpool[seed/prefill-tail/small]``, ... (one item per
case, parity-contract.md §1): ``-k`` selects cases, pytest-xdist spreads them over workers
(``--dist loadscope`` keeps nothing together: every case starts from fresh caches), JUnit and the
terminal show a failure as the expected-vs-actual message of :class:`parity.api.ParityFailure`
with its replay command. Without ``--kpool-kernel`` the plugin adds nothing (it is loaded in
every pytest session of an environment that has this package, and imports no torch then).

In a test file instead of on the command line (a vendor repository's own suite)::

    from parity.pytest_plugin import parity_test
    test_kpool_parity = parity_test("vllm-ascend:.", suite="seed", size="small")
"""
from __future__ import annotations

import os
from typing import Optional

import pytest

ITEM = "kpool"
"""Name of every collected item (``kpool[<suite>/<case>/<size>]``)."""


def pytest_addoption(parser):
    group = parser.getgroup("kpool", "KPool parity cases (parity.api)")
    group.addoption("--kpool-kernel", default=None, metavar="IMPL",
                    help="collect the parity cases against this implementation (python -m parity list "
                         "implementations): kpool, mutant:NAME, git:REV, vllm-ascend:PATH, package.module:function")
    group.addoption("--kpool-suite", default="seed", choices=("corpus", "seed", "public", "generated", "all"),
                    help="cases of this suite (default: seed)")
    group.addoption("--kpool-size", default="small", choices=("small", "glm5.3-flash", "all"),
                    help="seed case size (default: small)")
    group.addoption("--kpool-device", default=None, choices=("auto", "cpu", "cuda", "npu"),
                    help="kernel device (default: $KPOOL_DEVICE or the best available; cpu = Triton interpreter)")
    group.addoption("--kpool-bundles", default=None, metavar="DIR",
                    help="write the repro bundles of failing cases here (default: pytest's temporary directory)")


def _device(config) -> Optional[str]:
    return config.getoption("--kpool-device") or os.environ.get("KPOOL_DEVICE") or None


def pytest_configure(config):
    if config.getoption("--kpool-kernel") is None:
        return
    # the device decides whether Triton runs interpreted: resolve it before any kernel import
    from kpool.platform import resolve_device
    os.environ["KPOOL_DEVICE"] = resolve_device(_device(config))
    config.addinivalue_line("markers", "kpool: a parity case collected by --kpool-kernel")


class KPoolItem(pytest.Item):
    """One parity case against the implementation of ``--kpool-kernel``."""

    def __init__(self, *, case, spec: str, **kwargs):
        super().__init__(**kwargs)
        self.case, self.spec = case, spec
        self.add_marker(pytest.mark.kpool)

    def runtest(self):
        from . import api
        bundles = self.config.getoption("--kpool-bundles")      # None: a new temporary directory
        api.assert_parity(self.case, self.spec, device=os.environ.get("KPOOL_DEVICE"), bundle_dir=bundles)

    def repr_failure(self, excinfo):
        from .api import ParityFailure
        if isinstance(excinfo.value, ParityFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"{ITEM}[{self.case.test_id}] on {self.spec}"


class KPoolCollector(pytest.Collector):
    """The parent of the items (``--kpool-kernel`` on the command line)."""

    def collect(self):
        return []


def _items(parent, spec: str, suite: str, size: str):
    from . import api
    return [KPoolItem.from_parent(parent, name=f"{ITEM}[{case.test_id}]", nodeid=f"{ITEM}[{case.test_id}]",
                                  case=case, spec=spec)
            for case in api.list_cases(suite, size, device=os.environ.get("KPOOL_DEVICE"))]


@pytest.hookimpl(tryfirst=True)      # before -k / -m deselection, so they see the cases
def pytest_collection_modifyitems(session, config, items):
    spec = config.getoption("--kpool-kernel")
    if spec is None:
        return
    parent = KPoolCollector.from_parent(session, name=ITEM, nodeid=ITEM)
    cases = _items(parent, spec, config.getoption("--kpool-suite"), config.getoption("--kpool-size"))
    items.extend(cases)
    # reported as a collection, so "collected N items" (and -q's "N tests collected") count them
    config.hook.pytest_collectreport(report=pytest.CollectReport(ITEM, "passed", None, cases))


def parity_test(implementation: str, *, suite: str = "seed", size: str = "small", device: Optional[str] = None):
    """A parametrized test function: one test per case of ``suite``/``size`` on ``implementation``
    (for a test module of another repository; ids ``seed/decode-tail/small``).

    Cases are listed at collection (:func:`parity.api.list_cases`), each run by
    :func:`parity.api.assert_parity`. Raises at collection what :func:`parity.api.list_cases` raises.
    """
    from . import api
    cases = api.list_cases(suite, size, device=device)

    @pytest.mark.parametrize("kpool_case", cases, ids=[c.test_id for c in cases])
    def test(kpool_case, tmp_path):
        api.assert_parity(kpool_case, implementation, device=device, bundle_dir=str(tmp_path))
    return test
