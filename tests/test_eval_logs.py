"""`posttrain eval --compare` on evaluations run elsewhere: inspect_ai logs and
lm-evaluation-harness `--log_samples` output, written by the libraries themselves (inspect's
`eval` with its mockllm model answering by a scripted function; lm-eval's
`simple_evaluate` with a scripted `LM` on a local task, saved by its `EvaluationTracker`).

posttrain's verdict on two logs must be posttrain's statistics on the same pairs: the
delta is the mean over samples of (after - before), each side averaged over its epochs,
computed here from the logs with the libraries' own readers.
"""

from __future__ import annotations

import json
import re
from itertools import count
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("inspect_ai")

from posttrain.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def inspect_example(inspect_example_site, monkeypatch):
    monkeypatch.syspath_prepend(str(inspect_example_site))


def inspect_log(folder: Path, *, count_: int, epochs: int, wrong_every: int,
                task_args: dict | None = None) -> Path:
    """An inspect log of the arith task: a scripted model that gets every
    ``wrong_every``-th product wrong (call by call, so epochs differ)."""
    from inspect_ai import eval as inspect_eval
    from inspect_ai.model import ModelOutput, ModelUsage
    from inspect_arith import arith

    calls = count()

    def scripted(input, tools, tool_choice, config):
        a, op, b = re.search(r"(\d+) (plus|times) (\d+)", input[-1].text).groups()
        value = int(a) + int(b) if op == "plus" else int(a) * int(b)
        if op == "times" and next(calls) % wrong_every == 0:
            value += 1
        output = ModelOutput.from_content(model="mockllm", content=str(value))
        output.usage = ModelUsage(input_tokens=10, output_tokens=5, total_tokens=15)
        return output

    log = inspect_eval(arith(count=count_, **(task_args or {})), model="mockllm/model",
                       model_args={"custom_outputs": scripted}, epochs=epochs,
                       log_dir=str(folder), display="none")[0]
    assert log.status == "success"
    return Path(log.location)


def pass_means(path: Path, scorer: str = "match") -> dict[str, float]:
    """Per sample id, its pass rate over epochs, read with inspect's own reader."""
    from inspect_ai.log import read_eval_log

    passes: dict[str, list[float]] = {}
    for sample in read_eval_log(str(path)).samples:
        passes.setdefault(str(sample.id), []).append(
            1.0 if sample.scores[scorer].value == "C" else 0.0)
    return {key: sum(values) / len(values) for key, values in passes.items()}


