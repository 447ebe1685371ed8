"""Preference pairs for DPO: built from graded rows, constructed for missing contrast, and
read from or written to JSONL.

A pair is one TRL conversational row plus three fields of ours::

    {"prompt": [system, user], "chosen": [assistant], "rejected": [assistant],
     "margin": float, "scenario_id": str, "constructed": bool}

**Sampled pairs** (``build_preference_pairs``). Rows are grouped by prompt text
(lower-cased, whitespace collapsed; the scenario id is noted on each pair but does
not group, because one scenario can have several phrasings that are different
prompts to the model). Within a group, replies are ranked by raw score; each one in
turn, best first, is paired with an unused reply at least ``min_margin`` lower, the
one closest to it in length (characters), so that "longer wins" is not the easiest
thing to learn. Each reply joins at most one pair, and a prompt gives at most
``max_pairs_per_prompt`` pairs. The raw score is used rather than pass/fail so that
a right answer (1.0) also pairs with a near miss (0.3 or 0.2), not only with 0.

A pair whose two *first turns* read the same is dropped: the first turn is the first
tool-call block rendered canonically (sorted-key JSON), else the reply text, so two
replies that make the same call and differ in surrounding prose teach nothing about
the rule. Its two replies still count as used.

**Constructed negatives** (``constructed_negatives``). DPO only learns where a
prompt has contrast, and a base policy that almost never invents an order id on a
no-id prompt gives those prompts no pairs, while the with-id pairs teach "call the
tool" everywhere. For each distinct prompt where the environment knows a bad reply
(its ``constructed_negative`` hook: for the refund rule, an invented lookup on a
prompt without an id) and the policy answered with a passing reply, the shortest such
reply is the chosen side and the environment's bad reply the rejected side. They are
capped at ``constructed_share`` of the sampled pairs (floor): uncapped, they teach
"never call a tool" (DPO seed recipe: with-id pass@1 fell 0.11 to 0.05). With no
sampled pair the cap is 0, so constructed pairs never make up a training set alone;
the recipe then stops and asks for more samples, which is the real problem.

``export_preference`` writes pairs; ``load_pairs`` reads them back and names the
line of anything wrong (bad JSON, a missing side, identical sides).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from posttrain.agents import stable_seed
from posttrain.envs.base import ConstructedNegatives, Env, case_of, passes, require_hook
from posttrain.envs.wire import parse_tool_call, render_tool_call
from posttrain.errors import InputFileError
from posttrain.jsonl import numbered_lines, strict_json_loads, write_jsonl_atomic
from posttrain.score.rows import grade

Pair = dict[str, Any]

DEFAULT_MIN_MARGIN = 0.5
DEFAULT_MAX_PAIRS_PER_PROMPT = 2
DEFAULT_CONSTRUCTED_SHARE = 0.3
# "chosen is longer" in at least this share of at least this many pairs reads as a
# length confound (the reference SDK's threshold)
LENGTH_CONFOUND_SHARE = 0.75
LENGTH_CONFOUND_MIN_PAIRS = 8
PAIR_FIELDS = ("prompt", "chosen", "rejected", "margin", "scenario_id", "constructed")

_SPACES = re.compile(r"\s+")


# ---------------------------------------------------------------- small helpers


def prompt_key(text: str) -> str:
    """The grouping key of a prompt: lower-cased, runs of whitespace made one space."""
    return _SPACES.sub(" ", (text or "").strip().lower())


def first_turn(reply: str) -> str:
    """The reply's first tool call rendered canonically, else its stripped text."""
    call = parse_tool_call(reply)
    if call is not None:
        return render_tool_call(call["name"], call["arguments"], canonical=True)
    return (reply or "").strip()


def pair_row(
    messages: list[dict[str, str]],
    chosen: str,
    rejected: str,
    *,
    margin: float | None,
    scenario_id: str,
    constructed: bool,
) -> Pair:
    """One pair in the file and trainer shape (see module docstring)."""
    return {
        "prompt": [dict(message) for message in messages],
        "chosen": [{"role": "assistant", "content": chosen}],
        "rejected": [{"role": "assistant", "content": rejected}],
        "margin": None if margin is None else round(float(margin), 6),
        "scenario_id": str(scenario_id),
        "constructed": bool(constructed),
    }


