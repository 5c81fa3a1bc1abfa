"""The kernel sources stay inside the portable Triton subset (platform-numerics.md §6.1, §1.4).

Static (AST) checks of every ``kpool/ops/**/*.py`` with ``tools/portability.py`` (a lint tool, not a
runtime module), plus the one
place NPU-only launch options may live (``kpool/platform.py:launch_options``). Every rule also
has a negative test on an inline source that violates it, so the check can fail, and a fixed
twin that must pass, so it does not over-report.
"""
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load_portability():
    # tools/ is a lint package beside the runtime ones (the repository root is on sys.path).
    from tools import launch_options, portability
    return portability, launch_options


P, L = _load_portability()
KERNEL_FILES = sorted((REPO / "kpool" / "ops").rglob("*.py"))
KPOOL_FILES = sorted(p for p in (REPO / "kpool").rglob("*.py") if p.name != "platform.py")


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def _rules(source: str, **kw) -> list:
    return sorted({v.rule for v in P.check_portable_subset(textwrap.dedent(source), "<snippet>", **kw)})


# ---------------------------------------------------------------------------- the real tree

@pytest.mark.parametrize("path", KERNEL_FILES, ids=_rel)
def test_kernel_file_uses_only_portable_subset(path):
    found = P.check_portable_subset(path.read_text(encoding="utf-8"), _rel(path))
    assert not found, "non-portable constructs:\n" + "\n".join(map(str, found))


@pytest.mark.parametrize("path", KERNEL_FILES, ids=_rel)
def test_every_tl_sum_is_masked(path):
    """Every ``tl.sum`` is over ``tl.where(...)``: a one-element select (exact), an integer sum
    (exact in any order), or the decode kernel's head sum of the scores (any order, certified by
    parity-contract.md §3.2); or over an integer shift ``a >> b`` (the select's counting passes:
    an integer sum). Printed with -s / -rA."""
    calls = P.sum_calls(path.read_text(encoding="utf-8"), _rel(path))
    for line, ok in calls:
        print(f"{_rel(path)}:{line}: tl.sum first argument is tl.where(...) or a shift: {ok}")
    bad = [line for line, ok in calls if not ok]
    assert not bad, f"tl.sum not over tl.where(...) or a shift at lines {bad}"


@pytest.mark.parametrize("path", KPOOL_FILES, ids=_rel)
def test_npu_options_only_in_platform(path):
    found = P.check_portable_subset(path.read_text(encoding="utf-8"), _rel(path), rules=["npu-option"])
    assert not found, "\n".join(map(str, found))


def test_platform_launch_options_branches():
    source = (REPO / "kpool" / "platform.py").read_text(encoding="utf-8")
    assert L.check_launch_options(source, "kpool/platform.py") == []


def test_kernel_files_listed():
    """The parametrized checks above really run over kpool/ops (not over nothing)."""
    assert REPO / "kpool" / "ops" / "__init__.py" in KERNEL_FILES


# ---------------------------------------------------------------------------- negative tests

HEADER = "import triton\nimport triton.language as tl\n"