def compare(before, after, *extra, capsys) -> tuple[int, dict]:
    code = main(["eval", "--compare", str(before), str(after), "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


def test_two_inspect_logs_give_posttrains_paired_verdict(tmp_path, inspect_example, capsys):
    before = inspect_log(tmp_path / "a", count_=30, epochs=2, wrong_every=1)  # products wrong
    after = inspect_log(tmp_path / "b", count_=30, epochs=2, wrong_every=4)
    means_before, means_after = pass_means(before), pass_means(after)
    expected = sum(means_after[k] - means_before[k] for k in means_before) / len(means_before)
    code, report = compare(before, after, capsys=capsys)
    assert report["delta"] == pytest.approx(expected) and expected > 0.2
    assert report["n_paired"] == 30
    assert report["verdict"] == "moved" and code == 0
    # epochs are repeats: the before side's two epochs give the noise band
    assert report["noise"]["n_repeats"] == 2 and report["noise"]["band"] is not None
    groups = {group["name"]: group for group in report["groups"]}
    assert set(groups) == {"add", "multiply"}
    assert groups["add"]["delta"] == 0.0 and groups["multiply"]["delta"] > 0.4
    assert "task inspect_arith/arith; score match" in report["sources"]["before"]
    assert any("the first of match, concise" in note for note in report["notes"])
    # the text report names both sides and reads the same verdict
    assert main(["eval", "--compare", str(before), str(after)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("before: inspect log") and "-> moved" in text


def test_score_picks_another_scorer_and_json_logs_read_too(tmp_path, inspect_example, capsys):
    from inspect_ai.log import read_eval_log, write_eval_log

    before = inspect_log(tmp_path / "a", count_=12, epochs=1, wrong_every=1)
    after = inspect_log(tmp_path / "b", count_=12, epochs=1, wrong_every=2)
    as_json = tmp_path / "after.json"
    write_eval_log(read_eval_log(str(after)), str(as_json), format="json")
    code, report = compare(before, as_json, "--score", "concise", capsys=capsys)
    assert report["delta"] == 0.0 and report["before"]["pass_at_1"] == 1.0  # all concise
    assert code == 0 and report["verdict"] == "flat"
    code, report = compare(before, as_json, capsys=capsys)
    assert code == 0
    expected = sum(pass_means(after)[k] - pass_means(before)[k] for k in pass_means(before)) / 12
    assert report["delta"] == pytest.approx(expected)
    assert "no noise band" in " ".join(report["warnings"])  # one epoch: no repeats
    assert main(["eval", "--compare", str(before), str(after), "--score", "nope"]) == 2
    assert "has no scorer 'nope'; it has match, concise" in capsys.readouterr().err


def test_logs_that_cannot_be_paired_are_refused_with_the_reason(tmp_path, inspect_example,
                                                                capsys):
    small = inspect_log(tmp_path / "a", count_=6, epochs=1, wrong_every=1)
    large = inspect_log(tmp_path / "b", count_=24, epochs=1, wrong_every=1)
    assert main(["eval", "--compare", str(small), str(large)]) == 2
    assert "cannot pair: they share 6 of 24 sample ids" in capsys.readouterr().err
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.model import ModelOutput, ModelUsage
    from inspect_ai.scorer import match

    def scripted(input, tools, tool_choice, config):
        output = ModelOutput.from_content(model="mockllm", content="4")
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
        return output

    other = inspect_eval(Task(dataset=MemoryDataset([Sample(id=f"q{i:03d}", input="2+2?",
                                                            target="4") for i in range(6)]),
                              scorer=match(), name="other"),
                         model="mockllm/model", model_args={"custom_outputs": scripted},
                         log_dir=str(tmp_path / "c"), display="none")[0]
    assert main(["eval", "--compare", str(small), other.location]) == 2
    assert "cannot pair: they ran different tasks (inspect_arith/arith against other)" in \
        capsys.readouterr().err
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "p", "scenario_id": "1", "reward": 1, "score": 1.0,
                                "sample": 0, "markers": {}}) + "\n")
    assert main(["eval", "--compare", str(small), str(rows)]) == 2
    assert "is an inspect log and" in capsys.readouterr().err
    not_a_log = tmp_path / "x.json"
    not_a_log.write_text('{"a": 1}')
    assert main(["eval", "--compare", str(not_a_log), str(small)]) == 2
    assert "x.json: not an inspect_ai log" in capsys.readouterr().err
    broken = tmp_path / "broken.eval"
    broken.write_bytes(small.read_bytes()[:200])
    assert main(["eval", "--compare", str(broken), str(small)]) == 2
    assert "broken.eval: not a readable inspect_ai log" in capsys.readouterr().err


# -- lm-evaluation-harness ---------------------------------------------------------------

TASK_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files: {data}
test_split: train
output_type: multiple_choice
doc_to_text: "{{{{question}}}} ="
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def lm_eval_task(folder: Path, name: str, docs: int) -> Path:
    """A local multiple-choice task of ``docs`` sums (no download): its YAML's folder."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.jsonl"
    with data.open("w") as handle:
        for index in range(docs):
            right = 2 * index
            handle.write(json.dumps({"question": f"{index}+{index}",
                                     "choices": [str(right), str(right + 1)], "label": 0,
                                     "category": "even" if index % 2 == 0 else "odd"}) + "\n")
    (folder / f"{name}.yaml").write_text(TASK_YAML.format(name=name, data=data))
    return folder


def lm_eval_tasks(folder: Path) -> Any:
    """lm-eval's task index over its own tasks and those in ``folder`` (about 7 s to build:
    it reads every task lm-eval ships, so the runs of a test share one)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(folder))


