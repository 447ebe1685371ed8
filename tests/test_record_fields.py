"""Ground truth from the data: an environment that reads prompt-file columns, and prompts
in TRL's conversational form."""

import json
from dataclasses import dataclass, field

import pytest

from posttrain.data.prompts import load_prompts, save_prompts
from posttrain.errors import InputFileError
from posttrain.score.rows import grade
from posttrain.train.rewards import RuleReward


@dataclass(frozen=True)
class SumsEnv:
    """The answer is a column (``answer``), not something the text spells out."""

    name: str = "sums"
    categories: tuple = ("small", "large")
    tools: list = field(default_factory=list)
    system: str = "Answer with the number only."
    record_fields: dict = field(default_factory=lambda: {"answer": "number"})

    def messages_for(self, prompt):
        return [{"role": "system", "content": self.system}, {"role": "user", "content": prompt}]

    def case_for(self, prompt):
        return {"answer": None}

    def case_from_record(self, prompt, fields):
        return {"answer": fields["answer"]}

    def category(self, case):
        return "large" if (case["answer"] or 0) >= 100 else "small"

    def score(self, reply, case):
        return 1.0 if reply.strip() == str(case["answer"]) else 0.0

    def markers(self, reply, case):
        return {"well_formed": 1.0}


SUMS = SumsEnv()


def write(path, *objects):
    path.write_text("".join(json.dumps(o) + "\n" for o in objects))
    return path


def test_columns_become_the_case_and_the_category(tmp_path):
    path = write(tmp_path / "p.jsonl",
                 {"prompt": "What is 2 + 2?", "scenario_id": "a", "answer": 4},
                 {"prompt": "What is 60 + 60?", "scenario_id": "b", "answer": 120})
    records = load_prompts(path, env=SUMS)
    assert [r["case"] for r in records] == [{"answer": 4}, {"answer": 120}]
    assert [r["category"] for r in records] == ["small", "large"]
    again = load_prompts(save_prompts(tmp_path / "saved.jsonl", records), env=SUMS)
    assert again == records  # the columns go back to the top level and round-trip


@pytest.mark.parametrize("line, problem", [
    ({"prompt": "What is 1 + 1?"}, "field 'answer': missing: the environment 'sums' reads it"),
    ({"prompt": "What is 1 + 1?", "answer": "two"}, "field 'answer': expected number, got str"),
    ({"prompt": "What is 1 + 1?", "answer": True}, "expected number, got a boolean"),
])
def test_a_bad_column_names_the_file_line_and_field(tmp_path, line, problem):
    path = write(tmp_path / "p.jsonl", {"prompt": "What is 3 + 3?", "answer": 6}, line)
    with pytest.raises(InputFileError) as error:
        load_prompts(path, env=SUMS)
    assert str(error.value).startswith(f"{path}:2: ") and problem in str(error.value)


def test_grading_and_the_training_reward_read_the_column(tmp_path):
    path = write(tmp_path / "p.jsonl", {"prompt": "What is 2 + 2?", "answer": 4})
    records = load_prompts(path, env=SUMS)
    rows = grade(SUMS, records, lambda messages: "4", k=2)
    assert [row["score"] for row in rows] == [1.0, 1.0] and rows[0]["case"] == {"answer": 4}
    reward = RuleReward(SUMS)
    scores = reward(["4", "5"], prompt_text=["What is 2 + 2?"] * 2, scenario_id=["s"] * 2,
                    case=[json.dumps({"answer": 4})] * 2)
    assert scores == [1.0, 0.0]


def test_the_grpo_dataset_carries_the_case_for_the_reward(tmp_path):
    pytest.importorskip("datasets")
    from posttrain.train.grpo.trainer import grpo_dataset

    records = load_prompts(write(tmp_path / "p.jsonl", {"prompt": "2 + 2?", "answer": 4}),
                           env=SUMS)
    row = grpo_dataset(SUMS, records)[0]
    assert json.loads(row["case"]) == {"answer": 4} and row["prompt_text"] == "2 + 2?"


def test_prompts_in_trls_conversational_form(tmp_path):
    path = write(tmp_path / "p.jsonl",
                 {"prompt": [{"role": "user", "content": "Where is my order ORD-4017?"}]},
                 {"prompt": [{"role": "system", "content": "ignored: the env's own is used"},
                             {"role": "user", "content": "Hello there"}]})
    records = load_prompts(path)
    assert [r["prompt"] for r in records] == ["Where is my order ORD-4017?", "Hello there"]
    assert records[0]["category"] == "with_id"


@pytest.mark.parametrize("prompt, problem", [
    ([], "expected a non-empty string or a list of messages"),
    ([{"role": "assistant", "content": "hi"}], "the last message must be the user's"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
      {"role": "user", "content": "c"}], "earlier turns (user, assistant) cannot be replayed"),
    ([{"role": "user"}], "each message must be an object with text 'role' and 'content'"),
])
def test_a_bad_conversational_prompt_is_named(tmp_path, prompt, problem):
    path = write(tmp_path / "p.jsonl", {"prompt": prompt})
    with pytest.raises(InputFileError) as error:
        load_prompts(path)
    assert f"{path}:1: field 'prompt': " in str(error.value) and problem in str(error.value)
