#!/usr/bin/env bash
# One-step setup: creates .venv (or uses the active virtual environment) and installs
# scansnap_lens with its test tools. On a machine without an NVIDIA GPU it installs the
# CPU build of torch, never a multi-GB CUDA build.
#   TL_MAJOR=3|4   TransformerLens major (default: the newest the package allows, 4.x)
#   VENV=DIR       where to create the environment (default .venv)
#   TORCH_INDEX_URL  a package index of CPU torch wheels, where this machine has no wheel
set -euo pipefail
cd "$(dirname "$0")"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
VENV="${VENV:-.venv}"
case "${TL_MAJOR:-}" in
    "") TL_SPEC="transformer-lens" ;;
    3) TL_SPEC="transformer-lens>=3.9,<4" ;;
    4) TL_SPEC="transformer-lens>=4,<5" ;;
    *) echo "setup.sh: TL_MAJOR must be 3 or 4, got '$TL_MAJOR'" >&2; exit 2 ;;
esac

if [ -n "${VIRTUAL_ENV:-}" ]; then
    PY="$VIRTUAL_ENV/bin/python"
    # the README's commands call .venv/bin/...: point .venv at the active environment
    [ -e "$VENV" ] || ln -s "$VIRTUAL_ENV" "$VENV"
else
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    PY="$VENV/bin/python"
fi
"$PY" -m pip install --quiet --upgrade pip

if "$PY" -c "import torch; torch.__version__" 2>/dev/null; then  # a whole install, not leftovers
    echo "torch already installed: $("$PY" -c 'import torch; print(torch.__version__)')"
elif command -v nvidia-smi >/dev/null 2>&1; then
    "$PY" -m pip install "torch==${TORCH_VERSION}"
else
    # A CPU wheel on this machine (pip's find-links), else the index pip is configured with,
    # or TORCH_INDEX_URL where you name one (a CPU wheel index: the default index may give a
    # CUDA build).  The local wheel's own dependencies come from pip's configured index.
    wheels=$(mktemp -d)
    if "$PY" -m pip download --quiet --no-deps --no-index -d "$wheels" "torch==${TORCH_VERSION}" 2>/dev/null; then
        "$PY" -m pip install "$wheels"/torch-*.whl
    else
        "$PY" -m pip install "torch==${TORCH_VERSION}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
    fi
    rm -rf "$wheels"
fi

# Both TransformerLens majors work: 3.x has HookedTransformer and the bridge, 4.x the bridge.
"$PY" -m pip install --quiet -e ".[dev]" "$TL_SPEC"
"$PY" -c "import torch, scansnap_lens.models.backend as b; print('scansnap_lens ready; torch', torch.__version__, '| cuda:', torch.cuda.is_available(), '| transformer-lens', b.tl_version(), '| default backend:', b.default_backend())"
