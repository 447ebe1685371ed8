"""`--sampler vllm` (evaluations on vLLM): refused here with what is missing, before any
model loads or anything is written; its mapping of our sampling settings and vLLM's stop
reasons onto the row contract; and the generation timing `benchmarks/gpu.sh` reports,
read from a real GRPO run on the tiny starter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.policy.sampler import SamplingParams
from posttrain.policy.vllm_sampler import request_settings, stop_reason, vllm_problem

ROOT = Path(__file__).parents[1]
needs_no_vllm = pytest.mark.skipif(vllm_problem() is None,
                                   reason="vLLM and a CUDA GPU are here: nothing to refuse")


@needs_no_vllm
def test_eval_refuses_the_vllm_sampler_with_what_is_missing(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    assert main(["eval", "--base-model", "starter-2m", "--sampler", "vllm",
                 "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert "--sampler vllm:" in error and "leave it out to sample with transformers" in error
    assert ("vllm package is not installed" in error) or ("no CUDA GPU" in error)
    assert not out.exists()


def test_the_scripted_agent_has_nothing_for_vllm_to_sample(capsys):
    assert main(["eval", "--sampler", "vllm"]) == 2
    assert "--sampler vllm samples a model: give --base-model" in capsys.readouterr().err


@needs_no_vllm
@pytest.mark.parametrize("recipe", ["grpo", "dpo", "sft"])
def test_every_recipe_refuses_the_vllm_sampler_before_writing(recipe, tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main([recipe, "--sampler", "vllm", "--runs-dir", str(runs)]) == 2
    assert "--sampler vllm:" in capsys.readouterr().err
    assert not runs.exists()


def test_vllm_cannot_evaluate_a_policy_merged_in_memory(tmp_path, capsys):
    assert main(["grpo", "--sampler", "vllm", "--from-run", "earlier",
                 "--runs-dir", str(tmp_path)]) == 2
    assert "--sampler vllm with --from-run" in capsys.readouterr().err


def test_the_starter_models_are_refused_even_where_vllm_runs(monkeypatch):
    """vLLM does not know the starter's architecture: say so rather than fail inside vLLM."""
    import posttrain.policy.vllm_sampler as vllm_sampler
    from posttrain.errors import PosttrainError

    monkeypatch.setattr(vllm_sampler, "vllm_problem", lambda: None)
    for name in (None, "starter", "starter-2m"):
        with pytest.raises(PosttrainError, match="cannot load posttrain's starter models"):
            vllm_sampler.check_vllm_sampler(name)
    vllm_sampler.check_vllm_sampler("Qwen/Qwen2.5-0.5B-Instruct")  # accepted


def test_help_explains_the_sampler_flag(capsys):
    for command in (["eval", "--help"], ["grpo", "--help"]):
        with pytest.raises(SystemExit):
            main(command)
        text = " ".join(capsys.readouterr().out.split())
        assert "--sampler {transformers,vllm}" in text and "CUDA GPU" in text


def test_our_sampling_settings_map_onto_one_vllm_request_each():
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=48)
    settings = request_settings(params, seed=1234)
    assert settings == {"n": 1, "temperature": 0.7, "top_p": 0.9, "top_k": -1,
                        "max_tokens": 48, "stop": ["</tool_call>"],
                        "include_stop_str_in_output": True, "seed": 1234, "logprobs": 0}
    assert request_settings(SamplingParams(top_k=5), seed=0)["top_k"] == 5


@pytest.mark.parametrize("finish, matched, expected", [
    ("length", None, "length"),
    ("stop", "</tool_call>", "tool_call"),
    ("stop", "###", "stop"),
    ("stop", None, "eos"),
    ("stop", 151645, "eos"),  # a stop token id: an end of turn
])
def test_vllm_stop_reasons_map_onto_the_row_contract(finish, matched, expected):
    assert stop_reason(finish, matched) == expected


@pytest.mark.slow
def test_a_grpo_run_logs_its_phases_and_the_gpu_table_reads_them(starter_2m_folder,
                                                                     tmp_path):
    runs = tmp_path / "runs"
    code = main(["grpo", "--base-model", "starter-2m", "--prompts", "60", "--steps", "2",
                 "--num-generations", "4", "--eval-samples", "1", "--eval-repeats", "1",
                 "--monitor-every", "0", "--run-name", "timed", "--runs-dir", str(runs)])
    assert code in (0, 1)
    steps = [json.loads(line)["metrics"] for line in (runs / "timed" / "metrics.jsonl").open()]
    timed = [m for m in steps if "step_time" in m]
    assert len(timed) == 2
    assert all(0 < m["generation_time"] < m["step_time"] for m in timed)
    # every phase of TRL's step is logged, and they add up to no more than the step
    for m in timed:
        phases = [m[name] for name in ("generation_time", "scoring_time", "reward_time",
                                       "loss_forward_time", "backward_time")]
        assert all(value >= 0 for value in phases) and m["optimizer_time"] > 0, m
        assert m["loss_forward_time"] > 0 and m["backward_time"] > 0, m
        assert sum(phases) <= m["step_time"] * 1.01, m
        assert m["peak_rss_gib"] > 0.1, m
    summary = json.loads((runs / "timed" / "summary.json").read_text())
    share = summary["generation_share"]
    assert 0 < share < 1
    shares = summary["step_phases"]
    assert set(shares) == {"generation", "scoring", "rewards", "loss forward", "backward",
                           "optimizer", "other"}
    assert abs(sum(shares.values()) - 1) < 0.01 and shares["generation"] > 0
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_summary.py"),
                           str(runs), "timed"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    row = done.stdout.splitlines()[2].split("|")
    assert row[1].strip() == "timed" and row[2].strip() == "2"
    assert row[4].strip() == f"{share:.0%}"
    assert float(row[5]) > 0  # tokens per second while generating


def test_gpu_sh_stops_clearly_without_a_gpu():
    import shutil

    if shutil.which("nvidia-smi"):
        pytest.skip("a GPU machine: gpu.sh would run for real")
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh")], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "no CUDA GPU here" in done.stderr
    assert not (ROOT / ".venv-gpu").exists()  # nothing set up for nothing
