"""`Analysis`: measured once, saved, reloaded identical where its inputs are the same, and
measured again where any of them changed."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from scansnap_lens.lab.synthetic import syn_medium
from scansnap_lens.measures.settings import AnalysisSettings
from scansnap_lens.reading.analysis import Analysis, fingerprint
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups


@pytest.fixture(scope="module")
def demo(demo_out):
    out, _ = demo_out
    classes = syn_medium(1)  # the demo's data: its groups and the theory's source
    return Trajectory.load(out / "trajectory"), TokenGroups.from_synthetic(classes), classes


def _same(a: Analysis, b: Analysis) -> None:
    pd.testing.assert_frame_equal(a.summary, b.summary)
    assert a.results.keys() == b.results.keys() and a.not_measured == b.not_measured
    for name, result in a.results.items():
        other = b.results[name]
        pd.testing.assert_frame_equal(result.table, other.table)
        assert result.table.attrs == other.table.attrs, name
        if result.detail is None:
            assert other.detail is None
        else:
            pd.testing.assert_frame_equal(result.detail, other.detail)
        if result.values is not None:
            torch.testing.assert_close(result.values, other.values, rtol=0, atol=0,
                                       equal_nan=True)  # fmt: skip
        for mine, theirs in zip(result.predictions or [], other.predictions or [], strict=True):
            assert torch.equal(mine.steps, theirs.steps)
            torch.testing.assert_close(mine.c_hat[:], theirs.c_hat[:], rtol=0, atol=0)


NO_FIT = AnalysisSettings(leave_out=["theory_fit"])  # minutes a run: not what is tested


@pytest.mark.tl
def test_a_saved_analysis_reloads_identical_tables(demo, tmp_path):
    traj, groups, classes = demo
    made = Analysis.of(traj, groups, source=classes, cache=tmp_path / "analysis")
    assert not made.reused and "theory_fit" in made.results  # the predictions are saved too
    assert made.results["theory_fit"].predictions
    again = Analysis.of(traj, groups, source=classes, cache=tmp_path / "analysis")
    assert again.reused and again.key == made.key
    _same(made, again)
    _same(made, Analysis.load(tmp_path / "analysis", traj, groups, classes))
    assert made.to_dataframe() is made.summary and "reloaded" in repr(again)


@pytest.mark.tl
def test_a_changed_input_is_measured_again(demo, tmp_path):
    traj, groups, classes = demo
    cache = tmp_path / "analysis"
    first = Analysis.of(traj, groups, source=classes, cache=cache)
    fewer = traj.select(steps=traj.steps[:-1].tolist())  # a run recorded further differs too
    other_groups = TokenGroups.from_synthetic(syn_medium(2))
    changes = [
        dict(traj=fewer, groups=groups, source=classes, settings=None),
        dict(traj=traj, groups=other_groups, source=classes, settings=None),
        dict(traj=traj, groups=groups, source=None, settings=None),
        dict(traj=traj, groups=groups, source=classes,
             settings=AnalysisSettings(theory_classes=1)),
        dict(traj=traj, groups=groups, source=classes,
             settings=AnalysisSettings(training={"lr_y": 0.5, "lr_z": 1.0})),
    ]  # fmt: skip
    keys = {first.key}
    for change in changes:
        analysis = Analysis.of(change.pop("traj"), change.pop("groups"), **change, cache=cache)
        assert not analysis.reused, change
        keys.add(analysis.key)
        saved = json.loads((cache / "analysis.json").read_text())
        assert saved["key"] == analysis.key  # the cache holds the latest
    assert len(keys) == len(changes) + 1
    with pytest.raises(ValueError, match="measured from other inputs"):
        Analysis.load(cache, traj, other_groups, classes)
    # a value that changed in place (the same object) changes the fingerprint
    edited = traj.replace(zbar=traj.zbar[:] + 1.0)
    assert fingerprint(edited) != fingerprint(traj)


@pytest.mark.tl
def test_an_analysis_saved_by_other_code_is_measured_again_and_said(demo, tmp_path, monkeypatch):
    """An upgrade of the measuring code: the same inputs and settings, another code version
    in the key (the package's version and its measuring stages' sources)."""
    from scansnap_lens.reading import analysis as module

    traj, groups, classes = demo
    cache = tmp_path / "analysis"
    first = Analysis.of(traj, groups, source=classes, cache=cache, settings=NO_FIT)
    assert json.loads((cache / "analysis.json").read_text())["code"] == module.code_version()
    monkeypatch.setattr(module, "code_version", lambda: "9.9+upgraded")
    again = Analysis.of(traj, groups, source=classes, cache=cache, settings=NO_FIT)
    assert not again.reused and again.key != first.key
    assert "measured by other code" in again.remeasured and "9.9+upgraded" in again.remeasured
    third = Analysis.of(traj, groups, source=classes, cache=cache, settings=NO_FIT)
    assert third.reused and third.remeasured is None


def _within(seconds: float, call):
    """`call()`'s result, or AssertionError where it has not returned in `seconds` (a read
    blocked on a FIFO never returns; its thread is left behind, as a daemon)."""
    import threading

    out = {}

    def run():
        try:
            out["value"] = call()
        except Exception as err:  # raised again here, in the test's thread
            out["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.mark.tl
@pytest.mark.parametrize("name", ["analysis.json", "summary.parquet"])
def test_a_fifo_in_a_saved_analysis_is_measured_again_not_waited_on(demo, tmp_path, name):
    """A saved analysis whose index or a table is a FIFO (issue 79): `report` blocked on it
    for ever; now it is no saved analysis, measured again and replaced."""
    import os

    traj, groups, classes = demo
    cache = tmp_path / "analysis"
    Analysis.of(traj, groups, source=classes, cache=cache, settings=NO_FIT)
    (cache / name).unlink()
    os.mkfifo(cache / name)
    again = _within(60, lambda: Analysis.of(traj, groups, source=classes, cache=cache,
                                            settings=NO_FIT))  # fmt: skip
    assert not again.reused and (cache / name).is_file()
    with pytest.raises(ValueError, match=r"not a regular file|no readable saved analysis"):
        os.unlink(cache / name)
        os.mkfifo(cache / name)
        _within(60, lambda: Analysis.load(cache, traj, groups, classes))


@pytest.mark.tl
def test_kept_figures_are_read_only_as_small_files_named_as_figures(demo, tmp_path):
    """The figures a report kept beside its analysis are read back by name from their index:
    a crafted index naming a path outside ("../../secret"), or a figure linked to a file
    outside, read that file into the next page, and a FIFO in place of a figure blocked
    `report` for ever; now none is read, and the figures are drawn again."""
    import json
    import os

    traj, groups, _ = demo
    cache = tmp_path / "analysis"
    analysis = Analysis.of(traj, groups, cache=cache, settings=NO_FIT)
    png = tmp_path / "heads.png"
    png.write_bytes(b"\x89PNG kept")
    analysis.keep_figures({"heads": png}, {"loss": "no loss was recorded"})
    assert analysis.drawn_figures() == {"heads": b"\x89PNG kept", "loss": "no loss was recorded"}
    index = cache / "figures" / "figures.json"
    said = json.loads(index.read_text())
    (tmp_path / "secret.png").write_bytes(b"a private file")
    index.write_text(json.dumps({**said, "drawn": ["../../secret"]}))
    assert analysis.drawn_figures() == {}
    index.write_text(json.dumps(said))
    os.unlink(cache / "figures" / "heads.png")
    os.mkfifo(cache / "figures" / "heads.png")
    assert _within(60, analysis.drawn_figures) == {}
    os.unlink(cache / "figures" / "heads.png")
    (cache / "figures" / "heads.png").symlink_to(tmp_path / "secret.png")  # a link out
    assert analysis.drawn_figures() == {}


@pytest.mark.tl
def test_a_table_that_expands_past_its_bound_is_not_read(demo, tmp_path, monkeypatch):
    """A saved table's size is read from its footer before the table: a small file of one
    repeated value expanded to 6.4 GB and exhausted memory (issue 79); past the bound it is
    refused by name, and `report` measures again."""
    import pyarrow.parquet as pq

    import scansnap_lens.reading.analysis as analysis_module

    traj, groups, _ = demo
    cache = tmp_path / "analysis"
    Analysis.of(traj, groups, cache=cache, settings=NO_FIT)
    meta = pq.ParquetFile(cache / "summary.parquet").metadata
    size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    monkeypatch.setattr(analysis_module, "FRAME_BYTES", size - 1)
    with pytest.raises(ValueError, match=r"\.parquet expands to .* bytes"):
        Analysis.load(cache, traj, groups)
    assert not Analysis.of(traj, groups, cache=cache, settings=NO_FIT).reused
    monkeypatch.setattr(analysis_module, "FRAME_BYTES", size)
    assert Analysis.of(traj, groups, cache=cache, settings=NO_FIT).reused


@pytest.mark.tl
def test_a_damaged_cache_is_measured_again_and_replaced(demo, tmp_path):
    traj, groups, _ = demo
    cache = tmp_path / "analysis"
    Analysis.of(traj, groups, cache=cache)
    (cache / "discriminative_bias.parquet").write_bytes(b"not parquet")
    analysis = Analysis.of(traj, groups, cache=cache)
    assert not analysis.reused
    assert Analysis.of(traj, groups, cache=cache).reused
    with pytest.raises(ValueError, match="no readable saved analysis"):
        Analysis.load(tmp_path / "elsewhere", traj, groups)


def test_settings_name_what_they_do_not_know():
    """Every settings value shares one base (`_settings.Settings`): `replace`, `to_dict` and
    `from_dict` round trip through JSON, and a name it does not know is refused the same way
    by each, naming it and the known ones (it was dropped, refused or ignored)."""
    from scansnap_lens.models.training import Rates
    from scansnap_lens.reading.live import LiveSettings
    from scansnap_lens.recording.settings import RecordingSettings
    from scansnap_lens.statistics.groups import Classification

    with pytest.raises(ValueError, match=r"unknown AnalysisSettings field 'classes': known"):
        AnalysisSettings().replace(classes=3)
    settings = AnalysisSettings(prediction=[100.0, 200.0], leave_out=["theory_fit"],
                                training={"lr_y": 0.1, "lr_z": 3.0})  # fmt: skip
    assert isinstance(settings.training, Rates)
    assert AnalysisSettings.from_dict(json.loads(json.dumps(settings.to_dict()))) == settings
    values = {AnalysisSettings: AnalysisSettings(), Classification: Classification(purity=0.9),
              RecordingSettings: RecordingSettings(layers=(1, 0), batch_size=4),
              Rates: Rates(0.1, 3.0, "adam"),
              LiveSettings: LiveSettings(per_head=True, stop_when=("snap",))}  # fmt: skip
    for kind, value in values.items():
        assert kind.from_dict(json.loads(json.dumps(value.to_dict()))) == value
        refused = f"unknown {kind.__name__} field 'colour'"
        with pytest.raises(ValueError, match=refused):
            kind.from_dict({**value.to_dict(), "colour": 1})
        with pytest.raises(ValueError, match=refused):
            value.replace(colour=1)


@pytest.mark.tl
def test_a_page_drawn_again_copies_its_figures_and_a_new_analysis_draws(demo, tmp_path,
                                                                         monkeypatch):  # fmt: skip
    """The report of a reloaded analysis copies the figures an earlier page of it drew (a new
    title costs no drawing); another analysis draws its own."""
    from scansnap_lens.report import write_report
    from scansnap_lens.viz import figures

    traj, groups, _ = demo
    cache = tmp_path / "analysis"
    first = write_report(Analysis.of(traj, groups, cache=cache), tmp_path / "a", views=False)
    drawn = {k: p.read_bytes() for k, p in first.files.items() if k.startswith("figure_")}
    assert len(drawn) >= 5

    def never(*args, **kwargs):
        raise AssertionError("a figure was drawn again")

    painters = [n for n in dir(figures) if n.startswith(("paint_", "plot_"))]
    for name in painters:
        monkeypatch.setattr(figures, name, never)
    again = write_report(Analysis.of(traj, groups, cache=cache), tmp_path / "b", title="again",
                         views=False)  # fmt: skip
    assert {k: p.read_bytes() for k, p in again.files.items() if k.startswith("figure_")} == drawn
    assert again.not_measured == first.not_measured
    with pytest.raises(AssertionError, match="drawn again"):  # another analysis: drawn anew
        other = Analysis.of(traj, groups, settings=AnalysisSettings(theory=False), cache=cache)
        write_report(other, tmp_path / "c", views=False)


@pytest.mark.tl
def test_without_a_cache_nothing_is_fingerprinted_until_saved(demo, tmp_path, monkeypatch):
    """Fingerprinting reads every input: an analysis nobody keeps is not made to pay for it,
    and one saved later is reloaded by the key a cached one would have."""
    import scansnap_lens.reading.analysis as module

    traj, groups, classes = demo
    calls = []
    real = module.fingerprint
    monkeypatch.setattr(module, "fingerprint", lambda *a: calls.append(a) or real(*a))
    made = Analysis.of(traj, groups, source=classes, settings=AnalysisSettings(theory=False))
    assert made.key is None and not calls
    made.save(tmp_path / "analysis")
    again = Analysis.of(traj, groups, source=classes, settings=AnalysisSettings(theory=False),
                        cache=tmp_path / "analysis")  # fmt: skip
    assert again.reused and again.key == made.key
    _same(made, again)
