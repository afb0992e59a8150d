"""Models and their checkpoints, on either TransformerLens major.

- `backend`: the calls that differ between TransformerLens 3.x (HookedTransformer) and 4.x
  (TransformerBridge), and the `HookedModel` protocol;
- `formats`: what a checkpoint file or folder holds, and the model it becomes;
- `hub`: checkpoint labels of hub families (Pythia, stanford-crfm, NeelNanda), each resolved
  to its exact revision or file;
- `checkpoints`: sources of (step, model) pairs: a folder, a pretrained family, memory;
- `steps`: the one step language (every k-th, "log:N", a list) of training and recording;
- `training`: train small models with the paper's two rates (``lr_y``, ``lr_z``);
- `tutorial`: the authors' WikiText model (PyTorch's transformer tutorial), hooked.
"""

from scansnap_lens._lazy import exports

_NAMES = {
    "BACKENDS": "backend",
    "BackendError": "backend",
    "Checkpoint": "checkpoints",
    "CheckpointError": "checkpoints",
    "CheckpointSource": "checkpoints",
    "FIRST_FEED_FORWARD": "tutorial",
    "HookedModel": "backend",
    "Steps": "steps",
    "TrainResult": "training",
    "attention_only_model": "training",
    "build_model": "backend",
    "checkpoint_labels": "hub",
    "config_fields": "backend",
    "default_backend": "backend",
    "folder": "checkpoints",
    "hf_bridge": "backend",
    "hf_folder_model": "formats",
    "in_memory": "checkpoints",
    "is_bridge": "backend",
    "is_hf_folder": "formats",
    "is_hf_model": "backend",
    "label_of_file": "hub",
    "load_file_object": "formats",
    "load_labelled": "hub",
    "load_state_dict": "checkpoints",
    "load_weights": "backend",
    "make_config": "backend",
    "nanogpt_model": "formats",
    "pretrained": "checkpoints",
    "Rates": "training",
    "read_tl_config": "formats",
    "resolve_backend": "backend",
    "revision_of": "hub",
    "cache_dir": "hub",
    "cached_commit": "hub",
    "delete_snapshot": "hub",
    "refuse_linked": "hub",
    "fetch_revision": "hub",
    "offline": "hub",
    "remove_orphans": "hub",
    "revision_files": "hub",
    "revision_info": "hub",
    "RevisionInfo": "hub",
    "snapshot_in": "hub",
    "schedule": "training",
    "select_steps": "steps",
    "sinusoidal_positions": "tutorial",
    "state_layout": "backend",
    "scratch_dir": "backend",
    "tensor_dict": "formats",
    "tl_major": "backend",
    "tl_model": "formats",
    "tl_to_native": "backend",
    "train": "training",
    "tutorial_model": "tutorial",
}
_MODULES = {"backend", "checkpoints", "formats", "hub", "steps", "training", "tutorial"}

__all__ = sorted(set(_NAMES) | _MODULES)
__getattr__, __dir__ = exports(__name__, _NAMES, _MODULES)
