"""Every NPU branch of ``kpool.platform`` and ``kpool.hardware`` with a fake ``torch_npu``
(kpool-algorithm.md §6 "Hardware gate"; platform-numerics.md §1.4, §2.2, §6.2).

No Ascend hardware here: a fake ``torch_npu`` module goes into ``sys.modules`` and a fake
``torch.npu`` namespace onto ``torch`` (monkeypatch, undone after each test). ``resolve_device``
is ``lru_cache``d and ``current_hardware_profile`` caches ``kpool.hardware._PROFILE``: the
``platform_state`` fixture clears both and restores ``TRITON_INTERPRET`` / ``KPOOL_DEVICE``,
so the rest of the session (KPOOL_DEVICE=cpu, TRITON_INTERPRET=1) is unaffected.
"""
import importlib.machinery
import os
import sys
import types

import pytest
import torch

from kpool import hardware, platform
from kpool.errors import KPoolUnsupportedError
from kpool.hardware import HardwareProfile, current_hardware_profile, hardware_profile
from kpool.platform import detect_device, launch_options, resolve_device

A2 = list(range(220, 226))
A3 = list(range(250, 256))
A5 = [260]
REJECTED = ([(s, "Ascend310P") for s in range(200, 207)] + [(s, "Ascend910 (A1)") for s in range(100, 105)]
            + [(s, "Ascend310B") for s in range(240, 244)]
            + [(s, "unknown SoC") for s in (0, 219, 226, 249, 256, 259, 261)])
NPU_ONLY_KEYS = {"multibuffer", "force_simt_only", "set_workspace_multibuffer", "compile_mode"}


class FakeNpu(types.SimpleNamespace):
    """Stands in for both ``torch.npu`` and ``torch_npu.npu`` (torch_npu makes them one object)."""

    def __init__(self):
        super().__init__(available=True, soc=223, name="Ascend910B3", index=0, soc_calls=0, raise_on_available=False)

    def is_available(self):
        if self.raise_on_available:
            raise RuntimeError("driver not loaded")  # what a broken CANN install looks like
        return self.available

    def current_device(self):
        return self.index

    def get_device_name(self, device=None):
        return self.name

    def get_soc_version(self):
        self.soc_calls += 1
        return self.soc


