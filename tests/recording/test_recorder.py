"""The Recorder: every checkpoint source into one resumable trajectory folder, planned
from queries or from a plan, refusing what does not match the folder."""

from __future__ import annotations

import pytest
import torch
from _runs import V, train_run
from _tiny import QUIET

from scansnap_lens.cli import cli_message
from scansnap_lens.lab.synthetic import syn_small
from scansnap_lens.models import checkpoints
from scansnap_lens.models.checkpoints import in_memory
from scansnap_lens.models.formats import CheckpointError
from scansnap_lens.models.training import attention_only_model
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.recording.recorder import Recorder, record_trajectory
from scansnap_lens.recording.settings import RecordingSettings
from scansnap_lens.recording.trajectory import Trajectory

pytestmark = pytest.mark.tl  # builds or runs TransformerLens models: both majors run it

SMALL_V = 20  # the vocabulary of the recordings made here from random tokens


def test_folder_source_records_and_resumes(trained, tmp_path):
    out, _, tokens = trained
    plan = plan_recording(tokens, V, queries=syn_small().query.tolist())
    source = checkpoints.folder(out)
    assert source.steps == [0, 5, 10, 20, 30]
    full = Recorder(tmp_path / "full", tokens, QUIET, plan=plan).record(source)
    assert full.steps.tolist() == [0, 5, 10, 20, 30]
    assert full.zbar.shape == (5, 1, 2, plan.num_pairs)

    # Interrupt after two checkpoints, then resume: finished steps are not loaded again.
    loads = []

    class Interrupt(Exception):
        pass

    def wrapped(source, stop_after=None):
        for c in source.checkpoints:

            def load(c=c, inner=c.loader):
                if stop_after is not None and len(loads) == stop_after:
                    raise Interrupt
                loads.append(c.step)
                return inner()

            c.loader = load
        return source

    with pytest.raises(Interrupt):
        Recorder(tmp_path / "resumed", tokens, QUIET, plan=plan).record(
            wrapped(checkpoints.folder(out), stop_after=2)
        )
    assert Trajectory.load(tmp_path / "resumed").steps.tolist() == [0, 5]
    loads.clear()
    resumed = Recorder(tmp_path / "resumed", tokens, QUIET, plan=plan).record(
        wrapped(checkpoints.folder(out))
    )
    assert loads == [10, 20, 30]
    for name in ("zbar", "c_hat", "entropy", "query_entropy"):
        assert torch.equal(getattr(resumed, name), getattr(full, name))

    other = plan_recording(tokens, V)
    with pytest.raises(ValueError, match="another plan"):
        Recorder(tmp_path / "full", tokens, QUIET, plan=other).record(source)


def test_each_checkpoints_model_is_collected_walking_only_what_it_made(trained, tmp_path):
    """After each checkpoint its model is gone (its reference cycles collected: a sweep
    deletes the file they map next); the collection walks only the objects the checkpoint
    made (the older ones frozen meanwhile: 0.5 ms, not a full walk of the process), and the
    process's own frozen objects are left as they were."""
    import gc
    import weakref

    out, _, tokens = trained
    models, frozen_at_collect = [], []
    source = checkpoints.folder(out)
    for c in source.checkpoints:

        def load(inner=c.loader):
            model = inner()
            models.append(weakref.ref(model))
            return model

        c.loader = load
    collect = gc.collect

    def watched(*args, **kwargs):
        frozen_at_collect.append(gc.get_freeze_count())
        return collect(*args, **kwargs)

    gc.collect = watched
    try:
        Recorder(tmp_path / "a", tokens, QUIET).record(source)
        assert len(models) == 5 and all(m() is None for m in models)  # collected
        assert len(frozen_at_collect) == 5 and min(frozen_at_collect) > 0
        assert gc.get_freeze_count() == 0  # thawed
        frozen_at_collect.clear()
        gc.freeze()  # a caller's own: left frozen, the collection then a full one
        try:
            Recorder(tmp_path / "b", tokens, QUIET).record(checkpoints.folder(out))
            assert gc.get_freeze_count() > 0 and len(frozen_at_collect) == 5
        finally:
            gc.unfreeze()
    finally:
        gc.collect = collect


