"""Property tests for the third hostile probe's classes 2, 5, 6 and 7 (issue #49; classes
1, 3 and 4 have theirs in test_write_ownership.py, test_tinker_durable.py and
test_text_encoding.py). Each holds for any input Hypothesis draws, not only the probe's:

2. only real runs are runs: a record anyone may ingest never makes a folder deletable,
   whatever the folder holds; the store's own file names are refused in any case;
5. numbers that are not numbers: whatever a score hook returns, the grade is a finite
   number or one line naming the environment and the scenario; an lm-eval samples file
   with any ids and values reads as one row per document or is refused in one line naming
   the file and line;
6. every foreign failure is one line: a PostgreSQL URL that cannot serve, whatever its
   password, is refused in one line that holds the password neither as written nor decoded;
7. nothing lost on a failed replace: ``--overwrite``'s folder swap and its store snapshot
   give back the old run exactly when the new one does not end ``done``, and keep the new
   one exactly when it does.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from posttrain.errors import PosttrainError

PROPERTY = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

# a folder's contents: relative file paths (one or two folders deep) and their bytes; every
# file name ends in ".dat", so no file can collide with a folder of the same name
TREES = st.dictionaries(
    keys=st.tuples(st.sampled_from(["", "sub/", "sub/deeper/", "adapter/"]),
                   st.text(alphabet="abcxyz_-0189", min_size=1, max_size=8)).map(
        lambda parts: f"{parts[0]}{parts[1]}.dat"),
    values=st.binary(max_size=64), max_size=6)

# what a config.json that posttrain did not write for a run may hold
NOT_A_RUN_CONFIG = st.one_of(
    st.none(), st.text(max_size=20).map(lambda text: text.encode()),
    st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                 lambda inner: st.lists(inner, max_size=3)
                 | st.dictionaries(st.sampled_from(["recipe", "x", "name", "steps"]), inner,
                                   max_size=3), max_leaves=6).filter(
        lambda value: not (isinstance(value, dict) and "recipe" in value
                           and "settings" in value)).map(lambda value: json.dumps(value).encode()))


def write_tree(root: Path, tree: dict[str, bytes]) -> None:
    for relative, content in tree.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)


def read_tree(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes()
            for path in sorted(root.rglob("*")) if path.is_file()}


# ------------------------------------------------------------------ class 2


@PROPERTY
@given(tree=TREES, config=NOT_A_RUN_CONFIG, status=st.sampled_from(["done", "failed",
                                                                    "stopped"]),
       linked=st.booleans())
def test_an_ingested_record_never_makes_any_folder_deletable(tmp_path_factory, tree, config,
                                                             status, linked):
    from posttrain.runs.removal import delete_run
    from posttrain.runs.sqlite_store import SqliteRunStore

    root = tmp_path_factory.mktemp("runs")
    target = root / "precious"
    write_tree(target, tree)
    target.mkdir(exist_ok=True)
    if config is not None:
        (target / "config.json").write_bytes(config)
    name = "precious"
    if linked:  # a link under the runs folder to a folder that is no run
        (root / "alias").symlink_to(target, target_is_directory=True)
        name = "alias"
    before = read_tree(target)
    with SqliteRunStore(root / "posttrain.db") as store:
        store.apply([{"op": "create", "run": name, "config": {"recipe": "forged",
                                                              "settings": {}}},
                     {"op": "finish", "run": name, "status": status, "summary": {}}])
        deleted = delete_run(store, root, name, force=True)
        assert deleted.record and deleted.folder is None
        assert store.get_run(name) is None
    assert read_tree(target) == before
    assert (root / name).exists()


@PROPERTY
@given(name=st.sampled_from(["posttrain.db", "posttrain.db-wal", "posttrain.db-shm",
                             "posttrain.db-journal"]),
       flips=st.lists(st.booleans(), min_size=20, max_size=20))
def test_the_stores_own_file_names_are_refused_in_any_case(name, flips):
    from posttrain.runs.ops import RunStoreError, check_run_name

    cased = "".join(char.upper() if flip else char for char, flip in zip(name, flips, strict=False))
    with pytest.raises(RunStoreError, match="the run store's own file"):
        check_run_name(cased)


# ------------------------------------------------------------------ class 5

ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3000), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    st.builds(object), st.just(float("nan")), st.just(float("-inf")))


@PROPERTY
@given(value=ANY_VALUE, raises=st.booleans())
@example(value="x" * 100_000, raises=False)  # a long string: the line stays short
@example(value="line one\nline two", raises=True)
def test_any_score_a_hook_returns_grades_as_a_number_or_one_line(value, raises):
    from posttrain.envs import get_env
    from posttrain.score.rows import rule_score

    refund = get_env("refund")

    class Hook(type(refund)):
        def score(self, reply, case):
            if raises:
                raise ValueError(value)
            return value

    env = Hook()
    record = {"prompt": "hello", "scenario_id": "s-7", "case": {}}
    finite = (not raises and not isinstance(value, bool) and isinstance(value, (int, float))
              and math.isfinite(value))
    if finite:
        assert rule_score(env, "reply", {}, record) == float(value)
        return
    with pytest.raises(PosttrainError) as refused:
        rule_score(env, "reply", {}, record)
    message = str(refused.value)
    assert "\n" not in message and len(message) < 1000
    assert "'s-7'" in message and "score of environment" in message
    # the same value from a --reward function: one line naming the training reward
    from posttrain.score.rubric import training_rubric

    def reward(reply, case):
        if raises:
            raise ValueError(value)
        return value

    with pytest.raises(PosttrainError) as refused:
        training_rubric(get_env("refund"), reward).score("reply", {})
    message = str(refused.value)
    assert "\n" not in message and len(message) < 1000 and "the training reward" in message


DOC_IDS = st.lists(st.integers(min_value=0, max_value=6), min_size=1, max_size=10)
# a per-document value as JSON text: numbers (some too large for a float), and values that
# are no number at all
JSON_VALUES = st.one_of(
    st.integers(min_value=-3, max_value=3).map(str), st.floats(0, 1).map(repr),
    st.sampled_from(["null", '"yes"', "true", "[1]", "{}", "NaN", "Infinity", "1e999"]))


@PROPERTY
@given(ids=DOC_IDS, values=st.lists(JSON_VALUES, min_size=10, max_size=10))
@example(ids=[0, 1, 0], values=["1"] * 10)  # a document counted twice
@example(ids=[0, 1], values=["true", "1"] + ["0"] * 8)
def test_any_lm_eval_samples_file_reads_each_document_once_or_says_which_line(
        tmp_path_factory, ids, values):
    from posttrain.score.eval_logs import load_compared

    folder = tmp_path_factory.mktemp("lm")
    path = folder / "samples_t_2026-01-01T00-00-00.jsonl"
    path.write_text("".join(
        f'{{"doc_id": {doc}, "doc": {{"q": "q{doc}"}}, "filter": "none", '
        f'"metrics": ["acc"], "acc": {values[line]}}}\n' for line, doc in enumerate(ids)))
    try:
        compared = load_compared(path)
    except PosttrainError as error:
        message = str(error)
        assert "\n" not in message and f"{path}:" in message
        return
    # read: every document once, every score a finite number
    assert len(set(ids)) == len(ids)
    assert len(compared.rows) == len(ids)
    assert all(math.isfinite(row["score"]) for row in compared.rows)


# ------------------------------------------------------------------ class 6

PASSWORDS = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FF,
                                           blacklist_categories=("Cs",)),
                    min_size=6, max_size=24).map(lambda text: "pw" + text)


@settings(max_examples=30, deadline=None)
@given(password=PASSWORDS,
       shape=st.sampled_from(["127.0.0.1:1/db", "127.0.0.1:notaport/db",
                              "127.0.0.1:99999/db", "127.0.0.1:1/db?bogus_option=1",
                              "127.0.0.1:1/db?sslmode=sometimes"]))
def test_a_postgres_url_that_cannot_serve_never_shows_its_password(password, shape):
    pytest.importorskip("psycopg")
    from posttrain.runs.ops import RunStoreError
    from posttrain.runs.postgres_store import PostgresRunStore, redacted

    written = quote(password, safe="")
    url = f"postgresql://someone:{written}@{shape}"
    with pytest.raises(RunStoreError) as refused:
        PostgresRunStore(url, connect_timeout=2, hold_when_down=False)
    message = str(refused.value)
    assert "\n" not in message, message
    for secret in (password, written):
        assert secret not in message and secret not in redacted(url)


# ------------------------------------------------------------------ class 7

RUN_CONFIG = json.dumps({"recipe": "grpo", "settings": {"seed": 0}}).encode()


@PROPERTY
@given(old=TREES, new=TREES, outcome=st.sampled_from(["done", "failed", "stopped"]))
def test_a_replace_gives_back_the_old_folder_unless_the_new_run_is_done(tmp_path_factory,
                                                                        old, new, outcome):
    from posttrain.runs.folder import check_new_run, create_run_folder

    root = tmp_path_factory.mktemp("runs")
    old = {**old, "config.json": RUN_CONFIG}
    write_tree(root / "kept", old)
    taken = check_new_run(root, "kept", overwrite=True)
    folder = create_run_folder(taken)
    assert read_tree(root / "kept") == {"run.lock": (root / "kept" / "run.lock").read_bytes()}
    write_tree(folder.path, {**new, "config.json": RUN_CONFIG})
    restored = taken.finish(succeeded=outcome == "done")
    assert restored == (outcome != "done")
    expected = {**new, "config.json": RUN_CONFIG} if outcome == "done" else old
    assert read_tree(root / "kept") == expected
    assert sorted(path.name for path in root.iterdir()) == ["kept"]  # nothing set aside


METRICS = st.dictionaries(st.sampled_from(["loss", "reward", "kl", "entropy"]),
                          st.floats(-1e6, 1e6), min_size=1, max_size=4)


def record_of(store, name: str) -> dict:
    run = store.get_run(name)
    return {"status": run["status"], "config": run["config"], "summary": run["summary"],
            "notes": [(note["step"], note["text"]) for note in run["notes"]],
            "alarms": [(alarm["kind"], alarm["message"]) for alarm in run["alarms"]],
            "points": [point[:3] for point in store.metric_points(name, limit=10_000)]}


@PROPERTY
@given(old_steps=st.lists(METRICS, min_size=1, max_size=5),
       new_steps=st.lists(METRICS, max_size=5),
       notes=st.lists(st.text(min_size=1, max_size=30), max_size=3),
       outcome=st.sampled_from(["done", "failed", "stopped"]))
def test_a_replace_gives_back_the_old_record_unless_the_new_run_is_done(
        tmp_path_factory, old_steps, new_steps, notes, outcome):
    from posttrain.runs.sqlite_store import SqliteRunStore
    from posttrain.runs.store import open_run

    folder = tmp_path_factory.mktemp("store")
    with SqliteRunStore(folder / "posttrain.db") as store:
        old = open_run("kept", {"recipe": "grpo", "settings": {"seed": 0}}, store=store,
                       heartbeat_seconds=None)
        for step, metrics in enumerate(old_steps):
            old.log(step, metrics)
        for text in notes:
            old.note(text, step=1)
        old.alarm("hack", 2, "paid for a format token", {"category": "with_id"})
        old.finish({"verdict": "moved"}, status="done")
        before = record_of(store, "kept")
        new = open_run("kept", {"recipe": "grpo", "settings": {"seed": 1}}, store=store,
                       heartbeat_seconds=None, keep_replaced=True)
        for step, metrics in enumerate(new_steps):
            new.log(step, metrics)
        new.note("the new run")
        new.finish({"verdict": "flat"}, status=outcome)
        after = record_of(store, "kept")
    if outcome == "done":
        assert after["config"]["settings"]["seed"] == 1 and after["notes"][-1][1] == "the new run"
        assert after["status"] == "done" and after["summary"] == {"verdict": "flat"}
        assert len(after["points"]) == sum(len(metrics) for metrics in new_steps)
    else:
        assert new.restored and after == before
