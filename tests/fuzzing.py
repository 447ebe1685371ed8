"""Fuzz targets: hostile input for every place where input enters posttrain.

Each target is a Hypothesis strategy plus a check that takes one drawn input and asserts
the contract: any input gives a result or a clear, named error (never a traceback, never
a 500), and nothing already stored changes. ``run_target`` runs one target for a number
of examples and counts them; ``tests/test_fuzz.py`` runs every target briefly in CI and
``benchmarks/fuzz.py`` runs them longer on demand.

Inputs are drawn three ways at once: arbitrary JSON-like values (NaN, infinities, huge
integers, deep nesting, odd strings), valid records with a few fields replaced by such
values (so the checks past the first one are reached), and raw bytes (not UTF-8, not JSON).
"""

from __future__ import annotations

import http.client
import json
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# --- strategies -------------------------------------------------------------------------

ODD_STRINGS = st.sampled_from([
    "", " ", "\x00", "../../etc", "a/b", ".hidden", "NaN", "Infinity", "1e400", "-0",
    "\ud800", "é" * 3, "<tool_call>", "x" * 300, "ORD-4417", "user", "assistant",
])
ODD_NUMBERS = st.sampled_from([
    0, -1, 1, 2**31, 2**53 + 1, 2**63, 2**64, -(2**63) - 1, 10**30,
    0.0, -0.0, 1e-300, 1e308, float("nan"), float("inf"), float("-inf"), 0.5, True, False,
])
SCALARS = (st.none() | st.booleans() | st.integers() | ODD_NUMBERS
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20) | ODD_STRINGS)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=10) | ODD_STRINGS, children, max_size=5),
    max_leaves=20,
)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    paths = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            paths += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            paths += _paths(item, (*prefix, index))
    return paths


def _replace(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replace(value[head], rest, new)}
    copy = list(value)
    copy[head] = _replace(copy[head], rest, new)
    return copy


@st.composite
def mutated(draw: st.DrawFn, template: Any) -> Any:
    """``template`` with up to three of its parts replaced, deleted or given a new key
    (none or one most often, so the checks after the first are reached too)."""
    value = template
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 1, 2, 3]))):
        path = draw(st.sampled_from(_paths(value)))
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "delete" and path:
            parent = path[:-1]
            holder = value
            for part in parent:
                holder = holder[part]
            if isinstance(holder, dict):
                smaller = {k: v for k, v in holder.items() if k != path[-1]}
            else:
                smaller = [v for i, v in enumerate(holder) if i != path[-1]]
            value = _replace(value, parent, smaller)
        elif action == "add":
            holder = value
            for part in path:
                holder = holder[part]
            if isinstance(holder, dict):
                value = _replace(value, path, {**holder, draw(st.text(max_size=8)):
                                               draw(JSON_VALUES)})
            elif isinstance(holder, list):
                value = _replace(value, path, [*holder, draw(JSON_VALUES)])
        else:
            value = _replace(value, path, draw(JSON_VALUES))
    return value


def json_text(value: Any) -> str:
    """JSON as a hostile writer would send it: NaN and Infinity tokens included."""
    return json.dumps(value, allow_nan=True, ensure_ascii=False)


def lines_of(template: Any) -> st.SearchStrategy[bytes]:
    """A JSONL file's bytes: lines from mutated templates, arbitrary JSON, raw text or
    bytes, joined by newlines (sometimes CRLF, sometimes with a blank line)."""
    near_valid = mutated(template).map(lambda v: json_text(v).encode("utf-8", "surrogatepass"))
    line = st.one_of(
        near_valid, near_valid, near_valid, near_valid,
        JSON_VALUES.map(lambda v: json_text(v).encode("utf-8", "surrogatepass")),
        st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.binary(max_size=40),
        st.just(b""),
        st.just(b'{"prompt": ' + b"[" * 3000 + b"]" * 3000 + b"}"),  # deep nesting
    )
    newline = st.sampled_from([b"\n", b"\r\n"])
    return st.tuples(st.lists(line, min_size=0, max_size=4), newline).map(
        lambda parts: parts[1].join(parts[0]))


