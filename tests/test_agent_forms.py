"""Every agent form the contract documents (posttrain.agents) is taken wherever an agent
is: a plain callable ``agent(messages) -> str`` as much as a batch agent."""

from __future__ import annotations

import json
from pathlib import Path

from posttrain.agents import agent_identity, agent_sampling
from posttrain.cli import main

PLAIN_AGENT_ENV = """
from examples.library_env import LibraryEnv


def always_chat(messages):
    return "We open at nine."


class PlainAgentLibrary(LibraryEnv):
    def scripted_agent(self, seed=0, behaviour=None):
        return always_chat


ENV = PlainAgentLibrary()
"""


def test_a_plain_callable_is_described_by_its_name():
    def polite(messages):
        return "hello"

    assert agent_identity(polite) == {"agent": "polite"}
    assert agent_sampling(polite) == {}


def test_eval_takes_an_environments_plain_callable_scripted_agent(tmp_path, capsys,
                                                                   monkeypatch):
    root = Path(__file__).resolve().parents[1]
    monkeypatch.syspath_prepend(str(root))  # examples/ is importable as a package path
    env_file = tmp_path / "plain_env.py"
    env_file.write_text(PLAIN_AGENT_ENV)
    out = tmp_path / "rows.jsonl"
    code = main(["eval", "--env", f"{env_file}:ENV", "--agent", "seeded", "--prompts", "60",
                 "--samples", "2", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert "policy: agent=always_chat" in printed
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all(row["policy"] == {"agent": "always_chat"} for row in rows)
    assert all(row["reply"] == "We open at nine." for row in rows)
