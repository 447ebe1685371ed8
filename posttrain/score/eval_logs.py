"""Evaluations run elsewhere as graded rows: inspect_ai eval logs and lm-evaluation-harness
``--log_samples`` output, for ``posttrain eval --compare`` (and ``--noise-from``).

``load_compared(path, score)`` reads one side of a comparison, whatever wrote it:

- **posttrain's graded rows** (JSONL, ``score.rows.load_rows``);
- **an inspect_ai log** (``.eval``, or ``.json`` as ``inspect log convert`` writes it), read
  with inspect's own ``read_eval_log``: one row per sample and epoch, paired by sample id,
  each epoch an ``eval_run`` (so a log of 2+ epochs carries the repeats a noise band is
  made of), the category from ``metadata["category"]``;
- **lm-evaluation-harness samples** (``samples_TASK_TIME.jsonl``, or the output folder
  that holds one or more): one row per document, paired by task and ``doc_id``, the
  category from the document's ``category`` field, else the task's name.

A row passes (``reward`` 1) when its score reaches 1.0, as every posttrain rule's does:
inspect's C is 1.0 (``value_to_float``: P is 0.5, I 0), lm-eval's ``acc`` and
``exact_match`` are 0 or 1. ``score`` picks the scorer (inspect) or ``METRIC[,FILTER]``
(lm-eval, as its results name them: ``exact_match,strict-match``); by default the first.
Every scorer or metric is also a marker.

``pairing_problem(a, b)`` says why two sides cannot be paired (different formats,
different tasks, sample sets that barely overlap), or None.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.errors import InputFileError, PosttrainError
from posttrain.jsonl import MAX_PARSE_COST, describe_cost, read_jsonl_objects, stream_parse_cost
from posttrain.score.rows import load_rows
from posttrain.text import json_kind

POSTTRAIN_ROWS, INSPECT_LOG, LM_EVAL_SAMPLES = "posttrain rows", "inspect log", "lm-eval samples"
#: the category of a row whose log names none (as ``load_rows`` defaults it)
NO_CATEGORY = "all"
#: the most bytes one inspect_ai log may unpack to (a .eval's members as the archive
#: declares them, which bounds what reading them can produce; a .json log's size): past
#: it the log is refused before it is read (a 1.1 MB zip bomb took 2.1 GB of memory)
MAX_LOG_BYTES = 256 * 1024 * 1024
_LM_EVAL_NAME = re.compile(r"^samples_(?P<task>.+)_(?P<time>\d{4}-\d{2}-\d{2}T[\d.\-]+)\.jsonl$")


@dataclass
class ComparedRows:
    """One side of a comparison: its graded rows and where they came from."""

    path: str
    kind: str
    rows: list[dict[str, Any]]
    #: the task(s) the rows answer (empty for posttrain's rows, which name no task)
    tasks: tuple[str, ...] = ()
    #: the scorer or metric that decided ``reward`` (foreign logs only)
    score: str | None = None
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        what = f"{self.kind} {self.path}"
        if self.tasks:
            what += f" (task {', '.join(self.tasks)}"
            what += f"; score {self.score})" if self.score else ")"
        return what


def load_compared(path: str | Path, score: str | None = None) -> ComparedRows:
    """Read one side of ``--compare`` (module docstring); InputFileError for a file that is
    none of the known kinds."""
    path = Path(path)
    if path.is_dir():
        return _lm_eval_folder(path, score)
    if not path.is_file():
        raise InputFileError(str(path), None, None, "no such file or folder")
    if path.suffix == ".eval" or (path.suffix == ".json" and _is_inspect_json(path)):
        return _inspect_log(path, score)
    if path.suffix == ".json":
        raise InputFileError(str(path), None, None,
                             "not an inspect_ai log (no 'eval' header); expected posttrain's "
                             "graded rows (.jsonl), an inspect log (.eval/.json) or lm-eval's "
                             "samples_*.jsonl")
    if _is_lm_eval_samples(path):
        return _lm_eval_files([path], score, str(path))
    if score is not None:
        raise PosttrainError(f"--score {score!r} applies to inspect logs and lm-eval samples; "
                             f"{path} holds posttrain's graded rows (their reward is the rule's)")
    return ComparedRows(str(path), POSTTRAIN_ROWS, load_rows(path))


def pairing_problem(before: ComparedRows, after: ComparedRows) -> str | None:
    """Why ``before`` and ``after`` cannot be paired, or None. posttrain's own rows keep
    their NOT COMPARABLE verdict instead (``score.delta``)."""
    if before.kind != after.kind:
        return (f"{before.path} is {_article(before.kind)} and {after.path} "
                f"{_article(after.kind)}: compare two of one kind")
    if before.kind == POSTTRAIN_ROWS:
        return None
    if set(before.tasks) != set(after.tasks):
        return (f"they ran different tasks ({', '.join(before.tasks)} against "
                f"{', '.join(after.tasks)}); a paired delta needs the same samples")
    ids_before = {row["scenario_id"] for row in before.rows}
    ids_after = {row["scenario_id"] for row in after.rows}
    shared, union = ids_before & ids_after, ids_before | ids_after
    if 2 * len(shared) < len(union):
        return (f"they share {len(shared)} of {len(union)} sample ids (different datasets, "
                "shuffles or --limit?); a paired delta needs the same samples on both sides")
    return None


def _article(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else kind


# -- inspect_ai ---------------------------------------------------------------------


def _is_inspect_json(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            head = handle.read(4096).decode("utf-8", errors="replace")
    except OSError:
        return False
    return head.lstrip().startswith("{") and '"eval"' in head


def check_log_size(path: Path, limit: int = MAX_LOG_BYTES,
                   cost_limit: int = MAX_PARSE_COST) -> None:
    """``InputFileError`` when an inspect_ai log would unpack to more than ``limit`` bytes
    (a ``.eval`` archive by its members' declared sizes: reading cannot give more than a
    member declares; any other file by its size on disk), or when parsing what it holds
    would cost more than ``cost_limit`` bytes of memory (``jsonl.parse_cost``, counted in
    a linear pass over the unpacked bytes, a megabyte at a time)."""
    import zipfile

    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                unpacked = sum(member.file_size for member in archive.infolist())
                _check_unpacked(path, unpacked, limit)
                cost = sum(stream_parse_cost(archive.open(member))
                           for member in archive.infolist())
        except (zipfile.BadZipFile, OSError, EOFError) as error:
            raise InputFileError(str(path), None, None,
                                 f"not a readable inspect_ai log ({error})") from None
    else:
        _check_unpacked(path, path.stat().st_size, limit)
        cost = stream_parse_cost(path.open("rb"))
    if cost > cost_limit:
        raise InputFileError(str(path), None, None, describe_cost(cost, cost_limit)
                             + ": compare fewer samples")


def _check_unpacked(path: Path, unpacked: int, limit: int) -> None:
    if unpacked > limit:
        raise InputFileError(str(path), None, None,
                             f"unpacks to {unpacked / 2**20:,.0f} MB, more than the "
                             f"{limit / 2**20:,.0f} MB posttrain reads from one log (a "
                             "compressed bomb, or a log too large to compare in memory: "
                             "compare fewer samples)")



def _inspect_log(path: Path, score: str | None) -> ComparedRows:
    try:
        from inspect_ai.log import read_eval_log
        from inspect_ai.scorer import value_to_float
    except ImportError:
        raise PosttrainError(
            f"{path}: reading an inspect_ai log needs the inspect_ai package; install "
            "posttrain's ecosystem extra (pip install 'posttrain[ecosystem]', Python 3.11+)"
        ) from None
    check_log_size(path)
    try:
        log = read_eval_log(str(path))
    except Exception as error:  # a truncated zip, a JSON of another shape
        raise InputFileError(str(path), None, None,
                             f"not a readable inspect_ai log ({type(error).__name__}: {error})"
                             ) from None
    task = str(log.eval.task)
    if not log.samples:
        raise InputFileError(str(path), None, None,
                             f"the log of task {task} holds no samples (status {log.status})")
    as_float = value_to_float()
    notes = []
    if log.status != "success":
        notes.append(f"{path}: the evaluation's status is {log.status}, not success")
    scorers = _scorer_names(log.samples)
    chosen = _chosen(score, scorers, path, "scorer")
    if len(scorers) > 1 and score is None:
        notes.append(f"{path}: reward from scorer {chosen} (the first of {', '.join(scorers)}; "
                     "pick another with --score)")
    rows, errored, not_numbers = [], 0, 0
    seen: set[tuple[str, int]] = set()
    for sample in log.samples:
        key = (str(sample.id), int(sample.epoch))
        if key in seen:
            raise InputFileError(str(path), None, None,
                                 f"sample {key[0]!r} (epoch {key[1]}) appears twice: a sample "
                                 "is counted once")
        seen.add(key)
        values = {name: as_float(value.value) for name, value in (sample.scores or {}).items()}
        if chosen not in values:
            errored += 1
            continue
        if not math.isfinite(values[chosen]):
            not_numbers += 1
            continue
        values = {name: value for name, value in values.items() if math.isfinite(value)}
        metadata = sample.metadata or {}
        category = metadata.get("category")
        rows.append(_row(str(sample.id), sample.epoch - 1,
                         category if isinstance(category, str) and category else NO_CATEGORY,
                         _input_text(sample.input), values[chosen], values,
                         reply=sample.output.completion if sample.output else ""))
    if errored:
        notes.append(f"{path}: {errored} sample(s) without a {chosen} score (errored or "
                     "unscored) were left out")
    if not_numbers:
        notes.append(f"{path}: {not_numbers} sample(s) whose {chosen} score is not a finite "
                     "number (NaN or infinity) were left out")
    if not rows:
        raise InputFileError(str(path), None, None, f"no sample has a {chosen} score")
    return ComparedRows(str(path), INSPECT_LOG, rows, (task,), chosen, notes)


def _scorer_names(samples: list[Any]) -> list[str]:
    names: dict[str, None] = {}
    for sample in samples:
        for name in sample.scores or {}:
            names.setdefault(name, None)
    return list(names)


def _input_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    texts = [getattr(message, "text", "") for message in value or []]
    return texts[-1] if texts else ""


# -- lm-evaluation-harness ------------------------------------------------------------


def _is_lm_eval_samples(path: Path) -> bool:
    if _LM_EVAL_NAME.match(path.name):
        return True
    try:
        with path.open("rb") as handle:
            first = handle.readline().decode("utf-8", errors="replace")
        item = json.loads(first)
    except (OSError, ValueError):
        return False
    return isinstance(item, dict) and "doc_id" in item and "doc" in item


def _lm_eval_folder(folder: Path, score: str | None) -> ComparedRows:
    files = sorted(folder.rglob("samples_*.jsonl"))
    if not files:
        raise InputFileError(str(folder), None, None,
                             "no samples_*.jsonl in this folder (run lm-eval with "
                             "--log_samples --output_path)")
    by_task: dict[str, list[Path]] = {}
    for path in files:
        match = _LM_EVAL_NAME.match(path.name)
        by_task.setdefault(match.group("task") if match else path.stem, []).append(path)
    repeated = {task: paths for task, paths in by_task.items() if len(paths) > 1}
    if repeated:
        task, paths = next(iter(repeated.items()))
        raise InputFileError(str(folder), None, None,
                             f"holds {len(paths)} sample files of task {task} "
                             f"({', '.join(p.name for p in paths)}): one run per folder, or "
                             "name the file")
    return _lm_eval_files(files, score, str(folder))


def _lm_eval_files(paths: list[Path], score: str | None, where: str) -> ComparedRows:
    rows: list[dict[str, Any]] = []
    tasks, notes = [], []
    chosen_names: set[str] = set()
    for path in paths:
        match = _LM_EVAL_NAME.match(path.name)
        task = match.group("task") if match else path.stem
        tasks.append(task)
        lines = list(read_jsonl_objects(path))
        if not lines:
            raise InputFileError(str(path), None, None, "the file holds no samples")
        metric, chosen_filter = _lm_eval_choice(lines, score, path)
        chosen_names.add(f"{metric},{chosen_filter}")
        file_rows = []
        seen: dict[Any, int] = {}  # doc_id -> the line it was read on
        for line_number, item in lines:
            if item.get("filter", "none") != chosen_filter:
                continue
            for name in ("doc_id", metric):
                if name not in item:
                    raise InputFileError(str(path), line_number, name,
                                         "missing from an lm-eval sample")
            values = {name: _metric_value(item[name]) for name in item.get("metrics") or []
                      if name in item}
            value = _metric_value(item[metric])
            if value is None:
                raise InputFileError(str(path), line_number, metric,
                                     f"expected a finite number (a per-document metric), got "
                                     f"{item[metric]!r}")
            if item["doc_id"] in seen:
                raise InputFileError(str(path), line_number, "doc_id",
                                     f"document {item['doc_id']!r} appears twice (also line "
                                     f"{seen[item['doc_id']]}): a document is counted once")
            seen[item["doc_id"]] = line_number
            doc = item.get("doc") if isinstance(item.get("doc"), dict) else {}
            category = doc.get("category")
            file_rows.append(_row(f"{task}/{item['doc_id']}", 0,
                                  category if isinstance(category, str) and category else task,
                                  f"{task}/{item['doc_id']}", value,
                                  {k: v for k, v in values.items() if v is not None}))
        rows.extend(file_rows)
        if not {row["score"] for row in file_rows} <= {0.0, 1.0}:
            notes.append(f"{path}: {metric} is not 0/1 per document; a document passes "
                         "when it reaches 1.0")
    return ComparedRows(where, LM_EVAL_SAMPLES, rows, tuple(tasks),
                        ", ".join(sorted(chosen_names)), notes)


def _lm_eval_choice(lines: list[tuple[int, dict[str, Any]]], score: str | None,
                    path: Path) -> tuple[str, str]:
    """The metric and filter ``--score METRIC[,FILTER]`` names (default: the first)."""
    metrics: dict[str, None] = {}
    filters: dict[str, None] = {}
    for line_number, item in lines:
        check_lm_eval_fields(item, path, line_number)
        for name in item.get("metrics") or []:
            metrics.setdefault(name, None)
        filters.setdefault(str(item.get("filter", "none")), None)
    wanted_metric, _, wanted_filter = (score or "").partition(",")
    metric = _chosen(wanted_metric or None, list(metrics), path, "metric")
    chosen_filter = _chosen(wanted_filter or None, list(filters), path, "filter")
    return metric, chosen_filter


def check_lm_eval_fields(item: dict[str, Any], path: Path, line_number: int) -> None:
    """The fields posttrain reads of an lm-eval sample, of the types lm-eval writes:
    ``doc_id`` a whole number or a string, ``metrics`` a list of names, ``filter`` a
    string; ``InputFileError`` naming the file, the line and the field otherwise."""
    doc_id = item.get("doc_id")
    if "doc_id" in item and (isinstance(doc_id, bool) or not isinstance(doc_id, (int, str))):
        raise InputFileError(str(path), line_number, "doc_id",
                             f"expected a whole number or a string, got {json_kind(doc_id)}")
    names = item.get("metrics")
    if names is not None and (not isinstance(names, list)
                              or not all(isinstance(name, str) for name in names)):
        raise InputFileError(str(path), line_number, "metrics",
                             f"expected a list of metric names, got {json_kind(names)}")
    if not isinstance(item.get("filter", "none"), str):
        raise InputFileError(str(path), line_number, "filter",
                             f"expected a string, got {json_kind(item['filter'])}")


def _metric_value(value: Any) -> float | None:
    """A per-document value as a float; None for anything that is not a finite number
    (NaN and infinity would otherwise read as a fail or a pass)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


# -- shared ----------------------------------------------------------------------------


def _chosen(wanted: str | None, names: list[str], path: Path, what: str) -> str:
    if not names:
        raise InputFileError(str(path), None, None, f"no {what} is recorded")
    if wanted is None:
        return names[0]
    if wanted not in names:
        raise PosttrainError(f"--score: {path} has no {what} {wanted!r}; it has "
                             f"{', '.join(names)}")
    return wanted


def _row(scenario: str, eval_run: int, category: str, prompt: str, score: float,
         markers: dict[str, float], reply: str = "") -> dict[str, Any]:
    """A graded row as ``score.rows`` writes them (one sample per scenario and run)."""
    return {"prompt": prompt, "scenario_id": scenario, "category": category, "sample": 0,
            "reply": reply, "score": score, "reward": int(score >= 1.0),
            "markers": {name: float(value >= 1.0) for name, value in markers.items()},
            "eval_run": eval_run}