# --- targets ----------------------------------------------------------------------------


@dataclass
class Target:
    """One fuzz target: what it draws, what it checks, and what it needs set up."""

    name: str
    strategy: st.SearchStrategy
    check: Callable[[Any, dict[str, Any]], bool]  # True: accepted, False: a named refusal
    setup: Callable[[Path], dict[str, Any]] = lambda folder: {}
    teardown: Callable[[dict[str, Any]], None] = lambda context: None


VALID_PROMPT = {"prompt": "Please refund order ORD-4417, it arrived broken.", "scenario_id": "s1"}


def check_prompt_file(data: bytes, context: dict[str, Any]) -> bool:
    from posttrain.data.prompts import load_prompts
    from posttrain.errors import InputFileError

    path = context["folder"] / "prompts.jsonl"
    path.write_bytes(data)
    try:
        records = load_prompts(path, env=context["env"])
    except InputFileError as error:
        assert str(path) in str(error), f"error does not name the file: {error}"
        return False
    assert records
    for record in records:
        assert isinstance(record["prompt"], str) and record["prompt"].strip()
        assert isinstance(record["category"], str)
        json.dumps(record, allow_nan=False)  # a loaded record never carries NaN
    return True


def prompt_setup(folder: Path) -> dict[str, Any]:
    from posttrain.envs import get_env

    return {"folder": folder, "env": get_env("refund")}


VALID_PAIR = {
    "prompt": [{"role": "user", "content": "Refund ORD-4417 please."}],
    "chosen": [{"role": "assistant", "content": "Refunding ORD-4417."}],
    "rejected": [{"role": "assistant", "content": "No."}],
    "margin": 0.5, "scenario_id": "s1", "constructed": False,
}


def check_pairs_file(drawn: tuple[bytes, bool], context: dict[str, Any]) -> bool:
    from posttrain.errors import InputFileError
    from posttrain.train.training_data.pairs import load_pairs

    data, skip_invalid = drawn
    path = context["folder"] / "pairs.jsonl"
    path.write_bytes(data)
    try:
        pairs, skipped = load_pairs(path, skip_invalid=skip_invalid)
    except InputFileError as error:
        assert str(path) in str(error), f"error does not name the file: {error}"
        return False
    assert pairs
    for pair in pairs:
        margin = pair.get("margin") if isinstance(pair, dict) else getattr(pair, "margin", None)
        assert margin is None or math.isfinite(margin)
    assert all(str(path) in line for line in skipped)
    return True


VALID_OPS = [
    {"op": "create", "run": "fuzz-a", "time": 1.0, "config": {"base_model": "starter"}},
    {"op": "metrics", "run": "fuzz-a", "time": 2.0, "step": 1, "metrics": {"reward": 0.5}},
    {"op": "progress", "run": "fuzz-a", "time": 2.0, "step": 1, "total": 10, "eta": 3.0},
    {"op": "note", "run": "fuzz-b", "time": 3.0, "text": "hello", "step": 1},
    {"op": "alarm", "run": "fuzz-a", "time": 3.0, "kind": "hack", "step": 1,
     "message": "m", "details": {"share": 0.4}},
    {"op": "finish", "run": "fuzz-a", "time": 4.0, "status": "done", "summary": {"delta": 0.1}},
    {"op": "heartbeat", "run": "fuzz-b", "time": None},
    {"op": "samples", "run": "fuzz-a", "time": 3.0, "step": 2, "source": "monitor",
     "rows": [{"prompt": "p", "reply": "r", "score": 1.0, "reward": 1, "category": "with_id",
               "markers": {"well_formed": 1.0}}]},
]
SENTINEL = "sentinel"


def store_setup(folder: Path) -> dict[str, Any]:
    from posttrain.runs.sqlite_store import SqliteRunStore

    store = SqliteRunStore(folder / "posttrain.db")
    _restore_sentinel(store)
    return {"store": store}