def test_callback_and_memory_sources_match_folder(trained, tmp_path):
    out, _, tokens = trained
    plan = plan_recording(tokens, V, queries=syn_small().query.tolist())
    folder_traj = Recorder(tmp_path / "a", tokens, QUIET, plan=plan).record(checkpoints.folder(out))
    # Recording inside the training loop, without saving weights, sees the same models.
    recorder = Recorder(tmp_path / "b", tokens, QUIET, plan=plan)
    model, _ = train_run(on_checkpoint=recorder.on_checkpoint)
    callback_traj = recorder.trajectory()
    for name, atol in (("zbar", 1e-5), ("c_hat", 1e-6)):
        got, want = getattr(callback_traj, name).full(), getattr(folder_traj, name).full()
        torch.testing.assert_close(got, want, atol=atol, rtol=1e-5)
    mem = record_trajectory(
        checkpoints.in_memory({30: model}), tokens, tmp_path / "c", QUIET, plan=plan
    )
    torch.testing.assert_close(mem.zbar[0], folder_traj.zbar[-1], atol=1e-5, rtol=1e-5)


def test_prompt_attention_kept_per_checkpoint(trained, tmp_path):
    out, _, tokens = trained
    plan = plan_recording(tokens, V, queries=syn_small().query.tolist())
    source = checkpoints.folder(out)
    traj = Recorder(
        tmp_path / "t", tokens, RecordingSettings(prompt_length=10, progress=False), plan=plan
    ).record(source)
    assert torch.equal(traj.prompt, tokens[0, :10])
    assert traj.prompt_pattern.shape == (5, 1, 2, 10, 10)
    # the kept weights are the model's own hook_pattern, checkpoint by checkpoint
    model = source.checkpoints[3].load()
    _, cache = model.run_with_cache(tokens[:1, :10])
    torch.testing.assert_close(traj.prompt_pattern[3, 0], cache["pattern", 0][0])
    # they survive save, load and select, and a resume with another prompt is refused
    copy = Trajectory.load(traj.save(tmp_path / "copy"))
    assert torch.equal(copy.prompt_pattern, traj.prompt_pattern)
    sub = copy.select(steps=[10, 30], heads=[1])
    assert torch.equal(sub.prompt_pattern, traj.prompt_pattern[[2, 4]][:, :, [1]])
    with pytest.raises(ValueError, match="another example prompt"):
        Recorder(
            tmp_path / "t",
            tokens,
            RecordingSettings(prompt=tokens[1, :10], progress=False),
            plan=plan,
        )
    # a plain resume keeps the recorded prompt; another length asked for is refused
    assert torch.equal(Recorder(tmp_path / "t", tokens, QUIET, plan=plan).prompt, traj.prompt)
    with pytest.raises(ValueError, match=r"prompt of 10 tokens, and prompt_length= here \(12\)"):
        Recorder(tmp_path / "t", tokens, QUIET.replace(prompt_length=12), plan=plan)


def test_a_recorder_with_other_rates_is_refused_and_overwrite_replaces(tmp_path):
    from scansnap_lens.recording.recorder import Recorder

    tokens = torch.randint(0, SMALL_V, (4, 10), generator=torch.Generator().manual_seed(0))
    plan = plan_recording(tokens, SMALL_V)
    model = attention_only_model(SMALL_V, d_model=8, n_ctx=16, seed=0)
    first = Recorder(tmp_path / "t", tokens, QUIET, plan=plan)
    first.on_checkpoint(0, model, training={"lr_y": 0.1, "lr_z": 1.0})
    again = Recorder(tmp_path / "t", tokens, QUIET, plan=plan)  # the same run: resumes
    again.on_checkpoint(1, model, training={"lr_y": 0.1, "lr_z": 1.0})
    edited = Recorder(tmp_path / "t", tokens, QUIET, plan=plan)
    with pytest.raises(ValueError, match=r"another run \(lr_y 0.1 there, 0.2 here\).*overwrite"):
        edited.on_checkpoint(2, model, training={"lr_y": 0.2, "lr_z": 1.0})
    assert Trajectory.load(tmp_path / "t").steps.tolist() == [0, 1]  # nothing lost
    fresh = Recorder(
        tmp_path / "t", tokens, RecordingSettings(progress=False, overwrite=True), plan=plan
    )
    fresh.on_checkpoint(5, model, training={"lr_y": 0.2, "lr_z": 1.0})
    replaced = Trajectory.load(tmp_path / "t")
    assert replaced.steps.tolist() == [5] and replaced.meta["lr_y"] == 0.2


