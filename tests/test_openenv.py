"""OpenEnv environments in, posttrain's rules out (issue #50), with the real ``openenv``
package: environments written with OpenEnv's own classes (tests/openenv_examples.py),
reached by URL and by MODULE:APP; rows whose scores are the environment's own rewards;
a short GRPO through one; the refund rule served by ``posttrain env serve`` and driven by
OpenEnv's own client; every error in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv")

# tests/openenv_examples.py is imported by the tests that use it: its import loads
# gradio (~4 CPU s), which every worker would otherwise pay to collect this file
from posttrain.cli import main
from posttrain.envs import get_env
from posttrain.errors import PosttrainError
from posttrain.runs.sqlite_store import SqliteRunStore
from posttrain.score.rows import grade

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def arith_server():
    """The arith app on a loopback port, as a server the tests reach by URL."""
    from posttrain.envs.ecosystem.openenv_server import local_server

    server = local_server("openenv_examples:arith_app")
    yield server
    server.stop()


def right_on_even_seeds(messages):
    """Answers the sum when the question's seed is even, something wrong otherwise."""
    question = messages[-1]["content"]
    a, b = (int(part.strip(" ?")) for part in question.removeprefix("What is ").split("+"))
    return f"{a + b}" if (a + b) % 2 == 0 else "I do not know"


def test_an_openenv_environment_by_url_and_by_module_grades_with_its_own_rewards(
        arith_server):
    from openenv_examples import arith_question, arith_reward
    by_url = get_env(f"openenv:{arith_server.url}?prompts=12")
    by_module = get_env("openenv:openenv_examples:arith_app?prompts=12&first_seed=3")
    try:
        assert by_url.action.text_field == "answer" and by_url.prompt_field == "prompt"
        assert set(by_url.categories) <= {"small", "large"}
        records = by_url.write_prompts(12, seed=0)
        assert [r["case"]["seed"] for r in records] == list(range(12))
        for record in records:  # the first observation is the prompt, its metadata the category
            a, b = arith_question(record["case"]["seed"])
            assert record["prompt"] == f"What is {a} + {b}?"
            assert record["category"] == ("small" if a + b < 60 else "large")
        rows = grade(by_url, records, right_on_even_seeds, 2)
        assert len(rows) == 24
        for row in rows:
            seed = int(row["scenario_id"].removeprefix("seed-"))
            assert row["score"] == arith_reward(seed, row["reply"])
            assert row["markers"] == {"action_ok": 1.0}
        assert {row["score"] for row in rows} == {0.0, 1.0}
        # by module: posttrain started the app itself; seeds from first_seed on
        module_records = by_module.write_prompts(4, seed=0)
        assert {r["case"]["seed"] for r in module_records} <= set(range(3, 15))
        assert by_module.server is not None and by_module.url.startswith("http://127.0.0.1:")
        for row in grade(by_module, module_records, right_on_even_seeds, 1):
            seed = int(row["scenario_id"].removeprefix("seed-"))
            assert row["score"] == arith_reward(seed, row["reply"])
    finally:
        by_url.close()
        by_module.close()
    # the app posttrain started is stopped with the environment
    with pytest.raises(PosttrainError, match="no answer from"):
        get_env(f"openenv:{by_module.url}?prompts=1")


def test_an_action_of_several_fields_takes_json_and_a_reply_that_is_none_fails():
    env = get_env("openenv:openenv_examples:tool_app?prompts=5")
    try:
        assert env.action.text_field is None and set(env.action.fields) == {"tool", "argument"}
        assert "JSON object" in env.system and env.messages_for("apple")[0]["role"] == "system"
        case = env.write_prompts(5, seed=0)[0]["case"]
        word = case["prompt"]
        assert env.score(json.dumps({"tool": "upper", "argument": word.upper()}), case) == 1.0
        assert env.score(f'```json\n{{"tool": "upper", "argument": "{word}"}}\n```', case) == 0.5
        for reply in ("upper it", '{"tool": "upper"}', '{"tool": "upper", "argument": 5}',
                      '{"tool": "upper", "argument": "x", "extra": 1}', "[]"):
            assert env.score(reply, case) == 0.0, reply
            assert env.markers(reply, case) == {"action_ok": 0.0}
    finally:
        env.close()