def user_text(pair: Pair) -> str:
    """The last user turn of a pair's prompt ('' when there is none)."""
    for message in reversed(pair.get("prompt") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            return str(message.get("content", ""))
    return ""


def side_text(pair: Pair, side: str) -> str:
    """The content of a pair's assistant turn on ``side`` ("chosen" or "rejected")."""
    return str(pair[side][-1].get("content", ""))


def constructed_cap(sampled_pairs: int, share: float) -> int:
    """At most ``share`` x ``sampled_pairs`` constructed pairs, rounded down (0 for none)."""
    if share < 0:
        raise ValueError(f"constructed share must be >= 0, got {share}")
    return math.floor(sampled_pairs * share + 1e-9)


# ---------------------------------------------------------------- the report


@dataclass
class PairReport:
    """What went into a set of pairs, for the run summary and the console.

    ``prompts_seen`` / ``prompts_with_contrast`` / ``identical_first_turns_dropped`` /
    ``constructed_cap`` are None when the pairs came from a file. Length figures are
    over the sampled pairs only (a constructed pair's length is set by construction).
    """

    source: str  # "on-policy" or the file read
    pairs: int = 0  # sampled + constructed: what the trainer gets
    sampled_pairs: int = 0
    constructed_pairs: int = 0
    prompts_seen: int | None = None
    prompts_with_contrast: int | None = None
    prompts_paired: int = 0
    mean_margin: float | None = None
    chosen_longer: int = 0
    chosen_longer_share: float | None = None
    identical_first_turns_dropped: int | None = None
    constructed_cap: int | None = None
    min_margin: float | None = None
    max_pairs_per_prompt: int | None = None
    skipped_lines: int = 0
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """Two or more readable lines (the warnings last, each prefixed with '!')."""
        if self.prompts_seen is not None:
            head = (
                f"pairs {self.pairs}: {self.sampled_pairs} sampled from "
                f"{self.prompts_with_contrast}/{self.prompts_seen} prompts with contrast"
            )
        else:
            head = (
                f"pairs {self.pairs} from {self.source}: {self.sampled_pairs} sampled, "
                f"{self.prompts_paired} prompts"
            )
        if self.constructed_cap is not None:
            head += f", {self.constructed_pairs} constructed (cap {self.constructed_cap})"
        elif self.constructed_pairs:
            head += f", {self.constructed_pairs} constructed"
        detail = []
        if self.mean_margin is not None:
            detail.append(f"mean margin {self.mean_margin:.2f}")
        if self.chosen_longer_share is not None:
            detail.append(
                f"chosen longer in {self.chosen_longer}/{self.sampled_pairs} "
                f"({self.chosen_longer_share:.0%})"
            )
        if self.identical_first_turns_dropped is not None:
            detail.append(f"identical first turns dropped {self.identical_first_turns_dropped}")
        if self.skipped_lines:
            detail.append(f"invalid lines skipped {self.skipped_lines}")
        lines = [head] + (["  " + "; ".join(detail)] if detail else [])
        lines += [f"! {warning}" for warning in self.warnings]
        return "\n".join(lines)


def summarize_pairs(pairs: Sequence[Pair], *, source: str = "on-policy") -> PairReport:
    """A report of what a list of pairs holds (counts, margin, length balance, warnings)."""
    sampled = [pair for pair in pairs if not pair.get("constructed")]
    margins = [float(p["margin"]) for p in sampled if isinstance(p.get("margin"), (int, float))]
    longer = sum(len(side_text(p, "chosen")) > len(side_text(p, "rejected")) for p in sampled)
    report = PairReport(
        source=source,
        pairs=len(pairs),
        sampled_pairs=len(sampled),
        constructed_pairs=len(pairs) - len(sampled),
        prompts_paired=len({prompt_key(user_text(pair)) for pair in pairs}),
        mean_margin=round(sum(margins) / len(margins), 4) if margins else None,
        chosen_longer=longer,
        chosen_longer_share=round(longer / len(sampled), 4) if sampled else None,
    )
    share = report.chosen_longer_share
    if share is not None and len(sampled) >= LENGTH_CONFOUND_MIN_PAIRS:
        if share >= LENGTH_CONFOUND_SHARE:
            report.warnings.append(
                f"length confound: the chosen reply is the longer one in {longer} of "
                f"{len(sampled)} sampled pairs; DPO can learn 'longer wins' before the rule"
            )
    return report


# ---------------------------------------------------------------- sampled pairs


def _check_row(index: int, row: Any) -> None:
    if not isinstance(row, dict):
        raise ValueError(f"row {index} is {type(row).__name__}, expected a graded row (dict)")
    for name in ("prompt", "reply"):
        if not isinstance(row.get(name), str):
            raise ValueError(f"row {index}: field {name!r} is missing or not text")
    score = row.get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        raise ValueError(
            f"row {index}: field 'score' (the raw rule score) is missing or not a number"
        )


def _pairs_for_prompt(
    group: list[dict[str, Any]],
    env: Env,
    *,
    min_margin: float,
    max_pairs: int,
    length_match: bool,
) -> tuple[list[Pair], int]:
    """Greedy pairing within one prompt's rows; returns (pairs, identical first turns dropped)."""
    ranked = sorted(group, key=lambda row: -float(row["score"]))  # stable: ties keep order
    used: set[int] = set()
    pairs: list[Pair] = []
    dropped = 0
    for position, chosen in enumerate(ranked):
        if len(pairs) >= max_pairs:
            break
        if position in used:
            continue
        candidates = [
            other
            for other in range(position + 1, len(ranked))
            if other not in used
            and float(chosen["score"]) - float(ranked[other]["score"]) >= min_margin - 1e-9
        ]
        if not candidates:
            # every later reply scores lower still, so it cannot find a partner either
            break
        if length_match:
            length = len(chosen["reply"])
            pick = min(
                candidates, key=lambda other: (abs(len(ranked[other]["reply"]) - length), other)
            )
        else:
            pick = candidates[0]
        used.update((position, pick))
        rejected = ranked[pick]
        if first_turn(chosen["reply"]) == first_turn(rejected["reply"]):
            dropped += 1
            continue
        pairs.append(
            pair_row(
                env.messages_for(chosen["prompt"]),
                chosen["reply"],
                rejected["reply"],
                margin=float(chosen["score"]) - float(rejected["score"]),
                scenario_id=str(chosen.get("scenario_id", "")),
                constructed=False,
            )
        )
    return pairs, dropped


def build_preference_pairs(
    rows: Iterable[dict[str, Any]],
    *,
    env: Env,
    min_margin: float = DEFAULT_MIN_MARGIN,
    max_pairs_per_prompt: int = DEFAULT_MAX_PAIRS_PER_PROMPT,
    length_match: bool = True,
    constructed_share: float | None = None,
) -> tuple[list[Pair], PairReport]:
    """Chosen/rejected pairs from graded rows (see module docstring); returns (pairs, report).

    ``rows`` need ``prompt``, ``reply`` and ``score`` (raw rule score, not the 0/1
    reward); ``scenario_id`` is copied onto each pair. ``constructed_share`` None adds
    no constructed negatives; a number appends them, capped at that share of the
    sampled pairs (``constructed_cap``). Pairs come out in first-seen prompt order,
    constructed ones last. Raises ``ValueError`` for a malformed row (naming its
    index), ``min_margin <= 0`` or ``max_pairs_per_prompt < 1``.
    """
    if min_margin <= 0:
        raise ValueError(
            f"min_margin must be > 0, got {min_margin}: equal scores are no preference"
        )
    if max_pairs_per_prompt < 1:
        raise ValueError(f"max_pairs_per_prompt must be at least 1, got {max_pairs_per_prompt}")
    rows = list(rows)
    groups: dict[str, list[dict[str, Any]]] = {}
    for index, row in enumerate(rows):
        _check_row(index, row)
        groups.setdefault(prompt_key(row["prompt"]), []).append(row)
    pairs: list[Pair] = []
    with_contrast = dropped = 0
    for group in groups.values():
        scores = [float(row["score"]) for row in group]
        if max(scores) - min(scores) >= min_margin - 1e-9:
            with_contrast += 1
        found, lost = _pairs_for_prompt(
            group,
            env,
            min_margin=min_margin,
            max_pairs=max_pairs_per_prompt,
            length_match=length_match,
        )
        pairs.extend(found)
        dropped += lost
    cap = None
    if constructed_share is not None:
        cap = constructed_cap(len(pairs), constructed_share)
        pairs.extend(constructed_negatives(rows, env=env, max_pairs=cap))
    report = summarize_pairs(pairs)
    report.prompts_seen = len(groups)
    report.prompts_with_contrast = with_contrast
    report.identical_first_turns_dropped = dropped
    report.constructed_cap = cap
    report.min_margin = min_margin
    report.max_pairs_per_prompt = max_pairs_per_prompt
    if report.sampled_pairs == 0:
        report.warnings.append(
            "no prompt had contrast (every prompt's replies scored within the margin): "
            "sample more replies per prompt (--pair-samples)"
        )
    if dropped:
        report.warnings.append(
            f"{dropped} pair(s) dropped because both replies open with the same first turn"
        )
    return pairs, report


# ---------------------------------------------------------------- constructed negatives


def _passing(row: dict[str, Any]) -> bool:
    return bool(row["reply"].strip()) and passes(float(row["score"]))


def constructed_negatives(
    rows: Iterable[dict[str, Any]],
    *,
    env: Env,
    max_pairs: int | None = None,
) -> list[Pair]:
    """Pairs (own passing reply, the environment's known-bad reply) where it has one.

    The known-bad reply comes from the environment's ``constructed_negative(prompt,
    case)`` hook (the refund rule: a lookup of an invented id on a prompt that gives
    none; ``None`` where it has no negative). One pair per distinct prompt text
    (repeats from ``--balance`` do not multiply it) that has a negative and at least
    one passing reply; the chosen side is the shortest passing reply (the first on
    ties). The margin is the environment's score of the chosen minus that of the
    negative; a negative that scores as well is skipped. Over ``max_pairs``, a spread
    of ``max_pairs`` is kept (every k-th, in prompt order), so the cap does not favour
    the first prompts. Raises ``PosttrainError`` when the environment has no hook.
    """
    negative_for = require_hook(env, ConstructedNegatives, "knows no bad reply to pair against",
                                "drop --constructed-negatives").constructed_negative
    best: dict[str, dict[str, Any]] = {}
    for index, row in enumerate(rows):
        _check_row(index, row)
        if not _passing(row):
            continue
        key = prompt_key(row["prompt"])
        if key not in best or len(row["reply"].strip()) < len(best[key]["reply"].strip()):
            best[key] = row
    pairs = []
    for row in best.values():
        case = case_of(env, row)
        rejected = negative_for(row["prompt"], case)
        if rejected is None:
            continue
        margin = float(row["score"]) - env.score(rejected, case)
        if margin <= 0:
            continue
        pairs.append(
            pair_row(
                env.messages_for(row["prompt"]),
                row["reply"],
                rejected,
                margin=margin,
                scenario_id=str(row.get("scenario_id", "")),
                constructed=True,
            )
        )
    if max_pairs is not None and len(pairs) > max_pairs:
        pairs = [pairs[int(i * len(pairs) / max_pairs)] for i in range(max_pairs)]
    return pairs


# ---------------------------------------------------------------- files


def _message_problem(message: Any) -> str | None:
    if not isinstance(message, dict):
        return "each message must be an object with 'role' and 'content'"
    if not isinstance(message.get("role"), str) or not isinstance(message.get("content"), str):
        return "each message needs text 'role' and 'content'"
    return None


def pair_problem(pair: Any) -> tuple[str | None, str] | None:
    """What is wrong with a pair as ``(field, problem)``, or None when it is usable."""
    if not isinstance(pair, dict):
        return None, "expected a JSON object"
    prompt = pair.get("prompt")
    if not isinstance(prompt, list) or not prompt:
        return "prompt", "missing: expected a list of messages ending with the user turn"
    for message in prompt:
        problem = _message_problem(message)
        if problem:
            return "prompt", problem
    if not user_text(pair).strip():
        return "prompt", "no user turn with text"
    for side in ("chosen", "rejected"):
        value = pair.get(side)
        if not isinstance(value, list) or not value:
            return side, "missing: expected a list with one assistant message"
        problem = _message_problem(value[-1])
        if problem:
            return side, problem
        if value[-1]["role"] != "assistant":
            return side, "the last message must be the assistant's"
        if not value[-1]["content"].strip():
            return side, "the assistant turn is empty"
    if side_text(pair, "chosen").strip() == side_text(pair, "rejected").strip():
        return "rejected", "identical to chosen: a pair needs two different replies"
    margin = pair.get("margin")
    if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float))
                               or not math.isfinite(margin)):
        return "margin", "must be a finite number (or absent)"
    if not isinstance(pair.get("constructed", False), bool):
        return "constructed", "must be true or false (or absent)"
    return None


