"""A 20-revision sweep of a small GPT-NeoX from a hub on the loopback: download overlapped
with recording, and the disk the sweep holds.

    python analyses/benchmarks/bench_sweep.py [--revisions 20]     # about 5 minutes on 2 cores

The hub (the tests' `LoopbackHub`, tests/_hub.py, in a process of its own) serves revisions
written by ``save_pretrained``; the real `huggingface_hub` client downloads them.  Timed in one
run:

- ``record_s``: the sweep with every revision already in the cache (loading and recording);
- ``download_s``: downloading every revision, one after the other, nothing recorded;
- ``sweep_s``: the sweep from an empty cache, 2 revisions on disk at most;

at two bandwidths, chosen from ``record_s`` so that downloading takes twice the recording
(download dominates) and half of it (recording dominates).  ``ratio`` = sweep_s /
max(download_s, record_s) (1 is perfect overlap; ``sequential`` = (download_s + record_s) /
max(...) is what the sweep did before); ``peak_in_use_mb`` is the most disk space in use by
the sweep's cache (``statvfs``, sampled every 2 ms: deleted files still held open or mapped
count) against ``bound_mb`` = 2 revisions, and ``peak_visible_mb`` the most its blobs showed
(every 20 ms).
The cache is a tmpfs of its own where this process may mount one (root on Linux; ``disk``
says which), else the disk under the temporary folder, where others' writes count too.
One JSON line per bandwidth.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from scansnap_lens.recording.settings import RecordingSettings

# the hub on the loopback is the tests' own (tests/_hub.py), read here as they read it
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

NAME = "EleutherAI/pythia-70m"  # TransformerLens's labels of Pythia name the revisions
MODEL = {"d_model": 256, "n_layers": 4, "n_heads": 8, "vocab_size": 4096, "n_ctx": 128}


def _serve(repos, bandwidth, pipe) -> None:
    from _hub import LoopbackHub

    os.nice(19)  # the hub's CPU is another machine's: here it yields to the sweep
    with LoopbackHub(repos, bandwidth=bandwidth) as hub:
        pipe.send(hub.endpoint)
        pipe.recv()  # until told to stop


class Server:
    """The loopback hub in a process of its own (its sending takes no time from the sweep)."""

    def __init__(self, repos, bandwidth):
        context = multiprocessing.get_context("spawn")
        self.pipe, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(repos, bandwidth, child), daemon=True)
        self.process.start()
        self.endpoint = self.pipe.recv()

    def stop(self) -> None:
        self.pipe.send("stop")
        self.process.join(10)


class Peak:
    """The most disk in use under `folder` (statvfs, less what was in use at the start) and
    the most bytes its blobs showed, sampled in a thread."""

    def __init__(self, folder: Path):
        self.folder, self.peak, self.visible, self._stop = folder, 0, 0, threading.Event()
        self.base = _used(folder)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        tick = 0
        while not self._stop.is_set():
            self.peak = max(self.peak, _used(self.folder) - self.base)  # a syscall: each 2 ms
            if tick % 10 == 0:  # the walk costs the recording more CPU: each 20 ms
                try:
                    self._visible()
                except OSError:  # a folder deleted while the walk was in it: the next one
                    pass
            tick += 1
            time.sleep(0.002)

    def _visible(self) -> None:
        total = 0
        for blobs in self.folder.glob("*/models--*/blobs"):
            for entry in list(os.scandir(blobs)):
                try:
                    total += entry.stat().st_size
                except FileNotFoundError:  # deleted while we looked
                    pass
        self.visible = max(self.visible, total)

    def stop(self) -> tuple[int, int]:
        self._stop.set()
        self._thread.join()
        return self.peak, self.visible


def _used(folder: Path) -> int:
    stat = os.statvfs(folder)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


def _own_disk(folder: Path, size: int) -> bool:
    """Mount a tmpfs of `size` bytes at `folder` where allowed; whether it was."""
    import subprocess

    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    command = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)]
    return subprocess.run(command, capture_output=True).returncode == 0


def _sweep(steps, tokens, out: Path, endpoint: str, on_disk=2, keep=False, download=None):
    from _hub import pointed_at

    from scansnap_lens.models import checkpoints
    from scansnap_lens.recording.recorder import Recorder

    shutil.rmtree(out, ignore_errors=True)
    with pointed_at(endpoint):
        source = checkpoints.pretrained(NAME, steps=steps, backend="bridge")
        start = time.perf_counter()
        settings = RecordingSettings(
            progress=False, on_disk=on_disk, keep_checkpoints=keep, download_dir=download
        )
        Recorder(out, tokens, settings).record(source)
        return time.perf_counter() - start


def _download(revisions, endpoint: str) -> float:
    from _hub import pointed_at

    from scansnap_lens.models import hub

    with pointed_at(endpoint):
        start = time.perf_counter()
        for revision in revisions:
            hub.fetch_revision(NAME, revision)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--revisions", type=int, default=20)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="one bandwidth: it runs")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_sweep_"))
    os.environ["HF_HUB_CACHE"] = str(work / "cache")
    import torch
    from _hub import saved_revisions

    from scansnap_lens.models.hub import checkpoint_labels

    steps = checkpoint_labels(NAME)[0][: args.revisions]
    revisions = [f"step{s}" for s in steps]
    folders = saved_revisions(work / "hub", revisions, **MODEL)
    size = sum(p.stat().st_size for p in folders["step0"].iterdir())
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, MODEL["vocab_size"], (args.rows, MODEL["n_ctx"]), generator=generator)
    repos = {NAME: {r: str(f) for r, f in folders.items()}}
    try:
        # recording alone: every revision cached first (unthrottled), the sweep keeps them
        server = Server(repos, None)
        _download(revisions, server.endpoint)
        record_s = _sweep(steps, tokens, work / "out", server.endpoint, keep=True)
        server.stop()
        regimes = ((2.0, "download dominates"), (0.5, "recording dominates"))
        for factor, regime in regimes[:1] if args.quick else regimes:
            bandwidth = size * len(revisions) / (factor * record_s)
            shutil.rmtree(work / "cache", ignore_errors=True)
            server = Server(repos, bandwidth)
            download_s = _download(revisions, server.endpoint)
            shutil.rmtree(work / "cache", ignore_errors=True)
            disk = work / "disk"  # the sweep downloads only there
            own = _own_disk(disk, 4 * size)
            try:
                peak = Peak(disk)
                sweep_s = _sweep(steps, tokens, work / "out", server.endpoint,
                                 download=disk / "hub-cache")  # fmt: skip
                in_use, visible = peak.stop()
            finally:
                if own:
                    import subprocess

                    subprocess.run(["umount", "-l", str(disk)], capture_output=True)
            server.stop()
            longer = max(download_s, record_s)
            print(json.dumps({
                "bench": "sweep", "regime": regime, "revisions": len(revisions),
                "revision_mb": round(size / 1e6, 2), "bandwidth_mb_s": round(bandwidth / 1e6, 2),
                "download_s": round(download_s, 2), "record_s": round(record_s, 2),
                "sweep_s": round(sweep_s, 2), "ratio": round(sweep_s / longer, 3),
                "sequential": round((download_s + record_s) / longer, 3),
                "peak_in_use_mb": round(in_use / 1e6, 2), "bound_mb": round(2 * size / 1e6, 2),
                "peak_visible_mb": round(visible / 1e6, 2),
                "disk": "tmpfs of its own" if own else "shared (others' writes count)",
                "threads": torch.get_num_threads(),
            }), flush=True)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