def test_episodes_run_on_several_sessions_at_once_as_far_as_the_server_allows(capsys):
    """concurrency=4 against a server that allows two sessions: two steps in flight at
    once (never more), said once; the rows are the ones one session at a time gives."""
    from openenv_examples import SlowArithEnv

    rows = {}
    for concurrency, app in ((1, "slow_arith_app_b"), (4, "slow_arith_app")):
        # each on an app of its own: a server frees a closed session's slot in its own time
        env = get_env(f"openenv:openenv_examples:{app}?prompts=12&concurrency={concurrency}")
        try:
            SlowArithEnv.peak = 0
            rows[concurrency] = grade(env, env.write_prompts(12, seed=0), right_on_even_seeds, 2)
            assert SlowArithEnv.peak == min(concurrency, 2), concurrency
            assert env.sessions.limit == min(concurrency, 2)
        finally:
            env.close()
    said = [line for line in capsys.readouterr().err.splitlines()
            if not line.startswith("openenv: serving")]
    assert len(said) == 1 and "the server allows 2 session(s) at once" in said[0], said
    assert [(r["scenario_id"], r["reply"], r["score"], r["markers"]) for r in rows[4]] == [
        (r["scenario_id"], r["reply"], r["score"], r["markers"]) for r in rows[1]]
    assert {row["score"] for row in rows[4]} == {0.0, 1.0}


@pytest.mark.parametrize("app, said", [
    ("nan_app", "ended with no reward; a reward must be a finite number"),
    ("none_app", "ended with no reward; a reward must be a finite number"),
    ("endless_app", "is not done after the policy's reply"),
])
def test_a_broken_reward_or_an_endless_episode_is_one_line(app, said):
    env = get_env(f"openenv:openenv_examples:{app}?prompts=2")
    try:
        with pytest.raises(PosttrainError) as refused:
            grade(env, env.write_prompts(2, seed=0), lambda messages: "42", 1)
        message = str(refused.value)
        assert said in message and "\n" not in message and app in message
    finally:
        env.close()


def test_a_server_that_is_down_slow_or_not_openenv_is_one_line(tmp_path, capsys):
    import http.server
    import threading

    class NotJson(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/slow/schema":
                time.sleep(3)
            try:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"<html>hello</html>")
            except BrokenPipeError:  # the slow case: the client gave up, as it should
                pass

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotJson)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        cases = [
            ("openenv:http://127.0.0.1:1", "no answer from http://127.0.0.1:1/schema"),
            (f"openenv:{base}", "did not answer JSON"),
            (f"openenv:{base}/slow?timeout_s=0.5", "no answer from"),
            ("openenv:openenv_examples:not_there", "has no 'not_there'"),
            ("openenv:openenv_examples:ToolEnv", "is not an ASGI app"),
            ("openenv:openenv_examples:arith_app?colour=red", "unknown --env-arg colour"),
            ("openenv:openenv_examples:arith_app?prompts=0", "prompts=0"),
        ]
        for spec, said in cases:
            code = main(["eval", "--env", spec, "--agent", "seeded", "--out",
                         str(tmp_path / "rows.jsonl")])
            err = capsys.readouterr().err
            assert code == 2, (spec, err)
            assert said in err and len(err.strip().splitlines()) == 1, (spec, err)
            assert not (tmp_path / "rows.jsonl").exists()
    finally:
        server.shutdown()


@pytest.mark.slow
def test_posttrain_eval_and_grpo_run_through_an_openenv_environment(arith_server,
                                                                   starter_2m_folder,
                                                                   tmp_path):
    from openenv_examples import arith_reward
    spec = f"openenv:{arith_server.url}?prompts=16"
    rows_file = tmp_path / "rows.jsonl"
    assert main(["eval", "--env", spec, "--base-model", "starter-2m", "--prompts", "16",
                 "--samples", "2", "--max-new-tokens", "16", "--out", str(rows_file)]) == 0
    rows = [json.loads(line) for line in rows_file.open()]
    assert rows
    for row in rows:  # the environment's own reward, row by row
        seed = int(row["scenario_id"].removeprefix("seed-"))
        assert row["score"] == arith_reward(seed, row["reply"])
    runs = tmp_path / "runs"
    code = main(["grpo", "--env", spec, "--base-model", "starter-2m", "--prompts", "16",
                 "--steps", "1", "--num-generations", "2", "--batch-size", "4",
                 "--eval-samples", "1", "--eval-repeats", "1", "--monitor-every", "1",
                 "--cold-start", "none", "--runs-dir", str(runs), "--run-name", "oe"])
    assert code in (0, 1)
    summary = json.loads((runs / "oe" / "summary.json").read_text())
    assert summary["status"] == "done"
    # the hack monitor re-graded the policy's holdout replies through the environment at
    # step 1; the reward audit ran on the base rows (too few per category here to scan)
    monitor = summary["monitor"]
    assert [check["step"] for check in monitor["checks"]] == [1], monitor
    assert set(summary["reward_audit"]["skipped"]) == {"large", "small"}  # too few rows here
    config = json.loads((runs / "oe" / "config.json").read_text())
    assert config["settings"]["env"] == spec