def export_preference(pairs: Iterable[Pair], path: str | os.PathLike) -> Path:
    """Write pairs as JSONL (atomically), one per line, fields ``PAIR_FIELDS`` only.

    Raises ``ValueError`` naming the first unusable pair (its index and field) before
    anything is written.
    """
    lines = []
    for index, pair in enumerate(pairs):
        problem = pair_problem(pair)
        if problem is not None:
            where, what = problem
            raise ValueError(f"pair {index}" + (f" field {where!r}" if where else "") + f": {what}")
        lines.append(pair_record(pair))
    return write_jsonl_atomic(path, lines)


def pair_record(pair: dict[str, Any]) -> Pair:
    """A checked pair in the file's shape: our six fields, the optional ones filled in."""
    return {
        "prompt": pair["prompt"],
        "chosen": pair["chosen"],
        "rejected": pair["rejected"],
        "margin": pair.get("margin"),
        "scenario_id": str(pair.get("scenario_id", "")),
        "constructed": bool(pair.get("constructed", False)),
    }


def load_pairs(
    path: str | os.PathLike, *, skip_invalid: bool = False
) -> tuple[list[Pair], list[str]]:
    """Read a pairs JSONL file; returns ``(pairs, skipped)``.

    Every line must be a JSON object with a prompt, two non-empty assistant sides that
    differ, and optional ``margin`` / ``scenario_id`` / ``constructed``. A bad line
    raises ``InputFileError`` naming ``path:line`` and the field, unless
    ``skip_invalid``: then it is left out and described in ``skipped`` (one
    ``"path:line: problem"`` each). Blank lines are ignored. A missing file, or one
    with no usable pair, raises ``InputFileError`` either way.
    """
    path = Path(path)
    if not path.is_file():
        raise InputFileError(str(path), None, None, "no such pairs file")
    pairs: list[Pair] = []
    skipped: list[str] = []
    hint = " (or pass --skip-invalid to drop such lines)"
    for line_number, line in numbered_lines(path):
        if not line.strip():
            continue
        try:
            item = strict_json_loads(line)
            problem = pair_problem(item)
        except (ValueError, RecursionError) as error:
            problem = (None, f"not valid JSON ({error})")
        if problem is not None:
            if not skip_invalid:
                raise InputFileError(str(path), line_number, problem[0], problem[1] + hint)
            skipped.append(str(InputFileError(str(path), line_number, problem[0], problem[1])))
            continue
        pairs.append(pair_record(item))
    if not pairs:
        what = (
            f"no usable preference pair ({len(skipped)} invalid lines)"
            if skipped
            else ("no preference pairs")
        )
        raise InputFileError(str(path), None, None, what)
    return pairs, skipped


