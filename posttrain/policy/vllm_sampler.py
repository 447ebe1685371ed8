"""Evaluation sampling on vLLM: ``--sampler vllm`` for ``posttrain eval`` and the recipes.

The default back end (``posttrain.policy.sampler``) is our own loop over transformers;
on a GPU box vLLM samples the same requests much faster. This back end keeps the row
contract of the default one, so grading, pass@k, the noise band and the paired delta
are computed by the same code on its rows:

- one request per (prompt, sample) with that sample's own seed (vLLM's per-request
  ``seed``), so a rerun draws the same replies; the replies differ from the transformers
  back end's for the same seed (another random stream), which is why a run records
  which sampler drew its rows;
- the reply ends right after a stop string (``include_stop_str_in_output``), at an end
  of turn, or at the token cap; stop reasons map onto ``eos`` / ``tool_call`` / ``stop``
  / ``length``;
- ``logprobs[i]`` is the sampled token's log-probability (vLLM's default raw logprobs,
  before temperature and top-p, as ours).

A LoRA adapter is served through vLLM's LoRA support next to the base weights. vLLM
loads architectures it knows (hub models, their local folders); the starter models are
posttrain's own and are refused. Needs the ``vllm`` package and a CUDA GPU; without them
``sampler_problem`` says which is missing and nothing starts.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from posttrain.errors import PosttrainError
from posttrain.policy.models import resolve_model_source
from posttrain.policy.sampler import TOOL_CALL_END, Completion, Messages, SamplingParams
from posttrain.policy.starter_names import is_starter_name

SAMPLERS = ("transformers", "vllm")
#: share of GPU memory the evaluation engine may take: a recipe's trainer still holds the
#: policy on the same GPU while the holdout is sampled
GPU_MEMORY_SHARE = 0.35
MAX_LORA_RANK = 64


def vllm_problem() -> str | None:
    """Why vLLM cannot run here (no vllm package, no CUDA GPU), or None."""
    missing = []
    if importlib.util.find_spec("vllm") is None:
        missing.append("the vllm package is not installed (pip install vllm, on a CUDA "
                       "machine)")
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        missing.append("there is no CUDA GPU on this machine")
    return "; ".join(missing) or None


def check_vllm_sampler(base_model: str | None, flag: str = "--sampler vllm") -> None:
    """Refuse ``--sampler vllm`` up front when it cannot work, saying what to do."""
    problem = vllm_problem()
    if problem:
        raise PosttrainError(f"{flag}: {problem}; leave it out to sample with transformers")
    if base_model is None or is_starter_name(base_model):
        raise PosttrainError(f"{flag}: vLLM cannot load posttrain's starter models; give "
                             "--base-model a hub id or a local transformers folder")


def stop_reason(finish_reason: str | None, matched: Any) -> str:
    """vLLM's (finish_reason, stop_reason) as the row contract's stop reason."""
    if finish_reason == "length":
        return "length"
    if isinstance(matched, str):
        return "tool_call" if matched == TOOL_CALL_END else "stop"
    return "eos"


def request_settings(params: SamplingParams, seed: int) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for one request."""
    return {
        "n": 1,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,  # vLLM: -1 is off
        "max_tokens": params.max_new_tokens,
        "stop": list(params.stop_strings),
        "include_stop_str_in_output": True,
        "seed": int(seed),
        "logprobs": 0,  # the sampled token's own log-probability only
    }


class VllmSampler:
    """Samples conversations on a vLLM engine holding ``base_model`` (+ an adapter)."""

    def __init__(self, base_model: str, adapter: str | None = None):
        from vllm import LLM

        # check_vllm_sampler refused the starters, so the name is a folder, gguf or hub id
        source, _ = resolve_model_source(base_model)
        self.adapter = str(Path(adapter)) if adapter else None
        self.engine = LLM(model=source, enable_lora=self.adapter is not None,
                          max_lora_rank=MAX_LORA_RANK, gpu_memory_utilization=GPU_MEMORY_SHARE,
                          seed=0)
        self.tokenizer = self.engine.get_tokenizer()

    def sample(self, conversations: list[Messages], seeds: list[int],
               params: SamplingParams) -> list[Completion]:
        from vllm import SamplingParams as VllmParams
        from vllm.inputs import TokensPrompt
        from vllm.lora.request import LoRARequest

        if len(conversations) != len(seeds):
            raise ValueError(f"{len(conversations)} conversations but {len(seeds)} seeds")
        prompts = [list(self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True)) for messages in conversations]
        lora = LoRARequest("adapter", 1, self.adapter) if self.adapter else None
        outputs = self.engine.generate(
            [TokensPrompt(prompt_token_ids=ids) for ids in prompts],
            sampling_params=[VllmParams(**request_settings(params, seed)) for seed in seeds],
            lora_request=lora, use_tqdm=False)
        completions = []
        for prompt, output in zip(prompts, outputs, strict=True):
            reply = output.outputs[0]
            token_ids = list(reply.token_ids)
            logprobs = [float(step[token].logprob) for step, token in
                        zip(reply.logprobs or [], token_ids, strict=False)]
            completions.append(Completion(
                text=reply.text, token_ids=token_ids, logprobs=logprobs,
                stop_reason=stop_reason(reply.finish_reason, reply.stop_reason),
                prompt_token_ids=prompt))
        return completions


class VllmAgent:
    """The batch-agent protocol (``reply_batch``, ``policy``, ``sampling``) on vLLM."""

    def __init__(self, base_model: str, adapter: str | None, params: SamplingParams,
                 merged_adapters: tuple[str, ...] = ()):
        self.sampler = VllmSampler(base_model, adapter)
        self.params = params
        self.policy: dict[str, Any] = {"base_model": base_model, "adapter": adapter,
                                       "sampler": "vllm"}
        if merged_adapters:
            self.policy["merged_adapters"] = list(merged_adapters)
        self.sampling: dict[str, Any] = params.to_dict()
        self.last_completions: list[Completion] = []

    def reply_batch(self, conversations: list[Messages], seeds: list[int]) -> list[str]:
        self.last_completions = self.sampler.sample(conversations, seeds, self.params)
        return [completion.text for completion in self.last_completions]

    def __call__(self, messages: Messages, seed: int = 0) -> str:
        return self.reply_batch([messages], [seed])[0]

    def close(self) -> None:
        """Give the engine's GPU memory back (a recipe trains between its evaluations)."""
        import gc

        import torch

        self.sampler = None  # type: ignore[assignment]
        gc.collect()
        torch.cuda.empty_cache()
