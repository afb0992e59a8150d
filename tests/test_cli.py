import subprocess
import sys

from scansnap_lens.cli import main


def test_demo_writes_figures_and_prints_the_summary(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--steps", "30"]) == 0
    out = capsys.readouterr().out
    assert "lrY10_lrZ1" in out and "t0 (theory)" in out
    for name in [
        "demo_attention_lrY1_lrZ1.png",
        "demo_loss.png",
        "demo_attention.csv",
        "demo_loss.csv",
    ]:
        assert (tmp_path / name).stat().st_size > 0


def test_theory_command_and_errors(tmp_path, capsys):
    assert (
        main(
            [
                "theory",
                "--K",
                "10",
                "--M",
                "1000",
                "--lr-y",
                "1",
                "--lr-z",
                "0.5",
                "--csv",
                str(tmp_path / "b.csv"),
            ]
        )
        == 0
    )
    assert "182.34" in capsys.readouterr().out
    assert (tmp_path / "b.csv").read_text().startswith("t,B,xi,B_integral,chi_upper")
    assert main(["theory", "--K", "10", "--M", "1000", "--lr-y", "-1", "--lr-z", "0.5"]) == 2
    assert "lr_y must be positive" in capsys.readouterr().err


def test_console_script_help():
    done = subprocess.run(
        [sys.executable, "-m", "scansnap_lens.cli", "demo", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--out" in done.stdout
