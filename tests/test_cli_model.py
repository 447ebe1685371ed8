"""`posttrain model build|info`: where a starter lives, its recipe, spec and quality gate."""

from __future__ import annotations

import json

from posttrain.cli import main


def test_info_on_the_starter_names_its_shape_spec_and_first_build_seed(capsys):
    assert main(["model", "info", "starter"]) == 0
    printed = capsys.readouterr().out
    assert "hidden 256, 9 layers" in printed
    assert "first build seed 0" in printed
    assert "spec:          copy rate >= " in printed and "with_id" in printed


def test_info_on_another_build_seed_names_that_seed(capsys):
    assert main(["model", "info", "starter@3"]) == 0
    assert "first build seed 3" in capsys.readouterr().out


def test_info_on_a_built_starter_2m_gives_its_size_and_gate(starter_2m_folder, capsys):
    assert main(["model", "info", "starter-2m"]) == 0
    printed = capsys.readouterr().out
    build = json.loads((starter_2m_folder / "build.json").read_text())
    assert str(starter_2m_folder) in printed
    assert "parameters:    1,609,856" in printed
    assert "final SFT loss" in printed
    # every build seed the gate tried is listed with its probe and verdict
    assert f"quality gate:  passed, build seed {build['build_seed']}" in printed
    for attempt in build["attempts"]:
        assert f"build seed {attempt['seed']}: copy " in printed


def test_build_of_an_unknown_starter_stops_before_building(capsys, models_folder):
    assert main(["model", "build", "--name", "starter-10b"]) == 2
    assert "choose one of starter, starter-2m" in capsys.readouterr().err
    assert not (models_folder / "starter").exists() or not any(
        path.name.startswith("starter-10b") for path in (models_folder / "starter").iterdir()
    )


def test_info_on_a_name_it_does_not_know_or_cannot_load_is_an_error(capsys, tmp_path,
                                                                   monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["model", "info", "nosuch"]) == 2
    assert "'nosuch' is not a model posttrain knows" in capsys.readouterr().err
    assert main(["model", "info", "Qwen/Qwen2.5-0.5B-Instruct"]) == 1
    assert "not in the Hugging Face cache" in capsys.readouterr().out
    (tmp_path / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct").mkdir(parents=True)
    assert main(["model", "info", "Qwen/Qwen2.5-0.5B-Instruct"]) == 0
