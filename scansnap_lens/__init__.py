"""scansnap_lens: Scan and Snap instruments for TransformerLens models."""

__version__ = "0.1.0"
