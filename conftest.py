"""Test-session setup that must run before anything imports huggingface_hub.

The hub cache points at a fresh folder and the hub is offline: tests that load "pretrained"
checkpoints read a tiny cache built by `fake_hub_model` (tests/_hub.py).
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

# OpenMP's threads (torch's, MKL's) spin while they wait for work: beside any other busy
# process (another worker, another job on the machine) they take its cores, and a training
# test took 4-8 times as long (the demo's placement loop: 10.7 s alone, 38-84 s beside one
# busy core).  Passive, they sleep; and each xdist worker computes on one thread.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
