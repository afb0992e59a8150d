#!/usr/bin/env bash
# One-step setup: creates .venv (or uses the active virtual environment) and installs
# scansnap_lens with its test tools. On a machine without an NVIDIA GPU it installs the
# CPU build of torch, never a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"

if [ -n "${VIRTUAL_ENV:-}" ]; then
    PY="$VIRTUAL_ENV/bin/python"
    # the README's commands call .venv/bin/...: point .venv at the active environment
    [ -e .venv ] || ln -s "$VIRTUAL_ENV" .venv
else
    [ -x .venv/bin/python ] || python3 -m venv .venv
    PY=.venv/bin/python
fi
"$PY" -m pip install --quiet --upgrade pip

if "$PY" -c "import torch" 2>/dev/null; then
    echo "torch already installed: $("$PY" -c 'import torch; print(torch.__version__)')"
elif command -v nvidia-smi >/dev/null 2>&1; then
    "$PY" -m pip install "torch==${TORCH_VERSION}"
else
    # A CPU wheel on this machine (pip's find-links), else PyTorch's CPU index; plain PyPI
    # would give a CUDA build.  The local wheel's own dependencies come from PyPI.
    wheels=$(mktemp -d)
    if "$PY" -m pip download --quiet --no-deps --no-index -d "$wheels" "torch==${TORCH_VERSION}" 2>/dev/null; then
        "$PY" -m pip install "$wheels"/torch-*.whl
    else
        "$PY" -m pip install "torch==${TORCH_VERSION}" \
            --index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple
    fi
    rm -rf "$wheels"
fi

# transformer-lens 3.x keeps HookedTransformer (4.x has only TransformerBridge).
"$PY" -m pip install -e ".[dev]" "transformer-lens>=3.0,<4"
"$PY" -c "import torch, transformer_lens, scansnap_lens; print('scansnap_lens ready; torch', torch.__version__, '| cuda:', torch.cuda.is_available())"
