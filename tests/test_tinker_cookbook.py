"""The unmodified tinker-cookbook 0.6.1 loops against `posttrain serve`, offline.

`tinker_cookbook.supervised.train` (on a local JSONL of conversations: its loss falls) and
`tinker_cookbook.rl.train` (importance_sampling on a small in-test environment: its reward
rises) run against a server on 127.0.0.1 with starter-2m; a short RL run is then continued
from its `checkpoints.jsonl`, which the cookbook resumes through
`create_training_client_from_state_with_optimizer`. The model name handed to the
cookbook is starter-2m's local folder, with the `qwen3_instruct` renderer (the starters'
chat template; the cookbook's name tables only know hub models); nothing reaches a hub.

The cookbook is installed with `--no-deps` (scripts/venv.sh says why); without it these
tests are skipped.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import pytest

pytest.importorskip("torch")
pytest.importorskip("tinker")
pytest.importorskip("tinker_cookbook")

import chz
from tinker_cookbook import renderers
from tinker_cookbook.rl import train as rl_train
from tinker_cookbook.rl.problem_env import ProblemEnv, ProblemGroupBuilder
from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset, RLDatasetBuilder
from tinker_cookbook.supervised import train as sl_train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig
from tinker_cookbook.tokenizer_utils import get_tokenizer

from posttrain.service.engine import Engine
from posttrain.service.server import start_server

BASE = "starter-2m"
# the cookbook's Qwen3 instruct renderer writes `<|im_start|>role\n...<|im_end|>`, the
# starters' own chat template; under `role_colon`, a format the starter never saw, the RL
# reward started at 0.0 and then rose or collapsed to empty replies by luck (7 of 24 runs)
RENDERER = "qwen3_instruct"


@pytest.fixture(scope="module", autouse=True)
def offline_sdk():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TINKER_API_KEY", "tml-local")
        patch.setenv("TINKER_TELEMETRY", "0")
        patch.setenv("HF_DATASETS_OFFLINE", "1")
        yield


@pytest.fixture(scope="module")
def server(starter_2m_folder, tmp_path_factory):
    import torch

    from posttrain.policy.loading import load_policy

    threads = torch.get_num_threads()
    policy = load_policy(BASE, device="cpu", show_progress=False)
    engine = Engine(BASE, tmp_path_factory.mktemp("state"), policy=policy, torch_threads=1)
    running = start_server(engine, port=0)
    yield running
    running.stop()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model_folder(server):
    """The base model's local folder: the cookbook's model name and tokenizer here."""
    return str(server.engine.policy.source)


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def with_lora_seed(monkeypatch, seed: int) -> None:
    """The cookbook asks for a training client without a LoRA seed, so the service draws
    one (as Tinker does); this makes the SDK send ``seed``. Why: from a drawn seed the
    supervised loss below fell to 0.60-0.73 of its start in 12 runs here, but one suite run
    overshot at its fourth step (a loss of 7.9) and ended at 0.92, over the bound; seeds
    0-11 given: 0.59-0.63 each (2026-12-06, Intel Xeon)."""
    import tinker

    create = tinker.ServiceClient.create_lora_training_client

    def seeded(self, *args, **kwargs):
        kwargs.setdefault("seed", seed)
        return create(self, *args, **kwargs)

    monkeypatch.setattr(tinker.ServiceClient, "create_lora_training_client", seeded)


def test_the_supervised_loop_trains_and_saves(server, model_folder, tmp_path, monkeypatch):
    with_lora_seed(monkeypatch, 0)
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"Where is order ORD-{1000 + i}?"},
        {"role": "assistant", "content": f"Order ORD-{1000 + i} ships tomorrow."}]}) + "\n"
        for i in range(8)))
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=model_folder,
                                            renderer_name=RENDERER, max_length=256,
                                            batch_size=4)
    config = sl_train.Config(
        log_path=str(tmp_path / "log"), model_name=model_folder, recipe_name="posttrain-test",
        renderer_name=RENDERER, lora_rank=8, learning_rate=5e-3, base_url=server.url,
        dataset_builder=FromConversationFileBuilder(file_path=str(chats), common_config=common),
        save_every=4, eval_every=0, infrequent_eval_every=0, num_epochs=4)
    asyncio.run(sl_train.main(config))
    metrics = records(tmp_path / "log" / "metrics.jsonl")
    assert [row["step"] for row in metrics] == list(range(8))  # 4 passes over 2 batches
    # the loss falls as the 8 conversations are learned (seed 0: 6.03 -> 3.40 here)
    nll = [row["train_mean_nll"] for row in metrics]
    assert all(0 < value < 20 for value in nll)
    assert sum(nll[-2:]) / 2 < 0.85 * sum(nll[:2]) / 2, nll
    final = records(tmp_path / "log" / "checkpoints.jsonl")[-1]
    assert final["name"] == "final" and final["state_path"].startswith("tinker://run-")
    assert "/sampler_weights/final" in final["sampler_path"]


class OrderQuestion(ProblemEnv):
    """Reward 1 when the reply mentions an order id (the starter was trained on such)."""

    def __init__(self, renderer, number: int):
        super().__init__(renderer, require_stop_sequence_for_format=False)
        self.number = number

    def get_question(self) -> str:
        return f"Where is order ORD-{self.number}?"

    def check_answer(self, response: str) -> bool:
        return "ORD" in response

    def check_format(self, response: str) -> bool:
        return bool(response.strip())

    def get_reference_answer(self) -> str:
        return f"ORD-{self.number}"


class OrderQuestions(RLDataset):
    def __init__(self, renderer, batches: int, groups: int, group_size: int):
        self.renderer = renderer
        self.batches = batches
        self.groups = groups
        self.group_size = group_size

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return [ProblemGroupBuilder(env_thunk=lambda n=self.groups * index + k: OrderQuestion(
            self.renderer, 1000 + n), num_envs=self.group_size) for k in range(self.groups)]

    def __len__(self) -> int:
        return self.batches


@chz.chz
class OrderQuestionsBuilder(RLDatasetBuilder):
    model_folder: str
    renderer_name: str = RENDERER
    batches: int = 4
    groups: int = 2
    group_size: int = 4

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        tokenizer = get_tokenizer(self.model_folder)
        renderer = renderers.get_renderer(self.renderer_name, tokenizer)
        return OrderQuestions(renderer, self.batches, self.groups, self.group_size), None


def rl_config(server, model_folder, log_path, max_steps: int, *, learning_rate: float = 1e-3,
              groups: int = 2, group_size: int = 4) -> rl_train.Config:
    dataset = OrderQuestionsBuilder(model_folder=model_folder, batches=max_steps,
                                    groups=groups, group_size=group_size)
    return rl_train.Config(
        learning_rate=learning_rate, model_name=model_folder, recipe_name="posttrain-test",
        dataset_builder=dataset, max_tokens=8,
        log_path=str(log_path), renderer_name=RENDERER, lora_rank=8,
        base_url=server.url, loss_fn="importance_sampling", eval_every=0, save_every=1,
        max_steps=max_steps)


def test_the_rl_loops_reward_rises(server, model_folder, tmp_path):
    """16 steps of 4 groups x 8 replies at learning rate 3e-4: the share of replies that
    name an order id climbs from about 0.35 to about 0.8. Measured here (2026-12-06, Intel
    Xeon, LoRA seeds drawn) over 12 runs: the last 8 steps averaged 0.32-0.52 above the
    first 3, and no step of those 8 read under 0.56. At 5e-4, as before, the rise was the
    same (0.32-0.58 over 22 runs alone), but one suite run collapsed after its fifth step:
    every reply grew to the 8-token cap with no text in it (reward -0.1 each). The smaller
    step keeps the rise and moves the policy less at each step."""
    asyncio.run(rl_train.main(rl_config(server, model_folder, tmp_path / "log", 16,
                                        learning_rate=3e-4, groups=4, group_size=8)))
    rewards = [row["env/all/reward/total"] for row in records(tmp_path / "log" / "metrics.jsonl")
               if "env/all/reward/total" in row]
    assert len(rewards) == 16
    assert sum(rewards[-8:]) / 8 >= sum(rewards[:3]) / 3 + 0.1, rewards


def test_the_rl_loop_trains_and_resumes_from_its_checkpoints(server, model_folder, tmp_path):
    def config(max_steps: int) -> rl_train.Config:
        return rl_config(server, model_folder, tmp_path / "log", max_steps)

    asyncio.run(rl_train.main(config(2)))
    first = records(tmp_path / "log" / "checkpoints.jsonl")
    assert [row["name"] for row in first] == ["000001", "000002", "final"]
    trained = [row for row in records(tmp_path / "log" / "metrics.jsonl")
               if "optim/kl_sample_train_v1" in row]
    assert len(trained) == 2
    # sampler and trainer logprobs of the same tokens agree (float rounding only)
    assert all(abs(row["optim/kl_sample_train_v1"]) < 1e-4 for row in trained)

    asyncio.run(rl_train.main(config(3)))  # picks up checkpoints.jsonl: one more step
    resumed = records(tmp_path / "log" / "checkpoints.jsonl")[len(first):]
    assert [row["batch"] for row in resumed if row["name"] != "final"] == [3]
    assert resumed[-1]["state_path"].split("/")[2] != first[-1]["state_path"].split("/")[2]
