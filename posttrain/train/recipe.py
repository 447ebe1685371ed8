"""A training recipe as five named phases, each one call a recipe makes in order.

Every recipe's ``run_<name>`` reads the same way (``run_grpo`` in ``train/grpo/run.py``)::

    prepared = prepare("grpo", settings, say=say)        # 1. prepare
    context = load(prepared)                             # 2. load
    with finishing(context) as measured:                 # 5. finish, however the block ends
        measured.before = baseline(context)              # 3. baseline
        with timed(context, "train_s"):
            measured.outcome = train_grpo(context, settings)  # 4. train: the recipe's own step
        measured.after = evaluate_trained(context, measured.outcome)
    return measured.summary

1. **prepare**: check the settings (the shared flags, then the recipe's own:
   ``settings.check()``), the environment, the prompts and the holdout (same seed, same
   split), the settings against the data (``settings.check_data``), the run store, and
   take the run's name. Nothing is written before every input has been checked; under
   torchrun every process learns when one of them cannot start.
2. **load**: the base policy (``--from-run``'s adapter merged in), the learning rate for
   its size, the run folder, ``config.json`` and the run in the store.
3. **baseline**: the base policy on the holdout, ``eval_repeats`` times (the noise band),
   and the audit of the training reward on those rows (``posttrain.score.audit``). GRPO
   takes the first evaluation alone, decides whether a cold start runs, and takes the
   other repeats only when none does (a cold-started policy is RL's baseline then).
4. **train**: the recipe's own step (``train_grpo``, ``train_dpo``, ``train_sft``), called
   directly by the recipe with its typed settings (the same object as ``context.settings``,
   handed over so the step's signature says what it reads), with progress and monitoring.
5. **finish**: the trained policy on the same holdout prompts with the same seeds
   (``evaluate_trained``), then, on the way out of ``finishing`` whatever happened, the
   paired delta, guard and category table, ``summary.json``, ``report.md``, ``curves.png``,
   and the run marked done, stopped or failed.

Ctrl-C or SIGTERM in phases 3-5 marks the run ``stopped`` and keeps what was measured.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic

from posttrain.cpu_numerics import describe_process_numerics
from posttrain.data.prepare import PreparedData, prepare_data
from posttrain.envs import get_env
from posttrain.envs.base import Env, check_default_base_model, env_name, own_starter_model
from posttrain.errors import PosttrainError
from posttrain.interrupts import handled
from posttrain.policy.loading import load_policy
from posttrain.policy.models import Policy, load_adapter, merge_adapter, parameter_count
from posttrain.runs.dashboard_link import local_dashboard_url
from posttrain.runs.folder import (
    NewRun,
    RunFolder,
    check_new_run,
    create_run_folder,
    find_run,
    from_run_base_model,
    runs_root,
)
from posttrain.runs.store import NullRun, check_store_opens, open_run
from posttrain.score.audit import RewardAudit, audit_reward
from posttrain.score.delta import RUN_GUARDS
from posttrain.score.guards import choose_guards
from posttrain.train import distributed
from posttrain.train.context import RecipeContext, SettingsT, TrainOutcome
from posttrain.train.distributed import Ranks
from posttrain.train.measure import PolicyEvaluation, evaluate_policy
from posttrain.train.rewards import RuleReward, load_reward_function
from posttrain.train.settings import RecipeSettings, check_before_loading
from posttrain.train.summary import finish_run

#: the base model of a recipe whose environment names no starter of its own
DEFAULT_STARTER = "starter"


@dataclass
class PreparedRun(Generic[SettingsT]):
    """What ``prepare`` checked and built before any model loads."""

    recipe: str
    settings: SettingsT
    env: Env
    data: PreparedData
    reward: RuleReward  # the training reward (the environment's rule unless --reward)
    root: Path  # the runs folder
    folder: RunFolder  # the run's folder (another process's scratch one under torchrun)
    new_run: NewRun | None  # the main process's claim on the run's name, else None
    ranks: Ranks
    say: Callable[[str], None]
    started: float  # time.monotonic() when the run started
    timings: dict[str, float]  # seconds per phase so far (data_s)


@dataclass
class Measured:
    """What phases 3-5 measured; ``finishing`` completes ``summary`` from it."""

    before: PolicyEvaluation | None = None
    # a GRPO run's supervised cold start, evaluated (RL's baseline then), else None
    cold_start: PolicyEvaluation | None = None
    outcome: TrainOutcome = field(default_factory=lambda: TrainOutcome(policy=None))
    after: PolicyEvaluation | None = None
    notes: dict[str, Any] = field(default_factory=dict)  # more summary entries
    summary: dict[str, Any] = field(default_factory=dict)


# -- 1. prepare --------------------------------------------------------------------------


def prepare(recipe: str, settings: SettingsT, *,
            say: Callable[[str], None] = print) -> PreparedRun[SettingsT]:
    """Phase 1 (see module docstring): every input checked, the data built and the run's
    name taken, before any model loads. Raises ``PosttrainError`` naming what is wrong."""
    started = time.monotonic()
    ranks = distributed.current_ranks()
    distributed.start(ranks)
    if not ranks.is_main:
        say = _silent  # one console: the main process's
    failure: BaseException | None = None
    try:
        check_before_loading(settings, ranks.world)
        # the environment, then what it decides: the run's default name and base model
        env = get_env(settings.env)
        settings.name_run_for(env_name(env))
        env_starter = own_starter_model(env)
        settings.check_env(env)
        custom_reward = settings.training_reward()
        reward = RuleReward(env, load_reward_function(custom_reward, env)
                            if custom_reward else None)
        data = prepare_data(settings.data_config(), env)
        settings.check_data(data)
        # then the runs folder: the run it starts from, the store, the run's own name
        root = runs_root(settings.runs_dir)
        if settings.from_run:
            # an adapter only fits the model it was trained on: default to that one
            settings.base_model = from_run_base_model(root, settings.from_run,
                                                      settings.base_model)
        if settings.base_model is None:  # the environment's own starter, else the starter
            check_default_base_model(env)
            settings.base_model = env_starter or DEFAULT_STARTER
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
    return PreparedRun(recipe, settings, env, data, reward, root, folder, new_run, ranks,
                       say, started, timings={"data_s": time.monotonic() - started})


# -- 2. load -----------------------------------------------------------------------------


def load(prepared: PreparedRun[SettingsT]) -> RecipeContext[SettingsT]:
    """Phase 2: the base policy, the learning rate for its size, the run folder,
    ``config.json`` and the run in the store; says where the run is and what it trains.
    A failure before the folder exists frees the run's name again."""
    settings, new_run, say = prepared.settings, prepared.new_run, prepared.say
    timings = prepared.timings
    mark = time.monotonic()
    try:
        policy, from_run_path = load_base_policy(settings, prepared.root)
        parameters = parameter_count(policy.model)
        learning_rate, learning_rate_source = settings.resolved_learning_rate(parameters)
        if new_run is not None:
            create_run_folder(new_run)
    except BaseException:
        if new_run is not None:  # the run never started: its name is free again
            new_run.abandon()
        raise
    timings["load_s"] = time.monotonic() - mark
    ranks, data = prepared.ranks, prepared.data
    config = {
        "recipe": prepared.recipe,
        # one id in config.json and in the store's record: the proof that the record was
        # written by the run that made the folder (what deleting the folder asks for)
        "run_id": uuid.uuid4().hex,
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
            "numerics": process_numerics(),
            **settings.resolved_defaults(parameters),
        },
        "data": {"source": data.source, "split": data.split, **data.counts()},
        "versions": _versions(),
    }
    folder = prepared.folder
    # one record of the run: the main process's (the others log nothing)
    replacing = new_run is not None and new_run.aside is not None  # --overwrite
    try:
        run = (open_run(settings.run_name, config, run_dir=folder.path,
                        runs_root=prepared.root, store_url=settings.store,
                        keep_replaced=replacing,
                        replaced_folder=new_run.aside if new_run is not None else None)
               if ranks.is_main else NullRun())
    except BaseException:
        # the store refused the run (a run server that says no): nothing of it is left,
        # and a run it was to replace is put back
        if new_run is not None:
            if replacing:
                new_run.finish(succeeded=False)
            else:
                new_run.abandon()
        raise
    folder.write_json("config.json", config)
    page = getattr(run, "url", None) or _local_run_page(prepared.root, settings.run_name)
    where = f"  dashboard: {page}" if page else ""
    say(f"posttrain {prepared.recipe}: run {settings.run_name} -> {folder.path}{where}")
    say(data.describe(tuple(prepared.env.categories)))
    say(
        f"base model: {settings.base_model}"
        + (f" + {settings.from_run} (merged)" if settings.from_run else "")
        + f" ({parameters / 1e6:.1f}M parameters, {policy.device} {policy.dtype}); "
        f"learning rate {learning_rate:g} ({learning_rate_source})"
    )
    context = RecipeContext(
        prepared.recipe, settings, prepared.env, data, folder, policy, learning_rate, run,
        prepared.reward, say=say, ranks=ranks, timings=timings, started=prepared.started,
        claim=new_run,
    )
    return context


