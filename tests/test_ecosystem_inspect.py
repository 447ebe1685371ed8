"""`--env inspect:PKG/TASK` and `inspect:FILE.py@TASK`: an inspect_ai task as a posttrain
environment, with the real library. The example package (examples/inspect_arith) is
installed for the session with pip into a temporary site-packages folder, so inspect
finds its task through the `inspect_ai` entry point as it would after `pip install`.

The reward posttrain records for a reply must be what inspect computes for it: inspect's
own `eval` (its mockllm model answering with a scripted function) and posttrain's eval of
an OpenAI-compatible server answering with the same function are compared sample by
sample.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import ClassVar

import pytest

pytest.importorskip("inspect_ai")

from chat_servers import MISBEHAVIOURS, ChatHandler, completion, misbehaving, serving

from posttrain.cli import main
from posttrain.envs import get_env
from posttrain.errors import PosttrainError

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_TASK = "inspect:inspect_arith/arith"
FILE_TASK = "inspect:" + str(ROOT / "examples" / "inspect_arith" / "inspect_arith.py") + "@arith"
CASES = "inspect:" + str(ROOT / "tests" / "ecosystem_envs" / "inspect_cases.py") + "@"


@pytest.fixture(autouse=True)
def example_on_path(inspect_example_site, monkeypatch):
    monkeypatch.syspath_prepend(str(inspect_example_site))
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "ecosystem_envs"))


def answer(question: str) -> str:
    """Sums right; products one too high, every third of them after some prose."""
    a, op, b = re.search(r"(\d+) (plus|times) (\d+)", question).groups()
    if op == "plus":
        return str(int(a) + int(b))
    if int(a) % 3 == 0:
        return (f"Let me think about {a} times {b} carefully, step by step, before I give "
                f"you the number. It is {int(a) * int(b) + 1}")
    return str(int(a) * int(b) + 1)


class Calculator(ChatHandler):
    def do_POST(self) -> None:
        self.send_json(completion(self.model, answer(self.body()["messages"][-1]["content"])))


def test_samples_become_prompt_records_by_package_and_by_file():
    env = get_env(PACKAGE_TASK + "?count=12")
    assert env.name == "arith" and env.categories == ("add", "multiply")
    assert env.system.startswith("You are a careful calculator.")  # its system_message
    records = env.write_prompts(8, seed=3)
    assert len(records) == 8 and records == env.write_prompts(8, seed=3)
    assert records != env.write_prompts(8, seed=4)
    assert len(env.write_prompts(1000)) == 12
    record = records[0]
    assert re.fullmatch(r"q\d{3}", record["scenario_id"])  # the sample's id
    assert record["fields"]["metadata"]["category"] == record["category"]
    assert env.messages_for(record["prompt"]) == [
        {"role": "system", "content": env.system}, {"role": "user", "content": record["prompt"]}]
    assert env.case_for(record["prompt"]) == record["case"]
    # the same task from its file (no install needed)
    by_file = get_env(FILE_TASK + "?count=12")
    assert by_file.write_prompts(8, seed=3) == records


def test_the_reward_is_the_first_scorer_and_every_scorer_is_a_marker():
    env = get_env(PACKAGE_TASK + "?count=4")
    case = env.write_prompts(1)[0]["case"]
    right = case["target"][0]
    assert env.score(right, case) == 1.0
    assert env.markers(right, case) == {"match": 1.0, "concise": 1.0}
    assert env.score("-1", case) == 0.0
    long_right = "Well. " * 20 + right
    assert env.score(long_right, case) == 1.0
    assert env.markers(long_right, case) == {"match": 1.0, "concise": 0.0}
    # inspect's own Score objects for the same reply
    scores = env.scores_of(right, case)
    assert scores["match"].value == "C" and scores["concise"].value == "C"


def test_solvers_shape_the_prompt_and_dict_scores_become_markers():
    env = get_env(CASES + "templated")
    record = env.write_prompts(1)[0]
    assert "Before answering, reason in a step-by-step manner" in record["prompt"]
    assert env.system == "Answer briefly." and env.categories == ("even", "odd")
    env = get_env(CASES + "dict_valued")
    case = env.write_prompts(1)[0]["case"]
    reply = f"It is {case['target'][0]}, surely, beyond doubt"
    assert env.markers(reply, case) == {"parts": 0.5, "parts/answer": 1.0, "parts/short": 0.0}
    assert env.score(reply, case) == 0.5


def test_posttrain_records_the_score_inspect_computes(tmp_path, capsys):
    from inspect_ai import eval as inspect_eval
    from inspect_ai.model import ModelOutput, ModelUsage
    from inspect_arith import arith

    def scripted(input, tools, tool_choice, config):
        output = ModelOutput.from_content(model="mockllm", content=answer(input[-1].text))
        # usage given, so inspect does not count tokens with tiktoken (a download)
        output.usage = ModelUsage(input_tokens=10, output_tokens=5, total_tokens=15)
        return output

    log = inspect_eval(arith(count=24), model="mockllm/model", display="none",
                       model_args={"custom_outputs": scripted}, log_dir=str(tmp_path / "logs"))[0]
    library = {str(sample.id): {name: score.value for name, score in sample.scores.items()}
               for sample in log.samples}
    assert len(library) == 24
    with serving(Calculator) as url:
        out = tmp_path / "rows.jsonl"
        assert main(["eval", "--env", PACKAGE_TASK + "?count=24", "--endpoint", url,
                     "--endpoint-model", "scripted", "--split", "all", "--samples", "1",
                     "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 24
    to_float = {"C": 1.0, "I": 0.0}
    for row in rows:  # sample by sample: the same verdicts, scorer by scorer
        assert row["score"] == to_float[library[row["scenario_id"]]["match"]]
        assert row["markers"] == {name: to_float[value]
                                  for name, value in library[row["scenario_id"]].items()}
    assert {row["markers"]["concise"] for row in rows} == {0.0, 1.0}
    assert re.search(r"add\s+\d+\s+\d+\s+1\.00", printed)
    assert re.search(r"multiply\s+\d+\s+\d+\s+0\.00", printed)


def tool_step(messages: list[dict]) -> tuple[str, dict] | str:
    """The scripted tool user, for both sides: the question's tool call first; then the
    tool's result (one too high on even products); every third product, a guess."""
    question = next(m["content"] for m in messages if m["role"] == "user")
    a, op, b = re.search(r"(\d+) (plus|times) (\d+)", question).groups()
    a, b = int(a), int(b)
    if messages[-1]["role"] == "tool":
        return str(int(messages[-1]["content"]) + (op == "times" and a % 2 == 0))
    if op == "times" and a % 3 == 0:
        return "100"
    return ("add" if op == "plus" else "multiply", {"a": a, "b": b})