def lm_eval_run(tasks: Any, task: str, out: Path, wrong_docs: set[int]) -> Path:
    """lm-eval's own run and writer over the task index ``tasks`` (``lm_eval_tasks``): a
    scripted LM that prefers the right choice except on ``wrong_docs``; returns the samples
    file."""
    import lm_eval
    from lm_eval.api.model import LM
    from lm_eval.loggers import EvaluationTracker

    class Scripted(LM):
        def loglikelihood(self, requests):
            scores = []
            for request in requests:
                context, continuation = request.args
                index = int(context.split("+")[0])
                right = continuation.strip() == str(2 * index)
                prefer = right != (index in wrong_docs)
                scores.append((0.0 if prefer else -5.0, prefer))
            return scores

        def loglikelihood_rolling(self, requests):
            raise NotImplementedError("not used by a multiple-choice task")

        def generate_until(self, requests):
            raise NotImplementedError("not used by a multiple-choice task")

    results = lm_eval.simple_evaluate(model=Scripted(), tasks=[task], log_samples=True,
                                      task_manager=tasks)
    tracker = EvaluationTracker(output_path=str(out))
    tracker.save_results_aggregated(results=results, samples=results["samples"])
    for name, samples in results["samples"].items():
        tracker.save_results_samples(task_name=name, samples=samples)
    return sorted(out.rglob(f"samples_{task}_*.jsonl"))[-1]  # the newest (time in its name)


def test_two_lm_eval_sample_files_give_posttrains_paired_verdict(tmp_path, capsys):
    pytest.importorskip("lm_eval")
    folder = lm_eval_task(tmp_path / "tasks", "sums", docs=40)
    lm_eval_task(folder, "products", docs=40)
    tasks = lm_eval_tasks(folder)
    before = lm_eval_run(tasks, "sums", tmp_path / "before", wrong_docs=set(range(0, 40, 2)))
    after = lm_eval_run(tasks, "sums", tmp_path / "after", wrong_docs={0, 4})
    acc = {}
    for side, path in (("before", before), ("after", after)):
        acc[side] = {line["doc_id"]: line["acc"] for line in map(json.loads, path.open())}
    expected = sum(acc["after"][d] - acc["before"][d] for d in acc["before"]) / 40
    code, report = compare(before, after, capsys=capsys)
    assert report["delta"] == pytest.approx(expected) == pytest.approx(18 / 40)
    assert report["verdict"] == "moved" and code == 0 and report["n_paired"] == 40
    groups = {group["name"]: group for group in report["groups"]}
    assert groups["odd"]["delta"] == 0.0 and groups["even"]["delta"] == pytest.approx(0.9)
    assert report["sources"]["after"].endswith("(task sums; score acc,none)")
    # the output folder works as well as the file
    code, report = compare(tmp_path / "before", tmp_path / "after", capsys=capsys)
    assert report["delta"] == pytest.approx(expected)
    # an unknown metric, another task, and a folder of two runs of one task are refused
    assert main(["eval", "--compare", str(before), str(after), "--score", "f1"]) == 2
    assert "has no metric 'f1'; it has acc" in capsys.readouterr().err
    other = lm_eval_run(tasks, "products", tmp_path / "other", wrong_docs=set())
    assert main(["eval", "--compare", str(before), str(other)]) == 2
    assert "they ran different tasks (sums against products)" in capsys.readouterr().err
    lm_eval_run(tasks, "sums", tmp_path / "before", wrong_docs=set())
    assert main(["eval", "--compare", str(tmp_path / "before"), str(after)]) == 2
    assert "holds 2 sample files of task sums" in capsys.readouterr().err


def lm_eval_samples(path: Path, values: list) -> Path:
    """An lm-eval samples file written by hand: one document per value of ``acc``."""
    path.write_text("".join(json.dumps({"doc_id": doc, "doc": {"q": f"q{doc}"}, "filter": "none",
                                        "metrics": ["acc"], "acc": value}) + "\n"
                            for doc, value in enumerate(values)))
    return path


