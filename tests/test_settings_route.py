"""A recipe run reads from its route to its step in a few modules: the functions its
settings are handed to, recorded while the run runs (``tests/settings_route.py``), reach
the step in at most 15 modules with at most 5 returns to a module already left."""

import pytest

from tests.settings_route import trace_settings_route

pytestmark = pytest.mark.slow

MODULES, RETURNS = 15, 5
RUN = ["--base-model", "starter-2m", "--prompts", "40", "--eval-samples", "1", "--steps", "2"]
# GRPO's longest route: a cold start (its own SFT settings, trainer and evaluation) between
# the baseline and the step, with the hack monitor on
GRPO_COLD_START = [*RUN, "--num-generations", "4", "--monitor-every", "2", "--cold-start",
                   "sft", "--cold-start-steps", "2"]  # fmt: skip


def route_of(recipe, flags, tmp_path, *, own_methods=False):
    code, route = trace_settings_route(
        [recipe, *flags, "--runs-dir", str(tmp_path)], start=f"train/{recipe}/run.py:run_{recipe}",
        step=f"train/{recipe}/trainer.py:train_{recipe}", own_methods=own_methods)
    assert code in (0, 1), route.describe()  # 1: the run ended with a guard down
    assert route.reached, route.describe()
    return route


def test_a_cold_started_grpo_run_reaches_its_step_in_a_few_modules(starter_2m_folder, tmp_path):
    route = route_of("grpo", GRPO_COLD_START, tmp_path)
    assert len(route.modules) <= MODULES and route.returns <= RETURNS, route.describe()
    # the route's own order: prepared, loaded, the baseline measured, the cold start shaped
    # and run (SFT's trainer), then the step
    assert route.visits[0].module == "train/grpo/run.py"
    assert route.visits[-1].module == "train/grpo/trainer.py"
    assert route.visits[-1].functions == ["train_grpo"]
    order = route.modules
    assert (order.index("train/recipe.py") < order.index("train/grpo/cold_start_shape.py")
            < order.index("train/grpo/cold_start.py") < order.index("train/sft/trainer.py")
            < order.index("train/grpo/trainer.py"))


def test_counting_the_settings_own_methods_the_route_keeps_its_modules(starter_2m_folder,
                                                                      tmp_path):
    # the settings' methods live in three modules (the recipe's settings, the shared ones,
    # the data flags): they add returns, not rooms
    route = route_of("grpo", GRPO_COLD_START, tmp_path, own_methods=True)
    assert len(route.modules) <= MODULES, route.describe()
    assert {"train/settings.py", "data/prepare.py"} <= set(route.modules)


@pytest.mark.parametrize("recipe", ["dpo", "sft"])
def test_dpo_and_sft_reach_their_step_in_a_few_modules(recipe, starter_2m_folder, tmp_path):
    route = route_of(recipe, RUN, tmp_path)
    assert len(route.modules) <= MODULES and route.returns <= RETURNS, route.describe()
    assert route.visits[-1].functions == [f"train_{recipe}"]