# rule -> (violating source, fixed twin[, all rules the bad source breaks]). Without the third
# item the bad source breaks exactly the one rule (a non-ieee tl.dot breaks two).
CASES = {
    "extra-libdevice": [
        ("from triton.language.extra import libdevice\n", ""),
        ("from triton.language.extra.cuda import libdevice as ld\n", ""),
        ("@triton.jit\ndef k(x):\n    return tl.extra.cann.extension.sub_vec(x)\n",
         "@triton.jit\ndef k(x):\n    return x - 1\n"),
        ("import triton.language.extra.libdevice\n", ""),
        ("@triton.jit\ndef k(x):\n    return triton.language.extra.libdevice.exp(x)\n",
         "@triton.jit\ndef k(x):\n    return x\n"),
        ("import importlib\nm = importlib.import_module('triton.language.extra.cann')\n", ""),
    ],
    "sort-topk": [
        ("@triton.jit\ndef k(x):\n    return tl.sort(x)\n", "@triton.jit\ndef k(x):\n    return x\n"),
        ("@triton.jit\ndef k(x):\n    return tl.topk(x, 4)\n", "@triton.jit\ndef k(x):\n    return x\n"),
        ("from triton.language import sort\n", "from triton.language import where\n"),
        ("@triton.jit\ndef k(x):\n    return x.sort(0)\n", "@triton.jit\ndef k(x):\n    return x\n"),
    ],
    "tf32": [
        ("@triton.jit\ndef k(a, b, DOT_F32: tl.constexpr):\n    return tl.dot(a, b, allow_tf32=True, input_precision='ieee')\n",
         "@triton.jit\ndef k(a, b, DOT_F32: tl.constexpr):\n    return tl.dot(a, b, input_precision='ieee')\n"),
        ("@triton.jit\ndef k(a, b, DOT_F32: tl.constexpr):\n    return tl.dot(a, b, input_precision='tf32x3')\n",
         "@triton.jit\ndef k(a, b, DOT_F32: tl.constexpr):\n    return tl.dot(a, b, input_precision='ieee')\n",
         ["dot-precision", "tf32"]),
        ("@triton.jit\ndef k(a, b, DOT_F32: tl.constexpr):\n    return tl.dot(a, b, input_precision='hf32')\n",
         "@triton.jit\ndef k(a, b, DOT_F32: tl.constexpr):\n    return tl.dot(a, b, input_precision='ieee')\n",
         ["dot-precision", "tf32"]),
        ("@triton.jit\ndef k(a, b, DOT_F32: tl.constexpr):\n    return tl.dot(a, b, input_precision='tf32')\n",
         "@triton.jit\ndef k(a, b, DOT_F32: tl.constexpr):\n    return tl.dot(a, b, input_precision='ieee')\n",
         ["dot-precision", "tf32"]),
    ],
    "dot-precision": [
        ("@triton.jit\ndef k(a, b, DOT_F32: tl.constexpr):\n    return tl.dot(a, b)\n",
         "@triton.jit\ndef k(a, b, DOT_F32: tl.constexpr):\n    return tl.dot(a, b, input_precision=\"ieee\")\n"),
        ("@triton.jit\ndef k(a, b, acc, DOT_F32: tl.constexpr):\n    return tl.dot(a, b, acc, 'ieee')\n",
         "@triton.jit\ndef k(a, b, acc, DOT_F32: tl.constexpr):\n    return tl.dot(a, b, acc, input_precision='ieee')\n"),
        ("@triton.jit\ndef k(a, b, P: tl.constexpr, DOT_F32: tl.constexpr):\n    return tl.dot(a, b, input_precision=P)\n",
         "@triton.jit\ndef k(a, b, P: tl.constexpr, DOT_F32: tl.constexpr):\n    return tl.dot(a, b, input_precision='ieee')\n"),
        ("@triton.jit\ndef k(a, b, sa, sb):\n    return tl.dot_scaled(a, sa, 'e4m3', b, sb, 'e4m3')\n",
         "@triton.jit\ndef k(a, b, sa, sb, DOT_F32: tl.constexpr):\n    return tl.dot(a, b, input_precision='ieee')\n"),
    ],
    "dot-accumulator": [
        ("@triton.jit\ndef k(a, b, DOT_F32: tl.constexpr):\n    return tl.dot(a, b, input_precision='ieee', "
         "out_dtype=tl.float16)\n",
         "@triton.jit\ndef k(a, b, DOT_F32: tl.constexpr):\n    return tl.dot(a, b, input_precision='ieee', "
         "out_dtype=tl.float32)\n"),
        ("@triton.jit\ndef k(a, b, DOT_F32: tl.constexpr):\n    return tl.dot(a, b, input_precision='ieee', "
         "max_num_imprecise_acc=32)\n",
         "@triton.jit\ndef k(a, b, DOT_F32: tl.constexpr):\n    return tl.dot(a, b, input_precision='ieee')\n"),
    ],
    "dot-interpreter": [
        ("@triton.jit\ndef k(a, b):\n    return tl.dot(a, b, input_precision='ieee')\n",
         "@triton.jit\ndef k(a, b, DOT_F32: tl.constexpr):\n    if DOT_F32:\n        a = a.to(tl.float32)\n"
         "    return tl.dot(a, b, input_precision='ieee')\n"),
        ("@triton.jit\ndef k(a, b, F32: tl.constexpr):\n    return tl.dot(a, b, input_precision='ieee')\n",
         "@triton.jit\ndef k(a, b, *, DOT_F32: tl.constexpr):\n    return tl.dot(a, b, input_precision='ieee')\n"),
    ],
    "inline-asm": [
        ("@triton.jit\ndef k(x):\n    return tl.inline_asm_elementwise('mov.b32 $0, $1;', '=r,r', [x], "
         "dtype=tl.int32, is_pure=True, pack=1)\n", "@triton.jit\ndef k(x):\n    return x\n"),
    ],
    "npu-option": [
        ("def launch(kern, grid, x):\n    kern[grid](x, multibuffer=True)\n",
         "def launch(kern, grid, x, opts):\n    kern[grid](x, **opts)\n"),
        ("OPTS = {'force_simt_only': True}\n", "OPTS = {}\n"),
        ("def launch(kern, grid, x):\n    kern[grid](x, set_workspace_multibuffer=4)\n",
         "def launch(kern, grid, x):\n    kern[grid](x)\n"),
        ("@triton.jit\ndef k(p, o):\n    tl.store(o, tl.load(p, care_padding=False))\n",
         "@triton.jit\ndef k(p, o):\n    tl.store(o, tl.load(p))\n"),
        ("@triton.jit\ndef k(a, b):\n    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)\n",
         "@triton.jit\ndef k(a, b):\n    return tl.where(a < b, b, a)\n"),
        ("CFG = triton.Config({'BLOCK': 16}, compile_mode='simt_only')\n",
         "CFG = triton.Config({'BLOCK': 16})\n"),
        ("def f(options):\n    return options.multibuffer\n", "def f(options):\n    return options.num_warps\n"),
    ],
    "reduction": [
        ("@triton.jit\ndef k(x):\n    return tl.sum(x, axis=0)\n",
         "@triton.jit\ndef k(x, i):\n    return tl.sum(tl.where(tl.arange(0, 8) == i, x, 0.0), axis=0)\n"),
        ("@triton.jit\ndef k(x):\n    return tl.sum(x * 2, axis=0)\n",
         "@triton.jit\ndef k(x, m):\n    return tl.sum(input=tl.where(m, x, 0.0), axis=0)\n"),
        ("@triton.jit\ndef k(x, c):\n    return tl.sum(x - c, axis=0)\n",
         "@triton.jit\ndef k(x, c):\n    return tl.sum((x - c) >> 31, axis=0)\n"),
        ("@triton.jit\ndef k(x):\n    return tl.sum((x >> 1) * 0.5, axis=0)\n",
         "@triton.jit\ndef k(x):\n    return tl.sum(x >> 1, axis=0)\n"),
        ("@triton.jit\ndef k(x):\n    return tl.max(x, axis=0)\n", "@triton.jit\ndef k(x):\n    return x\n"),
        ("@triton.jit\ndef k(x):\n    return tl.min(x, axis=0)\n", "@triton.jit\ndef k(x):\n    return x\n"),
        ("@triton.jit\ndef k(x):\n    return x.sum(0)\n", "@triton.jit\ndef k(x):\n    return x\n"),
        ("@triton.jit\ndef k(x):\n    return x.max(0)\n", "def host(t):\n    return t.max(0)\n"),
        ("from triton.language import sum as tsum\n\n@triton.jit\ndef k(x):\n    return tsum(x, 0)\n",
         "from triton.language import where\n"),
    ],
    "bf16-rounding": [
        ("@triton.jit\ndef k(o, x):\n    tl.store(o, x.to(tl.bfloat16, bitcast=False))\n",
         "@triton.jit\ndef k(o, bits):\n    tl.store(o, bits.to(tl.bfloat16, bitcast=True))\n"),
        ("@triton.jit\ndef k(o, x):\n    tl.store(o, x.to(tl.bfloat16))\n",
         "@triton.jit\ndef k(o, x):\n    tl.store(o, round_to_bf16_bits(x).to(tl.int16).to(tl.bfloat16, bitcast=True))\n"),
        ("@triton.jit\ndef k(o, x):\n    tl.store(o, tl.cast(x, tl.bfloat16))\n",
         "@triton.jit\ndef k(o, x):\n    b = round_to_bf16_bits(x)\n    tl.store(o, tl.cast(b.to(tl.int16), tl.bfloat16, bitcast=True))\n"),
        ("@triton.jit\ndef r(x):\n    return round_to_bf16_bits(x)\n\n@triton.jit\ndef k(o, x):\n"
         "    tl.store(o, x.to(dtype=tl.bfloat16))\n",
         "@triton.jit\ndef k(o, x):\n    tl.store(o, x.to(tl.float32))\n"),
        ("from triton.language import bfloat16 as BF\n\n@triton.jit\ndef k(o, x):\n    tl.store(o, x.cast(BF))\n",
         "@triton.jit\ndef k(o, x):\n    tl.store(o, _portable.round_to_bf16_bits(x).to(tl.int16).to(tl.bfloat16, bitcast=True))\n"),
    ],
    "transcendental": [
        ("@triton.jit\ndef k(x):\n    return tl.exp(x)\n", "@triton.jit\ndef k(x):\n    return exp_fp32(x)\n"),
        ("@triton.jit\ndef k(x):\n    return tl.exp2(x)\n", "@triton.jit\ndef k(x):\n    return x * x\n"),
        ("@triton.jit\ndef k(x):\n    return tl.math.log(x)\n", "@triton.jit\ndef k(x):\n    return x\n"),
        ("@triton.jit\ndef k(x):\n    return tl.sqrt(x)\n", "@triton.jit\ndef k(x):\n    return x\n"),
        ("@triton.jit\ndef k(x):\n    return tl.sigmoid(x)\n", "@triton.jit\ndef k(x):\n    return x\n"),
        ("@triton.jit\ndef k(x):\n    return tl.rsqrt(x)\n", "@triton.jit\ndef k(x):\n    return x\n"),
        ("@triton.jit\ndef k(x, y, z):\n    return tl.fma(x, y, z)\n", "@triton.jit\ndef k(x, y, z):\n    return x * y + z\n"),
        ("@triton.jit\ndef k(x):\n    return x.exp()\n", "def host(t):\n    return t.exp()\n"),
        ("from triton.language.math import exp2 as e2\n", "from triton.language.math import div_rn\n"),
    ],
    "float-division": [
        ("@triton.jit\ndef k(x, y):\n    return x / y\n", "@triton.jit\ndef k(x, y):\n    return tl.math.div_rn(x, y)\n"),
        ("@triton.jit\ndef k(x, y):\n    x /= y\n    return x\n", "@triton.jit\ndef k(n):\n    n //= 2\n    return n\n"),
        ("@triton.jit(do_not_specialize=['n'])\ndef k(x, n):\n    return x / n\n",
         "@triton.jit(do_not_specialize=['n'])\ndef k(x, n):\n    return x * n\n"),
        ("from triton import jit\n\n@jit\ndef k(x):\n    def inner(y):\n        return y / 2\n    return inner(x)\n",
         "from triton import jit\n\n@jit\ndef k(x):\n    return x // 2\n"),
        ("@triton.jit\ndef k(x, y):\n    return tl.fdiv(x, y)\n", "@triton.jit\ndef k(x, y):\n    return tl.math.div_rn(x, y)\n"),
        ("@triton.jit\ndef k(x, y):\n    return tl.math.div_rz(x, y)\n", "def host(a, b):\n    return a / b\n"),
    ],
}
CASE_PARAMS = [pytest.param(rule, case[0], case[1], case[2] if len(case) > 2 else [rule], id=f"{rule}-{i}")
               for rule, cases in CASES.items() for i, case in enumerate(cases)]