def _restore_sentinel(store: Any) -> None:
    """(Re)write the finished run every input must leave alone."""
    store.create_run(SENTINEL, {"base_model": "starter", "lr": 1e-4}, started=100.0)
    store.log_metrics(SENTINEL, 3, {"reward": 0.25}, timestamp=101.0)
    store.add_alarm(SENTINEL, "hack", 3, "kept", {"share": 0.5}, timestamp=102.0)
    store.finish_run(SENTINEL, {"delta": 0.2}, "done", timestamp=103.0)


def _snapshot(store: Any) -> str:
    runs = store.list_runs()
    full = {run["name"]: store.get_run(run["name"]) for run in runs}
    series = {name: store.metric_series(name, metric)
              for name, run in full.items() for metric in run["metric_names"]}
    # whatever a run holds must serialise as strict JSON: the API never emits NaN
    return json.dumps([runs, full, series], allow_nan=False, sort_keys=True)


def _sentinel(store: Any) -> str:
    return json.dumps([store.get_run(SENTINEL), store.metric_series(SENTINEL, "reward")],
                      sort_keys=True, allow_nan=False)


def _forget_other_runs(store: Any) -> None:
    """Back to the sentinel alone, so every input meets the same small store (and a long
    fuzz run does not slow down as accepted runs pile up)."""
    for run in store.list_runs():
        if run["name"] != SENTINEL:
            store.delete_run(run["name"], force=True)


def check_ingest_ops(ops: Any, context: dict[str, Any]) -> bool:
    from posttrain.runs.ops import RunStoreError

    store = context["store"]
    before = _snapshot(store)
    sentinel = _sentinel(store)
    try:
        store.apply(ops)
    except RunStoreError:
        assert _snapshot(store) == before, "a refused batch changed the store"
        return False
    _snapshot(store)  # what was applied still reads back as strict JSON
    if not any(isinstance(op, dict) and op.get("run") == SENTINEL for op in ops):
        assert _sentinel(store) == sentinel, "a batch for other runs changed another run"
    else:
        _restore_sentinel(store)
    _forget_other_runs(store)
    return True


def ops_strategy() -> st.SearchStrategy:
    run_names = st.sampled_from(["fuzz-a", "fuzz-b", SENTINEL]) | st.text(max_size=10)
    one_op = st.one_of(*[mutated(op) for op in VALID_OPS])
    ops = st.lists(one_op | renamed_op(one_op, run_names), max_size=6)
    return st.one_of(ops, ops, ops, JSON_VALUES)


def renamed_op(one_op: st.SearchStrategy, run_names: st.SearchStrategy) -> st.SearchStrategy:
    """An op sent for another run name (safe, unsafe or the sentinel's)."""
    return st.tuples(one_op, run_names).map(
        lambda pair: {**pair[0], "run": pair[1]} if isinstance(pair[0], dict) else pair[0])


def http_setup(folder: Path) -> dict[str, Any]:
    from posttrain.runs.server import serve, start_in_thread

    context = store_setup(folder)
    context["store"].close()
    server = serve(folder / "posttrain.db", port=0, token="tok")
    context.update(server=server, thread=start_in_thread(server), store=server.store)
    return context


def http_teardown(context: dict[str, Any]) -> None:
    context["server"].shutdown()
    context["server"].server_close()
    context["thread"].join(5)


def check_ingest_http(drawn: tuple[bytes, str, bool], context: dict[str, Any]) -> bool:
    body, content_type, with_token = drawn
    store = context["store"]
    sentinel = _sentinel(store)
    headers = {"Content-Type": content_type}
    if with_token:
        headers["Authorization"] = "Bearer tok"
    connection = http.client.HTTPConnection("127.0.0.1", context["server"].server_address[1],
                                            timeout=30)
    try:
        connection.request("POST", "/api/ingest", body, headers)
        response = connection.getresponse()
        answer = response.read()
    finally:
        connection.close()
    assert response.status < 500, f"{response.status}: {answer[:200]!r}"
    json.loads(answer)  # every answer is JSON
    touched = SENTINEL.encode() in body
    if response.status != 200 or not touched:
        assert _sentinel(store) == sentinel, "the sentinel run changed"
    if response.status == 200:
        if touched:
            _restore_sentinel(store)
        _forget_other_runs(store)
    return response.status == 200


