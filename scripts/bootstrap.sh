#!/usr/bin/env bash
# Bootstrap a Python interpreter that can run the KPool parity harness.
#
# Usage:  scripts/bootstrap.sh [main|ascend]
#
# Prints the absolute path of the interpreter to use on its LAST stdout line
# (everything else goes to stderr), e.g.
#     PY="$(scripts/bootstrap.sh)" && "$PY" -m parity run
#
# main (default):
#   a. $PYTHON set                       -> use it as is, install nothing.
#   b. system python3 imports torch and (triton or torch_npu)
#                                        -> reuse it; pip-install only the
#                                           missing pure-python deps, never
#                                           torch/torch_npu/triton/triton-ascend.
#   c. otherwise                         -> build .venv with CPU torch 2.13.0 +
#                                           triton 3.6.0 + pure deps + the [hf]
#                                           extra (transformers 5.24.0, for
#                                           --oracle hf), then
#                                           `pip install -e . --no-deps`.
#   In case b the [hf] extra is optional and never installed (transformers
#   must not touch the accelerator stack): --oracle hf then says why it skips.
#                                           Stamp: .venv/.bootstrap-ok
# ascend:
#   $PYTHON_ASCEND set -> use it as is; otherwise build .venv-ascend with CPU
#   torch 2.13.0 + triton-ascend 3.2.0 + pybind11 + pure deps (for running
#   triton-ascend's frontend under TRITON_INTERPRET=1 on CPU).
#   Stamp: .venv-ascend/.bootstrap-ok
#
# Knobs (env): BASE_PYTHON (interpreter used to create the venv),
#   KPOOL_WHEELS_DIR (default /opt/wheels, passed as --find-links if present).
set -euo pipefail

exec 3>&1 1>&2          # fd 3 = real stdout (result only); all chatter -> stderr

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE="${1:-main}"

TORCH_VERSION="2.13.0"
TRITON_VERSION="3.6.0"
TRITON_ASCEND_VERSION="3.2.0"
HF_VERSION="5.24.0"     # the [hf] extra of pyproject.toml (parity/oracles/hf_oracle.py HF_VERSION)
PURE_DEPS=(numpy pandas hypothesis pytest pytest-xdist rich)
WHEELS_DIR="${KPOOL_WHEELS_DIR:-/opt/wheels}"

export PIP_DISABLE_PIP_VERSION_CHECK=1

log()  { echo "[bootstrap] $*"; }
die()  { echo "[bootstrap] ERROR: $*"; exit 1; }
emit() { echo "$1" >&3; exit 0; }

case "$MODE" in
    main|ascend) ;;
    *) die "unknown mode '$MODE' (expected: main | ascend)" ;;
esac

# Serialise concurrent bootstraps (e.g. `make -j parity test`).
if command -v flock >/dev/null 2>&1; then
    exec 9<"${BASH_SOURCE[0]}"
    flock 9
fi

find_links=()
if [ -d "$WHEELS_DIR" ]; then find_links=(--find-links "$WHEELS_DIR"); fi

# ---------------------------------------------------------------- (a) explicit
if [ "$MODE" = main ] && [ -n "${PYTHON:-}" ]; then
    log "using PYTHON=$PYTHON as is"
    emit "$PYTHON"
fi
if [ "$MODE" = ascend ] && [ -n "${PYTHON_ASCEND:-}" ]; then
    log "using PYTHON_ASCEND=$PYTHON_ASCEND as is"
    emit "$PYTHON_ASCEND"
fi

# ---------------------------------------------------------- (b) system python
# One probe (importing torch is slow): exit 0 iff torch and (triton or torch_npu)
# import; prints sys.executable, then the pure deps that are missing.
probe_sys_python() {
    python3 - "${PURE_DEPS[@]}" <<'EOF2' 2>/dev/null
import importlib, sys
import torch  # noqa: F401
try:
    import triton  # noqa: F401
except Exception:
    import torch_npu  # noqa: F401
print(sys.executable)
mod = {"pytest-xdist": "xdist"}
for dist in sys.argv[1:]:
    try:
        importlib.import_module(mod.get(dist, dist.replace("-", "_")))
    except Exception:
        print(dist)
EOF2
}
if [ "$MODE" = main ] && command -v python3 >/dev/null 2>&1 && probe="$(probe_sys_python)"; then
    SYS_PY="$(head -n1 <<<"$probe")"
    mapfile -t missing < <(tail -n +2 <<<"$probe")
    log "reusing system interpreter $SYS_PY (torch + triton/torch_npu already importable)"
    if [ "${#missing[@]}" -gt 0 ]; then
        log "installing missing pure-python deps: ${missing[*]}"
        # Pin whatever accelerator stack is installed so pip can never touch it.
        constraints="$(mktemp)"
        "$SYS_PY" - >"$constraints" <<'EOF2'
