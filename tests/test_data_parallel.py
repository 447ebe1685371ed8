"""Data parallel for real: `torchrun --nproc_per_node 2 -m posttrain grpo|dpo` on this CPU
(gloo), checked for world size 2, one run folder, one metric row per step and the holdout
rows of every prompt gathered once, in the order one process would write them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

COMMON = ["--base-model", "starter-2m", "--prompts", "60", "--eval-samples", "2",
          "--eval-repeats", "1"]


def launch_environment(scratch: Path) -> dict[str, str]:
    """This process's environment without what would send the run elsewhere or fake a rank;
    the launchers' temporary files (torchrun's log folders, which it leaves behind) go
    under ``scratch``, the test's own folder, not the machine's /tmp."""
    scratch.mkdir(parents=True, exist_ok=True)
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("POSTTRAIN_SERVER", "POSTTRAIN_TOKEN", "WORLD_SIZE", "RANK")}
    return {**environment, "TMPDIR": str(scratch)}


def torchrun(args: list[str], runs, timeout: int = 900,
             extra_environment: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environment = {**launch_environment(runs.parent / "tmp"), **(extra_environment or {})}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", "-m", "posttrain", *args, "--runs-dir", str(runs)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env=environment)


def read_rows(path):
    return [json.loads(line) for line in path.open()]


def check_one_run(runs, name: str, steps: int) -> dict:
    assert [path.name for path in runs.iterdir() if path.is_dir()] == [name]  # one folder
    config = json.loads((runs / name / "config.json").read_text())
    summary = json.loads((runs / name / "summary.json").read_text())
    assert config["resolved"]["world_size"] == 2 and config["resolved"]["launcher"] == "torchrun"
    assert summary["world_size"] == 2 and summary["status"] == "done"
    # TRL itself trained on 2 processes (not two copies of a one-process run)
    assert summary["trainer_world_size"] == 2
    assert summary["trainer_distributed_type"] == "MULTI_CPU"  # DDP over gloo
    logged = [json.loads(line)["step"] for line in (runs / name / "metrics.jsonl").open()
              if "loss" in json.loads(line)["metrics"]]
    assert logged == list(range(1, steps + 1))  # each step once, from the main process
    return summary


def test_grpo_on_two_processes_writes_one_run_with_every_holdout_row_once(
        starter_2m_folder, tmp_path):
    runs = tmp_path / "runs"
    done = torchrun(["grpo", *COMMON, "--steps", "2", "--num-generations", "4",
                     "--monitor-every", "1", "--run-name", "ddp"], runs)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    assert done.stdout.count("posttrain grpo: run ddp") == 1  # one console
    summary = check_one_run(runs, "ddp", 2)
    assert summary["monitor"]["checks"]  # the monitor ran on the main process
    # the same holdout, prompt by prompt and sample by sample, as one process writes it
    from posttrain.data.prepare import DataConfig, prepare_data
    from posttrain.envs import get_env

    holdout = prepare_data(DataConfig(prompts=60, seed=0), get_env("refund")).holdout
    rows = read_rows(runs / "ddp" / "holdout_before.jsonl")
    assert [(row["prompt"], row["sample"]) for row in rows] == [
        (record["prompt"], sample) for record in holdout for sample in range(2)]
    assert len(read_rows(runs / "ddp" / "holdout_after.jsonl")) == 2 * len(holdout)


@pytest.fixture(scope="module")
def dpo_on_two_processes(starter_2m_folder, tmp_path_factory, request):
    """One DPO run on two processes (2 steps), read by the two tests below: one checks the
    run and its pairs, the other the store the ``POSTTRAIN_STORE`` URL names (a database on
    the suite's PostgreSQL server; without one, the run goes to the runs folder's SQLite
    file and that test is skipped). Returns (runs folder, store URL or None, the launch)."""
    try:
        store_url = request.getfixturevalue("postgres_server").new_database()
    except pytest.skip.Exception:
        store_url = None
    runs = tmp_path_factory.mktemp("dpo-ddp") / "runs"
    done = torchrun(["dpo", *COMMON, "--steps", "2", "--batch-size", "4", "--pair-samples",
                     "4", "--run-name", "ddp-dpo"], runs,
                    # every process reads it
                    extra_environment={"POSTTRAIN_STORE": store_url} if store_url else None)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return runs, store_url, done


def test_dpo_on_two_processes_trains_and_reports_like_one(dpo_on_two_processes):
    runs, _, done = dpo_on_two_processes
    assert "split over 2 processes" in done.stdout
    summary = check_one_run(runs, "ddp-dpo", 2)
    assert (runs / "ddp-dpo" / "adapter" / "adapter_model.safetensors").is_file()
    # the pair sampling was split by prompt and merged: one process samples the same
    # prompts with the same per-sample seeds, so it builds the same pairs (a token may
    # flip where batch shapes change the last float bits, hence "nearly all")
    from types import SimpleNamespace

    from posttrain.data.prepare import DataConfig, prepare_data
    from posttrain.envs import get_env
    from posttrain.policy.loading import load_policy
    from posttrain.train.dpo.settings import DPOSettings
    from posttrain.train.dpo.trainer import policy_agent, sample_pairs
    from posttrain.train.training_data.pairs import load_pairs

    env = get_env("refund")
    settings = DPOSettings(base_model="starter-2m", prompts=60, pair_samples=4, batch_size=4)
    context = SimpleNamespace(settings=settings, env=env, say=lambda line: None,
                              data=prepare_data(DataConfig(prompts=60, seed=0), env),
                              policy=load_policy("starter-2m"))
    alone, alone_report = sample_pairs(context, policy_agent(context))
    report = summary["pair_report"]
    assert report["prompts_seen"] == alone_report.prompts_seen  # every prompt, once
    key = lambda pair: json.dumps([pair["prompt"], pair["chosen"], pair["rejected"]],  # noqa: E731
                                  sort_keys=True)
    merged = {key(pair) for pair in load_pairs(runs / "ddp-dpo" / "pairs.jsonl")[0]}
    assert len(merged & {key(pair) for pair in alone}) >= 0.9 * len(alone)


def test_two_processes_write_one_run_into_the_store_the_url_names(dpo_on_two_processes):
    # every process reads POSTTRAIN_STORE; only the main one writes the run, into the
    # database, and no SQLite file appears in the runs folder
    runs, store_url, _ = dpo_on_two_processes
    if store_url is None:
        pytest.skip("no PostgreSQL server for the store's URL (see tests/postgres_server.py)")
    assert not (runs / "posttrain.db").exists()
    from posttrain.runs.postgres_store import PostgresRunStore

    with PostgresRunStore(store_url) as store:
        (run,) = store.list_runs()
        assert run["name"] == "ddp-dpo" and run["status"] == "done"
        record = store.get_run("ddp-dpo")
        assert record["config"]["resolved"]["world_size"] == 2
        assert store.metric_series("ddp-dpo", "loss")["steps"] == [1, 2]


def test_accelerate_launch_runs_sft_on_two_processes(starter_2m_folder, tmp_path):
    """`accelerate launch --multi_gpu` is the accelerate form that starts 2 processes on a
    CPU (with `--cpu` it starts one); the world size is checked, not assumed."""
    runs = tmp_path / "runs"
    environment = launch_environment(tmp_path / "tmp")
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
               "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
               "--dynamo_backend", "no", "--main_process_port", "0",
               "-m", "posttrain", "sft", *COMMON, "--steps", "2", "--batch-size", "4",
               "--run-name", "acc-sft", "--runs-dir", str(runs)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=environment)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    config = json.loads((runs / "acc-sft" / "config.json").read_text())
    assert config["resolved"]["launcher"] == "accelerate"
    summary = json.loads((runs / "acc-sft" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["trainer_world_size"] == 2
    assert summary["trainer_distributed_type"] == "MULTI_CPU"
    assert [path.name for path in runs.iterdir() if path.is_dir()] == ["acc-sft"]
    logged = [json.loads(line)["step"] for line in (runs / "acc-sft" / "metrics.jsonl").open()
              if "loss" in json.loads(line)["metrics"]]
    assert logged == [1, 2]


def test_a_batch_that_does_not_split_across_the_processes_is_refused(starter_2m_folder,
                                                                     tmp_path):
    runs = tmp_path / "runs"
    done = torchrun(["dpo", *COMMON, "--batch-size", "3", "--run-name", "odd"], runs,
                    timeout=300)
    assert done.returncode != 0
    assert "does not split across 2 processes" in done.stderr
    assert not runs.exists() or not any(runs.iterdir())


def test_an_fsdp_config_on_a_cpu_trains_data_parallel_and_says_so(starter_2m_folder, tmp_path):
    """The shipped FSDP example launches here, but accelerate trains plain data parallel on
    CPUs; the run must say that rather than let a reader believe the model was sharded."""
    runs = tmp_path / "runs"
    config = Path(__file__).parents[1] / "examples" / "accelerate" / "fsdp.yaml"
    environment = launch_environment(tmp_path / "tmp")
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
               "--mixed_precision", "no", "--main_process_port", "0",
               "-m", "posttrain", "sft", *COMMON, "--steps", "1", "--batch-size", "4",
               "--run-name", "fsdp", "--runs-dir", str(runs)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=environment)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    summary = json.loads((runs / "fsdp" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["trainer_distributed_type"] == "MULTI_CPU"
    assert "asked for FSDP but the trainer ran MULTI_CPU" in summary["launch_warning"]
    assert "! the accelerate config asked for FSDP" in done.stdout
