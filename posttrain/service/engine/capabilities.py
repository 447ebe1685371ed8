"""What the engine serves, described: its primitives, losses, optimizer, sampling, limits.

``GET /v1/training/capabilities`` answers with ``capabilities_of(engine)``; a client checks
an algorithm against it before it creates anything (``posttrain.service.client.rl.
check_expressible``).
"""

from __future__ import annotations

from typing import Any

from posttrain.policy.models import parameter_count
from posttrain.policy.sampler import end_of_turn_ids
from posttrain.service.engine import losses
from posttrain.service.engine.runs import FAILS_THE_RUN
from posttrain.service.schema import ADAM_KEYS

API_VERSION = 1

# primitive -> what its body holds (served by capabilities; the parsers enforce it)
PRIMITIVES: dict[str, str] = {
    "save_weights_for_sampler": '{"version": N}: freeze the current adapter as sampler version N',
    "sample": '{"version", "prompt": {"token_ids"}, "num_samples", "sampling_params": '
    '{"max_tokens", "temperature", "top_p", "top_k", "seed", "stop"}}',
    "logprobs": '{"sequences": [[ids]], "version": N | null}: per-token logprobs '
    "(null: the trainer's current weights); entry 0 of each is null",
    "forward": '{"data", "loss_function", "loss_config"}: loss and logprobs, no gradients',
    "forward_backward": '{"data", "loss_function", "loss_config"}: gradients accumulate '
    "until optim_step",
    "optim_step": '{"adam_params": {"learning_rate", "beta1", "beta2", "eps", "weight_decay", '
    '"grad_clip_norm"}}: one AdamW step, every hyper-parameter explicit',
    "save_state": '{"name"}: adapter + AdamW state + step, to the state folder',
    "load_state": '{"name", "run_id"?, "optimizer"?: true}: replace adapter, AdamW state '
    "(unless optimizer is false) and step by a saved state",
    "export_lora": '{"name"}: write a PEFT adapter folder (adapter_model.safetensors)',
    "finish": "{}: end the run after everything before it",
}


def capabilities_of(engine: Any) -> dict[str, Any]:
    """Primitives, losses (inputs, config keys, defaults), base model, limits of ``engine``
    (an ``Engine``: its base model, policy, vocabulary, LoRA targets and limits)."""
    tokenizer = engine.policy.tokenizer
    return {
        "api_version": API_VERSION,
        "base_model": {
            "name": engine.base_model,
            "vocab_size": engine.vocab_size,
            "max_context_length": engine.limits.max_sequence_tokens,
            "parameters": parameter_count(engine.policy.model),
            "dtype": engine.policy.dtype,
            "device": engine.policy.device,
            "lora_target_modules": list(engine.module_names),
            "lora_optional_target_modules": list(engine.optional_lora_targets),
            "end_of_turn_token_ids": sorted(end_of_turn_ids(tokenizer, engine.policy.model)),
            "pad_token_id": tokenizer.pad_token_id,
        },
        "primitives": {
            name: {"body": body, "ordered": True, "fails_run_on_error": name in FAILS_THE_RUN}
            for name, body in PRIMITIVES.items()
        },
        "losses": losses.capabilities(),
        "optimizer": {"name": "adamw", "required_params": list(ADAM_KEYS)},
        "sampling_params": {
            "required": ["max_tokens"],
            "defaults": {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": None,
                         "stop": []},
            "logprobs": "log-softmax of the raw logits (temperature 1) at each sampled token",
            "per_sample_seed": "seed + i",
        },
        "limits": engine.limits.to_json(),
        "semantics": {
            "loss_reduction": "sum over tokens and datums; normalise with weights/advantages",
            "datum_convention": "model_input = full[:-1]; target_tokens = full[1:]; every "
            "per-token input has len(model_input) values",
            "ordering": "one FIFO per run, strict sequence order",
            "idempotency": "same seq + same payload -> the same operation; "
            "same seq + another payload -> 409",
        },
    }
