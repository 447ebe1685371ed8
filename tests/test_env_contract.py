"""The typed environment contract (posttrain.envs.base): hooks found by protocol, refused
with the flag that replaces them, multi-turn declared rather than guessed, and mypy
passing on the contract and on every module that calls into a hook."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from posttrain.envs import get_env
from posttrain.envs.base import (
    ConstructedNegatives,
    MultiTurnEnv,
    PromptWriter,
    ReferenceAgentSource,
    check_env,
    has_hook,
    is_multi_turn,
    require_hook,
)
from posttrain.errors import PosttrainError

ROOT = Path(__file__).resolve().parents[1]
MYPY = Path(sys.executable).with_name("mypy")


@dataclass(frozen=True)
class PlainRule:
    """The five required members and nothing else."""

    name: str = "plain"
    categories: tuple[str, ...] = ("only",)
    tools: tuple = ()
    system: str = "Answer."

    def messages_for(self, prompt: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": prompt}]

    def case_for(self, prompt: str) -> dict[str, Any]:
        return {}

    def category(self, case: dict[str, Any]) -> str:
        return "only"

    def score(self, reply: str, case: dict[str, Any]) -> float:
        return 1.0

    def markers(self, reply: str, case: dict[str, Any]) -> dict[str, float]:
        return {}


class DeskOnly(PlainRule):
    """Episode members without the declaration."""

    max_turns = 3

    def new_desk(self, case: dict[str, Any]) -> Any:
        return None

    def episode_summary(self, reply: str, case: dict[str, Any]) -> dict[str, Any]:
        return {}

    def trl_environment(self) -> type:
        return object


class DeclaredOnly(PlainRule):
    """The declaration without the episode members."""

    multi_turn = True


class DeclaredEpisodes(DeskOnly):
    multi_turn = True


def test_the_built_in_environments_provide_the_hooks_they_document():
    refund, desk = get_env("refund"), get_env("refund-multiturn")
    for hook in (PromptWriter, ReferenceAgentSource, ConstructedNegatives):
        assert has_hook(refund, hook)
    assert not is_multi_turn(refund)
    assert is_multi_turn(desk) and has_hook(desk, MultiTurnEnv)
    assert not has_hook(desk, ConstructedNegatives)


def test_a_missing_hook_is_refused_naming_it_and_the_flag_instead():
    with pytest.raises(PosttrainError) as raised:
        require_hook(PlainRule(), PromptWriter, "writes no prompts", "give --prompts-file")
    assert str(raised.value) == ("environment 'plain' writes no prompts (no write_prompts "
                                 "hook): give --prompts-file")


def test_a_hook_attribute_that_is_not_callable_does_not_count():
    rule = PlainRule()
    object.__setattr__(rule, "write_prompts", "not a function")
    assert not has_hook(rule, PromptWriter)


def test_require_hook_hands_back_the_environment_when_the_hook_is_there():
    refund = get_env("refund")
    writer = require_hook(refund, PromptWriter, "writes no prompts", "give --prompts-file")
    assert writer is refund
    assert len(writer.write_prompts(3, seed=0)) >= 3


def test_multi_turn_is_declared_not_inferred():
    assert not is_multi_turn(DeskOnly())
    assert is_multi_turn(DeclaredEpisodes())
    assert check_env(DeclaredEpisodes(), "--env 'x'") is not None


def test_episode_members_without_the_declaration_are_refused():
    with pytest.raises(PosttrainError, match="has new_desk but does not declare "
                                             "multi_turn = True"):
        check_env(DeskOnly(), "--env 'desk.py:ENV'")


def test_the_declaration_without_the_members_is_refused_naming_them():
    with pytest.raises(PosttrainError, match="declares multi_turn = True but lacks "
                                             "max_turns, new_desk, episode_summary, "
                                             "trl_environment"):
        check_env(DeclaredOnly(), "--env 'x'")


def test_an_object_without_the_required_members_is_refused_naming_them():
    with pytest.raises(PosttrainError, match="lacks name, categories"):
        check_env(object(), "--env 'x'")


@pytest.mark.skipif(not MYPY.exists(), reason="mypy is in the dev extra")
def test_mypy_passes_on_the_contract_and_every_hook_call():
    # the files are listed in pyproject.toml ([tool.mypy] files). mypy's own incremental
    # cache, kept in the virtual environment (not the checkout): it re-reads what changed
    # and gives the answer a run without it gives (26 s -> 1-2 s here when little changed)
    cache = (["--cache-dir", str(Path(sys.prefix) / "mypy-cache")]
             if sys.prefix != sys.base_prefix else ["--no-incremental"])
    result = subprocess.run([str(MYPY), *cache], cwd=ROOT, capture_output=True,
                            text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout


def test_no_type_ignore_in_the_environments_or_at_the_hook_calls():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    paths = [path for entry in files for path in (
        sorted((ROOT / entry).rglob("*.py")) if (ROOT / entry).is_dir() else [ROOT / entry])]
    assert len(paths) > 20
    flagged = [f"{path.relative_to(ROOT)}:{number}" for path in paths
               for number, line in enumerate(path.read_text().splitlines(), 1)
               if "type: ignore" in line]
    assert flagged == []


BROKEN_SCORE_ENV = '''
import math
from posttrain.envs.refund.env import RefundEnv


class BrokenScore(RefundEnv):
    answer = None

    def score(self, reply, case):
        if self.answer == "raise":
            raise KeyError("order_id")
        return self.answer


NONE = BrokenScore()
TEXT = BrokenScore()  # a frozen dataclass: answers set through object.__setattr__
object.__setattr__(TEXT, "answer", "1")
NAN = BrokenScore()
object.__setattr__(NAN, "answer", math.nan)
RAISES = BrokenScore()
object.__setattr__(RAISES, "answer", "raise")
'''


@pytest.mark.parametrize("name, said", [
    ("NONE", "returned None: a score must be a finite number"),
    ("TEXT", "returned '1': a score must be a finite number"),
    ("NAN", "returned nan: a score must be a finite number"),
    ("RAISES", "raised KeyError: 'order_id'"),
])
def test_a_score_hook_that_returns_no_number_or_raises_is_one_line(tmp_path, monkeypatch,
                                                                   capsys, name, said):
    from posttrain.cli import main

    (tmp_path / "broken_score.py").write_text(BROKEN_SCORE_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["eval", "--agent", "seeded", "--env", f"broken_score:{name}",
                 "--prompts", "20"])
    err = capsys.readouterr().err
    assert code == 2, err
    last = err.strip().splitlines()[-1]  # after the data's description
    assert said in last and "the score of environment" in last and "on scenario" in last
    assert "Traceback" not in err


@pytest.mark.parametrize("code", ["0", "3", "'bye'"])
def test_an_environment_module_that_exits_at_import_is_one_line_not_a_quiet_end(
        tmp_path, capsys, code):
    from posttrain.cli import main

    (tmp_path / "leaves.py").write_text(f"import sys\nsys.exit({code})\nENV = None\n")
    status = main(["eval", "--agent", "seeded", "--env", f"{tmp_path / 'leaves.py'}:ENV"])
    err = capsys.readouterr().err
    assert status == 2
    assert f"called sys.exit({code})" in err and "if __name__ == '__main__'" in err
    assert len(err.strip().splitlines()) == 1
