"""posttrain: turn one testable rule into a trained, measured agent.

The library's public API is re-exported here: the environment contract, the data step,
grading and statistics, the reward pipeline, preference pairs, the run store, the
recipes and their callbacks. Names are imported lazily so that ``import posttrain``
stays fast and never pulls in torch: the foundation (environments, prompts, grading,
statistics) works without any model; the recipes and callbacks need the train extra.
One rule's helpers are not here: reach them through its environment
(``get_env("refund").write_prompts``, ``.scripted_agent``).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    # environments and agents
    "Env": "posttrain.envs.base",
    "get_env": "posttrain.envs",
    "Agent": "posttrain.agents",
    "BatchAgent": "posttrain.agents",
    # prompts and the data step
    "load_prompts": "posttrain.data.prompts",
    "save_prompts": "posttrain.data.prompts",
    "split_holdout": "posttrain.data.prompts",
    "split_holdout_stratified": "posttrain.data.prompts",
    "balance": "posttrain.data.prompts",
    "DataConfig": "posttrain.data.prepare",
    "prepare_data": "posttrain.data.prepare",
    # grading, statistics, audits
    "grade": "posttrain.score.rows",
    "pass_at": "posttrain.score.passat",
    "delta": "posttrain.score.delta",
    "noise_band": "posttrain.score.delta",
    "hack_scan": "posttrain.score.hack_scan",
    "reward_audit": "posttrain.score.audit",
    # the reward pipeline
    "Rubric": "posttrain.score.rubric",
    "RewardTerm": "posttrain.score.rubric",
    "rule_rubric": "posttrain.score.rubric",
    "group_mean_advantages": "posttrain.score.rubric",
    # preference pairs
    "build_preference_pairs": "posttrain.train.pairs",
    "export_preference": "posttrain.train.pairs",
    "load_pairs": "posttrain.train.pairs",
    # models
    "load_policy": "posttrain.policy.loading",
    # runs
    "open_run": "posttrain.runs.store",
    "NullRun": "posttrain.runs.store",
    # the recipes (the train extra)
    "GRPOSettings": "posttrain.train.grpo",
    "DPOSettings": "posttrain.train.dpo",
    "SFTSettings": "posttrain.train.sft",
    "run_grpo": "posttrain.train.grpo_trainer",
    "run_dpo": "posttrain.train.dpo_trainer",
    "run_sft": "posttrain.train.sft_trainer",
    "TrainerCallback": "posttrain.train.callbacks",
    "HackMonitor": "posttrain.train.monitor",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'posttrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
