"""The flow every training recipe shares, top to bottom:

1. check the settings, build the prompts and the holdout (same seed, same split);
2. refuse an existing run name, load the base policy (merging ``--from-run``'s adapter);
3. create the run folder and the run in the store, write ``config.json``;
4. evaluate the base policy on the holdout, ``eval_repeats`` times (the noise band),
   and audit the training reward on those rows (``posttrain.score.audit``);
5. train (the recipe's own step: GRPO or DPO), with progress and monitoring;
6. evaluate the trained policy on the same holdout prompts with the same seeds;
7. the paired delta, guard check and category table; ``summary.json``,
   ``report.md``, ``curves.png``; finish the run done / stopped / failed.

Ctrl-C or SIGTERM during training marks the run ``stopped`` and keeps what was measured.
Nothing is written before every input has been checked.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from posttrain.data.prepare import PreparedData, prepare_data
from posttrain.envs import get_env
from posttrain.envs.base import (
    DefaultBaseModel,
    env_name,
    has_hook,
)
from posttrain.errors import PosttrainError
from posttrain.interrupts import stop_reason
from posttrain.policy.loading import load_policy
from posttrain.policy.models import Policy, load_adapter, merge_adapter, parameter_count
from posttrain.runs.folder import RunFolder, check_new_run, create_run_folder, find_run, runs_root
from posttrain.runs.store import NullRun, check_store_opens, check_store_server, open_run
from posttrain.score.audit import RewardAudit, audit_reward
from posttrain.train import distributed
from posttrain.train.context import RecipeContext, TrainOutcome
from posttrain.train.distributed import Ranks
from posttrain.train.measure import evaluate_policy, finish_summary
from posttrain.train.rewards import RuleReward, load_reward_function
from posttrain.train.settings import RecipeSettings, check_recipe_settings
from posttrain.ui.announce import local_dashboard_url

#: a recipe's own settings class (GRPOSettings, DPOSettings, SFTSettings)
SettingsT = TypeVar("SettingsT", bound=RecipeSettings)

#: the base model of a recipe whose environment names no starter of its own
DEFAULT_STARTER = "starter"


def _versions() -> dict[str, str]:
    import importlib.metadata as metadata

    versions = {"python": sys.version.split()[0]}
    for package in ("posttrain", "torch", "transformers", "trl", "peft", "datasets"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def _load_base(settings: RecipeSettings, root: Any) -> tuple[Policy, str | None]:
    from_folder = None
    if settings.from_run:
        from_folder = find_run(root, settings.from_run)
        if not from_folder.adapter.is_dir():
            raise PosttrainError(
                f"run {settings.from_run!r} has no adapter/ (it did not finish training): "
                "choose a finished run for --from-run"
            )
    merged_base = from_folder.file("merged") if from_folder else None
    if merged_base is not None and merged_base.is_dir():
        # a DPO round-two run saved its merged base: stack on top of it
        policy = load_policy(str(merged_base))
    else:
        assert settings.base_model is not None, "run_recipe names the base model first"
        # ``starter`` is the environment's own when it has no hand-written one
        policy = load_policy(settings.base_model, env=settings.env,
                             prompts_file=settings.prompts_file)
    if from_folder is not None:
        policy = merge_adapter(load_adapter(policy, from_folder.adapter))
    return policy, str(from_folder.path) if from_folder else None


def _silent(line: str) -> None:
    """The console of a process that is not the main one."""


def check_world(settings: RecipeSettings, ranks: Ranks) -> None:
    """Refuse what a launch of several processes cannot do (before anything loads): a
    step's batch must split evenly across them, and a stop on an alarm, decided on the
    main process, would leave the others waiting."""
    if not ranks.distributed:
        return
    batch = settings.per_step_batch()
    if batch % ranks.world:
        raise PosttrainError(
            f"--batch-size {batch} does not split across {ranks.world} processes: give a "
            f"multiple of {ranks.world} (each process takes an equal share of every step)")
    if getattr(settings, "stop_on", ""):
        raise PosttrainError("--stop-on is not available with several processes yet: the "
                             "alarm is raised on the main process only; leave it out")


def from_run_base_model(root: Path, name: str, asked: str | None) -> str | None:
    """The base model for ``--from-run NAME``: the one that run trained on. ``asked`` (the
    ``--base-model`` flag) must be that one, or None; a run with no record of its base
    model leaves ``asked`` as it is."""
    import json

    config_path = find_run(root, name).file("config.json")
    try:
        trained_on = json.loads(config_path.read_text())["settings"]["base_model"]
    except (OSError, ValueError, KeyError, TypeError):
        return asked
    if not isinstance(trained_on, str):
        return asked
    if asked is not None and asked != trained_on:
        raise PosttrainError(
            f"--from-run {name} trained its adapter on {trained_on!r}, which does not fit "
            f"--base-model {asked!r}: leave --base-model out (it follows the run) or pass "
            f"--base-model {trained_on}"
        )
    return trained_on


def run_recipe(
    recipe: str,
    settings: SettingsT,
    *,
    check: Callable[[SettingsT], None],
    train: Callable[[RecipeContext], TrainOutcome],
    say: Callable[[str], None] = print,
    check_data: Callable[[SettingsT, PreparedData], None] | None = None,
) -> dict[str, Any]:
    """Run one recipe end to end (see module docstring); returns the summary dict.

    ``check`` refuses impossible settings and ``check_data`` settings that do not fit
    the prepared prompts, both before the model loads or anything is written."""
    timings: dict[str, float] = {}
    started = time.monotonic()
    ranks = distributed.current_ranks()
    distributed.start(ranks)
    if not ranks.is_main:
        say = _silent  # one console: the main process's
    failure: BaseException | None = None
    try:
        check_recipe_settings(settings)
        check(settings)
        check_world(settings, ranks)
        check_store_server()
        env = get_env(settings.env)
        settings.name_run_for(env_name(env))
        root = runs_root(settings.runs_dir)
        if settings.from_run:
            # an adapter only fits the model it was trained on: default to that one
            settings.base_model = from_run_base_model(root, settings.from_run,
                                                      settings.base_model)
        if settings.base_model is None:  # the environment's own starter, else the starter
            settings.base_model = (env.starter_model if has_hook(env, DefaultBaseModel)
                                   and env.starter_model else DEFAULT_STARTER)
        custom_reward = getattr(settings, "reward", None)
        reward = RuleReward(env, load_reward_function(custom_reward, env)
                            if custom_reward else None)
        data = prepare_data(settings.data_config(), env)
        if check_data is not None:
            check_data(settings, data)
        # only the main process owns the run folder (and takes its name now, so a second
        # start under that name is refused before either loads a model); the others
        # write into a scratch one
        new_run = None
        if ranks.is_main:
            # a damaged store or a database that does not answer is said now, not after
            # the model loads
            check_store_opens(root, settings.store)
            new_run = check_new_run(root, settings.run_name, overwrite=settings.overwrite)
            folder = new_run.folder
        else:
            folder = RunFolder(Path(tempfile.mkdtemp(prefix="posttrain-rank-")))
    except Exception as error:  # every rank learns that one of them cannot start
        failure = error
    distributed.agree(ranks, failure)
    timings["data_s"] = time.monotonic() - started

    mark = time.monotonic()
    try:
        policy, from_run_path = _load_base(settings, root)
        parameters = parameter_count(policy.model)
        learning_rate, learning_rate_source = settings.resolved_learning_rate(parameters)
        if new_run is not None:
            create_run_folder(new_run)
    except BaseException:
        if new_run is not None:  # the run never started: its name is free again
            new_run.abandon()
        raise
    timings["load_s"] = time.monotonic() - mark
    config = {
        "recipe": recipe,
        "settings": settings.to_config(),
        "resolved": {
            "learning_rate": learning_rate,
            "learning_rate_source": learning_rate_source,
            "base_parameters": parameters,
            "device": policy.device,
            "dtype": policy.dtype,
            "from_run": from_run_path,
            "world_size": ranks.world,
            "launcher": distributed.launcher(),
            **settings.resolved_defaults(parameters),
        },
        "data": {"source": data.source, "split": data.split, **data.counts()},
        "versions": _versions(),
    }
    folder.write_json("config.json", config)
    # one record of the run: the main process's (the others log nothing)
    run = (open_run(settings.run_name, config, run_dir=folder.path, runs_root=root,
                    store_url=settings.store)
           if ranks.is_main else NullRun())
    page = getattr(run, "url", None) or _local_run_page(root, settings.run_name)
    where = f"  dashboard: {page}" if page else ""
    say(f"posttrain {recipe}: run {settings.run_name} -> {folder.path}{where}")
    say(data.describe(tuple(env.categories)))
    say(
        f"base model: {settings.base_model}"
        + (f" + {settings.from_run} (merged)" if settings.from_run else "")
        + f" ({parameters / 1e6:.1f}M parameters, {policy.device} {policy.dtype}); "
        f"learning rate {learning_rate:g} ({learning_rate_source})"
    )

    context = RecipeContext(
        recipe, settings, env, data, folder, policy, learning_rate, run, reward, say=say,
        ranks=ranks,
    )
    summary: dict[str, Any] = {"recipe": recipe, "run_name": settings.run_name, "status": "failed"}
    outcome = TrainOutcome(policy=None)
    before = after = None
    try:
        mark = time.monotonic()
        before = evaluate_policy(
            context, policy, repeats=settings.eval_repeats, label="before: evaluating holdout"
        )
        context.before_rows = before.rows
        folder.write_rows("holdout_before.jsonl", before.rows)
        timings["before_eval_s"] = time.monotonic() - mark
        say(f"before  {before.describe()}")
        audit = audit_training_reward(context)
        summary["reward_audit"] = audit.to_dict()
        say(audit.format())
        for sentence in audit.described():
            run.note(f"reward audit: {sentence}")

        mark = time.monotonic()
        try:
            outcome = train(context)
        except KeyboardInterrupt as interrupt:
            outcome = TrainOutcome(policy=None, status="stopped",
                                   stop_reason=stop_reason(interrupt))
            say(f"interrupted ({outcome.stop_reason}): the run is marked stopped; what was "
                "measured is kept")
        timings["train_s"] = time.monotonic() - mark

        if outcome.policy is not None:
            mark = time.monotonic()
            after = evaluate_policy(context, outcome.policy, repeats=1, label="after: evaluating")
            folder.write_rows("holdout_after.jsonl", after.rows)
            timings["after_eval_s"] = time.monotonic() - mark
        summary["status"] = outcome.status
    except KeyboardInterrupt as interrupt:
        summary["status"] = "stopped"
        outcome.stop_reason = outcome.stop_reason or stop_reason(interrupt)
        say(f"interrupted ({outcome.stop_reason}): the run is marked stopped; what was "
            "measured is kept")
    except BaseException as error:
        summary["error"] = f"{type(error).__name__}: {error}"
        raise
    finally:
        timings["total_s"] = time.monotonic() - started
        summary = finish_summary(context, summary, before, after, outcome, timings)
        run.finish(summary, status=summary["status"])
        if new_run is not None:
            new_run.finish()
        elif not ranks.is_main:  # the scratch run folder of another process: not kept
            shutil.rmtree(folder.path, ignore_errors=True)
    return summary


def audit_training_reward(context: RecipeContext) -> RewardAudit:
    """The reward audit (``posttrain.score.audit``) of the training reward on the base
    policy's holdout rows, once, before training."""
    reward = context.reward
    return audit_reward(context.env, context.before_rows, reward.score_reply,
                        rule=context.env.score if reward.custom else None,
                        seed=context.settings.seed)


def _local_run_page(runs_root: Path, name: str) -> str | None:
    """The run's page on a ``posttrain ui`` serving this runs folder, if one is running."""
    url = local_dashboard_url(runs_root)
    return f"{url}runs/{name}" if url else None