from importlib import metadata
for dist in ("torch", "torch-npu", "triton", "triton-ascend"):
    try:
        print(f"{dist}=={metadata.version(dist)}")
    except metadata.PackageNotFoundError:
        pass
EOF2
        if ! "$SYS_PY" -m pip install -q --retries 1 --timeout 15 -c "$constraints" "${missing[@]}"; then
            log "WARNING: could not install ${missing[*]} into $SYS_PY;" \
                "install them by hand or set PYTHON=... (continuing)"
        fi
        rm -f "$constraints"
    fi
    log "the [hf] extra (transformers==$HF_VERSION) is optional here and not installed by bootstrap;" \
        "python -m parity run --oracle hf states why it skips when it is missing"
    emit "$SYS_PY"
fi

# ------------------------------------------------------------------ (c) venv
if [ "$MODE" = main ]; then
    VENV="$ROOT/.venv"
    # transformers does not depend on torch: the [hf] extra cannot change the CPU torch pin.
    PKGS=("torch==$TORCH_VERSION" "triton==$TRITON_VERSION" "${PURE_DEPS[@]}" "transformers==$HF_VERSION")
else
    VENV="$ROOT/.venv-ascend"
    # No plain `triton` here: triton-ascend ships the `triton` module itself.
    # Current NumPy is fine: triton-ascend 3.2's interpreter converts 1-element
    # arrays with int(arr) (runtime loop bounds), which NumPy >= 2.3 rejects, but
    # kpool/ops/_portable.py patches that conversion for both interpreter shapes.
    PKGS=("torch==$TORCH_VERSION" "triton-ascend==$TRITON_ASCEND_VERSION" pybind11 "${PURE_DEPS[@]}")
fi
STAMP="$VENV/.bootstrap-ok"
SPEC="$MODE: ${PKGS[*]}"

if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SPEC" ]; then
    emit "$VENV/bin/python"
fi

t0=$SECONDS
if [ ! -x "$VENV/bin/python" ]; then
    # Pick a base interpreter. triton-ascend 3.2.0 wheels exist for 3.9-3.11 only.
    if [ "$MODE" = ascend ]; then
        candidates=(${BASE_PYTHON:-} python3 python3.11 python3.10 python3.9)
        want='(3, 9) <= sys.version_info[:2] <= (3, 11)'
    else
        candidates=(${BASE_PYTHON:-} python3)
        want='sys.version_info[:2] >= (3, 10)'
    fi
    base=""
    for c in "${candidates[@]}"; do
        if command -v "$c" >/dev/null 2>&1 && "$c" -c "import sys; sys.exit(0 if $want else 1)" 2>/dev/null; then
            base="$c"; break
        fi
    done
    [ -n "$base" ] || die "no suitable base python found (tried: ${candidates[*]}; need $want)"
    log "creating $VENV with $(command -v "$base") ($("$base" --version 2>&1))"
    rm -rf "$VENV"
    "$base" -m venv "$VENV"
else
    log "$VENV exists but is not stamped for this spec; (re)installing"
fi
rm -f "$STAMP"

log "pip install ${find_links[*]} ${PKGS[*]}"
"$VENV/bin/python" -m pip install -q --progress-bar off "${find_links[@]}" "${PKGS[@]}"

log "pip install -e . --no-deps"
if ! "$VENV/bin/python" -m pip install -q --progress-bar off -e "$ROOT" --no-deps; then
    log "WARNING: editable install failed; the harness still runs from the repo root"
fi

# Sanity check: the stack imports, and in the ascend env `triton` is triton-ascend.
"$VENV/bin/python" - "$MODE" <<'EOF'
import sys
from importlib import metadata
import torch, triton, numpy, pandas, hypothesis, pytest, xdist, rich  # noqa: F401
mode = sys.argv[1]
if mode == "ascend":
    try:
        metadata.version("triton")
        sys.exit("plain `triton` is installed in the ascend venv; it shadows triton-ascend")
    except metadata.PackageNotFoundError:
        pass
    tri = "triton-ascend " + metadata.version("triton-ascend")
else:
    tri = "triton " + triton.__version__
    import importlib
    importlib.import_module("transformers.models.glm5_next.modeling_glm5_next")   # the [hf] extra
    tri += ", transformers " + metadata.version("transformers")
print(f"[bootstrap] ok: python {sys.version.split()[0]}, torch {torch.__version__}, {tri}",
      file=sys.stderr)
EOF

echo "$SPEC" >"$STAMP"
log "done in $((SECONDS - t0)) s"
emit "$VENV/bin/python"