def http_strategy() -> st.SearchStrategy:
    ops_body = ops_strategy().map(
        lambda ops: json_text({"batch": None, "ops": ops}).encode("utf-8", "surrogatepass"))
    bodies = st.one_of(
        ops_body, ops_body, ops_body,
        JSON_VALUES.map(lambda v: json_text(v).encode("utf-8", "surrogatepass")),
        st.binary(max_size=200),
        st.just(b"[" * 5000 + b"]" * 5000),
    )
    content_types = st.sampled_from(["application/json", "application/json",
                                     "application/json; charset=utf-8", "text/plain", ""])
    return st.tuples(bodies, content_types, st.sampled_from([True, True, True, False]))


VALID_BODIES: dict[str, Any] = {
    "forward_backward": {"seq": 1, "loss_function": "importance_sampling", "data": [{
        "model_input": {"token_ids": [1, 2, 3]},
        "loss_fn_inputs": {"target_tokens": [2, 3, 4], "logprobs": [0.0, -1.0, -1.0],
                           "advantages": [0.0, 1.0, 1.0]}}]},
    "optim_step": {"seq": 2, "adam_params": {"learning_rate": 1e-3, "beta1": 0.9,
                                             "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0,
                                             "grad_clip_norm": 1.0}},
    "sample": {"seq": 3, "version": 0, "prompt": {"token_ids": [1, 2]}, "num_samples": 2,
               "sampling_params": {"max_tokens": 8, "temperature": 0.8, "top_p": 0.9,
                                   "top_k": 0, "seed": 1, "stop": ["\n"]}},
    "logprobs": {"seq": 4, "sequences": [[1, 2, 3]], "version": None},
    "save_weights_for_sampler": {"seq": 5, "version": 1},
    "save_state": {"seq": 6, "name": "step-1"},
    "load_state": {"seq": 7, "name": "step-1", "run_id": "run-abc"},
    "export_lora": {"seq": 8, "name": "adapter"},
    "finish": {"seq": 9},
}
VALID_BODIES["forward"] = VALID_BODIES["forward_backward"]
VALID_LORA = {"rank": 4, "alpha": 8, "seed": 0, "target_modules": ["q_proj", "v_proj"]}


def check_service_body(drawn: tuple[str, Any], context: dict[str, Any]) -> bool:
    from posttrain.service.engine.errors import ServiceError
    from posttrain.service.engine.requests import Limits
    from posttrain.service.protocols.native import parsing

    primitive, body = drawn
    limits = Limits(max_sequence_tokens=64, max_tokens_per_call=512)
    try:
        if primitive == "create_run":
            parsing.parse_lora(body, limits, ("q_proj", "v_proj", "o_proj"))
        else:
            parsing.sequence_number(body)
            parsing.parse_primitive(primitive, body, 100, limits)
    except ServiceError as error:
        assert 400 <= error.status < 500 and str(error)
        return False
    return True


def service_strategy() -> st.SearchStrategy:
    named = [st.tuples(st.just(name), mutated(body) | JSON_VALUES)
             for name, body in VALID_BODIES.items()]
    named.append(st.tuples(st.just("create_run"), mutated(VALID_LORA) | JSON_VALUES))
    return st.one_of(*named)


def check_json_loads(text: str, context: dict[str, Any]) -> bool:
    from posttrain.jsonl import strict_json_loads

    try:
        value = strict_json_loads(text)
    except ValueError:
        return False
    json.dumps(value, allow_nan=False)  # what it accepts is strict JSON
    return True


# --- the command line: every numeric flag of every command, and --config files --------------

NUMBER_TEXT = st.one_of(
    ODD_NUMBERS.map(str), st.integers().map(str), st.floats().map(repr),
    st.sampled_from(["", " ", "nan", "-inf", "1e400", "0x10", "1_0", "\u0661\u0662", "+3",
                     " 7 ", "9" * 25, "-" + "9" * 25, "9" * 5000, "1e-400", "2**63", "0.5"]),
    st.text(max_size=12),
)