# ---------------------------------------------------------------- sampling


def sample_pair_rows(
    env: Env,
    records: Sequence[dict[str, Any]],
    agent: Any,
    samples: int,
    *,
    seed: int = 0,
    progress: Any = None,
) -> list[dict[str, Any]]:
    """Graded rows for pair building: ``samples`` replies per distinct train prompt.

    A prompt repeated in ``records`` (``--balance``) gets ``samples`` x its count
    replies, so balancing buys a minority prompt more chances of contrast; the replies
    all differ because each sample index has its own seed (``grade``). Rows come out
    in first-seen prompt order. ``progress(done, total)`` is called as replies arrive.
    """
    if samples < 1:
        raise ValueError(f"samples per prompt must be at least 1, got {samples}")
    first: dict[str, dict[str, Any]] = {}
    counts: dict[str, int] = {}
    for record in records:
        key = prompt_key(record["prompt"])
        first.setdefault(key, record)
        counts[key] = counts.get(key, 0) + 1
    order = {key: position for position, key in enumerate(first)}
    by_repeat: dict[int, list[dict[str, Any]]] = {}
    for key, record in first.items():
        by_repeat.setdefault(counts[key], []).append(record)
    total = sum(samples * counts[key] for key in first)
    rows: list[dict[str, Any]] = []
    for repeat, group in sorted(by_repeat.items()):
        done = len(rows)

        def report(finished: int, _: int, done: int = done) -> None:
            if progress is not None:
                progress(done + finished, total)

        pair_seed = stable_seed("pairs", seed)
        rows.extend(grade(env, group, agent, samples * repeat, seed=pair_seed, progress=report))
    rows.sort(key=lambda row: (order[prompt_key(row["prompt"])], row["sample"]))
    return rows
