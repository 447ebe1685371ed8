"""What the service keeps on disk: run records, saved training states, exported adapters.

Layout under the server's state folder::

    runs/<run_id>/run.json              the run's record (LoRA spec, status, last save)
    runs/<run_id>/states/<name>/        save_state: adapter.safetensors (trainer adapter),
                                        optimizer.safetensors (AdamW moments), state.json
                                        (step, seq, LoRA spec, base model)
    runs/<run_id>/exports/<name>/       export_lora: adapter_model.safetensors and
                                        adapter_config.json, a folder ``peft`` loads

Everything is written to a temp folder or file and renamed into place, so a crash never
leaves half a state that a restarted server would resume from. Gradients accumulated since
the last ``optim_step`` are not saved: save after a step.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from posttrain.access import NAME as OWNER_NAME
from posttrain.atomic import write_text_atomic
from posttrain.service.engine.checks import state_name
from posttrain.service.engine.requests import LoraSpec
from posttrain.text import echo

STATE_FORMAT = 1


def run_folder(state_dir: Path, run_id: str) -> Path:
    """``runs/<run_id>`` under the state folder; ``BadRequest`` for an id that is not a
    plain name (an id read back from a journal or a request is data, never a path)."""
    return state_dir / "runs" / state_name(run_id, "run id")


def write_run_record(state_dir: Path, record: dict[str, Any]) -> None:
    """Write ``runs/<run_id>/run.json`` atomically."""
    path = run_folder(state_dir, record["run_id"]) / "run.json"
    write_text_atomic(path, json.dumps(record, indent=2, sort_keys=True) + "\n")


@dataclass(frozen=True)
class DamagedRecord:
    """A ``run.json`` that cannot be read as a run's record."""

    run_id: str  # its folder's name
    file: str  # relative to the state folder: ``runs/<run_id>/run.json``
    problem: str  # what is wrong with it, one short line

    def message(self) -> str:
        """What a client asking for the run, and the start-up log, are told."""
        return (f"run {self.run_id}'s state file {self.file} is damaged: {self.problem}; "
                "fix or remove that file, then restart the server")


def record_problem(record: Any, run_id: str) -> str | None:
    """What keeps ``record`` (a parsed ``run.json`` in folder ``run_id``) from being a run's
    record, or None: the fields a restarted engine reads, with their types."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    if record.get("run_id") != run_id:
        return f"run_id {echo(record.get('run_id'))} is not its folder's name"
    for key in ("base_model", "status"):
        if not isinstance(record.get(key), str):
            return f"{key}: expected a string, got {echo(record.get(key))}"
    owner = record.get("owner")
    if owner is not None and not (isinstance(owner, str) and OWNER_NAME.fullmatch(owner)):
        return f"owner: expected null or a tokens-file name, got {echo(owner)}"
    if not isinstance(record.get("created_at", 0), (int, float)):
        return f"created_at: expected a number, got {echo(record.get('created_at'))}"
    last = record.get("last_state")
    if last is not None and not (isinstance(last, dict) and isinstance(last.get("name"), str)
                                 and isinstance(last.get("seq"), int)):
        return "last_state: expected null or {\"name\", \"seq\", ...}"
    try:
        lora_from_json(record.get("lora"))
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        return f"lora: expected {{rank, alpha, target_modules, seed}} ({type(error).__name__})"
    return None


def read_run_records(state_dir: Path) -> tuple[list[dict[str, Any]], list[DamagedRecord]]:
    """Every ``run.json`` under ``state_dir``: the run records, oldest first, and the files
    that are not one (not UTF-8, not JSON, a field missing or of the wrong type), each with
    what is wrong. A damaged file is reported, never skipped: its run would vanish."""
    records, damaged = [], []
    for path in sorted((state_dir / "runs").glob("*/run.json")):
        run_id = path.parent.name
        file = f"runs/{run_id}/run.json"  # never the absolute path: clients read this
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:  # UnicodeDecodeError is a ValueError
            # the decoder's message says where (line, column), never what the file holds
            problem = (f"not UTF-8 JSON ({error})" if isinstance(error, ValueError)
                       else f"unreadable ({type(error).__name__})")
            damaged.append(DamagedRecord(run_id, file, problem))
            continue
        problem = record_problem(record, run_id)
        if problem is not None:
            damaged.append(DamagedRecord(run_id, file, problem))
            continue
        records.append(record)
    return sorted(records, key=lambda r: r.get("created_at", 0)), damaged


def lora_from_json(value: dict[str, Any]) -> LoraSpec:
    return LoraSpec(
        rank=int(value["rank"]),
        alpha=float(value["alpha"]),
        target_modules=tuple(value["target_modules"]),
        seed=int(value["seed"]),
    )


def _replace_folder(staging: Path, folder: Path) -> None:
    """Move ``staging`` to ``folder``, replacing an older one with the same name."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    old = folder.parent / f".{folder.name}.old-{uuid.uuid4().hex[:8]}"
    if folder.exists():
        folder.rename(old)
    staging.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def _staging(folder: Path) -> Path:
    staging = folder.parent / f".{folder.name}.saving-{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    return staging


