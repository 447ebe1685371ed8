"""Output paths are written the way command-line tools write them (#32, class 2).

A regular file is replaced atomically; a symlink is followed (its target changes, the
link stays); a device or FIFO is written into, never swapped for a file; a folder, a
path under a file, a folder that cannot take a new file and the run store itself are
refused with one line before any work starts. Real files, FIFOs and devices throughout.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.atomic import check_output_path, write_text_atomic
from posttrain.cli import main
from posttrain.errors import PosttrainError
from posttrain.runs.sqlite_store import SqliteRunStore
from posttrain.runs.store import open_run


def read_fifo_in_thread(path: Path) -> tuple[threading.Thread, list[str]]:
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(path.read_bytes().decode()),
                              daemon=True)
    reader.start()
    return reader, got


def test_a_symlink_is_followed_and_kept(tmp_path):
    target = tmp_path / "real.jsonl"
    target.write_text("old\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    write_text_atomic(link, "new\n")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new\n"
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "made-by-the-write")
    write_text_atomic(dangling, "x\n")  # as `> dangling` would: the target is created
    assert dangling.is_symlink() and (tmp_path / "made-by-the-write").read_text() == "x\n"


def test_a_fifo_is_written_into_not_replaced(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader, got = read_fifo_in_thread(fifo)
    write_text_atomic(fifo, "through the pipe\n")
    reader.join(timeout=10)
    assert got == ["through the pipe\n"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]  # no temp file beside it


def test_devices_are_written_into_and_a_full_one_says_so():
    write_text_atomic("/dev/null", "discarded\n")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    with pytest.raises(PosttrainError, match=r"^cannot write /dev/full: no space left"):
        write_text_atomic("/dev/full", "x" * 100_000)
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)  # still the device


@pytest.mark.parametrize("where, message", [
    ("folder", "is a folder"),
    ("file/x", "is a file, not a folder"),
    ("/proc/version", "no new file can be made in /proc"),
])
def test_unwritable_places_are_one_line_errors(tmp_path, where, message):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("keep\n")
    path = where if where.startswith("/") else tmp_path / where
    with pytest.raises(PosttrainError, match=message) as refused:
        write_text_atomic(path, "x\n")
    assert "\n" not in str(refused.value)
    assert (tmp_path / "file").read_text() == "keep\n"


def test_commands_refuse_bad_outputs_before_any_work(tmp_path, capsys):
    (tmp_path / "file").write_text("keep\n")
    assert main(["prompts", "write", str(tmp_path / "file" / "x.jsonl")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert main(["prompts", "write", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    prompts = tmp_path / "p.jsonl"
    assert main(["prompts", "write", str(prompts), "--prompts", "20"]) == 0
    capsys.readouterr()
    # a command never writes over the file it reads
    assert main(["prompts", "filter", str(prompts), str(prompts)]) == 2
    assert "which this command reads" in capsys.readouterr().err
    assert main(["eval", "--agent", "seeded", "--prompts-file", str(prompts),
                 "--out", str(prompts)]) == 2
    assert "which this command reads" in capsys.readouterr().err


def test_prompts_write_follows_a_symlink_and_feeds_a_fifo(tmp_path, capsys):
    target = tmp_path / "real.jsonl"
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    assert main(["prompts", "write", str(link), "--prompts", "20"]) == 0
    assert link.is_symlink() and len(target.read_text().splitlines()) > 10
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader, got = read_fifo_in_thread(fifo)
    assert main(["prompts", "write", str(fifo), "--prompts", "20"]) == 0
    reader.join(timeout=20)
    assert got and got[0] == target.read_text()  # the same prompts, through the pipe
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_runs_export_refuses_the_store_proc_and_paths_under_files(tmp_path, capsys):
    store = SqliteRunStore(tmp_path / "posttrain.db")
    run = open_run("r", {"recipe": "grpo"}, store=store, heartbeat_seconds=None)
    run.log(1, {"loss": 0.5})
    run.finish({}, status="done")
    store.close()
    before = (tmp_path / "posttrain.db").read_bytes()
    for out, message in [(tmp_path / "posttrain.db", "which this command reads"),
                         ("/proc/version", "no new file can be made in /proc"),
                         (tmp_path / "posttrain.db" / "x", "is a file, not a folder")]:
        assert main(["runs", "export", "r", "--runs-dir", str(tmp_path), "--out", str(out)]) == 2
        error = capsys.readouterr().err
        assert message in error and "Traceback" not in error, error
    assert (tmp_path / "posttrain.db").read_bytes() == before
    assert main(["runs", "export", "r", "--runs-dir", str(tmp_path), "--out", "/dev/null"]) == 0


# --- the property: whatever the path is, the rule holds ------------------------------------

PATH_KINDS = ["missing", "regular", "symlink", "dangling", "fifo", "folder", "under_file",
              "null_device", "missing_parents"]


def make_path(folder: Path, kind: str) -> Path:
    """A path of ``kind`` inside ``folder`` (fresh for every example)."""
    (folder / "file").write_text("a file\n")
    if kind == "regular":
        (folder / "out").write_text("old\n")
    elif kind == "symlink":
        (folder / "target").write_text("old\n")
        (folder / "out").symlink_to(folder / "target")
    elif kind == "dangling":
        (folder / "out").symlink_to(folder / "target")
    elif kind == "fifo":
        os.mkfifo(folder / "out")
    elif kind == "folder":
        (folder / "out").mkdir()
    elif kind == "under_file":
        return folder / "file" / "out"
    elif kind == "null_device":
        return Path("/dev/null")
    elif kind == "missing_parents":
        return folder / "a" / "b" / "out"
    return folder / "out"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(PATH_KINDS),
       text=st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=200))
def test_every_kind_of_path_is_written_or_refused_never_replaced(tmp_path_factory, kind, text):
    folder = tmp_path_factory.mktemp("out")
    path = make_path(folder, kind)
    kind_before = os.lstat(path).st_mode if os.path.lexists(path) else None
    reader, got = read_fifo_in_thread(path) if kind == "fifo" else (None, [])
    try:
        check_output_path(path)
        write_text_atomic(path, text)
        refused = None
    except PosttrainError as error:
        refused = str(error)
    if reader is not None:
        reader.join(timeout=10)
    if kind in ("folder", "under_file"):
        assert refused is not None and "\n" not in refused
    else:
        assert refused is None, refused
    if kind_before is not None:  # what was there is still that kind of thing
        assert stat.S_IFMT(os.lstat(path).st_mode) == stat.S_IFMT(kind_before)
    written = {"missing": path, "regular": path, "symlink": folder / "target",
               "dangling": folder / "target", "missing_parents": path}.get(kind)
    if written is not None:
        assert written.read_bytes() == text.encode("utf-8")
    if kind == "fifo":
        assert got == [text]
    leftovers = [p.name for p in folder.rglob(".*")]
    assert not leftovers, leftovers  # no temp file left beside anything