def _recipe_checks() -> dict[str, tuple[type, Callable[[Any], None]]]:
    from posttrain.train.dpo.settings import DPOSettings, check_dpo_settings
    from posttrain.train.grpo.settings import GRPOSettings, check_grpo_settings
    from posttrain.train.sft.settings import SFTSettings, check_sft_settings

    return {"grpo": (GRPOSettings, check_grpo_settings),
            "dpo": (DPOSettings, check_dpo_settings),
            "sft": (SFTSettings, check_sft_settings)}


def numeric_flags() -> list[tuple[tuple[str, ...], str]]:
    """(command words, flag) for every flag of every command that takes a number."""
    import argparse

    from posttrain.cli import build_parser
    from posttrain.commands import dataclass_args

    numeric = {dataclass_args.whole_number, dataclass_args.real_number}
    found = []

    def walk(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, (*words, name))
            elif action.option_strings and (action.type in numeric or getattr(
                    action.type, "__qualname__", "").startswith("whole_in.")):
                found.append((words, action.option_strings[0]))

    walk(build_parser(), ())
    return found


REQUIRED = {("prompts", "split"): ["--train-out", "t.jsonl", "--holdout-out", "h.jsonl"],
            ("pairs", "build"): ["--out", "pairs.jsonl"]}
POSITIONALS = {("prompts", "write"): ["out.jsonl"], ("prompts", "split"): ["p.jsonl"],
               ("prompts", "filter"): ["p.jsonl", "out.jsonl"], ("prompts", "stats"): ["p.jsonl"]}


def check_cli_flag(drawn: tuple[tuple[tuple[str, ...], str], str], context: dict[str, Any]
                   ) -> bool:
    """A numeric flag's value is parsed and bounded before any work: argparse refuses it
    with one line naming the flag (exit 2), or the settings it makes pass or fail the
    command's own checks with one PosttrainError line. Nothing else, never a traceback."""
    import contextlib
    import io

    from posttrain.cli import build_parser
    from posttrain.commands.dataclass_args import INT64
    from posttrain.commands.recipe_command import settings_for
    from posttrain.errors import PosttrainError
    from posttrain.train.settings import check_recipe_settings

    (words, flag), value = drawn
    argv = [*words, *POSITIONALS.get(words, []), f"{flag}={value}"]
    argv += REQUIRED.get(words, [])
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            args = build_parser().parse_args(argv)
    except SystemExit as stop:
        message = errors.getvalue().strip().splitlines()[-1]
        assert stop.code == 2 and flag in message and len(message) < 400, message
        return False
    parsed = getattr(args, flag.lstrip("-").replace("-", "_"), None)
    if isinstance(parsed, int) and not isinstance(parsed, bool):
        assert INT64[0] <= parsed <= INT64[1], (flag, parsed)
    if isinstance(parsed, float):
        assert math.isfinite(parsed), (flag, parsed)
    if words[0] in context["recipes"]:
        settings_class, check = context["recipes"][words[0]]
        try:
            settings = settings_for(settings_class, args, words[0])
            check_recipe_settings(settings)
            check(settings)
        except PosttrainError as error:
            assert "\n" not in str(error) and len(str(error)) < 400, str(error)
            return False
    return True


def cli_setup(folder: Path) -> dict[str, Any]:
    return {"recipes": _recipe_checks()}


def cli_strategy() -> st.SearchStrategy:
    return st.tuples(st.sampled_from(numeric_flags()), NUMBER_TEXT)


SETTINGS_KEYS = ["steps", "learning_rate", "prompts", "eval_samples", "holdout", "seed",
                 "batch_size", "num_generations", "lora_rank", "run_name", "beta", "top_p",
                 "max_completion_length", "base_model", "no_such_key"]
