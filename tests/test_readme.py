"""The Python snippets of the README and of analyses/README.md run as pasted: each in a fresh
namespace, from a scratch folder beside which ``../shared`` holds the shared data, as from the
root of a checkout."""

from __future__ import annotations

import re

import pytest

from conftest import REPO

DOCUMENTS = [REPO / "README.md", REPO / "analyses" / "README.md"]
BLOCKS = [
    block
    for doc in DOCUMENTS
    for block in re.findall(r"^```python\n(.*?)^```", doc.read_text(), re.S | re.M)
]


def test_the_readme_has_snippets():
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i + 1}" for i in range(len(BLOCKS))])
@pytest.mark.tl
def test_readme_snippet_runs(code, shared_dir, tmp_path, monkeypatch):
    work = tmp_path / "repo"
    work.mkdir()
    (tmp_path / "shared").symlink_to(shared_dir, target_is_directory=True)
    monkeypatch.chdir(work)
    exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
    assert not list(work.glob("*.safetensors"))  # outputs go to scratch/, not the checkout
