"""The adapter folder made complete for serving: the tokenizer next to the PEFT files and a
model card (README.md) that says what the run measured, and the upload to the Hub.

PEFT's ``save_pretrained`` writes a generic card; this one replaces it with the run's
verdict, pass@1 before and after with their intervals, the categories, and how to load and
reproduce it, so whoever finds the adapter alone still reads what it does and how sure
that is.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from posttrain.atomic import write_text_atomic


def _fmt(value: Any, signed: bool = False) -> str:
    if not isinstance(value, (int, float)):
        return "n/a"
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def _interval(values: Any, signed: bool = False) -> str:
    if isinstance(values, (list, tuple)) and len(values) == 2:
        return f"[{_fmt(values[0], signed)}, {_fmt(values[1], signed)}]"
    return ""


def model_card(summary: dict[str, Any], config: dict[str, Any]) -> str:
    """README.md text for a run's adapter folder."""
    settings = config.get("settings", {})
    base = str(summary.get("base_model") or settings.get("base_model") or "")
    recipe = str(summary.get("recipe") or config.get("recipe") or "")
    run = str(summary.get("run_name") or settings.get("run_name") or "")
    front = ["---", "library_name: peft", "tags:", "- posttrain", "- lora", f"- {recipe}"]
    if "/" in base:  # a hub id; a posttrain starter or a local folder is not one
        front.append(f"base_model: {base}")
    front.append("---")
    delta = summary.get("delta") or {}
    before, after = summary.get("before") or {}, summary.get("after") or {}
    lines = [
        *front, "",
        f"# {run}: a LoRA adapter trained by posttrain ({recipe})", "",
        f"- base model: `{base}`" + (f", started from run `{summary['from_run']}`"
                                     if summary.get("from_run") else ""),
        f"- environment (the rule it was trained and graded on): `{settings.get('env', '')}`",
        f"- status: {summary.get('status')}",
        "",
        "## What the run measured on its holdout", "",
    ]
    if delta:
        lines += [
            f"Verdict: **{summary.get('verdict')}**. pass@1 {_fmt(before.get('pass_at_1'))} "
            f"{_interval(before.get('ci95'))} before, {_fmt(after.get('pass_at_1'))} "
            f"{_interval(after.get('ci95'))} after; paired delta "
            f"{_fmt(delta.get('delta'), True)} {_interval(delta.get('ci95'), True)} over "
            f"{delta.get('n_paired', 'n/a')} paired scenarios.", "",
            "| category | pass@1 before | pass@1 after |", "|---|---|---|",
        ]
        after_by = {g.get("name"): g for g in summary.get("by_category_after") or []}
        for group in summary.get("by_category_before") or []:
            other = after_by.get(group.get("name"), {})
            lines.append(f"| {group.get('name')} | {_fmt(group.get('pass_at_1'))} | "
                         f"{_fmt(other.get('pass_at_1'))} |")
    else:
        lines.append("No after-evaluation: the run did not finish training.")
    lines += [
        "", "## Use it", "",
        "```python",
        "from peft import PeftModel",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        (f'base = AutoModelForCausalLM.from_pretrained("{base}")' if "/" in base else
         f'base = AutoModelForCausalLM.from_pretrained("<folder: posttrain model info {base}>")'),
        'model = PeftModel.from_pretrained(base, "<this folder or repo>")',
        'tokenizer = AutoTokenizer.from_pretrained("<this folder or repo>")',
        "```", "",
        "The run's `config.json` holds every setting; `posttrain "
        f"{recipe} --config config.json` re-runs it.", "",
    ]
    return "\n".join(lines)


def complete_adapter_folder(adapter: Path, tokenizer: Any, summary: dict[str, Any],
                            config: dict[str, Any]) -> None:
    """Save the tokenizer into ``adapter`` and write its model card (README.md)."""
    if not adapter.is_dir():
        return
    tokenizer.save_pretrained(str(adapter))
    write_text_atomic(adapter / "README.md", model_card(summary, config))


_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
_OFF = ("1", "true", "yes", "on")


def push_problem(repo_id: str) -> str | None:
    """Why the adapter could not be uploaded to ``repo_id`` from here, or None; checked
    before a run starts, so a run never trains for an upload that cannot happen."""
    if not _REPO_ID.fullmatch(repo_id) or len(repo_id) > 96:
        return "expected a Hub repo id OWNER/NAME (letters, digits, '-', '_', '.')"
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(variable, "").strip().lower() in _OFF:
            return (f"{variable} is set, so the Hub cannot be reached; unset it on a "
                    "machine with network access, or leave --push-to-hub out")
    try:
        from huggingface_hub import get_token
    except ImportError:
        return "the huggingface_hub package is not installed (pip install 'posttrain[train]')"
    if not get_token():
        return "no Hub token: set HF_TOKEN or run `hf auth login` first"
    return None


def push_adapter(adapter: Path, repo_id: str) -> dict[str, Any]:
    """Upload the adapter folder to ``repo_id`` (created private if missing): ``{"repo",
    "url"}`` or ``{"repo", "error"}``; a failed upload never fails the run."""
    try:
        from huggingface_hub import create_repo, upload_folder

        create_repo(repo_id, private=True, exist_ok=True)
        commit = upload_folder(repo_id=repo_id, folder_path=str(adapter),
                               commit_message="posttrain: adapter, tokenizer and model card")
        return {"repo": repo_id, "url": str(getattr(commit, "commit_url", commit))}
    except Exception as error:  # network, auth, quota: report it, keep the run
        return {"repo": repo_id, "error": f"{type(error).__name__}: {error}"}