def record_in_config(context: RecipeContext[Any], **entries: Any) -> None:
    """Add what the run decided after it loaded (its plan, ``posttrain.train.plan``) to
    its ``config.json``, one entry a keyword, in one write."""
    import json

    path = context.folder.file("config.json")
    config = json.loads(path.read_text())
    config.update(entries)
    context.folder.write_json("config.json", config)


def load_base_policy(settings: RecipeSettings, root: Path) -> tuple[Policy, str | None]:
    """The policy a run starts from and the ``--from-run`` folder it came from (or None):
    ``--base-model`` loaded (the environment's ``starter`` when that is the name), with
    ``--from-run``'s adapter merged in."""
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
        assert settings.base_model is not None, "prepare names the base model first"
        # ``starter`` is the environment's own when it has no hand-written one
        policy = load_policy(settings.base_model, env=settings.env,
                             prompts_file=settings.prompts_file)
    if from_folder is not None:
        policy = merge_adapter(load_adapter(policy, from_folder.adapter))
    return policy, str(from_folder.path) if from_folder else None


# -- 3. baseline -------------------------------------------------------------------------


def baseline(context: RecipeContext[Any]) -> PolicyEvaluation:
    """Phase 3: the base policy on the holdout ``eval_repeats`` times, then settled
    (``settle_baseline``)."""
    return settle_baseline(context, evaluate_base(context, context.settings.eval_repeats))