def test_every_rule_has_a_negative_case():
    assert set(CASES) == set(P.RULES)


@pytest.mark.parametrize("rule, bad, good, expected", CASE_PARAMS)
def test_checker_reports_violation(rule, bad, good, expected):
    assert rule in expected
    assert _rules(HEADER + bad) == expected
    assert _rules(HEADER + good) == []


def test_violation_carries_file_line_and_column():
    source = HEADER + "@triton.jit\ndef k(x, y):\n    a = x + 1\n    return a / y\n"
    (v,) = P.check_portable_subset(source, "kpool/ops/fake.py")
    assert (v.rule, v.filename, v.line, v.col) == ("float-division", "kpool/ops/fake.py", 6, 11)
    assert str(v).startswith("kpool/ops/fake.py:6:11: [float-division]")


def test_aliases_are_resolved():
    assert _rules("import triton.language as T\nx = T.sort\n") == ["sort-topk"]
    assert _rules("from triton import language as lang\nx = lang.math.exp\n") == ["transcendental"]
    # A module that rebinds tl to something else is not Triton.
    assert _rules("import numpy as tl\ny = tl.exp(1.0)\nz = tl.sort([2, 1])\n") == []


def test_host_code_is_not_jit_code():
    """Division, torch reductions and torch.exp outside @triton.jit are host code (fine)."""
    assert _rules("import torch\n\ndef host(a, b):\n    return (a / b).sum().exp(), torch.exp(a)\n") == []


