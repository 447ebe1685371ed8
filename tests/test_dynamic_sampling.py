"""Dynamic sampling (``--resample-dead-groups``): dead groups drawn again within a budget,
on fixed rollouts, and through a real GRPO run on the starter (posttrain's rollout)."""

from __future__ import annotations

import json

import pytest

from posttrain.cli import main
from posttrain.train.grpo.dynamic_sampling import ResampleCount, dead_groups, resample_dead


def test_dead_groups_are_the_groups_whose_replies_all_scored_the_same():
    scores = [1, 1, 1, 0, 0, 0, 0.3, 0.3, 0.3, 0.3, 0.3, 1]
    assert dead_groups(scores, 3) == [0, 1, 2]
    assert dead_groups(scores, 2) == [0, 2, 3, 4]
    assert dead_groups(scores, 4) == []
    with pytest.raises(ValueError, match="do not split into groups of 5"):
        dead_groups(scores, 5)


def fixed_redraws(script):
    """A redraw that hands out, per (group, round), the draws and scores of ``script``,
    and remembers what it was asked."""
    asked = []

    def redraw(groups, number):
        asked.append((list(groups), number))
        return {group: script[group, number] for group in groups}

    return redraw, asked


def test_a_dead_group_is_replaced_by_its_first_redraw_that_differs():
    draws = ["a0", "a1", "b0", "b1", "c0", "c1"]
    scores = [0.0, 0.0, 1.0, 0.0, 1.0, 1.0]  # groups of 2: a dead, b alive, c dead
    redraw, asked = fixed_redraws({
        (0, 1): (["a2", "a3"], [0.0, 0.0]), (0, 2): (["a4", "a5"], [1.0, 0.0]),
        (2, 1): (["c2", "c3"], [1.0, 1.0]), (2, 2): (["c4", "c5"], [1.0, 1.0]),
        (2, 3): (["c6", "c7"], [1.0, 1.0]),
    })
    count = ResampleCount(rounds=3)
    kept, kept_scores = resample_dead(draws, scores, 2, 3, redraw, count)
    # a revived in round 2; b never redrawn; c dead after the budget keeps its last draw
    assert kept == ["a4", "a5", "b0", "b1", "c6", "c7"]
    assert kept_scores == [1.0, 0.0, 1.0, 0.0, 1.0, 1.0]
    assert asked == [([0, 2], 1), ([0, 2], 2), ([2], 3)]  # one batched call a round
    assert draws[0] == "a0" and scores[0] == 0.0  # the inputs are left as they were
    assert count.to_dict() == {"rounds": 3, "steps": 1, "groups": 3, "dead": 2,
                               "revived": 1, "redraws": 5, "revived_by_round": [0, 1, 0]}
    assert count.words() == ("dynamic sampling: 1 of 2 dead groups revived by 5 group "
                             "redraws (up to 3 each) over 1 steps; 1 stayed dead")


def test_no_dead_group_no_redraw_and_a_redraw_of_the_wrong_size_is_an_error():
    redraw, asked = fixed_redraws({})
    count = ResampleCount(rounds=2)
    kept, _ = resample_dead(["x", "y"], [0.0, 1.0], 2, 2, redraw, count)
    assert kept == ["x", "y"] and asked == []
    assert count.words() == "dynamic sampling: no dead group in 1 groups over 1 steps"
    short, _ = fixed_redraws({(0, 1): (["z"], [1.0])})
    with pytest.raises(ValueError, match="gave 1 draws and 1 scores, not 2"):
        resample_dead(["x", "y"], [0.0, 0.0], 2, 1, short)


def test_bad_values_and_places_it_cannot_run_are_refused(tmp_path, capsys):
    runs = str(tmp_path / "runs")
    assert main(["grpo", "--resample-dead-groups", "-1", "--runs-dir", runs]) == 2
    assert "--resample-dead-groups must be >= 0" in capsys.readouterr().err
    assert main(["grpo", "--resample-dead-groups", "2", "--rollout", "trl",
                 "--runs-dir", runs]) == 2
    assert "redraws inside posttrain's rollout" in capsys.readouterr().err
    assert main(["grpo", "--resample-dead-groups", "2", "--env", "refund-multiturn",
                 "--runs-dir", runs]) == 2
    err = capsys.readouterr().err
    assert "plays episodes" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.slow
def test_a_run_redraws_dead_groups_in_posttrains_rollout(starter_2m_folder, tmp_path, capsys):
    runs = tmp_path / "runs"
    code = main(["grpo", "--base-model", "starter-2m", "--prompts", "40", "--eval-samples", "1",
                 "--eval-repeats", "1", "--monitor-every", "0", "--num-generations", "4",
                 "--steps", "3", "--resample-dead-groups", "2", "--runs-dir", str(runs),
                 "--run-name", "redraw"])
    assert code in (0, 1)
    out = capsys.readouterr().out
    summary = json.loads((runs / "redraw" / "summary.json").read_text())
    assert summary["status"] == "done"
    assert summary["rollout"] == {"sampler": "posttrain", "reason": "auto: "
                                  "--resample-dead-groups redraws groups in posttrain's rollout"}
    counted = summary["dynamic_sampling"]
    assert counted["rounds"] == 2 and counted["steps"] == 3 and counted["groups"] == 12
    assert 0 <= counted["revived"] <= counted["dead"] <= counted["groups"]
    assert counted["dead"] <= counted["redraws"] <= 2 * counted["dead"]
    assert sum(counted["revived_by_round"]) == counted["revived"]
    assert "dynamic sampling: " in out
