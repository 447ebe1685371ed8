"""`posttrain sft`: demonstrations (file and reference agent), the no-leak rule, the recipe
end to end on starter-2m with TRL's SFTTrainer, and `--from-run` chaining into GRPO."""

from __future__ import annotations

import json

import pytest

from posttrain.cli import main
from posttrain.data.prepare import DataConfig, prepare_data
from posttrain.envs import get_env
from posttrain.errors import InputFileError, PosttrainError
from posttrain.train.training_data.demos import drop_holdout_leaks, load_demos, reference_demos
from tests.adam_step import ROUNDING, assert_same_first_step

FAST = ["--base-model", "starter-2m", "--prompts", "60", "--eval-samples", "1",
        "--eval-repeats", "2"]


def write_lines(path, *items):
    path.write_text("".join((item if isinstance(item, str) else json.dumps(item)) + "\n"
                            for item in items))
    return path


def test_a_conversation_gives_one_demonstration_per_assistant_turn(tmp_path):
    conversation = {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Refund ORD-1234 please."},
        {"role": "assistant", "content": '<tool_call>{"name": "lookup_order"}</tool_call>'},
        {"role": "tool", "content": "refundable"},
        {"role": "assistant", "content": "Done."},
    ], "scenario_id": 7}
    pair = {"prompt": [{"role": "user", "content": "Hi"}],
            "completion": [{"role": "assistant", "content": "Hello."}]}
    demos = load_demos(write_lines(tmp_path / "demos.jsonl", conversation, "", pair))
    assert [len(demo["prompt"]) for demo in demos] == [2, 4, 1]
    assert [demo["completion"][0]["content"] for demo in demos][1:] == ["Done.", "Hello."]
    assert demos[0]["scenario_id"] == "7" and demos[2]["scenario_id"] is None


@pytest.mark.parametrize(("item", "field", "problem"), [
    ({"messages": [{"role": "user", "content": "x"}]}, "messages", "no assistant turn"),
    ({"messages": [{"role": "assistant", "content": "x"}]}, "messages", "before any user"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages", "role 'robot'"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages", "string content"),
    ({"prompt": [{"role": "user", "content": "x"}], "completion": []}, "completion",
     "non-empty list"),
    ({"prompt": [{"role": "user", "content": "x"}],
      "completion": [{"role": "user", "content": "y"}]}, "completion", "one assistant"),
    ({"text": "hello"}, None, '{"messages": [...]}'),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
      "scenario_id": [1]}, "scenario_id", "string or an integer"),
])
def test_a_bad_demonstration_line_is_named(tmp_path, item, field, problem):
    good = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    path = write_lines(tmp_path / "demos.jsonl", good, item)
    with pytest.raises(InputFileError) as raised:
        load_demos(path)
    message = str(raised.value)
    assert f"{path}:2" in message and problem in message
    if field:
        assert field in message


