"""The caller side: advantage/datum helpers, the ordered RL loop, and every algorithm variant.

The loops run against a real server on 127.0.0.1 (port 0, a thread) over starter-2m, with
tiny settings (2 prompts x 4 samples x 8 tokens, 2 cycles).
"""

from __future__ import annotations

import json
import math

import pytest

from posttrain.score.passat import pass_at

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from posttrain.service.client import (  # noqa: E402
    AdamParams,
    ServiceClient,
    algorithms,
)
from posttrain.service.client.rl import (  # noqa: E402
    Algorithm,
    AlgorithmNotExpressible,
    LoopContext,
    LoopSettings,
    NoGradientSignal,
    all_zero,
    forward_backward_payload,
    group_mean_advantages,
    leave_one_out_advantages,
    rl_datum,
    run_rl_loop,
    teacher_from_run,
)
from posttrain.service.engine import Engine  # noqa: E402
from posttrain.service.server import start_server  # noqa: E402

BASE = "starter-2m"
PROMPTS = ("Where is my order ORD-4417?", "Can I get a refund for my last purchase?")


# ---------------------------------------------------------------- helpers (no server)


def test_group_mean_advantages_centre_and_scale():
    # mean 0.5, population std 0.5: the centred +-0.5 become +-1
    assert group_mean_advantages([1, 0, 0, 1]) == [1.0, -1.0, -1.0, 1.0]
    assert group_mean_advantages([1, 0, 0, 1], normalize_std=False) == [0.5, -0.5, -0.5, 0.5]
    assert group_mean_advantages([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]  # no division by zero
    assert all_zero(group_mean_advantages([0.3, 0.3]))
    assert not all_zero([0.0, 1e-3])


def test_leave_one_out_baseline():
    # 1 - mean(0, 0, 0) = 1 ; 0 - mean(1, 0, 0) = -1/3
    assert leave_one_out_advantages([1, 0, 0, 0]) == pytest.approx([1, -1 / 3, -1 / 3, -1 / 3])
    with pytest.raises(ValueError, match="at least two"):
        leave_one_out_advantages([1.0])


def test_rl_datum_follows_the_shifted_convention():
    datum = rl_datum([1, 2, 3], [4, 5], [-0.1, -0.2], 2.0)
    assert datum == {
        "model_input": {"token_ids": [1, 2, 3, 4]},
        "loss_fn_inputs": {
            "target_tokens": [2, 3, 4, 5],
            "logprobs": [0.0, 0.0, -0.1, -0.2],
            "advantages": [0.0, 0.0, 2.0, 2.0],
            "weights": [0.0, 0.0, 1.0, 1.0],
        },
    }
    assert rl_datum([1], [4, 5], [-0.1, -0.2], [1.0, -1.0])["loss_fn_inputs"]["advantages"] == [
        1.0, -1.0]
    with pytest.raises(ValueError, match="2 completion tokens but 1 logprobs"):
        rl_datum([1], [4, 5], [-0.1], 1.0)
    assert forward_backward_payload([datum], "ppo")["loss_config"] == {}


def test_dpo_weights_are_the_exact_gradient_of_the_dpo_loss():
    # the cross_entropy weights DPO sends must equal -dL/dlp of the real DPO loss
    beta = 0.1
    chosen_lp = torch.tensor([-0.5, -1.0, -0.2], requires_grad=True)
    rejected_lp = torch.tensor([-2.0, -0.3], requires_grad=True)
    reference = [[None, -1.0, -0.7, -0.4, -0.9], [None, -1.0, -0.7, -1.5, -0.6]]
    z = beta * ((chosen_lp.sum() - sum(reference[0][2:])) - (rejected_lp.sum()
                                                             - sum(reference[1][2:])))
    (-torch.nn.functional.logsigmoid(z)).backward()

    class FakeContext:
        reference_version = 0

        def logprobs(self, sequences, version=None):
            return reference

        def note_rewards(self, rewards):
            pass

    sample = {"sequences": [
        {"tokens": [7, 8, 9], "logprobs": chosen_lp.tolist()},
        {"tokens": [3, 4], "logprobs": rejected_lp.tolist()},
    ]}
    algorithm = algorithms.dpo(lambda tokens, request: len(tokens), beta=beta)
    payload = algorithm.build_loss(sample, 0, {"prompt": {"token_ids": [1, 2]}}, FakeContext())
    assert payload["loss_function"] == "cross_entropy"
    chosen_w = payload["data"][0]["loss_fn_inputs"]["weights"][1:]
    rejected_w = payload["data"][1]["loss_fn_inputs"]["weights"][1:]
    assert chosen_w == pytest.approx((-chosen_lp.grad).tolist(), rel=1e-4, abs=1e-7)
    assert rejected_w == pytest.approx((-rejected_lp.grad).tolist(), rel=1e-4, abs=1e-7)


# ---------------------------------------------------------------- server fixtures


@pytest.fixture(scope="module")
def server(starter_2m_folder, tmp_path_factory):
    from posttrain.policy.loading import load_policy

    before = torch.get_num_threads()
    policy = load_policy(BASE, device="cpu", show_progress=False)
    engine = Engine(BASE, tmp_path_factory.mktemp("state"), policy=policy, torch_threads=1)
    running = start_server(engine, port=0)
    yield running
    running.stop()
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def client(server):
    return ServiceClient(server.url)


@pytest.fixture(scope="module")
def requests(client):
    return [
        {"prompt": {"token_ids": client.tokenize(messages=[{"role": "user", "content": text}])},
         "text": text}
        for text in PROMPTS
    ]


def varied_reward(tokens, request):
    """Deterministic, and different between almost any two distinct completions."""
    return (sum(t * (i + 1) for i, t in enumerate(tokens)) % 101) / 100


SETTINGS = LoopSettings(cycles=2, num_samples=4, max_tokens=8, learning_rate=1e-3,
                        checkpoint_name="final", skip_uniform_groups=True)


def _open_sessions(server):
    return [s for s in server.engine.sessions() if s["status"] == "open"]


# ---------------------------------------------------------------- the loop


def test_grpo_loop_runs_the_ordered_cycles_and_checkpoints(server, client, requests):
    def reward(tokens):  # the seed's shape: tokens in, a scalar out
        return varied_reward(tokens, None)

    def build_loss(sample, cycle, request, ctx):  # the seed's build_loss, line for line
        prompt_tokens = request["prompt"]["token_ids"]
        sequences = sample["sequences"]
        rewards = [reward(sequence["tokens"]) for sequence in sequences]
        advantages = group_mean_advantages(rewards, normalize_std=True)
        if all_zero(advantages):
            raise ValueError(
                f"cycle {cycle}: reward is uniform across the group, no gradient signal"
            )
        data = [
            rl_datum(prompt_tokens, sequence["tokens"], sequence["logprobs"], advantage)
            for sequence, advantage in zip(sequences, advantages, strict=True)
        ]
        return forward_backward_payload(data, "importance_sampling")

    seen = []
    report = run_rl_loop(client, Algorithm("grpo-seed", build_loss, "importance_sampling"),
                         requests, SETTINGS, on_cycle=seen.append)
    assert [c.cycle for c in report.cycles] == [0, 1] == [c.cycle for c in seen]
    for cycle in report.cycles:
        assert cycle.groups == 2 and cycle.skipped_groups == 0
        assert math.isfinite(cycle.loss) and cycle.grad_norm > 0
        assert cycle.parity_tokens > 0 and cycle.parity_mean_abs_diff < 1e-3
    assert report.status == "finished"
    assert report.state["step"] == 2 and report.state["name"] == "final"
    assert "adapter_model.safetensors" in report.export["files"]
    assert _open_sessions(server) == []


def test_a_uniform_reward_group_raises_and_the_run_is_cleaned_up(server, client, requests):
    grpo = algorithms.grpo(lambda tokens, request: 0.5)
    with pytest.raises(NoGradientSignal, match=r"cycle 0: reward is uniform.*no gradient signal"):
        run_rl_loop(client, grpo, requests, LoopSettings(cycles=2, max_tokens=4))
    runs = [server.engine.get_run(run_id) for run_id in server.engine.run_ids()]
    assert runs[-1]["status"] == "cancelled"
    assert _open_sessions(server) == []


def test_an_algorithm_the_server_cannot_express_is_refused_before_a_session(server, client,
                                                                           requests):
    sessions_before = len(server.engine.sessions())
    gspo = Algorithm("gspo", lambda *args: {}, "gspo")  # sequence-level ratio: not a built-in
    with pytest.raises(AlgorithmNotExpressible, match="before creating a session"):
        run_rl_loop(client, gspo, requests, SETTINGS)
    odd_config = Algorithm("ppo-eps", lambda *args: {}, "ppo", {"epsilon": 0.2})
    with pytest.raises(AlgorithmNotExpressible, match="epsilon"):
        run_rl_loop(client, odd_config, requests, SETTINGS)
    with pytest.raises(AlgorithmNotExpressible, match="teacher"):
        run_rl_loop(client, algorithms.on_policy_distillation(), requests, SETTINGS)
    assert len(server.engine.sessions()) == sessions_before


# ---------------------------------------------------------------- algorithm variants


@pytest.mark.parametrize("name", sorted(algorithms.REWARD_ALGORITHMS))
def test_each_algorithm_runs_two_cycles(client, requests, name):
    algorithm = algorithms.REWARD_ALGORITHMS[name](varied_reward)
    report = run_rl_loop(client, algorithm, requests, SETTINGS)
    assert report.status == "finished" and len(report.cycles) == 2
    trained = [c for c in report.cycles if c.loss is not None]
    assert len(trained) == 2, [c.line() for c in report.cycles]
    for cycle in trained:
        assert math.isfinite(cycle.loss) and cycle.grad_norm > 0
        assert cycle.parity_mean_abs_diff is not None and cycle.parity_mean_abs_diff < 1e-3


def test_ppo_and_dapo_send_their_clip_thresholds():
    assert algorithms.ppo_clip(varied_reward).loss_config == {
        "clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    dapo = algorithms.dapo(varied_reward)
    assert dapo.loss_function == "ppo"
    assert dapo.loss_config["clip_high_threshold"] == 1.28 and dapo.skip_uniform_groups


def test_dapo_drops_uniform_groups_instead_of_failing(client, requests):
    report = run_rl_loop(client, algorithms.dapo(lambda tokens, request: 1.0), requests,
                         LoopSettings(cycles=2, max_tokens=4, checkpoint_name=None))
    assert report.status == "finished"
    assert [c.skipped_groups for c in report.cycles] == [2, 2]
    assert all(c.loss is None for c in report.cycles)  # nothing to train on, no step taken


def test_on_policy_distillation_uses_a_second_model_as_teacher(client, requests):
    # the teacher is another run, pushed by a few supervised steps towards one reply
    with client.create_session() as session:
        teacher_run = session.create_run(rank=8, seed=123)
        target = client.tokenize(text="Could you tell me your order number?")
        prompt = requests[0]["prompt"]["token_ids"]
        full = prompt + target
        datum = {"model_input": {"token_ids": full[:-1]},
                 "loss_fn_inputs": {"target_tokens": full[1:],
                                    "weights": [0.0] * (len(prompt) - 1) + [1.0] * len(target)}}
        adam = AdamParams(1e-2, 0.9, 0.95, 1e-8, 0.0, 1.0)
        for _ in range(3):
            teacher_run.forward_backward([datum], "cross_entropy")
            teacher_run.optim_step(adam)
        teacher_run.save_weights_for_sampler(0).result()
        report = run_rl_loop(client, algorithms.on_policy_distillation(), requests, SETTINGS,
                             teacher=teacher_from_run(teacher_run, version=0))
    assert report.status == "finished"
    for cycle in report.cycles:
        assert cycle.loss is not None and cycle.grad_norm > 0
        assert cycle.mean_reward < 0  # minus a reverse KL: the teacher really differs
        assert cycle.parity_mean_abs_diff < 1e-3


def test_loop_context_reads_logprobs_of_any_version(client, requests):
    with client.create_session() as session:
        run = session.create_run(rank=4)
        run.save_weights_for_sampler(0)
        ctx = LoopContext(run=run, client=client)
        sequence = requests[0]["prompt"]["token_ids"]
        current, frozen = ctx.logprobs([sequence]), ctx.logprobs([sequence], version=0)
    assert current == frozen and current[0][0] is None


def test_primitives_demo_reports_pass_at_1_before_and_after(server, tmp_path):
    # a tiny run of `posttrain primitives-demo` against the module's server
    from posttrain.service.demo import DemoSettings, run_demo

    lines: list[str] = []
    settings = DemoSettings(base_model=BASE, url=server.url, cycles=2, groups_per_cycle=2,
                            num_samples=4, max_tokens=16, eval_prompts=6, eval_samples=2,
                            out=str(tmp_path))
    summary = run_demo(settings, say=lines.append)
    assert summary["status"] == "finished" and len(summary["cycles"]) == 2
    before_rows = [json.loads(line) for line in (tmp_path / "holdout_before.jsonl").open()]
    # the reported rate is the mean over scenarios of the saved rows' pass rates
    assert summary["pass_at_1_before"]["value"] == pytest.approx(
        pass_at(before_rows).pass_at_1, abs=1e-6
    )
    assert summary["pass_at_1_after"]["ci95"] is not None  # 6 scenarios: an interval exists
    assert any(line.startswith("cycle 1:") and "logprob parity" in line for line in lines)
    assert (tmp_path / "summary.json").is_file() and (tmp_path / "holdout_after.jsonl").is_file()
