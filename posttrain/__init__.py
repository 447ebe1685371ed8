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

from posttrain.lazy_exports import lazy_face

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
    "build_preference_pairs": "posttrain.train.training_data.pairs",
    "export_preference": "posttrain.train.training_data.pairs",
    "load_pairs": "posttrain.train.training_data.pairs",
    # models
    "load_policy": "posttrain.policy.loading",
    # runs
    "open_run": "posttrain.runs.store",
    "NullRun": "posttrain.runs.store",
    # the recipes (the train extra)
    "GRPOSettings": "posttrain.train.grpo.settings",
    "DPOSettings": "posttrain.train.dpo.settings",
    "SFTSettings": "posttrain.train.sft.settings",
    "run_grpo": "posttrain.train.grpo.run",
    "run_dpo": "posttrain.train.dpo.run",
    "run_sft": "posttrain.train.sft.run",
    "TrainerCallback": "posttrain.train.callbacks",
    "HackMonitor": "posttrain.train.grpo.monitor",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
