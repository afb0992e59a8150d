"""Distinct, common and undetermined tokens: the synthetic ground truth recovered, the
paper's definition, the guard against rare look-alikes, and a brute-force reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scansnap_lens.lab.synthetic import sequence_classes, syn_medium, syn_small
from scansnap_lens.statistics.corpus import cooccurrence
from scansnap_lens.statistics.kinds import COMMON, DISTINCT, UNDETERMINED, token_kinds


def synthetic_stats(classes, n=3000, seed=0):
    tokens, labels, _ = classes.sample(n, 64, torch.Generator().manual_seed(seed))
    rows = torch.cat([tokens, labels[:, None]], 1)  # context..., query, next
    return cooccurrence(rows, classes.vocab_size, queries=classes.query)


def truth_matches(tc, classes, scope):
    for m in classes.query.unique().tolist():
        truth = classes.distinct_for_query(m) if scope == "local" else classes.distinct_for()
        seen = (
            classes.support()[classes.query == m].any(0)
            if scope == "local"
            else classes.support().any(0)
        )
        expected = torch.where(truth >= 0, DISTINCT, COMMON)[seen]
        got = tc.kind_map(m if scope == "local" else None)[seen]
        if not torch.equal(got, expected):
            return False
        distinct = (truth >= 0) & seen
        owner_next = classes.next_token[truth[distinct]]
        assert set(
            zip(
                tc.distinct_tokens(m if scope == "local" else None).tolist(),
                tc.next_token[
                    tc._select(m if scope == "local" else None) & (tc.kind == DISTINCT)
                ].tolist(),
            )
        ) == set(zip(distinct.nonzero().flatten().tolist(), owner_next.tolist()))
    return True


@pytest.mark.parametrize("guard", [False, True])
@pytest.mark.parametrize("scope", ["local", "global"])
@pytest.mark.parametrize(
    "classes",
    [syn_medium(3), sequence_classes(2, 3, num_common=4, num_common_per_query=3)],
    ids=["syn_medium3", "per_query_common"],
)
def test_recovers_the_synthetic_ground_truth(classes, scope, guard):
    tc = token_kinds(synthetic_stats(classes), scope=scope, guard=guard)
    assert truth_matches(tc, classes, scope)


def test_single_next_token_queries_are_locally_distinct_but_undetermined_under_the_guard():
    stats = synthetic_stats(syn_small())
    assert (token_kinds(stats, guard=False).kind == DISTINCT).all()  # |Omega_m(l)| = 1, trivially
    assert (token_kinds(stats, guard=True).kind == UNDETERMINED).all()  # nothing to test against
    assert truth_matches(token_kinds(stats, scope="global", guard=True), syn_small(), "global")


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 8), st.sampled_from([None, 1, 3]))
def test_paper_definition_is_omega_size_one(seed, vocab, window):
    rows = torch.randint(vocab, (6, 12), generator=torch.Generator().manual_seed(seed))
    stats = cooccurrence(rows, vocab_size=vocab, window=window)
    tc = token_kinds(stats, guard=False)
    frame = stats.to_dataframe()
    omega = frame.groupby(["query", "token"])["next"].nunique()
    for q, tok, kind in zip(tc.query.tolist(), tc.token.tolist(), tc.kind.tolist()):
        assert kind == (DISTINCT if omega[(q, tok)] == 1 else COMMON)


def test_guard_marks_rare_lookalikes_undetermined_and_keeps_strong_distinct_tokens():
    # query 0 -> next 1 or 2 equally; token 5 always precedes next 1 (many times),
    # token 6 precedes next 1 once (pure, but could be chance)
    rows = [[5, 0, 1]] * 40 + [[7, 0, 2]] * 40 + [[6, 0, 1]] + [[8, 0, 1], [8, 0, 2]] * 20
    stats = cooccurrence(rows, vocab_size=9)
    tc = token_kinds(stats, guard=True)
    lm = tc.kind_map(0)
    assert lm[5] == DISTINCT and lm[7] == DISTINCT and lm[6] == UNDETERMINED and lm[8] == COMMON
    assert token_kinds(stats, guard=False).kind_map(0)[6] == DISTINCT
    assert token_kinds(stats, min_support=2, guard=False).kind_map(0)[6] == UNDETERMINED
    # purity below 1: a mostly-pure token counts as distinct
    rows2 = rows + [[8, 0, 1]] * 200
    assert (
        token_kinds(cooccurrence(rows2, vocab_size=9), purity=0.8, guard=False).kind_map(0)[8]
        == DISTINCT
    )


def test_dataframe_with_token_strings():
    from scansnap_lens.inputs.text import encode_documents, word_level_tokenizer

    docs = ["a b c d", "a b c e", "x b c d"]
    tok = word_level_tokenizer(docs)
    stats = cooccurrence(encode_documents(tok, docs), vocab_size=tok.get_vocab_size())
    frame = token_kinds(stats, guard=False).to_dataframe(tok)
    row = frame[(frame.query_str == "c") & (frame.token_str == "x")].iloc[0]
    assert row.kind == "distinct" and row.next_str == "d"
    assert set(token_kinds(stats, guard=False).counts_by_query().columns) >= {
        "distinct",
        "common",
        "undetermined",
    }


def test_bad_arguments():
    stats = cooccurrence(torch.tensor([[0, 1, 2, 3]]), vocab_size=4)
    for kwargs, match in [
        ({"scope": "both"}, "scope"),
        ({"purity": 0.0}, "purity"),
        ({"min_support": 0}, "min_support"),
        ({"alpha": 1.5}, "alpha"),
    ]:
        with pytest.raises(ValueError, match=match):
            token_kinds(stats, **kwargs)


def reference(stats, scope: str):
    """Brute force with pandas: per (query, token) (query pooled when global) the support,
    the top next token (ties: the smallest), |Omega|, the base share of the top next token and
    the guard's raw p-value."""
    import pandas as pd
    from scipy.stats import binom

    frame = stats.to_dataframe()[["query", "next", "token", "count"]]
    if scope == "global":
        frame = frame.assign(query=-1).groupby(["query", "next", "token"], as_index=False).sum()
    totals = frame.groupby(["query", "next"])["count"].sum()
    base = totals / totals.groupby(level="query").transform("sum")
    rivals = totals.groupby(level="query").size()
    rows = []
    for (q, tok), part in frame.groupby(["query", "token"]):
        per_next = part.groupby("next")["count"].sum()
        top_next = int(per_next[per_next == per_next.max()].index.min())
        support, top = int(per_next.sum()), int(per_next.max())
        p = binom.sf(top - 1, support, base[(q, top_next)]) * rivals[q]
        rows.append((q, tok, support, top_next, len(per_next), top / support, min(p, 1.0)))
    return pd.DataFrame(
        rows, columns=["query", "token", "support", "next", "num_next", "purity", "raw_p"]
    )


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(3, 9), st.sampled_from(["local", "global"]))
def test_classification_equals_brute_force(seed, vocab, scope):
    """The linear pass over each query's triples gives what a groupby over every (query, token)
    gives, including ties of the top next token and the guard's p-values (Benjamini-Hochberg
    over the candidates that pass support and purity)."""
    import numpy as np

    from scansnap_lens.statistics.kinds import _benjamini_hochberg

    rows = torch.randint(vocab, (8, 14), generator=torch.Generator().manual_seed(seed))
    stats = cooccurrence(rows, vocab_size=vocab, window=4)
    ref = reference(stats, scope)
    tc = token_kinds(stats, scope=scope, guard=True, purity=0.6, min_support=2)
    got = tc.to_dataframe()
    for column in ("query", "token", "support", "next", "num_next"):
        assert got[column].tolist() == ref[column].tolist(), column
    np.testing.assert_allclose(got["purity"], ref["purity"], rtol=1e-12)
    cand = (ref["support"] >= 2) & (ref["purity"] >= 0.6 - 1e-12)
    expected = np.full(len(ref), np.nan)
    expected[cand] = _benjamini_hochberg(ref["raw_p"][cand].to_numpy())
    np.testing.assert_allclose(got["p_value"], expected, rtol=1e-9)