@pytest.fixture
def platform_state(monkeypatch):
    """Fresh device resolution: no env override, no interpreter flag, caches cleared and restored."""
    # resolve_device writes os.environ directly, and monkeypatch.delenv records nothing for a
    # variable that was absent (a CUDA session has no TRITON_INTERPRET): restore both by hand.
    saved = {name: os.environ.get(name) for name in ("TRITON_INTERPRET", "KPOOL_DEVICE")}
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("KPOOL_DEVICE", raising=False)
    monkeypatch.setattr(hardware, "_PROFILE", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    resolve_device.cache_clear()
    yield monkeypatch
    resolve_device.cache_clear()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def no_torch_npu(platform_state):
    """A machine without torch_npu (even if some other test imported a fake)."""
    platform_state.delitem(sys.modules, "torch_npu", raising=False)
    platform_state.setattr(platform.importlib.util, "find_spec",
                           _find_spec_without("torch_npu", platform.importlib.util.find_spec))
    return platform_state


def _find_spec_without(name, real):
    return lambda mod, *a, **k: None if mod == name else real(mod, *a, **k)


@pytest.fixture
def fake_npu(platform_state):
    """Install the fake torch_npu / torch.npu; returns the :class:`FakeNpu` to steer."""
    npu = FakeNpu()
    module = types.ModuleType("torch_npu")
    module.__spec__ = importlib.machinery.ModuleSpec("torch_npu", loader=None)  # find_spec needs one
    module.npu = npu
    platform_state.setitem(sys.modules, "torch_npu", module)
    platform_state.setattr(torch, "npu", npu, raising=False)
    return npu


# ------------------------------------------------------------------------ availability probe

def test_npu_unavailable_without_torch_npu(no_torch_npu):
    assert platform._npu_available() is False
    assert detect_device() == "cpu"
    with pytest.raises(KPoolUnsupportedError, match="KPOOL_DEVICE=npu but torch_npu is missing"):
        detect_device("npu")


def test_npu_available_with_fake(fake_npu):
    assert platform._npu_available() is True
    fake_npu.available = False
    assert platform._npu_available() is False


def test_npu_probe_swallows_driver_errors(fake_npu):
    fake_npu.raise_on_available = True
    assert platform._npu_available() is False
    with pytest.raises(KPoolUnsupportedError, match="sees no NPU"):
        detect_device("npu")


def test_npu_probe_when_torch_npu_registers_no_torch_npu(fake_npu, platform_state):
    platform_state.delattr(torch, "npu")  # torch_npu imported but torch.npu missing
    assert platform._npu_available() is False


# ------------------------------------------------------------------------ detect_device

def test_auto_prefers_npu_over_cuda(fake_npu, platform_state):
    platform_state.setattr(torch.cuda, "is_available", lambda: True)
    assert detect_device() == "npu"
    assert detect_device("auto") == "npu"
    fake_npu.available = False
    assert detect_device() == "cuda"


def test_auto_falls_back_to_cpu(fake_npu):
    fake_npu.available = False
    assert detect_device() == "cpu"


def test_interpreter_flag_wins_over_npu_in_auto(fake_npu, platform_state):
    platform_state.setenv("TRITON_INTERPRET", "1")
    assert detect_device() == "cpu"


@pytest.mark.parametrize("env, requested, expected", [
    ("cpu", None, "cpu"),        # KPOOL_DEVICE overrides the available NPU
    ("NPU", None, "npu"),        # case-insensitive
    ("auto", None, "npu"),
    ("npu", "cpu", "cpu"),       # an explicit argument overrides the env
    ("cpu", "npu", "npu"),
])
def test_kpool_device_override(fake_npu, platform_state, env, requested, expected):
    platform_state.setenv("KPOOL_DEVICE", env)
    assert detect_device(requested) == expected


def test_cuda_override_without_cuda_raises(fake_npu, platform_state):
    platform_state.setenv("KPOOL_DEVICE", "cuda")
    with pytest.raises(KPoolUnsupportedError, match="KPOOL_DEVICE=cuda but"):
        detect_device()


def test_unknown_device_name_raises(fake_npu, platform_state):
    platform_state.setenv("KPOOL_DEVICE", "tpu")
    with pytest.raises(KPoolUnsupportedError, match="one of auto, npu, cuda, cpu; got 'tpu'"):
        detect_device()


# ------------------------------------------------------------------------ resolve_device

def test_resolve_npu_leaves_interpreter_off_and_caches(fake_npu):
    assert resolve_device("npu") == "npu"
    assert "TRITON_INTERPRET" not in os.environ
    fake_npu.available = False
    assert resolve_device("npu") == "npu"  # lru_cache: resolved once per process
    resolve_device.cache_clear()
    with pytest.raises(KPoolUnsupportedError):
        resolve_device("npu")


def test_resolve_npu_refuses_interpreter_mode(fake_npu, platform_state):
    platform_state.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(KPoolUnsupportedError, match="TRITON_INTERPRET=1 is set but device 'npu'"):
        resolve_device("npu")


def test_resolve_cpu_sets_interpreter(fake_npu, platform_state):
    for name in platform._KERNEL_MODULES:
        platform_state.delitem(sys.modules, name, raising=False)
    assert resolve_device("cpu") == "cpu"
    assert os.environ["TRITON_INTERPRET"] == "1"


def test_resolve_cpu_after_compiled_import_raises(fake_npu, platform_state):
    platform_state.setitem(sys.modules, "kpool.ops.compress", types.ModuleType("kpool.ops.compress"))
    with pytest.raises(KPoolUnsupportedError, match="imported in compiled mode"):
        resolve_device("cpu")


# ------------------------------------------------------------------------ hardware_profile

@pytest.mark.parametrize("soc, family", [(s, "A2") for s in A2] + [(s, "A3") for s in A3] + [(s, "A5") for s in A5])
def test_hardware_profile_families(fake_npu, soc, family):
    fake_npu.soc, fake_npu.name = soc, f"Ascend-{soc}"
    assert hardware_profile("npu") == HardwareProfile("npu", family, soc, f"Ascend-{soc}")
    assert hardware_profile("npu").is_a5 is (family == "A5")


@pytest.mark.parametrize("soc, label", REJECTED)
def test_hardware_profile_rejects_and_names_soc(fake_npu, soc, label):
    fake_npu.soc, fake_npu.name = soc, "Ascend310P3"
    with pytest.raises(KPoolUnsupportedError) as info:
        hardware_profile("npu")
    message = str(info.value)
    assert message.startswith(hardware.UNSUPPORTED_MESSAGE)
    assert f"Ascend310P3 ({label}, soc_version={soc})" in message


def test_hardware_profile_other_devices(platform_state):
    platform_state.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    assert hardware_profile("cuda") == HardwareProfile("cuda", "NVIDIA H200", None, "NVIDIA H200")
    assert hardware_profile("cpu").family == "interpreter"
    assert not hardware_profile("cpu").is_a5
    with pytest.raises(KPoolUnsupportedError, match="unknown device 'tpu'"):
        hardware_profile("tpu")


def test_current_profile_probes_once(fake_npu, platform_state):
    platform_state.setenv("KPOOL_DEVICE", "npu")
    fake_npu.soc = 251
    profile = current_hardware_profile(resolve_device)
    assert profile == HardwareProfile("npu", "A3", 251, "Ascend910B3")
    fake_npu.soc = 260
    assert current_hardware_profile(resolve_device) is profile and fake_npu.soc_calls == 1


# ------------------------------------------------------------------------ launch_options

@pytest.mark.parametrize("profile, multibuffer", [
    (HardwareProfile("npu", "A2", 223, "Ascend910B3"), True),
    (HardwareProfile("npu", "A3", 250, "Ascend910_9392"), True),
    (HardwareProfile("npu", "A5", 260, "Ascend950PR"), False),
])
def test_launch_options_npu_from_cached_profile(platform_state, profile, multibuffer):
    platform_state.setattr(hardware, "_PROFILE", profile)
    assert launch_options("npu") == {"multibuffer": multibuffer, "enable_fp_fusion": False}


@pytest.mark.parametrize("soc, multibuffer", [(220, True), (225, True), (255, True), (260, False)])
def test_launch_options_npu_end_to_end(fake_npu, platform_state, soc, multibuffer):
    """Nothing cached: launch_options -> current_hardware_profile -> resolve_device -> fake SoC."""
    platform_state.setenv("KPOOL_DEVICE", "npu")
    fake_npu.soc = soc
    assert launch_options("npu") == {"multibuffer": multibuffer, "enable_fp_fusion": False}
    assert hardware._PROFILE.soc_version == soc


def test_launch_options_npu_on_rejected_soc_raises(fake_npu, platform_state):
    platform_state.setenv("KPOOL_DEVICE", "npu")
    fake_npu.soc, fake_npu.name = 202, "Ascend310P3"
    with pytest.raises(KPoolUnsupportedError, match=r"Ascend310P3 \(Ascend310P, soc_version=202\)"):
        launch_options("npu")


def test_launch_options_cuda_and_cpu(platform_state):
    # The NPU profile must not leak into the other backends.
    platform_state.setattr(hardware, "_PROFILE", HardwareProfile("npu", "A2", 223, "Ascend910B3"))
    cuda = launch_options("cuda")
    assert cuda == {"num_warps": 4, "enable_fp_fusion": False}
    assert cuda["enable_fp_fusion"] is False and not NPU_ONLY_KEYS & set(cuda)
    assert launch_options("cpu") == {}
    assert launch_options("tpu") == {}


# ------------------------------------------------------------------------ torch_device, backend

def test_torch_device_cpu_and_cuda(platform_state):
    platform_state.setattr(torch.cuda, "current_device", lambda: 3)
    assert platform.torch_device("cpu") == torch.device("cpu")
    assert platform.torch_device("cuda") == torch.device("cuda", 3)


def test_torch_device_npu(fake_npu, platform_state):
    """``torch.device("npu", i)`` only parses after torch_npu's (irreversible) PrivateUse1 rename,
    so the module's ``torch`` is swapped for a proxy that records the constructor call."""
    fake_npu.index = 5
    proxy = types.SimpleNamespace(device=lambda *args: ("torch.device", args), npu=fake_npu, cuda=torch.cuda)
    platform_state.setattr(platform, "torch", proxy)
    assert platform.torch_device("npu") == ("torch.device", ("npu", 5))


def test_backend_rejects_unsupported_soc_before_kernel_import(fake_npu, platform_state):
    from kpool import SMALL
    from kpool.backend import KPoolIndexerBackend

    fake_npu.soc, fake_npu.name = 104, "Ascend910A"
    for name in platform._KERNEL_MODULES:
        platform_state.delitem(sys.modules, name, raising=False)
    with pytest.raises(KPoolUnsupportedError, match=r"Ascend910A \(Ascend910 \(A1\), soc_version=104\)"):
        KPoolIndexerBackend(SMALL, device="npu")
    assert not any(name in sys.modules for name in platform._KERNEL_MODULES)