YAML_VALUES = st.one_of(
    NUMBER_TEXT, JSON_VALUES.map(lambda v: json.dumps(v, allow_nan=True)),
    st.sampled_from(["&a [1, 2]", "*a", "!!python/object:os.system 'true'", "'1e-4'",
                     "[*b, *b, *b, *b]", "~", "yes", "0o17", "1_000", ".inf", "-.nan"]),
)


def check_settings_file(drawn: tuple[str, list[tuple[str, str]], bytes], context: dict[str, Any]
                        ) -> bool:
    """A --config file is read with a bounded, safe parser: its values become settings
    that pass the recipe's checks, or one PosttrainError line names the file and key."""
    import argparse

    from posttrain.cli import build_parser
    from posttrain.commands.recipe_command import settings_for
    from posttrain.errors import PosttrainError
    from posttrain.train.settings import check_recipe_settings

    suffix, pairs, junk = drawn
    path = context["folder"] / f"settings{suffix}"
    if suffix == ".json":
        text = json.dumps({key: value for key, value in pairs}, allow_nan=True).encode()
    elif suffix == ".toml":
        text = "\n".join(f"{key} = {value}" for key, value in pairs).encode("utf-8", "replace")
    else:
        bomb = 'a: &a ["x","x","x","x","x","x","x","x","x"]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a]\n'
        text = (bomb + "\n".join(f"{key}: {value}" for key, value in pairs)).encode(
            "utf-8", "replace")
    path.write_bytes(text + junk)
    args = build_parser().parse_args(["grpo", "--config", str(path)])
    assert isinstance(args, argparse.Namespace)
    settings_class, check = context["recipes"]["grpo"]
    started = time.perf_counter()
    try:
        settings = settings_for(settings_class, args, "grpo")
        check_recipe_settings(settings)
        check(settings)
    except PosttrainError as error:
        assert "\n" not in str(error) and len(str(error)) < 600, str(error)
        return False
    finally:
        assert time.perf_counter() - started < 5, "a settings file took seconds to read"
    return True


def settings_file_strategy() -> st.SearchStrategy:
    return st.tuples(st.sampled_from([".yaml", ".yml", ".json", ".toml"]),
                     st.lists(st.tuples(st.sampled_from(SETTINGS_KEYS), YAML_VALUES),
                              max_size=4),
                     st.sampled_from([b"", b"", b"\xff\xfe", b"\n:\n", b"\x00"]))


def settings_setup(folder: Path) -> dict[str, Any]:
    return {"folder": folder, "recipes": _recipe_checks()}


# --- the dashboard's query parameters -------------------------------------------------------

DASHBOARD_ROUTES = [
    ("/api/runs", []),
    ("/api/runs/sentinel", []),
    ("/api/runs/sentinel/metrics", ["names", "max_points", "after"]),
    ("/api/runs/sentinel/metrics.csv", ["names"]),
    ("/api/runs/sentinel/samples", ["which", "step", "limit"]),
    ("/api/runs/sentinel/rows.json", ["which"]),
    ("/api/runs/sentinel/rows.csv", ["which"]),
    ("/api/runs/no-such-run/metrics", ["names", "max_points", "after"]),
]


def dashboard_setup(folder: Path) -> dict[str, Any]:
    from posttrain.runs.server import start_in_thread
    from posttrain.ui.app import dashboard_server

    context = store_setup(folder)
    context["store"].close()
    (folder / SENTINEL).mkdir()
    (folder / SENTINEL / "holdout_after.jsonl").write_text(json.dumps(
        {"prompt": "=cmd|' /C calc'!A0", "reply": "-2+3", "score": 1.0, "category": "@x",
         "scenario_id": "s1", "eval_run": 0}) + "\n")
    server = dashboard_server(folder / "posttrain.db", port=0)
    context.update(server=server, thread=start_in_thread(server), store=server.store)
    return context


