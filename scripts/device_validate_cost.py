"""Where ``validate=True`` spends its time on a device: the decode 64 x 64k forward with and
without validation under torch.profiler (CPU and device time per op). Run from the repository
root on a CUDA host: ``PYTHONPATH=$PWD python3 scripts/device_validate_cost.py``."""
import time

import torch
from torch.profiler import ProfilerActivity, profile

from kpool.platform import resolve_device

resolve_device("cuda")
from kpool.indexer import forward  # noqa: E402
from kpool.validation import validate_forward  # noqa: E402
from parity.bench.shapes import build_case  # noqa: E402

case = build_case("decode", "decode 64 x 64k", [(1, 65536)] * 64, torch.device("cuda"))
kw = case.kwargs
names = validate_forward.__code__.co_varnames[:validate_forward.__code__.co_argcount + validate_forward.__code__.co_kwonlyargcount]
vk = {k: v for k, v in kw.items() if k in names}
vk.setdefault("output_buffer", None)
for _ in range(3):
    forward(**kw, validate=True)
torch.cuda.synchronize()
for label, fn in (("validate_forward alone", lambda: validate_forward(**vk)),
                  ("forward validate=False", lambda: forward(**kw, validate=False)),
                  ("forward validate=True", lambda: forward(**kw, validate=True))):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    print(f"{label}: {(time.perf_counter() - t) / 20 * 1e3:.3f} ms per call (host wall, 20 calls)")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    validate_forward(**vk)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))