def evaluate_base(context: RecipeContext[Any], repeats: int, *,
                  first_repeat: int = 0) -> PolicyEvaluation:
    """The base policy's evaluations ``first_repeat`` .. ``first_repeat + repeats - 1``
    of the holdout (a recipe may take its repeats in two parts: GRPO reads the first
    before it decides whether a cold start makes the base's noise band moot), timed into
    ``before_eval_s``."""
    mark = time.monotonic()
    before = evaluate_policy(context, context.policy, repeats=repeats,
                             first_repeat=first_repeat, label="before: evaluating holdout")
    context.timings["before_eval_s"] = (context.timings.get("before_eval_s", 0.0)
                                        + time.monotonic() - mark)
    return before


def evaluate_base_to(context: RecipeContext[Any], first: PolicyEvaluation,
                     evaluations: int) -> PolicyEvaluation:
    """The base's ``first`` evaluation followed by its later repeats, ``evaluations`` in
    all (GRPO reads the first alone for its plan, which says how many the run takes)."""
    if evaluations <= 1:
        return first
    return first.joined(evaluate_base(context, evaluations - 1, first_repeat=1))


def settle_baseline(context: RecipeContext[Any], before: PolicyEvaluation) -> PolicyEvaluation:
    """The base policy's rows kept (``holdout_before.jsonl`` and ``context.before_rows``)
    and said, then the training reward's audit on those rows, said and noted in the run.
    The guards those rows allow are the plan's to say (``posttrain.train.plan``)."""
    context.before_rows = before.rows
    context.folder.write_rows("holdout_before.jsonl", before.rows)
    context.say(f"before  {before.describe()}")
    audit = context.audit = audit_training_reward(context)
    context.say(audit.format())
    for sentence in audit.described():
        context.run.note(f"reward audit: {sentence}")
    return before


def say_guards(context: RecipeContext[Any], rows: list[dict[str, Any]]) -> None:
    """Say, before training, when a default guard cannot fail against these baseline rows
    and what the verdict guards instead (``posttrain.score.guards``: the verdict makes
    the same choice from the same rows)."""
    for note in choose_guards(rows, RUN_GUARDS).notes:
        context.say(note)
        context.run.note(note)