def test_a_file_that_is_not_utf8_or_empty_is_refused(tmp_path):
    (tmp_path / "bad.jsonl").write_bytes(b'{"messages": "\xff"}\n')
    with pytest.raises(InputFileError, match=r"bad\.jsonl"):
        load_demos(tmp_path / "bad.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(InputFileError, match="no demonstrations"):
        load_demos(tmp_path / "empty.jsonl")


def test_reference_demonstrations_pass_the_rule_and_come_from_the_given_prompts_only():
    env = get_env("refund")
    data = prepare_data(DataConfig(prompts=60, seed=3), env)
    demos, report = reference_demos(env, data.train, 2, seed=0)
    assert demos and report.failed_rule == 0  # the reference agent makes the right move
    train_ids = {str(record["scenario_id"]) for record in data.train}
    assert {demo["scenario_id"] for demo in demos} <= train_ids
    for demo in demos:
        case = env.case_for(demo["prompt"][-1]["content"])
        assert env.score(demo["completion"][0]["content"], case) >= 1.0
    assert report.duplicates > 0  # the reference is deterministic: the second copy is dropped


def test_balance_reaches_the_demonstrations_but_distinct_records_of_one_text_do_not():
    """--balance repeats a minority category's records (the same objects): each copy's
    demonstrations count again, so the cold start and SFT train on the balanced mix; two
    distinct records of the same text still give their demonstration once."""
    from posttrain.data.prompts import balance

    env = get_env("refund")
    train = prepare_data(DataConfig(prompts=60, seed=3), env).train
    plain, _ = reference_demos(env, train, 2, seed=0)
    balanced_train = balance(train, 0.4)
    balanced, report = reference_demos(env, balanced_train, 2, seed=0)
    assert len(balanced_train) > len(train)

    def by_category(demos):
        counts = {}
        for demo in demos:
            category = env.category(env.case_for(demo["prompt"][-1]["content"]))
            counts[category] = counts.get(category, 0) + 1
        return counts

    def shares(records):
        counts = {}
        for record in records:
            counts[record["category"]] = counts.get(record["category"], 0) + 1
        return counts

    # one demonstration per record copy (the second sample of each is the same reply)
    assert by_category(balanced) == shares(balanced_train)
    assert by_category(plain) == shares(train)
    assert report.duplicates == len(balanced_train)
    twins = [dict(train[0]), dict(train[0])]  # two records, one text
    assert len(reference_demos(env, twins, 2, seed=0)[0]) == 1


def test_demonstrations_of_holdout_prompts_are_dropped():
    env = get_env("refund")
    data = prepare_data(DataConfig(prompts=60, seed=3), env)
    holdout_prompt = data.holdout[0]["prompt"]
    demos = [
        {"prompt": env.messages_for("  " + holdout_prompt.upper() + " "),  # same text
         "completion": [{"role": "assistant", "content": "x"}], "scenario_id": None},
        {"prompt": env.messages_for("something else entirely"),
         "completion": [{"role": "assistant", "content": "x"}],
         "scenario_id": str(data.holdout[1]["scenario_id"])},  # a holdout scenario
        {"prompt": env.messages_for(data.train[0]["prompt"]),
         "completion": [{"role": "assistant", "content": "x"}], "scenario_id": None},
    ]
    kept, dropped = drop_holdout_leaks(demos, data.holdout)
    assert dropped == 2 and kept == demos[2:]


def test_settings_are_checked_before_anything_is_written(tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["sft", "--demos", str(tmp_path / "nosuch.jsonl"), "--runs-dir", str(runs)]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["sft", "--env", "refund-multiturn", "--runs-dir", str(runs)]) == 2
    assert "plays episodes" in capsys.readouterr().err
    assert main(["sft", "--demos-per-prompt", "0", "--runs-dir", str(runs)]) == 2
    assert "--demos-per-prompt must be at least 1" in capsys.readouterr().err
    assert main(["sft", "--micro-batch", "3", "--runs-dir", str(runs)]) == 2
    assert "--micro-batch 3 must be at least 1 and divide the step's 8" in capsys.readouterr().err
    assert not runs.exists()


def test_micro_batches_in_the_sft_config():
    from posttrain.train.sft.settings import SFTSettings, sft_config_kwargs

    settings = SFTSettings(batch_size=8)
    assert settings.micro_batch_for(large_model=False) == 8
    assert settings.micro_batch_for(large_model=True) == 2
    assert settings.micro_batch_for(large_model=True, world_size=8) == 1
    assert SFTSettings(batch_size=8, micro_batch=4).micro_batch_for(large_model=False) == 4
    one_pass = sft_config_kwargs(settings, 1e-4, "/tmp/out", "cpu")
    assert (one_pass["per_device_train_batch_size"],
            one_pass["gradient_accumulation_steps"]) == (8, 1)
    passes = sft_config_kwargs(settings, 1e-4, "/tmp/out", "cpu", micro_batch=2)
    assert (passes["per_device_train_batch_size"], passes["gradient_accumulation_steps"]) == (2, 4)
    two = sft_config_kwargs(settings, 1e-4, "/tmp/out", "cpu", world_size=2, micro_batch=2)
    assert (two["per_device_train_batch_size"], two["gradient_accumulation_steps"]) == (2, 2)
    with pytest.raises(PosttrainError, match="must divide"):
        sft_config_kwargs(settings, 1e-4, "/tmp/out", "cpu", micro_batch=3)


@pytest.mark.slow
def test_sft_micro_batches_take_the_same_step_as_one_pass(starter_2m_folder, tmp_path):
    """One SFT step of 8 demonstrations in one pass and in passes of 2: the same loss and
    adapter up to float rounding (each pass's loss is divided by the whole step's reply
    tokens, so the passes' gradients add up to the one pass's)."""
    from safetensors.torch import load_file

    runs = tmp_path / "runs"
    losses, adapters = {}, {}
    for micro in ("8", "2"):
        name = f"micro-{micro}"
        code = main(["sft", "--base-model", "starter-2m", "--prompts", "60", "--steps", "1",
                     "--batch-size", "8", "--micro-batch", micro, "--eval-samples", "1",
                     "--eval-repeats", "1", "--run-name", name, "--runs-dir", str(runs)])
        assert code in (0, 1)
        steps = [json.loads(line)["metrics"] for line in (runs / name / "metrics.jsonl").open()]
        losses[micro] = [(m["loss"], m["grad_norm"]) for m in steps if "grad_norm" in m]
        adapters[micro] = load_file(str(runs / name / "adapter" / "adapter_model.safetensors"))
    assert len(losses["8"]) == len(losses["2"]) == 1
    # loss and gradient norm: float32 sums in another order (ROUNDING, tests/adam_step.py)
    assert losses["2"][0] == pytest.approx(losses["8"][0], rel=ROUNDING)
    # up to what one AdamW step on float32-rounded gradients can differ by (any CPU; a
    # flat 1e-5 failed on an Intel Xeon with AMX), and the step did train (B moved)
    assert_same_first_step(adapters["8"], adapters["2"])


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def sft_run(starter_2m_folder, runs_root):
    code = main(["sft", *FAST, "--steps", "4", "--batch-size", "4", "--runs-dir",
                 str(runs_root), "--run-name", "cold"])
    summary = json.loads((runs_root / "cold" / "summary.json").read_text())
    assert code == (0 if summary["ok"] else 1)
    return runs_root / "cold"


@pytest.mark.slow
def test_sft_end_to_end_writes_a_run_with_a_verdict_and_an_adapter(sft_run):
    summary = json.loads((sft_run / "summary.json").read_text())
    assert summary["recipe"] == "sft" and summary["status"] == "done"
    assert summary["verdict"] == summary["delta"]["verdict"]
    assert (sft_run / "adapter" / "adapter_model.safetensors").is_file()
    report = summary["demo_report"]
    assert report["kept"] > 0 and report["holdout_leaks"] == 0
    assert "## Demonstrations" in (sft_run / "report.md").read_text()
    steps = [json.loads(line)["step"] for line in (sft_run / "metrics.jsonl").open()]
    assert max(steps) == 4


@pytest.mark.slow
def test_no_holdout_scenario_or_prompt_reaches_the_demonstrations(sft_run):
    holdout = [json.loads(line) for line in (sft_run / "holdout_before.jsonl").open()]
    demos = [json.loads(line) for line in (sft_run / "demos.jsonl").open()]
    holdout_ids = {row["scenario_id"] for row in holdout}
    holdout_prompts = {row["prompt"].strip().lower() for row in holdout}
    assert demos
    for demo in demos:
        assert demo["scenario_id"] not in holdout_ids
        users = [m["content"].strip().lower() for m in demo["prompt"] if m["role"] == "user"]
        assert not set(users) & holdout_prompts


@pytest.mark.slow
def test_grpo_from_an_sft_run_starts_from_its_adapter_on_its_base_model(sft_run, runs_root):
    code = main(["grpo", "--from-run", "cold", "--prompts", "60", "--eval-samples", "1",
                 "--eval-repeats", "1", "--monitor-every", "0", "--num-generations", "4",
                 "--steps", "2", "--runs-dir", str(runs_root), "--run-name", "after-cold"])
    assert code in (0, 1)
    config = json.loads((runs_root / "after-cold" / "config.json").read_text())
    # --base-model was left out: it followed the SFT run (starter-2m, not the env's starter)
    assert config["settings"]["base_model"] == "starter-2m"
    assert config["resolved"]["from_run"] == str(sft_run)
    summary = json.loads((runs_root / "after-cold" / "summary.json").read_text())
    assert summary["status"] == "done" and summary["signal"]["steps"] == 2
    # the base of this run is the SFT policy: its before-rows are the SFT run's after-rows
    sft_after = json.loads((sft_run / "summary.json").read_text())["after"]["pass_at_1"]
    assert summary["before"]["pass_at_1"] == pytest.approx(sft_after, abs=0.25)


def test_from_run_refuses_a_base_model_its_adapter_does_not_fit(tmp_path):
    folder = tmp_path / "runs" / "cold"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"settings": {"base_model": "starter-2m"}}))
    (folder / "adapter").mkdir()
    from posttrain.runs.folder import from_run_base_model

    assert from_run_base_model(tmp_path / "runs", "cold", None) == "starter-2m"
    with pytest.raises(PosttrainError, match="does not fit --base-model 'starter'"):
        from_run_base_model(tmp_path / "runs", "cold", "starter")


@pytest.mark.slow
def test_the_adapter_folder_is_complete_for_serving(sft_run):
    from peft import PeftConfig
    from transformers import AutoTokenizer

    adapter = sft_run / "adapter"
    card = (adapter / "README.md").read_text()
    summary = json.loads((sft_run / "summary.json").read_text())
    assert f"Verdict: **{summary['verdict']}**" in card and "library_name: peft" in card
    assert "posttrain model info starter-2m" in card  # a local base model says where it is
    tokenizer = AutoTokenizer.from_pretrained(str(adapter))  # the tokenizer travels along
    assert tokenizer("Refund ORD-1234").input_ids
    assert PeftConfig.from_pretrained(str(adapter)).r == 16