class ToolCaller(ChatHandler):
    def do_POST(self) -> None:
        body = self.body()
        assert [tool["function"]["name"] for tool in body["tools"]] == ["add", "multiply"]
        step = tool_step(body["messages"])
        if isinstance(step, str):
            self.send_json(completion(self.model, step))
        else:
            call = {"id": "call_1", "type": "function",
                    "function": {"name": step[0], "arguments": json.dumps(step[1])}}
            self.send_json(completion(self.model, None, tool_calls=[call]))


def test_a_tool_task_plays_episodes_scored_as_inspect_scores_them(tmp_path):
    from inspect_ai import eval as inspect_eval
    from inspect_ai.model import ModelOutput, ModelUsage
    from inspect_arith import arith

    def scripted(input, tools, tool_choice, config):
        messages = [{"role": m.role, "content": m.text} for m in input]
        step = tool_step(messages)
        if isinstance(step, str):
            output = ModelOutput.from_content(model="mockllm", content=step)
        else:
            output = ModelOutput.for_tool_call("mockllm", step[0], step[1])
        output.usage = ModelUsage(input_tokens=10, output_tokens=5, total_tokens=15)
        return output

    log = inspect_eval(arith(count=24, tools=True), model="mockllm/model", display="none",
                       model_args={"custom_outputs": scripted}, log_dir=str(tmp_path / "logs"))[0]
    assert log.status == "success"
    library = {str(sample.id): sample.scores["match"].value for sample in log.samples}
    calls = {str(sample.id): sum(len(m.tool_calls or []) for m in sample.messages
                                 if m.role == "assistant") for sample in log.samples}
    spec = PACKAGE_TASK + "?count=24&tools=true"
    env = get_env(spec)
    assert env.multi_turn is True and "<tool_call>" in env.system
    with serving(ToolCaller) as url:
        out = tmp_path / "rows.jsonl"
        assert main(["eval", "--env", spec, "--endpoint", url, "--endpoint-model", "scripted",
                     "--split", "all", "--samples", "1", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 24
    to_float = {"C": 1.0, "I": 0.0}
    for row in rows:  # episode by episode: inspect's verdict and its count of tool calls
        assert row["score"] == to_float[library[row["scenario_id"]]]
        assert row["episode"]["tool_calls"] == calls[row["scenario_id"]]
    assert {row["score"] for row in rows} == {0.0, 1.0}
    assert {row["episode"]["tool_calls"] for row in rows} == {0, 1}
    desk = env.trl_environment()()
    desk.reset(case="{}")
    assert desk.add(a=2, b=3) == "5" and desk.multiply(a=4, b=6) == "24"


def test_the_reference_agent_replies_with_the_target():
    for spec in (PACKAGE_TASK + "?count=8", PACKAGE_TASK + "?count=8&tools=true"):
        env = get_env(spec)
        agent = env.reference_agent()
        for record in env.write_prompts(8):
            reply = agent(env.messages_for(record["prompt"]))
            assert reply == record["case"]["target"][0] and env.score(reply, record["case"]) == 1.0


def test_env_arg_reaches_the_task_function(tmp_path, capsys):
    with serving(Calculator) as url:
        out = tmp_path / "rows.jsonl"
        assert main(["eval", "--env", "inspect:inspect_arith/arith", "--env-arg", "count=10",
                     "--env-arg", 'ops=["*"]', "--endpoint", url, "--endpoint-model",
                     "scripted", "--split", "all", "--samples", "1", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 10 and {row["category"] for row in rows} == {"multiply"}


def test_a_prompts_file_must_carry_the_samples_fields(tmp_path, capsys):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "What is 2 plus 2?", "target": "4"}) + "\n")
    assert main(["eval", "--env", PACKAGE_TASK, "--prompts-file", str(path),
                 "--base-model", "starter-2m"]) == 2
    error = capsys.readouterr().err
    assert "prompts.jsonl:1: field 'target'" in error and "expected array" in error


@pytest.mark.parametrize("name, says", [
    ("sandboxed", "runs in a sandbox"),
    ("file_samples", "sample 1 needs a sandbox"),
    ("graded", "its scorer model_graded_qa asks a model to grade the reply: give one with "
               "--env-judge-endpoint"),
    ("custom_graded", "its scorer asks_a_model failed on a reply: ValueError: No model"),
    ("builtin_tool", "tool(s) inspect_ai/bash need a sandbox or the network"),
    ("choices", "its solver multiple_choice is not supported"),
    ("unscored", "it has no scorer"),
    ("per_sample_system", "differ in the messages before the user's"),
])
def test_what_cannot_be_mapped_is_refused_with_the_reason(name, says, capsys):
    assert main(["eval", "--env", CASES + name, "--base-model", "starter-2m"]) == 2
    error = capsys.readouterr().err
    assert says in error and f"@{name}" in error and "Traceback" not in error


def test_unknown_tasks_files_and_bad_arguments_say_so(capsys):
    for spec, says in [
        ("inspect:no_such_pkg/task", "no inspect task by that name"),
        (CASES.removesuffix("@"), "the file defines 11 tasks"),
        ("inspect:no/such/file.py@task", "FileNotFoundError"),
        (PACKAGE_TASK + "?ops=%5B%22%2F%22%5D", "unknown operation"),
        ("inspect:", "name the inspect environment"),
    ]:
        assert main(["eval", "--env", spec, "--base-model", "starter-2m"]) == 2, spec
        assert says in capsys.readouterr().err, spec


class Grader(ChatHandler):
    """model_graded_qa's grader: C when the submission holds the criterion."""

    asked: ClassVar[list[str]] = []  # the model each request named, across requests

    def do_POST(self) -> None:
        body = self.body()
        Grader.asked.append(body["model"])
        text = body["messages"][-1]["content"]
        submission = re.search(r"\[Submission\]: (.*?)\n", text).group(1)
        criterion = re.search(r"\[Criterion\]: (.*?)\n", text).group(1)
        self.send_json(completion(self.model, "GRADE: C" if criterion in submission
                                  else "GRADE: I"))


def odd_right(question: str) -> str:
    """Right on odd numbers, one too high on even ones."""
    n = int(re.search(r"What is (\d+) plus", question).group(1))
    return f"It is {2 * n + (n % 2 == 0)}."


class OddRight(ChatHandler):
    def do_POST(self) -> None:
        self.send_json(completion(self.model, odd_right(self.body()["messages"][-1]["content"])))


def test_a_model_graded_scorer_calls_the_env_judge_endpoint(tmp_path):
    import inspect_cases
    from inspect_ai import eval as inspect_eval
    from inspect_ai.model import ModelOutput, ModelUsage, get_model

    from posttrain.envs.ecosystem.inspect_judge import PROVIDER, register_provider

    def scripted(input, tools, tool_choice, config):
        output = ModelOutput.from_content(model="mockllm", content=odd_right(input[-1].text))
        output.usage = ModelUsage(input_tokens=10, output_tokens=5, total_tokens=15)
        return output

    Grader.asked = []
    with serving(Grader) as judge_url, serving(OddRight) as url:
        # inspect's own eval, the grader role bound to the same endpoint
        register_provider()
        grader = get_model(f"{PROVIDER}/scripted-grader", base_url=judge_url, api_key="x")
        log = inspect_eval(inspect_cases.graded(), model="mockllm/model", display="none",
                           model_args={"custom_outputs": scripted},
                           model_roles={"grader": grader}, log_dir=str(tmp_path / "logs"))[0]
        assert log.status == "success"
        library = {str(s.id): s.scores["model_graded_qa"].value for s in log.samples}
        out = tmp_path / "rows.jsonl"
        assert main(["eval", "--env", CASES + "graded", "--env-judge-endpoint", judge_url,
                     "--env-judge-model", "scripted-grader", "--endpoint", url,
                     "--endpoint-model", "scripted", "--split", "all", "--samples", "1",
                     "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {row["scenario_id"]: row["score"] for row in rows} == {
        key: {"C": 1.0, "I": 0.0}[value] for key, value in library.items()}
    assert set(library.values()) == {"C", "I"}
    assert set(Grader.asked) == {"scripted-grader"}


@pytest.mark.parametrize("answer", [m for m in MISBEHAVIOURS
                                    if m.name in ("200 html", "json list", "choices empty",
                                                  "500", "hang up")], ids=lambda m: m.name)
def test_a_judge_that_answers_no_completion_is_one_line_naming_it(answer, capsys):
    """The judge an inspect grader calls is another server: a wrong answer stops the
    command with one line naming --env-judge-endpoint, not an error inside inspect."""
    with serving(misbehaving(answer)) as judge_url, serving(OddRight) as url:
        code = main(["eval", "--env", CASES + "graded", "--env-judge-endpoint", judge_url,
                     "--env-judge-model", "scripted-grader", "--endpoint", url,
                     "--endpoint-model", "scripted", "--split", "all", "--samples", "1"])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and error[-1].startswith("posttrain eval: error: --env-judge-endpoint")
    assert "Traceback" not in "\n".join(error)


def test_without_the_library_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "inspect_ai", None)  # an import of it now fails
    with pytest.raises(PosttrainError, match=r"pip install 'posttrain\[ecosystem\]'"):
        get_env(PACKAGE_TASK)


@pytest.mark.slow
@pytest.mark.parametrize("spec", [PACKAGE_TASK + "?count=40",
                                  PACKAGE_TASK + "?count=40&tools=true"])
def test_a_short_grpo_run_trains_on_the_tasks_scorer(spec, tmp_path, starter_2m_folder):
    pytest.importorskip("trl")
    assert main(["grpo", "--env", spec, "--base-model", "starter-2m",
                 "--steps", "2", "--num-generations", "4", "--eval-samples", "2",
                 "--runs-dir", str(tmp_path)]) == 0
    folder = tmp_path / "arith-grpo-v1"  # the run is named after the environment
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "done"
    config = json.loads((folder / "config.json").read_text())
    assert config["settings"]["env"] == spec
    env = get_env(config["settings"]["env"])
    rows = [json.loads(line) for line in (folder / "holdout_after.jsonl").open()]
    assert rows
    for row in rows:  # what the run recorded is the scorers' verdict on that reply
        assert row["score"] == env.score(row["reply"], row["case"])
        assert row["markers"] == env.markers(row["reply"], row["case"])
