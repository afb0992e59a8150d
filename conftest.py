"""Test-session setup that must run before anything imports huggingface_hub.

The hub cache points at a fresh folder and the hub is offline: tests that load "pretrained"
checkpoints read a tiny cache built by `scansnap_lens.testing.fake_hub_model`.
"""

import atexit
import os
import shutil
import tempfile

os.environ["HF_HUB_CACHE"] = tempfile.mkdtemp(prefix="scansnap_hub_")
atexit.register(shutil.rmtree, os.environ["HF_HUB_CACHE"], ignore_errors=True)
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

pytest_plugins = ["tests._major"]  # which tests depend on the TransformerLens major

if os.environ.get("PYTEST_XDIST_WORKER"):
    # one thread a worker: workers share the cores, and OpenMP's threads spin while waiting
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
