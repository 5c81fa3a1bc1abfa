"""The device-only large case (parity.running.large_case; issue 13 part 3): caches of >= 2**31 elements,
every page and ring block at the top of the range, must give the compact run's bits."""
import pytest


def test_int64_addressing_matches_the_compact_caches(device, torch_device):
    import torch
    if device == "cpu":
        pytest.skip("device only: caches of >= 2**31 elements (12 GiB) and interpreted kernels over them "
                    "would take hours on the CPU interpreter; run with --device cuda (or npu)")
    if device == "cuda" and torch.cuda.mem_get_info()[0] < 16 * 2 ** 30:
        pytest.skip("needs 16 GiB of free device memory")
    from parity.running.large_case import int64_addressing_check
    assert int64_addressing_check(torch_device) == []


def test_large_case_refuses_the_cpu():
    from parity.running.large_case import int64_addressing_check
    with pytest.raises(ValueError):
        int64_addressing_check("cpu")