@pytest.mark.parametrize("value, said", [
    ("null", "expected a finite number (a per-document metric), got None"),
    ('"yes"', "expected a finite number (a per-document metric), got 'yes'"),
    ("NaN", "NaN is not a number JSON allows"),  # the JSONL reader refuses these
    ("1e999", "does not fit a float"),
])
def test_a_per_document_value_that_is_no_finite_number_is_named(tmp_path, capsys, value,
                                                                 said):
    good = lm_eval_samples(tmp_path / "samples_t_2026-01-01T00-00-00.jsonl", [1, 0, 1, 0])
    raw = good.read_text().splitlines()
    raw[2] = raw[2].replace('"acc": 1', f'"acc": {value}')
    bad = tmp_path / "samples_t_2026-01-02T00-00-00.jsonl"
    bad.write_text("\n".join(raw) + "\n")
    assert main(["eval", "--compare", str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3" in err and said in err and "Traceback" not in err


@pytest.mark.parametrize("field, replacement, said", [
    ("doc_id", '"doc_id": {"a": 1}', "field 'doc_id': expected a whole number or a string, "
                                     "got an object"),
    ("doc_id", '"doc_id": [1]', "field 'doc_id': expected a whole number or a string, got a list"),
    ("metrics", '"metrics": 3', "field 'metrics': expected a list of metric names, got a number"),
    ("metrics", '"metrics": [1]', "field 'metrics': expected a list of metric names, got a list"),
    ("filter", '"filter": 7', "field 'filter': expected a string, got a number"),
    ("doc", '"doc": {"q": "\\ud800"}', "field 'doc': holds a lone UTF-16 surrogate"),
])
def test_an_lm_eval_field_of_the_wrong_type_is_named_by_file_line_and_field(
        tmp_path, capsys, field, replacement, said):
    import re

    good = lm_eval_samples(tmp_path / "samples_t_2026-01-01T00-00-00.jsonl", [1, 0, 1, 0])
    raw = good.read_text().splitlines()
    pattern = {"doc_id": r'"doc_id": 2', "metrics": r'"metrics": \["acc"\]',
               "filter": r'"filter": "none"', "doc": r'"doc": \{"q": "q2"\}'}[field]
    raw[2] = re.sub(pattern, lambda _: replacement, raw[2])
    bad = tmp_path / "samples_t_2026-01-02T00-00-00.jsonl"
    bad.write_text("\n".join(raw) + "\n")
    assert main(["eval", "--compare", str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3" in err and said in err and "Traceback" not in err, err


def test_a_prompts_file_with_a_lone_surrogate_is_named_by_line_and_field(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Where is ORD-1?", "scenario_id": "s1"}\n'
                       '{"prompt": "Refund ORD-2", "scenario_id": "s\\udc80"}\n')
    assert main(["prompts", "stats", str(prompts)]) == 2
    err = capsys.readouterr().err
    assert f"{prompts}:2: field 'scenario_id': holds a lone UTF-16 surrogate" in err, err


def test_a_document_counted_twice_is_refused_with_its_id(tmp_path, capsys):
    good = lm_eval_samples(tmp_path / "samples_t_2026-01-01T00-00-00.jsonl", [1, 0, 1, 0])
    twice = tmp_path / "samples_t_2026-01-02T00-00-00.jsonl"
    twice.write_text(good.read_text() + good.read_text().splitlines()[1] + "\n")
    assert main(["eval", "--compare", str(good), str(twice)]) == 2
    err = capsys.readouterr().err
    assert "document 1 appears twice (also line 2)" in err and f"{twice}:5" in err


def test_a_zip_bomb_eval_log_is_refused_before_it_is_read(tmp_path, capsys):
    """Issue #49: a 1.1 MB `.eval` that unpacked to gigabytes took 2.1 GB of memory. Its
    members' declared sizes are summed first and the log refused past the limit, in one
    line, without reading it (reading a member cannot give more than it declares)."""
    import resource
    import zipfile

    from posttrain.score.eval_logs import MAX_LOG_BYTES

    bomb = tmp_path / "bomb.eval"
    chunk = b"\0" * (1 << 20)
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("samples/1_epoch_1.json", "w", force_zip64=True) as member:
            for _ in range(MAX_LOG_BYTES // len(chunk) + 8):
                member.write(chunk)
    assert bomb.stat().st_size < 2 * 1024 * 1024
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert main(["eval", "--compare", str(bomb), str(bomb)]) == 2
    err = capsys.readouterr().err
    assert "bomb.eval" in err and "unpacks to 264 MB, more than the 256 MB" in err
    assert len(err.strip().splitlines()) == 1
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kb < 100 * 1024, grown_kb  # nothing was unpacked into memory