def audit_training_reward(context: RecipeContext[Any]) -> RewardAudit:
    """The reward audit (``posttrain.score.audit``) of the training reward on the base
    policy's holdout rows, once, before training."""
    reward = context.reward
    return audit_reward(context.env, context.before_rows, reward.score_reply,
                        rule=context.env.score if reward.custom else None,
                        seed=context.settings.seed)


# -- 4. train: the recipe's own step, timed ----------------------------------------------


@contextmanager
def timed(context: RecipeContext[Any], phase: str) -> Iterator[None]:
    """Seconds spent in the block, as ``context.timings[phase]`` (also when it raises)."""
    mark = time.monotonic()
    try:
        yield
    finally:
        context.timings[phase] = time.monotonic() - mark


# -- 5. finish ---------------------------------------------------------------------------


def evaluate_trained(context: RecipeContext[Any],
                     outcome: TrainOutcome) -> PolicyEvaluation | None:
    """The trained policy on the same holdout prompts with the same seeds (its rows in
    ``holdout_after.jsonl``); None when nothing was trained."""
    if outcome.policy is None:
        return None
    with timed(context, "after_eval_s"):
        after = evaluate_policy(context, outcome.policy, repeats=1, label="after: evaluating")
        context.folder.write_rows("holdout_after.jsonl", after.rows)
    return after


@contextmanager
def finishing(context: RecipeContext[Any]) -> Iterator[Measured]:
    """Phase 5, however the block ends: the summary from what was measured (delta, guard,
    categories), the report files, the run finished in the store and its name let go.
    Ctrl-C or SIGTERM in the block marks the run ``stopped`` and keeps what was measured;
    any other error marks it ``failed`` and is raised again."""
    measured = Measured()
    status, error = "failed", None
    try:
        yield measured
        status = measured.outcome.status
    except KeyboardInterrupt as interrupt:
        outcome = measured.outcome
        status = outcome.status = "stopped"
        reason = handled(interrupt)  # a checkpoint raises it no more
        outcome.stop_reason = outcome.stop_reason or reason
        context.say(f"interrupted ({outcome.stop_reason}): the run is marked stopped; what "
                    "was measured is kept")
    except BaseException as failure:
        error = f"{type(failure).__name__}: {failure}"
        raise
    finally:
        summary: dict[str, Any] = {"recipe": context.recipe,
                                   "run_name": context.settings.run_name, "status": status,
                                   **measured.notes}
        if context.audit is not None:
            summary["reward_audit"] = context.audit.to_dict()
        if error is not None:
            summary["error"] = error
        context.timings["total_s"] = time.monotonic() - context.started
        measured.summary = finish_run(context, summary, measured.before, measured.after,
                                      measured.outcome, context.timings,
                                      cold_start=measured.cold_start)
        status = measured.summary["status"]
        context.run.finish(measured.summary, status=status)
        if context.claim is not None and context.claim.finish(succeeded=status == "done"):
            context.say(f"the run ended {status}: run {context.settings.run_name!r} is back as "
                        "it was before --overwrite (its folder"
                        + (" and its record" if getattr(context.run, "restored", False) else "")
                        + ")")
        elif not context.ranks.is_main:  # another process's scratch run folder: not kept
            shutil.rmtree(context.folder.path, ignore_errors=True)


def process_numerics() -> dict[str, Any]:
    """What decides this process's bits (``posttrain.cpu_numerics``): the variables as
    set, the kernels torch chose and its thread count."""
    import torch

    return {**describe_process_numerics(), "cpu_capability":
            torch.backends.cpu.get_cpu_capability(), "torch_threads": torch.get_num_threads()}


def _versions() -> dict[str, str]:
    import importlib.metadata as metadata

    versions = {"python": sys.version.split()[0]}
    for package in ("posttrain", "torch", "transformers", "trl", "peft", "datasets"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def _silent(line: str) -> None:
    """The console of a process that is not the main one."""


def _local_run_page(runs_root: Path, name: str) -> str | None:
    """The run's page on a ``posttrain ui`` serving this runs folder, if one is running."""
    url = local_dashboard_url(runs_root)
    return f"{url}runs/{name}" if url else None