def test_a_recorder_plans_for_queries_from_the_first_model_and_resumes_without_one(tmp_path):
    """`Recorder(queries=)`: the plan is built from the first model recorded (its vocabulary)
    and equals `plan_recording`'s; a recorder resuming the folder reads its plan back; other
    queries are refused by name."""
    from scansnap_lens.recording.recorder import Recorder

    tokens = torch.randint(0, SMALL_V, (4, 10), generator=torch.Generator().manual_seed(0))
    models = [attention_only_model(SMALL_V, d_model=8, n_ctx=16, seed=s) for s in range(3)]
    planned = Recorder(tmp_path / "q", tokens, RecordingSettings(queries=[3, 5, 7], progress=False))
    planned.on_checkpoint(0, models[0])
    Recorder(tmp_path / "q", tokens, QUIET).on_checkpoint(1, models[1])  # resumes
    Recorder(
        tmp_path / "q", tokens, RecordingSettings(queries=[7, 5, 3], progress=False)
    ).on_checkpoint(2, models[2])
    explicit = plan_recording(tokens, SMALL_V, queries=[3, 5, 7])
    reference = record_trajectory(
        in_memory(dict(enumerate(models))), tokens, tmp_path / "p", QUIET, plan=explicit
    )
    got = Trajectory.load(tmp_path / "q")
    assert got.plan.queries.tolist() == [3, 5, 7] and got.steps.tolist() == [0, 1, 2]
    for name in ("zbar", "c_hat", "entropy", "query_entropy"):
        assert torch.equal(getattr(got, name), getattr(reference, name)), name
    with pytest.raises(ValueError, match="another plan"):
        Recorder(tmp_path / "q", tokens, RecordingSettings(queries=[3, 5], progress=False))
    with pytest.raises(ValueError, match=r"recorded with other exclude_bos \(exclude_bos=\)"):
        Recorder(
            tmp_path / "q", tokens, RecordingSettings(exclude_bos=True, progress=False)
        )  # another convention
    with pytest.raises(ValueError, match=r"recorded with other evaluation tokens \(tokens="):
        Recorder(tmp_path / "q", tokens[:3], QUIET)  # fewer rows (--max-rows)
    with pytest.raises(ValueError, match="give a plan, or the settings to plan for"):
        Recorder(
            tmp_path / "r", tokens, RecordingSettings(queries=[3], progress=False), plan=explicit
        )
    traj = record_trajectory(
        in_memory({0: models[0]}),
        tokens,
        tmp_path / "s",
        RecordingSettings(queries=[5], progress=False),
    )
    assert traj.plan.queries.tolist() == [5]


def _zipf_tokens(seed=0, rows=6, length=40, vocab=SMALL_V):
    gen = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)
    return torch.multinomial(weights, rows * length, replacement=True, generator=gen).reshape(
        rows, length
    )