def test_compliant_kernel_is_clean():
    source = '''
    import triton
    import triton.language as tl
    from kpool.ops._portable import exp_fp32, round_to_bf16_bits


    @triton.jit(do_not_specialize=["n"])
    def kern(x_ptr, y_ptr, o_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        base = pid.to(tl.int64) * BLOCK
        x = tl.load(x_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + base + offs, mask=mask, other=1.0).to(tl.float32)
        q = tl.math.div_rn(exp_fp32(x), y)
        pick = tl.sum(tl.where(offs == n // 2, q, 0.0), axis=0)
        r = tl.where(q < 0, 0.0, q) + pick
        bits = round_to_bf16_bits(r)
        tl.store(o_ptr + base + offs, bits.to(tl.int16).to(tl.bfloat16, bitcast=True), mask=mask)


    def launch(x, y, o, n, options):
        kern[(1,)](x, y, o, n, BLOCK=16, **options)
    '''
    assert P.check_portable_subset(textwrap.dedent(source), "ok.py") == []
    assert P.sum_calls(textwrap.dedent(source)) == [(16, True)]


def test_sum_calls_lists_each_call_with_verdict():
    source = (HEADER + "@triton.jit\ndef k(x, m):\n    a = tl.sum(x, 0)\n    b = tl.sum(tl.where(m, x, 0.0), 0)\n"
              "    c = tl.sum(x >> 31, 0)\n    d = tl.sum(x << 1, 0)\n")
    assert P.sum_calls(source) == [(5, False), (6, True), (7, True), (8, False)]


