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
