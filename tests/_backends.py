"""Which backends this environment has: tests of both run under either major."""

import pytest

from scansnap_lens.models.backend import tl_major

HAS_HOOKED = tl_major() < 4
BACKENDS = ["hooked", "bridge"] if HAS_HOOKED else ["bridge"]
requires_hooked = pytest.mark.skipif(
    not HAS_HOOKED, reason="HookedTransformer exists on transformer-lens 3.x only"
)
requires_tl4 = pytest.mark.skipif(HAS_HOOKED, reason="needs transformer-lens 4.x")