def save_state(
    folder: Path, model: Any, *, seq: int, base_model: str
) -> dict[str, Any]:
    """Save ``model``'s (a ``LoraModel``) adapter, AdamW state and step into ``folder``.

    Returns the ``state.json`` content. ``seq`` is the sequence number of the save itself:
    a run resumed from this state continues at ``seq + 1``.
    """
    from safetensors.torch import save_file

    staging = _staging(folder)
    try:
        save_file(model.adapter_tensors(), str(staging / "adapter.safetensors"))
        moments: dict[str, Any] = {}
        optimizer_steps: dict[str, float] = {}
        for name, parameter in model.parameters.items():
            state = model.optimizer.state.get(parameter)
            if state:
                moments[f"{name}::exp_avg"] = state["exp_avg"].contiguous()
                moments[f"{name}::exp_avg_sq"] = state["exp_avg_sq"].contiguous()
                optimizer_steps[name] = float(state["step"])
        save_file(moments, str(staging / "optimizer.safetensors"))
        info = {
            "format": STATE_FORMAT,
            "step": model.step,
            "seq": seq,
            "lora": asdict(model.spec),
            "base_model": base_model,
            "optimizer_steps": optimizer_steps,
            "saved_at": time.time(),
        }
        (staging / "state.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        _replace_folder(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return info


def read_state_info(folder: Path) -> dict[str, Any]:
    """The ``state.json`` of a saved state (its step, seq, LoRA spec and base model).

    Raises ``LookupError`` naming the state and its run (never the server's paths) when
    the folder holds no state."""
    info_path = folder / "state.json"
    if not info_path.is_file():
        # named by run and state, never by absolute path: the client need not learn it
        raise LookupError(f"no saved state {folder.name!r} in run {folder.parent.parent.name!r} "
                          "(save_state writes one)")
    return json.loads(info_path.read_text())


def load_state(folder: Path, model: Any, *, base_model: str, with_optimizer: bool = True
               ) -> dict[str, Any]:
    """Load a saved state into ``model`` (a ``LoraModel``): adapter, AdamW state, step.

    Without ``with_optimizer`` only the adapter and the step are loaded and the AdamW
    moments start afresh (the tinker SDK's ``create_training_client_from_state``).
    Everything is read and checked before anything is assigned, so a bad state leaves the
    model as it was. Accumulated gradients are cleared. Returns the ``state.json`` content.
    Raises ``LookupError`` when the folder holds no state, ``ValueError`` when it does not
    fit this run (another base model, LoRA rank or targets).
    """
    import torch
    from safetensors.torch import load_file

    info = read_state_info(folder)
    if info.get("base_model") != base_model:
        raise ValueError(
            f"state {folder.name} was saved on base model {info.get('base_model')!r}, "
            f"this server runs {base_model!r}"
        )
    saved_spec = lora_from_json(info["lora"])
    if (saved_spec.rank, saved_spec.target_modules) != (model.spec.rank, model.spec.target_modules):
        raise ValueError(
            f"state {folder.name} has LoRA rank {saved_spec.rank} on "
            f"{', '.join(saved_spec.target_modules)}; this run has rank {model.spec.rank} on "
            f"{', '.join(model.spec.target_modules)}"
        )
    adapter = load_file(str(folder / "adapter.safetensors"))
    moments = load_file(str(folder / "optimizer.safetensors"))
    if set(adapter) != set(model.parameters):
        raise ValueError(f"state {folder.name}: its adapter tensors do not match this run's")
    for name, parameter in model.parameters.items():
        if adapter[name].shape != parameter.shape:
            raise ValueError(f"state {folder.name}: {name} has shape {tuple(adapter[name].shape)}")
    with torch.no_grad():
        for name, parameter in model.parameters.items():
            parameter.copy_(adapter[name])
    model.optimizer.state.clear()
    saved_moments = info.get("optimizer_steps", {}) if with_optimizer else {}
    for name, steps in saved_moments.items():
        parameter = model.parameters[name]
        model.optimizer.state[parameter] = {
            "step": torch.tensor(float(steps)),
            "exp_avg": moments[f"{name}::exp_avg"].clone(),
            "exp_avg_sq": moments[f"{name}::exp_avg_sq"].clone(),
        }
    model.step = int(info["step"])
    model.clear_gradients()
    return info


def export_lora(folder: Path, model: Any) -> list[str]:
    """Write ``model``'s trainer adapter as a PEFT folder (atomically); returns file names."""
    staging = _staging(folder)
    try:
        files = model.export(staging)
        _replace_folder(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return files