def test_posttrain_env_serve_gives_openenv_clients_the_rules_own_scores(tmp_path):
    """The refund rule served by `posttrain env serve`, driven by OpenEnv's own client:
    every reward equals posttrain's grading of the same reply; and posttrain's own --env
    openenv:URL on it grades as the refund rule does."""
    from openenv import GenericEnvClient

    from posttrain.envs.ecosystem.openenv_server import check_health, free_port

    port = free_port()
    serving = subprocess.Popen(
        [sys.executable, "-m", "posttrain", "env", "serve", "--env", "refund", "--prompts",
         "30", "--port", str(port), "--max-concurrent-envs", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                check_health(url, 1.0, "env serve")
                break
            except PosttrainError:
                assert serving.poll() is None, serving.stdout.read()
                assert time.monotonic() < deadline
                time.sleep(0.2)
        refund = get_env("refund")
        records = refund.write_prompts(30, seed=0)
        agent = refund.scripted_agent(seed=5)
        with GenericEnvClient(base_url=url).sync() as client:
            for index, record in enumerate(records[:12]):
                first = client.reset(seed=index)
                assert first.observation["prompt"] == record["prompt"]
                reply = agent(refund.messages_for(record["prompt"]))
                result = client.step({"reply": reply})
                expected = grade(refund, [record], lambda messages, r=reply: r, 1)[0]
                assert result.done and result.reward == expected["score"]
                assert result.metadata["category"] == expected["category"]
                assert result.metadata["passed"] == bool(expected["reward"])
        # posttrain's own adapter on the served rule grades as the rule itself does
        # (30 situations give the refund writer 40 prompts: one per seed)
        served = get_env(f"openenv:{url}?prompts={len(records)}&action_field=reply")
        try:
            replies = {r["prompt"]: agent(refund.messages_for(r["prompt"])) for r in records}
            assert served.system == refund.system  # the rule's system prompt came along
            served_rows = grade(served, served.write_prompts(len(records), seed=0),
                                lambda messages: replies[messages[-1]["content"]], 1)
            own_rows = grade(refund, records, lambda messages: replies[messages[-1]["content"]],
                             1)
            assert sorted((r["prompt"], r["score"]) for r in served_rows) == sorted(
                (r["prompt"], r["score"]) for r in own_rows)
        finally:
            served.close()
    finally:
        serving.terminate()
        serving.wait(timeout=30)


@pytest.mark.slow
def test_trl_trains_on_a_rule_posttrain_serves(starter_2m_folder, tmp_path):
    """TRL's own GRPOTrainer (not posttrain's recipe) trains a step on the refund rule
    served as an OpenEnv environment: prompts from reset(), rewards from step() over
    openenv's client, each the rule's own score of the completion."""
    from datasets import Dataset
    from openenv import GenericEnvClient
    from trl import GRPOConfig, GRPOTrainer

    from posttrain.envs.ecosystem.openenv_server import LocalServer
    from posttrain.score.openenv_served import openenv_app

    refund = get_env("refund")
    records = refund.write_prompts(30, seed=0)
    server = LocalServer("refund", openenv_app(refund, records, 2)).start()
    scored = []
    try:
        with GenericEnvClient(base_url=server.url).sync() as client:
            rows = [{"prompt": client.reset(seed=seed).observation["messages"], "seed": seed}
                    for seed in range(4)]

            def served_reward(completions, seed, **_):
                rewards = []
                for completion, episode in zip(completions, seed, strict=True):
                    text = completion[-1]["content"]
                    client.reset(seed=episode)
                    rewards.append(client.step({"reply": text}).reward)
                    scored.append((episode, text, rewards[-1]))
                return rewards

            trainer = GRPOTrainer(
                model=str(starter_2m_folder), reward_funcs=served_reward,
                train_dataset=Dataset.from_list(rows),
                args=GRPOConfig(output_dir=str(tmp_path / "trl"), max_steps=1,
                                per_device_train_batch_size=8, num_generations=4,
                                max_completion_length=32, use_cpu=True, bf16=False,
                                report_to="none", save_strategy="no", logging_steps=1,
                                disable_tqdm=True, seed=0))
            trainer.train()
    finally:
        server.stop()
    assert len(scored) == 8
    for episode, text, reward in scored:  # the served reward is the rule's score
        assert reward == refund.score(text, refund.case_for(records[episode]["prompt"]))
    logged = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert logged and logged[0]["reward"] == pytest.approx(
        sum(reward for *_, reward in scored) / len(scored))


def test_a_recipe_without_a_base_model_says_which_to_bring(tmp_path, capsys):
    # an app no other test's run holds sessions of (arith_app is the fixture server's too)
    code = main(["grpo", "--env", "openenv:openenv_examples:tool_app?prompts=10",
                 "--runs-dir", str(tmp_path / "runs")])
    serving, *refusal = capsys.readouterr().err.strip().splitlines()
    assert serving.startswith("openenv: serving openenv_examples:tool_app on http://127.0.0.1:")
    assert code == 2 and len(refusal) == 1 and "bring a base model with --base-model" in refusal[0]
    assert not (tmp_path / "runs").exists()


def test_the_other_commands_take_an_openenv_environment(tmp_path, capsys):
    """prompts write writes the first observations with their seeds; sft and model build,
    which need the rule's right moves, say in one line which hook it lacks."""
    from openenv_examples import ToolEnv
    spec = "openenv:openenv_examples:tool_app?prompts=6"
    out = tmp_path / "prompts.jsonl"
    assert main(["prompts", "write", str(out), "--prompts", "6", "--env", spec]) == 0
    records = [json.loads(line) for line in out.open()]
    assert sorted(r["seed"] for r in records) == list(range(6))
    assert all(r["prompt"] == ToolEnv.WORDS[r["seed"] % 5] for r in records)
    for command in (["sft", "--base-model", "starter-2m", "--runs-dir", str(tmp_path / "runs")],
                    ["model", "build"]):
        capsys.readouterr()
        assert main([*command, "--env", spec]) == 2, command
        said = capsys.readouterr().err.splitlines()
        # beside the refusal: the app's start, and (on a busy machine, when the previous
        # command's sessions were still closing on the shared app) the capacity it found
        serving = [line for line in said if line.startswith("openenv: serving")]
        refusal = [line for line in said
                   if line not in serving and "session(s) at once" not in line]
        assert len(refusal) == 1 and "reference_agent hook" in refusal[0], refusal
        assert len(serving) == 1, said  # the app started once, not per check
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_ctrl_c_stops_the_run_and_the_app_it_started(starter_2m_folder, tmp_path):
    """SIGINT mid-run: the command exits 130, leaves no rows file, and the app it served
    answers no more."""
    import signal

    from posttrain.envs.ecosystem.openenv_server import check_health

    rows = tmp_path / "rows.jsonl"
    run = subprocess.Popen(
        [sys.executable, "-m", "posttrain", "eval", "--env",
         "openenv:openenv_examples:slow_arith_app?prompts=200", "--base-model", "starter-2m",
         "--samples", "8", "--out", str(rows)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])})
    try:
        line = run.stderr.readline()
        assert line.startswith("openenv: serving"), line
        url = line.split(" on ")[1].split()[0]
        check_health(url, 5.0, "the app the run serves")
        time.sleep(1.5)
        assert run.poll() is None, "the run ended before it could be interrupted"
        run.send_signal(signal.SIGINT)
        assert run.wait(timeout=60) == 130, run.stderr.read()
    finally:
        if run.poll() is None:
            run.kill()
    with pytest.raises(PosttrainError, match="no answer from"):
        check_health(url, 2.0, "the app the run served")
    assert not rows.exists()


