"""``import posttrain``: the library's public API, lazily, without one rule's helpers and
without torch for the parts that need no model."""

from __future__ import annotations

import subprocess
import sys

import posttrain


def test_every_exported_name_resolves_to_the_object_its_module_defines():
    import importlib

    for name in posttrain.__all__:
        module = importlib.import_module(posttrain._EXPORTS[name])
        assert getattr(posttrain, name) is getattr(module, name), name


def test_no_single_rule_helper_is_exported():
    # the refund rule's writer and agent are reached through its environment
    assert "simulate" not in posttrain.__all__ and "seeded_agent" not in posttrain.__all__
    assert not any(module.startswith("posttrain.envs.refund")
                   for module in posttrain._EXPORTS.values())


def test_the_model_free_api_loads_no_torch():
    code = ("import sys, posttrain\n"
            "for name in ('get_env', 'load_prompts', 'grade', 'delta', 'Rubric',\n"
            "             'build_preference_pairs', 'open_run'):\n"
            "    getattr(posttrain, name)\n"
            "print('torch' in sys.modules, 'transformers' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=120)
    assert result.stdout.split() == ["False", "False"]
