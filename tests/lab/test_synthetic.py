"""Sequence classes: the authors' Syn-Small layout, Syn-Medium sizes, ground truth that
follows the probabilities, seeded sampling."""

from __future__ import annotations

import pytest
import torch

from scansnap_lens.lab.synthetic import (
    COMMON,
    DISTINCT,
    NEXT,
    QUERY,
    SequenceClasses,
    sequence_classes,
    syn_medium,
    syn_small,
)


def test_syn_small_layout_matches_the_authors():
    c = syn_small()
    assert c.vocab_size == 34 and c.num_classes == 2
    kind = c.kind()
    assert (kind[:10] == COMMON).all()
    assert (kind[10:30] == DISTINCT).all()
    assert kind[30:32].tolist() == [QUERY, QUERY] and kind[32:34].tolist() == [NEXT, NEXT]
    owner = c.distinct_for()
    assert owner[10:20].tolist() == [0] * 10 and owner[20:30].tolist() == [1] * 10
    assert (owner[:10] == -1).all()
    # weights: 1 per common token, linspace(0.1, 1) on distinct, normalised together
    w = torch.cat([torch.ones(10), torch.linspace(0.1, 1.0, 10)])
    torch.testing.assert_close(c.probs[0, :20], w / w.sum())
    assert c.query.tolist() == [30, 31] and c.next_token.tolist() == [32, 33]


@pytest.mark.parametrize("q", [1, 3, 5, 10])
def test_syn_medium_sizes(q):
    c = syn_medium(q)
    K = 2 * q
    assert c.num_classes == K and c.vocab_size == 10 + 10 * K + q + K
    # two next tokens per query, in order
    assert c.query.tolist() == [c.query[0].item() + k // 2 for k in range(K)]


def test_per_query_common_tokens_are_local_common_but_global_distinctness_is_per_class():
    c = sequence_classes(num_queries=2, next_per_query=2, num_common=1, num_common_per_query=2)
    # tokens 1,2 shared by the two classes of query 0; 3,4 by query 1
    assert c.common_mask()[:5].all()
    local = c.distinct_for_query(c.query[0].item())
    assert (local[1:5] == -1).all()  # common within the query (1,2) or absent (3,4)
    assert (local[5:15] == 0).all() and (local[15:25] == 1).all()
    assert (local[25:45] == -1).all()  # distinct tokens of the other query's classes


def test_custom_weight_profile_and_truth_follows_probs():
    c = sequence_classes(1, 2, num_common=2, distinct_per_next=3, distinct_weights=[3, 0, 1])
    # a zero weight leaves that token out of the support: it is neither distinct nor common
    assert c.distinct_for()[2:8].tolist() == [0, -1, 0, 1, -1, 1]


def test_sampling_is_seeded_and_follows_the_distribution():
    c = syn_small()
    a = c.sample(256, 64, torch.Generator().manual_seed(3))
    b = c.sample(256, 64, torch.Generator().manual_seed(3))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    tokens, labels, idx = c.sample(4000, 65, torch.Generator().manual_seed(1))
    assert torch.equal(labels, c.next_token[idx]) and torch.equal(tokens[:, -1], c.query[idx])
    share = idx.float().mean().item()
    assert abs(share - 0.5) < 0.03  # classes uniform
    ctx = tokens[idx == 0, :-1].flatten()
    freq = torch.bincount(ctx, minlength=c.vocab_size).float() / ctx.numel()
    torch.testing.assert_close(freq, c.probs[0], atol=0.004, rtol=0)


def test_sample_with_many_runs_shape():
    tokens, labels, idx = syn_small().sample((3, 5), 10, torch.Generator().manual_seed(0))
    assert tokens.shape == (3, 5, 10) and labels.shape == (3, 5) and idx.shape == (3, 5)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="distinct_weights needs 10"):
        sequence_classes(1, 1, distinct_weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="num_queries"):
        sequence_classes(0, 1)
    with pytest.raises(ValueError, match="sum to 1"):
        SequenceClasses(torch.ones(1, 3), torch.tensor([0]), torch.tensor([1]))
    with pytest.raises(ValueError, match="query ids"):
        SequenceClasses(torch.ones(1, 3) / 3, torch.tensor([5]), torch.tensor([1]))
    with pytest.raises(ValueError, match="seq_len"):
        syn_small().sample(2, 1)
