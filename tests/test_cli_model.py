"""`posttrain model info`: where a starter lives, its recipe, and how it was made."""

from __future__ import annotations

from posttrain.cli import main


def test_info_on_the_starter_names_its_shape_and_that_it_is_grown(capsys):
    assert main(["model", "info", "starter"]) == 0
    printed = capsys.readouterr().out
    assert "hidden 256, 9 layers" in printed
    assert "grown from:    starter-2m" in printed


def test_info_on_a_built_starter_2m_gives_its_size_and_build(starter_2m_folder, capsys):
    assert main(["model", "info", "starter-2m"]) == 0
    printed = capsys.readouterr().out
    assert str(starter_2m_folder) in printed
    assert "parameters:    1,609,856" in printed
    assert "final SFT loss" in printed and "grown from" not in printed
