"""A starter's build data for any environment, from the rule's own hooks.

The refund rule hands the build hand-written data (its ``starter_data`` hook). Every
other environment gets the same build from what it already has:

- **prompts**: its prompt writer (``write_prompts``), or a prompts file;
- **right moves**: its reference agent (``reference_agent``), kept only where the
  rule passes them;
- **mistakes**: its scripted agent's replies (several seeds a prompt) that the rule
  fails, then its constructed negative, then the right move of a prompt of another
  category when the rule fails that here (the wrong tool, or a tool where none is
  wanted);
- **what is copied**: every argument of a right move's tool call that the prompt
  holds word for word (a title, a loan number, a weight) is a span the starter's copy
  circuit carries; its words are kept apart by the tokenizer so the span is the same
  tokens in the prompt and in the call, and the gate probes the copy.

``RightShare`` is the behaviour mix: the share of warm-start replies that are the
right move, per category. A share below one is what makes the base policy partial
(passes some, fails some, in every category), which is what GRPO needs.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from posttrain.data.prompts import load_prompts
from posttrain.envs.base import (
    ConstructedNegatives,
    Env,
    PromptWriter,
    ReferenceAgentSource,
    ScriptedAgentSource,
    case_of,
    env_label,
    has_hook,
    passes,
)
from posttrain.envs.wire import parse_tool_calls
from posttrain.errors import PosttrainError
from posttrain.score.rows import grade

#: scripted replies drawn per prompt when looking for its mistakes
MISTAKE_DRAWS = 6
#: a copied span is at least this long (shorter strings match by chance)
MIN_SPAN = 2
#: pass-rate range per category a build must land in: partial, so GRPO has contrast
DEFAULT_PASS_RANGE = (0.15, 0.80)


@dataclass(frozen=True)
class RightShare:
    """The behaviour mix of a starter built from hooks: the share of warm-start replies
    that are the right move (the rest: one of the rule's mistakes), per category
    (``overrides``: ``((category, share), ...)``; the others take ``right``)."""

    right: float = 0.35
    overrides: tuple[tuple[str, float], ...] = ()

    def share(self, category: str) -> float:
        return dict(self.overrides).get(category, self.right)

    def steered(self, pass_rates: dict[str, float],
                ranges: tuple[tuple[str, float, float], ...]) -> RightShare:
        """The mix for the next build after a probe outside the gate's ranges: each
        category outside its range gets its right share scaled by (the range's middle /
        its pass rate), kept within 0.05-0.95. A move the policy rarely gets right (a
        number it must compute) needs a larger share than one it copies; the share that
        lands a category inside its range is not known before the first build."""
        shares = {category: self.share(category) for category, _, _ in ranges}
        for category, low, high in ranges:
            rate = pass_rates.get(category)
            if rate is None or low <= rate <= high:
                continue
            scaled = shares[category] * ((low + high) / 2) / max(rate, 0.02)
            shares[category] = round(min(0.95, max(0.05, scaled)), 3)
        return RightShare(self.right, tuple(sorted(
            (category, share) for category, share in shares.items() if share != self.right)))


def copied_spans(prompt: str, reply: str) -> list[str]:
    """The arguments of ``reply``'s tool calls that ``prompt`` holds word for word (strings
    of ``MIN_SPAN`` characters or more, and numbers written the same way), longest first.
    An argument computed from the prompt ("three" -> 3) is not a copy."""
    spans = set()
    for call in parse_tool_calls(reply) or []:
        for value in _leaves(call.get("arguments", {})):
            if isinstance(value, str):
                if len(value) >= MIN_SPAN and value in prompt:
                    spans.add(value)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                text = json.dumps(value)
                if re.search(rf"(?<![\d.]){re.escape(text)}(?![\d.])", prompt):
                    spans.add(text)
    return sorted(spans, key=lambda span: (-len(span), span))


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


class HookStarterData:
    """What the starter build needs (the ``starter_data`` interface), from ``env``'s hooks
    (module docstring). ``prompts_file``: the prompts, instead of the prompt writer."""

    def __init__(self, env: Env, prompts_file: str | None = None) -> None:
        self.env = env
        self.prompts_file = prompts_file
        if not has_hook(env, ReferenceAgentSource):
            raise PosttrainError(
                f"environment {env_label(env)} has no reference_agent hook: a starter is "
                "built from the rule's right moves; add reference_agent(seed) to the "
                "environment, or give --base-model a model of your own")
        if prompts_file is None and not has_hook(env, PromptWriter):
            raise PosttrainError(
                f"environment {env_label(env)} has no write_prompts hook: a starter is built "
                "on the rule's prompts; add write_prompts(count, seed) to the environment, "
                "or give --prompts-file")
        self.reference = env.reference_agent(0)
        sample = self.records(3, 0)
        if not sample:
            raise PosttrainError(f"environment {env_label(env)}: no prompts to build a "
                                 "starter on")
        messages = env.messages_for(sample[0]["prompt"])
        self.system = next((m["content"] for m in messages if m["role"] == "system"), "")
        self.default_mix = RightShare()
        self.spec_pass_rates = tuple((c, *DEFAULT_PASS_RANGE) for c in env.categories)

    # ------------------------------------------------------------ prompts and dialogues

    def records(self, count: int, seed: int) -> list[dict[str, Any]]:
        """Prompt records: the writer's ``count`` situations from ``seed``, or the file's."""
        if self.prompts_file is not None:
            return load_prompts(self.prompts_file, env=self.env)
        assert has_hook(self.env, PromptWriter)
        return self.env.write_prompts(count, seed)

    def overlap_note(self, situations: int, seed: int) -> str | None:
        """A warning when the prompt writer holds a fixed set (a dataset: fewer prompts
        than asked for): the starter then learns the very prompts a recipe holds out, so
        its before/after numbers measure recall of their answers."""
        if self.prompts_file is not None:
            return None
        written = len(self.records(situations, seed))
        if written >= situations:
            return None
        return (f"note: environment {env_label(self.env)} writes a fixed set of {written} "
                f"prompts ({situations} asked): the starter learns the prompts the recipes "
                "hold out, so a run on it measures recall of their answers, not the rule "
                "learned; build it from --prompts-file prompts apart from your evaluation "
                "set, or bring a model")

    def dialogues(self, mix: RightShare, situations: int, data_seed: int
                  ) -> list[dict[str, Any]]:
        """Warm-start rows ``{"prompt", "category", "behaviour", "reply", "right_reply",
        "spans"}``, deterministic; prompts the reference agent fails are left out."""
        records = self.records(situations, data_seed)
        right_rows = grade(self.env, records, self.reference, 1, seed=data_seed)
        kept = [(r, row) for r, row in zip(records, right_rows, strict=True)
                if passes(row["score"])]
        if len(kept) < len(records) / 2:
            raise PosttrainError(
                f"environment {env_label(self.env)}: its reference agent fails the rule on "
                f"{len(records) - len(kept)} of {len(records)} prompts; a starter is built from "
                "right moves, so fix reference_agent (or the score) first")
        mistakes = self._mistakes([r for r, _ in kept], [row["reply"] for _, row in kept],
                                  data_seed)
        # every category at least its share of the corpus (a writer's categories need not
        # be balanced, and few distinct prompts of one kind dedupe away): a smaller one is
        # cycled up to it, each draw with its own move
        by_category: dict[str, list[int]] = {}
        for index, (_, right) in enumerate(kept):
            by_category.setdefault(right["category"], []).append(index)
        per_category = max(1, situations // max(1, len(by_category)))
        rng = random.Random(data_seed)
        rows = []
        for category in sorted(by_category):
            members = by_category[category]
            for draw in range(max(per_category, len(members))):
                index = members[draw % len(members)]
                record, right = kept[index]
                wrong = mistakes[index]
                is_right = not wrong or rng.random() < mix.share(category)
                kind, reply = ("right", right["reply"]) if is_right else rng.choice(wrong)
                rows.append({"prompt": record["prompt"], "category": category,
                             "behaviour": kind, "reply": reply, "right_reply": right["reply"],
                             "spans": copied_spans(record["prompt"], right["reply"])})
        return rows

    def _mistakes(self, records: list[dict[str, Any]], rights: list[str], seed: int
                  ) -> list[list[tuple[str, str]]]:
        """Per prompt, ``(kind, reply)`` for each distinct reply the rule fails."""
        found: list[list[tuple[str, str]]] = [[] for _ in records]
        if has_hook(self.env, ScriptedAgentSource):
            scripted = grade(self.env, records, self.env.scripted_agent(seed), MISTAKE_DRAWS,
                             seed=seed)
            for index, row in enumerate(scripted):
                slot = found[index // MISTAKE_DRAWS]
                if not passes(row["score"]) and row["reply"] not in {r for _, r in slot}:
                    slot.append(("scripted", row["reply"]))
        cases = [case_of(self.env, record) for record in records]
        if has_hook(self.env, ConstructedNegatives):
            for index, record in enumerate(records):
                negative = self.env.constructed_negative(record["prompt"], cases[index])
                if negative and not passes(self.env.score(negative, cases[index])):
                    found[index].append(("negative", negative))
        # another category's right move, where this prompt fails it
        by_category: dict[str, list[str]] = {}
        for case, right in zip(cases, rights, strict=True):
            by_category.setdefault(self.env.category(case), []).append(right)
        rng = random.Random(seed + 1)
        for index, case in enumerate(cases):
            if found[index]:
                continue
            others = [c for c in sorted(by_category) if c != self.env.category(case)]
            if others:
                reply = rng.choice(by_category[rng.choice(others)])
                if not passes(self.env.score(reply, case)):
                    found[index].append(("other_category", reply))
        return found

    def fresh(self, row: dict[str, Any], rng: random.Random) -> dict[str, Any]:
        """Rows are not re-randomised: the corpus is as large as the draws instead."""
        return row

    def render(self, row: dict[str, Any]) -> str:
        """A dialogue as the tokenizer's training text (ChatML)."""
        return (f"<|im_start|>system\n{self.system}<|im_end|>\n<|im_start|>user\n"
                f"{row['prompt']}<|im_end|>\n<|im_start|>assistant\n{row['reply']}<|im_end|>\n")

    # ------------------------------------------------------------ what is copied

    def isolated_words(self, rows: list[dict[str, Any]]) -> tuple[str, ...]:
        """The words of every copied span (digits aside: the tokenizer splits those anyway),
        kept whole by the tokenizer so a span is the same tokens in prompt and call."""
        words = set()
        for row in rows:
            for span in row["spans"]:
                words.update(w for w in re.findall(r"[^\W\d_]+", span) if len(w) > 1)
        return tuple(sorted(words, key=lambda w: (-len(w), w)))

    def copy_token_ids(self, tokenizer: Any, rows: list[dict[str, Any]]
                       ) -> tuple[list[int], list[int]]:
        """(the tokens inside copied spans, no prefix tokens): the copy circuit's set. A
        span's first token is the policy's to choose; the circuit copies what follows it."""
        tokens: set[int] = set()
        digits = False
        for row in rows:
            for span in row["spans"]:
                tokens.update(tokenizer.encode(span, add_special_tokens=False))
                digits = digits or any(ch.isdigit() for ch in span)
        if digits:  # fresh numbers use every digit chunk, not only those seen
            tokens.update(i for token, i in tokenizer.get_vocab().items() if token.isdigit())
        return sorted(tokens), []

    def copy_prompts(self, records: list[dict[str, Any]]) -> list[str]:
        """The prompts whose right move copies a span (the copy probe's)."""
        replies = grade(self.env, records, self.reference, 1, seed=0)
        return [record["prompt"] for record, row in zip(records, replies, strict=True)
                if copied_spans(record["prompt"], row["reply"])]

    def copy_probe(self, prompt: str) -> tuple[str, str, str]:
        """(the right move forced up to its longest copied span, "", the span)."""
        reply = grade(self.env, [{"prompt": prompt, "scenario_id": "probe"}], self.reference,
                      1, seed=0)[0]["reply"]
        span = copied_spans(prompt, reply)[0]
        # the span inside the call's arguments (not a tool name that happens to hold it)
        start = reply.index(span, max(0, reply.find('"arguments"')))
        return reply[:start], "", span

    def digest(self, rows: list[dict[str, Any]]) -> str:
        """12 hex digits of SHA-256 over the system prompt and the dialogues: the data part
        of the build key (another rule, or other prompts, is another starter)."""
        payload = json.dumps({"system": self.system, "rows": rows}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]