def test_by_default_the_recorder_tracks_the_queries_that_fit_the_budget(tmp_path, capsys):
    """Without queries=, the plan is the longest frequency-ordered prefix whose checkpoint
    fits max_checkpoint_bytes (and the run's share of max_run_bytes); the size is printed
    before the first checkpoint, and the files hold what the plan says."""
    from scansnap_lens.recording.aggregates import RANDOM_ROWS
    from scansnap_lens.recording.plan import budget_queries
    from scansnap_lens.statistics.corpus import cooccurrence

    tokens = _zipf_tokens()
    models = {s: attention_only_model(SMALL_V, d_model=16, n_heads=2, seed=s) for s in (0, 1, 2)}
    every = record_trajectory(
        in_memory(models),
        tokens,
        tmp_path / "all",
        RecordingSettings(queries="all", prompt_length=0, progress=False),
    )
    per_value = 4 * 1 * 2  # float32, one layer, two heads
    budget = every.plan.num_slots * per_value // 3
    traj = record_trajectory(
        in_memory(models),
        tokens,
        tmp_path / "budget",
        RecordingSettings(prompt_length=0, max_checkpoint_bytes=budget),
    )
    # the rows aggregates (the head types) take their rows first, whatever the queries
    fixed = sum(v.shape[-1] for n, v in traj.values.items() if traj.aggregates[n].axis == "rows")
    # six rows: too few for the induction score's interval, which reads 16 repeated random rows
    assert fixed == 2 * tokens.shape[0] + RANDOM_ROWS and traj.induction.shape[-1] == RANDOM_ROWS
    expected = budget_queries(cooccurrence(tokens, SMALL_V), budget // per_value - fixed)
    assert traj.plan.queries.tolist() == expected.tolist()
    assert 1 <= traj.plan.num_queries < every.plan.num_queries
    values = sum(v[0].numel() for v in traj.values.values())
    assert values * 4 == (traj.plan.num_slots + fixed) * per_value <= budget
    for q in traj.plan.queries.tolist():  # the same values as the full recording's
        mine, full = traj.logits(q, range(SMALL_V)), every.logits(q, range(SMALL_V))
        assert torch.equal(mine.isnan(), full.isnan())
        assert torch.equal(mine.nan_to_num(), full.nan_to_num())
    printed = capsys.readouterr().out
    assert f"plan: {traj.plan.describe()}" in printed and "for 3 checkpoints" in printed
    # the run's budget shares out per checkpoint: a third of it for 3 checkpoints
    shared = record_trajectory(
        in_memory(models),
        tokens,
        tmp_path / "run",
        RecordingSettings(prompt_length=0, max_run_bytes=budget * 3, progress=False),
    )
    assert shared.plan.queries.tolist() == expected.tolist()


def test_with_statistics_the_plan_is_made_for_the_scans_power(tmp_path):
    """With stats=, the queries whose distinct and common tokens both occur come first (the
    query 1, whose key token decides the next one), each with its distinct tokens and a sample
    of its common ones; the budget's rest goes to the most frequent others, whole."""
    from scansnap_lens.measures.discriminative import QueryTokens
    from scansnap_lens.statistics.corpus import cooccurrence
    from scansnap_lens.statistics.groups import TokenGroups

    gen = torch.Generator().manual_seed(1)
    noise = torch.randint(10, 14, (300, 8), generator=gen)  # frequent, predict nothing
    key = torch.randint(2, 5, (300, 1), generator=gen)  # decides the next token after 1
    tokens = torch.cat([noise[:, :5], key, noise[:, 5:], torch.ones_like(key), 5 + key], 1)
    stats = cooccurrence(tokens, SMALL_V, window=8)
    groups = TokenGroups.from_statistics(stats)
    frequent, _ = stats.query_counts()
    assert frequent[0] != 1 and 1 in groups.query.tolist()
    model = attention_only_model(SMALL_V, d_model=16, n_heads=2)
    power = plan_recording(tokens, SMALL_V, window=8, groups=groups, max_slots=10**6)
    budget = 4 * 2 * power.for_queries(torch.tensor([1]))[0].num_slots
    traj = record_trajectory(
        in_memory({0: model}),
        tokens,
        tmp_path / "t",
        RecordingSettings(max_checkpoint_bytes=budget, prompt_length=0, progress=False),
        stats=stats,
    )
    assert traj.plan.queries.tolist() == [1] and traj.plan.common_per_query == 32
    units = QueryTokens.of(traj, groups)
    assert units.query.tolist() == [1] and units.num_distinct.item() == 3  # the key tokens
    roomy = record_trajectory(
        in_memory({0: model}),
        tokens,
        tmp_path / "u",
        RecordingSettings(prompt_length=0, progress=False),
        stats=stats,
    )
    assert set(frequent.tolist()) <= set(roomy.plan.queries.tolist())  # the others, whole
    for m in frequent.tolist():
        if m != 1:
            assert torch.equal(
                roomy.plan.for_queries(torch.tensor([m]))[0].pair_token,
                plan_recording(tokens, SMALL_V, [m], window=8).pair_token,
            )


def test_a_run_over_the_budget_is_refused_before_anything_is_written(tmp_path):
    tokens = _zipf_tokens()
    model = attention_only_model(SMALL_V, d_model=16, n_heads=2)
    out = tmp_path / "t"
    budget = r"over the budget of 100 B \(max_run_bytes=\).*queries="
    with pytest.raises(ValueError, match=budget) as refused:
        record_trajectory(
            in_memory({0: model, 1: model}),
            tokens,
            out,
            RecordingSettings(queries="all", max_run_bytes=100, progress=False),
        )
    assert not (out / "manifest.json").exists()
    # the command line names its flags beside the settings' names
    said = cli_message(refused.value)
    assert "(max_run_bytes=, --max-run-gb)" in said and "(queries=, --queries)" in said
    with pytest.raises(ValueError, match="queries must be"):
        Recorder(tmp_path / "u", tokens, RecordingSettings(queries="most"))


def test_the_recording_takes_the_statistics_window(tmp_path):
    """With stats=, the plan aggregates the context the statistics counted (their window), so
    its slots are the statistics' own pairs and triples on the evaluation text."""
    from scansnap_lens.statistics.corpus import cooccurrence

    tokens = _zipf_tokens(2, rows=4, length=30)
    stats = cooccurrence(tokens, SMALL_V, window=5)
    model = attention_only_model(SMALL_V, d_model=16, n_heads=2)
    traj = record_trajectory(
        in_memory({0: model}),
        tokens,
        tmp_path / "t",
        RecordingSettings(queries="all", progress=False),
        stats=stats,
    )
    assert traj.plan.window == 5 and traj.plan.context.window == 5
    windowed = plan_recording(tokens, SMALL_V, window=5)
    assert traj.plan.same_as(windowed)
    assert not windowed.same_as(plan_recording(tokens, SMALL_V))
    assert windowed.num_triples == stats.num_triples  # the same counted context
    assert Trajectory.load(tmp_path / "t").plan.window == 5  # kept in the plan file
    with pytest.raises(ValueError, match="differs from the statistics' window"):
        Recorder(tmp_path / "u", tokens, RecordingSettings(window=7), stats=stats)


def test_a_sampled_plan_records_what_the_whole_plan_records_on_its_slots(tmp_path):
    """A plan made for power keeps some pairs, triples and classes of each query: each value it
    records is the whole plan's value of that slot (zbar, c_hat, the entropies: the
    attention is renormalised over the whole context, not over the kept tokens)."""
    from scansnap_lens.statistics.corpus import cooccurrence
    from scansnap_lens.statistics.groups import TokenGroups

    tokens = _zipf_tokens(2, rows=6, length=24)
    stats = cooccurrence(tokens, SMALL_V, window=6)
    groups = TokenGroups.from_statistics(stats, guard=False, purity=0.5)
    sampled = plan_recording(tokens, SMALL_V, window=6, groups=groups, max_slots=10**6,
                             common_per_query=2, classes_per_query=1)  # fmt: skip
    whole = plan_recording(tokens, SMALL_V, window=6, queries=sampled.queries)
    assert sampled.num_pairs < whole.num_pairs and sampled.num_triples < whole.num_triples
    model = {0: attention_only_model(SMALL_V, d_model=16, n_heads=2, seed=3)}
    a = record_trajectory(in_memory(model), tokens, tmp_path / "a", QUIET, plan=sampled)
    b = record_trajectory(in_memory(model), tokens, tmp_path / "b", QUIET, plan=whole)
    pair = whole.pair_slot(sampled.pair_query, sampled.pair_token)
    assert (pair >= 0).all()
    torch.testing.assert_close(a.zbar[:], b.zbar[..., pair])
    cls = torch.tensor([whole.class_slot(int(m), int(n))
                        for m, n in zip(sampled.class_query, sampled.class_next)])  # fmt: skip
    kept = [sampled.triple_token[sampled.triple_class == c] for c in range(sampled.num_classes)]
    triple = torch.cat([whole.triple_slot(int(cls[c]), t) for c, t in enumerate(kept)])
    torch.testing.assert_close(a.c_hat[:], b.c_hat[..., triple])
    torch.testing.assert_close(a.entropy[:], b.entropy[..., cls])
    torch.testing.assert_close(a.query_entropy[:], b.query_entropy[:])


def test_layers_or_heads_named_twice_are_refused_before_anything_is_written(tmp_path):
    tokens = _zipf_tokens()
    for name, values in (("layers", [0, 0]), ("heads", [1, 1])):
        with pytest.raises(ValueError, match=rf"{name} \[\d, \d\] name \[\d\] more than once"):
            Recorder(tmp_path / name, tokens, RecordingSettings(**{name: values}))
        assert not (tmp_path / name).exists()


def test_a_checkpoint_of_another_architecture_is_named_and_can_be_skipped(tmp_path):
    """A run whose architecture changes at one checkpoint: that checkpoint is named (the user
    passed no --layers), and on_error="skip" passes it over."""
    tokens = _zipf_tokens()
    models = {0: attention_only_model(SMALL_V, d_model=16, n_layers=2, seed=0),
              5: attention_only_model(SMALL_V, d_model=16, n_layers=1, seed=1),
              9: attention_only_model(SMALL_V, d_model=16, n_layers=2, seed=2)}  # fmt: skip
    with pytest.raises(CheckpointError, match=r"checkpoint 5 has 1 layers .* another"):
        record_trajectory(in_memory(models), tokens, tmp_path / "a", QUIET)
    traj = record_trajectory(
        in_memory(models),
        tokens,
        tmp_path / "b",
        RecordingSettings(progress=False, on_error="skip"),
    )
    assert traj.steps.tolist() == [0, 9] and [s["step"] for s in traj.skipped] == [5]