@pytest.mark.slow
def test_ctrl_c_exits_within_two_seconds_while_an_episode_hangs(starter_2m_folder, tmp_path):
    """SIGINT while a step hangs on the server (timeout_s a minute away): the command
    says it was interrupted and the process is gone within 2 s (it lived on until the
    step's timeout, waiting for the thread stuck in it)."""
    import signal

    marker = tmp_path / "stepping"
    run = subprocess.Popen(
        [sys.executable, "-m", "posttrain", "eval", "--env",
         "openenv:openenv_examples:hanging_app?prompts=4&timeout_s=60", "--base-model",
         "starter-2m", "--samples", "1", "--max-new-tokens", "8"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "HANG_MARKER": str(marker),
             "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])})
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), run.stderr.read() if run.poll() is not None else "no step"
        time.sleep(0.5)  # the step is hanging now
        interrupted = time.monotonic()
        run.send_signal(signal.SIGINT)
        code = run.wait(timeout=30)
        took = time.monotonic() - interrupted
    finally:
        if run.poll() is None:
            run.kill()
    err = run.stderr.read()
    assert code == 130 and "interrupted" in err, err
    assert took < 3.0, took  # 1.5 s for what is left (2 s on a quiet machine), and slack


class ReplayTurns:
    """An agent that says ``turns`` in order, one per assistant turn so far."""

    def __init__(self, turns):
        self.turns = turns

    def __call__(self, messages):
        return self.turns[sum(m["role"] == "assistant" for m in messages)]


def test_env_serve_plays_a_multi_turn_rule_a_turn_a_step():
    """refund-multiturn served: an OpenEnv client plays each episode a turn a step (tool
    results back as messages); the final reward, markers and conversation are what
    posttrain's own episode runner and grading give the same turns."""
    from openenv import GenericEnvClient

    from posttrain.envs.ecosystem.openenv_server import LocalServer
    from posttrain.score.openenv_served import openenv_app

    env = get_env("refund-multiturn")
    records = env.write_prompts(16, seed=0)
    server = LocalServer("refund-multiturn", openenv_app(env, records, 2)).start()
    rewards = set()
    try:
        with GenericEnvClient(base_url=server.url).sync() as client:
            for agent in (env.scripted_agent(seed=5), env.scripted_agent(seed=11)):
                for index, record in enumerate(records[:8]):
                    result = client.reset(seed=index)
                    messages = list(result.observation["messages"])
                    assert messages == env.messages_for(record["prompt"])
                    turns = []
                    while not result.done:
                        turns.append(agent(messages))
                        result = client.step({"reply": turns[-1]})
                        messages += [{"role": "assistant", "content": turns[-1]},
                                     *result.observation["messages"]]
                        assert len(turns) <= env.max_turns
                    row = grade(env, [record], ReplayTurns(turns), 1)[0]
                    assert result.reward == row["score"], (index, turns)
                    assert result.metadata["markers"] == row["markers"]
                    assert result.metadata["episode"] == row["episode"]
                    assert messages[len(env.messages_for(record["prompt"])):] == [
                        {key: m[key] for key in m} for m in row["transcript"]]
                    rewards.add(result.reward)
            with pytest.raises(Exception, match="episode is over"):
                client.step({"reply": "one more"})
    finally:
        server.stop()
    assert len(rewards) > 1  # passing and failing episodes both came through


def test_a_multi_step_environment_plays_each_turn_as_a_step():
    """Episodes of several steps (--env-arg max_turns): each policy turn that calls `act`
    is a step and the observation comes back; the reward is the episode's last (or sum);
    a server that allows one session is enough, whatever the number of episodes."""
    from posttrain.envs.wire import join_turns, render_tool_call
    from posttrain.score.episodes import play_episodes

    env = get_env("openenv:openenv_examples:two_step_app?prompts=6&max_turns=4")
    try:
        assert env.multi_turn and env.tools[0]["function"]["name"] == "act"
        assert "act" in env.system and env.messages_for("x")[0]["role"] == "system"
        records = env.write_prompts(6, seed=0)
        assert set(env.categories) == {"even", "odd"}

        def said(word):
            return render_tool_call("act", {"word": word})

        def agent(messages):  # hello then bye on even visitors; hello, hello on odd ones
            visitor = int(messages[1]["content"].split()[1].rstrip(":"))
            turns = sum(1 for m in messages if m["role"] == "assistant")
            return said("hello" if turns == 0 or visitor % 2 else "bye")

        starts = [(env.messages_for(r["prompt"]), r["case"], 0) for r in records]
        played = play_episodes(env, starts, agent)  # six episodes at once, one session
        for record, episode in zip(records, played, strict=True):
            seed = record["case"]["seed"]
            assert len(episode.turns) == 2
            assert episode.transcript[1]["content"].startswith("Now say bye.")
            expected = 1.0 if seed % 2 == 0 else 0.0
            assert env.score(episode.reply, record["case"]) == expected
            assert env.episode_summary(episode.reply, record["case"])["ended"] == "done"
        case = records[0]["case"]
        # a reply that stops after the hello scores what it had; sum adds the two rewards
        assert env.score(said("hello"), case) == 0.5
        assert env.markers(said("hello"), case) == {"done": 0.0, "action_ok": 1.0}
        assert env.score(render_tool_call("act", {"wrong": 1}), case) == 0.0
        # TRL's environment class: reset reads the seed, act takes a step
        desk_class = env.trl_environment()
        desk = desk_class()
        desk.reset(case=json.dumps(case))
        assert desk.act(word="hello").startswith("Now say bye.")
        assert "done" in desk.act(word="bye")
        import inspect

        assert list(inspect.signature(desk_class.act).parameters) == ["self", "word"]
    finally:
        env.close()
    # (after the first adapter's session closed: the server allows one at a time)
    summed = get_env("openenv:openenv_examples:two_step_app?prompts=2&max_turns=4&reward=sum")
    try:
        assert summed.score(join_turns([said("hello"), said("bye")]), case) == 1.5
    finally:
        summed.close()


@pytest.mark.slow
def test_a_run_on_an_environment_that_breaks_is_marked_failed_in_one_line(starter_2m_folder,
                                                                            tmp_path, capsys):
    """A reward of NaN mid-run: exit 2, one error line naming the environment, the run
    marked failed in its summary and the store, no adapter left behind."""
    runs = tmp_path / "runs"
    code = main(["grpo", "--env", "openenv:openenv_examples:nan_app?prompts=8",
                 "--base-model", "starter-2m", "--prompts", "8", "--steps", "1",
                 "--num-generations", "2", "--batch-size", "4", "--eval-samples", "1",
                 "--eval-repeats", "1", "--monitor-every", "0", "--cold-start", "none",
                 "--runs-dir", str(runs), "--run-name", "broken"])
    err = capsys.readouterr().err
    assert code == 2
    errors = [line for line in err.splitlines() if line.startswith("posttrain grpo: error")]
    assert len(errors) == 1 and "nan_app" in errors[0] and "finite number" in errors[0], err
    summary = json.loads((runs / "broken" / "summary.json").read_text())
    assert summary["status"] == "failed" and "finite number" in summary["error"]
    assert not (runs / "broken" / "adapter").exists()
    with SqliteRunStore(runs / "posttrain.db") as store:
        assert store.get_run("broken")["status"] == "failed"


def hostile_openenv_app(reset_answer, step_answer, schema=None):
    """A bare Starlette app speaking OpenEnv's wire: ``/health``, ``/schema`` and the
    WebSocket ``/ws``, answering every reset and step with the JSON given (what a
    broken or hostile server may send; OpenEnv's own server would not)."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route, WebSocketRoute

    schema = schema or {"action": {"properties": {"reply": {"type": "string"}},
                                   "type": "object"},
                        "observation": {"properties": {"prompt": {"type": "string"}}}}

    async def socket(websocket):
        await websocket.accept()
        try:
            while True:
                message = json.loads(await websocket.receive_text())
                if message["type"] == "close":
                    break
                data = reset_answer if message["type"] == "reset" else step_answer
                await websocket.send_text(json.dumps({"type": "observation", "data": data}))
        except Exception:
            pass

    return Starlette(routes=[
        Route("/health", lambda request: JSONResponse({"status": "healthy"})),
        Route("/schema", lambda request: JSONResponse(schema)),
        WebSocketRoute("/ws", socket)])


GOOD_RESET = {"observation": {"prompt": "2+2?"}, "reward": None, "done": False}


@pytest.mark.parametrize("reset_answer, step_answer, said", [
    ({"observation": "a string", "done": False}, None, "observation as a string"),
    ({"observation": 7, "done": False}, None, "observation as a number"),
    ({"observation": {"prompt": "x", "metadata": "cat"}, "done": False}, None,
     "metadata as a string"),
    ({"observation": {"prompt": "x", "metadata": [1]}, "done": False}, None,
     "metadata as a list"),
    ({"observation": {"prompt": "x" * 50_000}, "done": False}, None, "50,000 characters"),
    (GOOD_RESET, {"observation": {}, "reward": 1.0, "done": "false"}, "done as a string"),
    (GOOD_RESET, {"observation": {}, "reward": 1.7e308, "done": True}, "reward 1.7e+308"),
    (GOOD_RESET, {"observation": {}, "reward": -1.7e308, "done": True}, "reward -1.7e+308"),
    (GOOD_RESET, {"observation": {}, "reward": int("9" * 4000), "done": True},
     "digits"),
    (GOOD_RESET, {"observation": {}, "reward": "1", "done": True}, "a string"),
])
def test_an_openenv_answer_of_the_wrong_shape_is_one_line_naming_the_field(
        reset_answer, step_answer, said, tmp_path, capsys):
    from posttrain.envs.base import case_of
    from posttrain.envs.ecosystem.openenv_server import LocalServer

    server = LocalServer("hostile", hostile_openenv_app(reset_answer, step_answer)).start()
    spec = f"openenv:{server.url}?prompts=2&action_field=reply"
    try:
        if step_answer is None:  # the first observations are read as the env loads
            code = main(["prompts", "write", "--env", spec, str(tmp_path / "p.jsonl")])
            err = capsys.readouterr().err
            assert code == 2 and "Traceback" not in err, err
            message = err.strip().splitlines()[-1]
        else:  # a reply's episode, graded
            env = get_env(spec)
            try:
                record = env.write_prompts(1, seed=0)[0]
                with pytest.raises(PosttrainError) as refused:
                    env.score("4", case_of(env, record))
            finally:
                env.close()
            message = str(refused.value)
    finally:
        server.stop()
    assert said in message and "openenv:http://127.0.0.1" in message, message
    assert "\n" not in message and len(message) < 400, message


@pytest.mark.parametrize("schema, said", [
    ([1, 2], "/schema's answer is a list"),
    ({"observation": {}}, "/schema's action is null"),
    ({"action": {"properties": [1, 2]}}, "action properties is a list"),
    ({"action": {"properties": "reply"}}, "action properties is a string"),
    ({"action": {"properties": {"reply": "string"}}}, "action field 'reply' is a string"),
    ({"action": {"properties": {"reply": {"anyOf": "x"}}}}, "field 'reply''s types"),
    ({"action": {"properties": {"reply": {"type": "string"}}, "required": "reply"}},
     "action required fields is a string"),
    ({"action": {"properties": {}}, "observation": []}, "observation is a list"),
])
def test_a_schema_of_the_wrong_shape_is_one_line_naming_the_part(schema, said):
    from posttrain.envs.ecosystem.openenv_server import LocalServer

    server = LocalServer("hostile", hostile_openenv_app(GOOD_RESET, None, schema)).start()
    try:
        with pytest.raises(PosttrainError) as refused:
            get_env(f"openenv:{server.url}?prompts=2")
    finally:
        server.stop()
    message = str(refused.value)
    assert said in message and "\n" not in message, message


def test_a_schema_that_trickles_or_redirects_elsewhere_is_refused_in_time():
    import http.server

    class Trickle(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/schema" and self.server.redirect:
                self.send_response(302)
                self.send_header("Location", "http://198.51.100.7:9/schema")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "1000")
            self.end_headers()
            try:
                for _ in range(1000):  # a byte a 0.2 s: each read is quick, the whole is not
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                pass

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    server.daemon_threads = True
    server.redirect = False
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        started = time.monotonic()
        with pytest.raises(PosttrainError, match="did not finish its answer in time"):
            get_env(f"openenv:{base}?timeout_s=1.5")
        assert time.monotonic() - started < 4
        server.redirect = True
        with pytest.raises(PosttrainError, match="redirected to another host"):
            get_env(f"openenv:{base}?timeout_s=5")
    finally:
        server.shutdown()