def test_pragma_silences_only_the_named_rule_on_its_line():
    bad = HEADER + "@triton.jit\ndef k(v):\n    return tl.max(v, axis=0)  # portable-ok: reduction -- int32, exact\n"
    assert _rules(bad) == []
    wrong = bad.replace("portable-ok: reduction", "portable-ok: sort-topk")
    assert _rules(wrong) == ["reduction"]
    other_line = HEADER + "# portable-ok: reduction\n@triton.jit\ndef k(v):\n    return tl.max(v, axis=0)\n"
    assert _rules(other_line) == ["reduction"]


def test_rule_filter_and_errors():
    source = HEADER + "@triton.jit\ndef k(x, y):\n    return tl.exp(x) / y\n"
    assert _rules(source) == ["float-division", "transcendental"]
    assert _rules(source, rules=["transcendental"]) == ["transcendental"]
    with pytest.raises(ValueError, match="unknown rules"):
        P.check_portable_subset(source, rules=["no-such-rule"])
    (v,) = P.check_portable_subset("def broken(:\n", "bad.py")
    assert v.rule == "syntax" and v.filename == "bad.py"


# ---------------------------------------------------------------------------- launch_options

GOOD_PLATFORM = '''
def launch_options(device: str) -> dict:
    if device == "cuda":
        return {"num_warps": 4, "enable_fp_fusion": False}
    if device == "npu":
        from .hardware import current_hardware_profile
        return {"multibuffer": not current_hardware_profile(resolve_device).is_a5}
    return {}
'''


def test_launch_options_reference_shape_passes():
    assert L.check_launch_options(GOOD_PLATFORM) == []
    assert L.check_launch_options(GOOD_PLATFORM.replace('device == "npu"', '"npu" == device')) == []
    kwargs_form = GOOD_PLATFORM.replace('{"num_warps": 4, "enable_fp_fusion": False}',
                                        'dict(num_warps=4, enable_fp_fusion=False)')
    assert L.check_launch_options(kwargs_form) == []


@pytest.mark.parametrize("source, needle", [
    (GOOD_PLATFORM.replace('"enable_fp_fusion": False}', '"enable_fp_fusion": False, "multibuffer": True}'),
     "'multibuffer' outside"),
    (GOOD_PLATFORM.replace('"enable_fp_fusion": False', '"enable_fp_fusion": True'), "enable_fp_fusion=False"),
    (GOOD_PLATFORM.replace(', "enable_fp_fusion": False', ''), "enable_fp_fusion=False"),
    (GOOD_PLATFORM + '\nDEFAULTS = {"force_simt_only": False}\n', "'force_simt_only' outside"),
    (GOOD_PLATFORM + '\ndef other(k):\n    k[(1,)](multibuffer=True)\n', "'multibuffer' outside"),
    (GOOD_PLATFORM.replace('if device == "npu":', 'if device.startswith("n"):'), 'no `if device == "npu"`'),
    (GOOD_PLATFORM.replace('if device == "cuda":', 'if device in ("cuda",):'), 'no `if device == "cuda"`'),
    (GOOD_PLATFORM.replace("def launch_options", "def options_for"), "no module-level function launch_options"),
], ids=["npu-key-in-cuda", "fp-fusion-true", "fp-fusion-missing", "module-level-npu-dict",
        "npu-kwarg-elsewhere", "no-npu-branch", "no-cuda-branch", "no-function"])
def test_launch_options_violations(source, needle):
    found = L.check_launch_options(source)
    assert found and all(v.rule == "launch-options" for v in found)
    assert any(needle in v.message for v in found), [str(v) for v in found]