def check_dashboard_query(drawn: tuple[tuple[str, list[str]], list[tuple[bool, str]]],
                          context: dict[str, Any]) -> bool:
    """Any query string on any dashboard route is an answer (2xx or a JSON 4xx naming the
    parameter in one line), never a 500; CSV cells never start a spreadsheet formula."""
    from urllib.parse import urlencode

    (route, names), params = drawn
    # a route's own parameter names most of the time, an unknown one sometimes
    query = urlencode([(names[index % len(names)] if own and names else "junk",
                        value.encode("utf-8", "surrogatepass"))  # lone surrogates as bytes
                       for index, (own, value) in enumerate(params)])
    connection = http.client.HTTPConnection("127.0.0.1", context["server"].server_address[1],
                                            timeout=30)
    try:
        connection.request("GET", f"{route}?{query}")
        response = connection.getresponse()
        answer = response.read()
    finally:
        connection.close()
    assert response.status < 500, f"{route}?{query}: {response.status}: {answer[:300]!r}"
    if route.endswith(".csv") and response.status == 200:
        import csv
        import io

        for row in csv.reader(io.StringIO(answer.decode("utf-8"))):
            assert not any(cell[:1] in ("=", "+", "-", "@") for cell in row if cell), row
        return True
    body = json.loads(answer)
    if response.status >= 400:
        message = body["error"]["message"]
        assert "\n" not in message and len(message) < 400, message
    return response.status == 200


def dashboard_strategy() -> st.SearchStrategy:
    value = st.one_of(NUMBER_TEXT, ODD_STRINGS, st.text(max_size=300),
                      st.sampled_from(["before", "after", "monitor", "rollouts", "reward",
                                       "reward,loss", ",,,", "x" * 5000]))
    return st.tuples(st.sampled_from(DASHBOARD_ROUTES),
                     st.lists(st.tuples(st.sampled_from([True, True, False]), value),
                              max_size=3))


TARGETS: dict[str, Target] = {
    "dashboard_queries": Target("dashboard_queries", dashboard_strategy(),
                                check_dashboard_query, dashboard_setup, http_teardown),
    "cli_flags": Target("cli_flags", cli_strategy(), check_cli_flag, cli_setup),
    "settings_files": Target("settings_files", settings_file_strategy(), check_settings_file,
                             settings_setup),
    "prompt_file": Target("prompt_file", lines_of(VALID_PROMPT), check_prompt_file,
                          prompt_setup),
    "pairs_file": Target("pairs_file", st.tuples(lines_of(VALID_PAIR), st.booleans()),
                         check_pairs_file, lambda folder: {"folder": folder}),
    "ingest_ops": Target("ingest_ops", ops_strategy(), check_ingest_ops, store_setup,
                         lambda context: context["store"].close()),
    "ingest_http": Target("ingest_http", http_strategy(), check_ingest_http, http_setup,
                          http_teardown),
    "service_bodies": Target("service_bodies", service_strategy(), check_service_body),
    "strict_json": Target("strict_json",
                          JSON_VALUES.map(json_text) | st.text(max_size=60),
                          check_json_loads),
}


@dataclass
class FuzzResult:
    name: str
    examples: int  # inputs the check ran on
    accepted: int  # of which the target accepted (the rest got a named refusal)
    seconds: float


def run_target(name: str, examples: int, *, seed: int | None = None,
               time_budget: float | None = None) -> FuzzResult:
    """Run target ``name`` on up to ``examples`` generated inputs (fewer when
    ``time_budget`` seconds run out); a broken contract raises with the shrunk input."""
    target = TARGETS[name]
    count = accepted = 0
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{name}-") as folder:
        context = target.setup(Path(folder))
        try:
            @settings(max_examples=examples, deadline=None, database=None,
                      derandomize=seed is not None,
                      suppress_health_check=list(HealthCheck))
            @given(target.strategy)
            def run(drawn: Any) -> None:
                nonlocal count, accepted
                if time_budget is not None and time.perf_counter() - started > time_budget:
                    return
                count += 1
                accepted += bool(target.check(drawn, context))

            if seed is not None:
                from hypothesis import seed as fixed_seed

                run = fixed_seed(seed)(run)
            run()
        finally:
            target.teardown(context)
    return FuzzResult(name, count, accepted, time.perf_counter() - started)
