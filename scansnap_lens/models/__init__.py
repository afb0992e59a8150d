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

__all__, __getattr__, __dir__ = exports(
    __name__, "backend checkpoints formats hub steps training tutorial"
)
