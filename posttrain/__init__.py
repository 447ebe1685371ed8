"""posttrain: turn one testable rule into a trained, measured agent.

The public API is re-exported here. Names are imported lazily so that
``import posttrain`` stays fast and never pulls in torch: the foundation
(environments, prompts, grading, statistics) works without any model.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "Env": "posttrain.envs.base",
    "get_env": "posttrain.envs",
    "simulate": "posttrain.envs.refund.prompts",
    "load_prompts": "posttrain.data.prompts",
    "save_prompts": "posttrain.data.prompts",
    "split_holdout": "posttrain.data.prompts",
    "split_holdout_stratified": "posttrain.data.prompts",
    "balance": "posttrain.data.prompts",
    "seeded_agent": "posttrain.envs.refund.agent",
    "grade": "posttrain.score.rows",
    "pass_at": "posttrain.score.passat",
    "delta": "posttrain.score.delta",
    "noise_band": "posttrain.score.delta",
    "hack_scan": "posttrain.score.hack_scan",
    "open_run": "posttrain.runs.store",
    "NullRun": "posttrain.runs.store",
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
