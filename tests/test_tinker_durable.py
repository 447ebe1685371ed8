"""A durable tinker service: `posttrain serve` killed with SIGKILL mid-way through an SDK
training loop and started again on the same state folder answers the SDK's next calls as
if nothing happened (the journal of its submissions is replayed before it listens).

The same SDK script runs twice with the same seeds, once against a server that is never
stopped and once against one killed while a forward_backward and an optim_step are in
flight; both must end with the same adapter (the PEFT folder `save_weights_for_sampler`
writes), the same losses and the same sampled tokens. Raw requests check what the SDK
does not show: a future finished before the kill is retrievable after it, one in flight is
answered, request and session ids survive. The journal also replays from PostgreSQL
(`--state-store`), and a finished session is dropped from it, not replayed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from posttrain.service.engine import Engine  # noqa: E402
from posttrain.service.protocols.tinker.journal import Journal  # noqa: E402
from posttrain.service.server import start_server  # noqa: E402
from tests.tinker_wire import post_tinker, sdk_environment  # noqa: E402, F401 (fixture)

BASE = "starter-2m"
ADAM = types.AdamParams(learning_rate=5e-3, beta1=0.9, beta2=0.95, eps=1e-8,
                        weight_decay=0.0, grad_clip_norm=1.0)
SENTENCES = ["Where is my order ORD-4417? It has not arrived.",
             "Please refund order ORD-2231, the box was empty.",
             "Cancel ORD-9001 before it ships, please."]
STEPS = 6
KILL_AT = 3  # the step whose forward_backward and optim_step are in flight at the kill


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ServeProcess:
    """`posttrain serve` as its own process (what SIGKILL kills), on a fixed port."""

    def __init__(self, state_dir: Path, port: int, log: Path):
        self.state_dir, self.port, self.log = state_dir, port, log
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "a") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "posttrain", "serve", "--base-model", BASE,
                 "--port", str(self.port), "--state-dir", str(self.state_dir),
                 "--torch-threads", "1", "--quiet"],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(self.url + "/api/v1/healthz", timeout=2):
                    return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"posttrain serve did not start: {self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def answer_of(url: str, request_id: str) -> dict:
    """retrieve_future until it answers (a 408 is the server's try-again)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status, body = post_tinker(url, "/retrieve_future", {"request_id": request_id})
        if status == 200:
            return body
        assert status == 408, (status, body)
    raise AssertionError(f"no answer for {request_id}")


def training_script(url: str, in_flight=None) -> dict:
    """The SDK client under test: STEPS cross_entropy steps, a save_state, a snapshot
    sampler used after the kill, final named sampler weights. ``in_flight(step)`` is
    called right after a step's forward_backward and optim_step are submitted."""
    service = tinker.ServiceClient(base_url=url)
    trainer = service.create_lora_training_client(base_model=BASE, rank=4, seed=11).result()
    tokenizer = trainer.get_tokenizer()
    batch = []
    for sentence in SENTENCES:
        ids = tokenizer.encode(sentence)
        batch.append(types.Datum(
            model_input=types.ModelInput.from_ints(ids[:-1]),
            loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)}))
    losses, grad_norms, sampler = [], [], None
    for step in range(STEPS):
        if step == 2:
            trainer.save_state("step-2").result()
            sampler = trainer.save_weights_and_get_sampling_client().result()
        backward = trainer.forward_backward(batch, "cross_entropy")
        optim = trainer.optim_step(ADAM)
        if in_flight is not None:
            in_flight(step)
        losses.append(backward.result().metrics["loss:sum"])
        grad_norms.append(optim.result().metrics["grad_norm:mean"])
    prompt = types.ModelInput.from_ints(tokenizer.encode("Where is my order"))
    sampled = sampler.sample(prompt, 2, types.SamplingParams(max_tokens=8, seed=5)).result()
    final = trainer.save_weights_for_sampler("final").result().path
    service.close("success").result()
    run_id = final.split("/")[2]
    return {"losses": losses, "grad_norms": grad_norms, "run_id": run_id,
            "tokens": [list(sequence.tokens) for sequence in sampled.sequences]}


def journaled(state_dir: Path, route: str) -> int:
    """How many submissions of ``route`` the server's journal holds."""
    journal = Journal(state_dir)
    try:
        return sum(1 for entry in journal.entries() if entry.route == route)
    finally:
        journal.close()


def adapter(state_dir: Path, run_id: str) -> dict:
    from safetensors.torch import load_file

    return load_file(str(state_dir / "runs" / run_id / "exports" / "final"
                         / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def uninterrupted(starter_2m_folder, tmp_path_factory):
    folder = tmp_path_factory.mktemp("uninterrupted")
    server = ServeProcess(folder, free_port(), folder / "serve.log")
    server.start()
    try:
        result = training_script(server.url)
    finally:
        server.stop()
    return {**result, "state_dir": folder}


def test_a_sigkilled_server_restarted_finishes_the_sdk_script_with_the_same_weights(
        uninterrupted, tmp_path):
    server = ServeProcess(tmp_path, free_port(), tmp_path / "serve.log")
    server.start()
    restarted = threading.Event()

    def kill_and_restart(step: int) -> None:
        if step != KILL_AT:
            return
        # once the server has taken this step's optim_step (journaled, answered with a
        # request id), kill it before the SDK has its result
        deadline = time.monotonic() + 60
        while journaled(tmp_path, "optim_step") < KILL_AT + 1:
            assert time.monotonic() < deadline, "the optim_step never reached the server"
            time.sleep(0.01)
        server.kill()  # the SDK's polls now fail to connect and are retried

        def start_again() -> None:
            time.sleep(1.0)
            server.start()
            restarted.set()
        threading.Thread(target=start_again, daemon=True).start()

    try:
        result = training_script(server.url, kill_and_restart)
        assert restarted.is_set()
    finally:
        server.stop()
    log = (tmp_path / "serve.log").read_text()
    assert "replayed" in log and "did not replay" not in log, log[-3000:]
    assert result["losses"] == pytest.approx(uninterrupted["losses"], rel=1e-6, abs=1e-9)
    assert result["grad_norms"] == pytest.approx(uninterrupted["grad_norms"], rel=1e-6)
    assert result["tokens"] == uninterrupted["tokens"]
    assert result["losses"][-1] < result["losses"][0]  # it trained: no step lost or doubled
    mine, theirs = adapter(tmp_path, result["run_id"]), adapter(
        uninterrupted["state_dir"], uninterrupted["run_id"])
    assert mine.keys() == theirs.keys()
    for name in mine:
        assert torch.allclose(mine[name], theirs[name], rtol=0, atol=1e-6), name


def test_futures_and_ids_survive_a_kill(starter_2m_folder, tmp_path):
    """Raw requests: a session, a client, a finished future and one submitted just before
    the kill, all answered after the restart under the ids handed out before it."""
    server = ServeProcess(tmp_path, free_port(), tmp_path / "serve.log")
    server.start()
    try:
        _, session = post_tinker(server.url, "/create_session", {"sdk_version": tinker.__version__})
        session_id = session["session_id"]
        _, created = post_tinker(server.url, "/create_model", {
            "session_id": session_id, "model_seq_id": 0, "base_model": BASE,
            "lora_config": {"rank": 4}})  # no seed: the server draws one and journals it
        model_id = created["model_id"]
        assert answer_of(server.url, created["request_id"])["model_id"] == model_id
        _, saved = post_tinker(server.url, "/save_weights", {"model_id": model_id, "seq_id": 1,
                                                      "path": "first"})
        finished = answer_of(server.url, saved["request_id"])
        _, stepped = post_tinker(server.url, "/optim_step", {
            "model_id": model_id, "seq_id": 2,
            "adam_params": {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.95,
                            "eps": 1e-8, "weight_decay": 0.0, "grad_clip_norm": 0.0}})
        server.kill()  # the optim_step may be queued, running or done: it is journaled
        server.start()
        assert answer_of(server.url, saved["request_id"]) == finished
        after = answer_of(server.url, stepped["request_id"])
        assert after["metrics"]["step:max"] == 1, after
        # the same session and client go on; the name taken before the kill stays taken
        _, again = post_tinker(server.url, "/save_weights", {"model_id": model_id, "seq_id": 3,
                                                      "path": "first"})
        assert "already exists" in answer_of(server.url, again["request_id"])["error"]
        _, info = post_tinker(server.url, "/get_info", {"model_id": model_id})
        assert info["model_id"] == model_id
        status, _ = post_tinker(server.url, "/session_heartbeat", {"session_id": session_id})
        assert status == 200
        # a finished session is dropped from the journal at the next start
        assert post_tinker(server.url, f"/sessions/{session_id}/finish", {})[0] == 200
        server.kill()
        server.start()
        status, _ = post_tinker(server.url, "/session_heartbeat", {"session_id": session_id})
        assert status == 410
    finally:
        server.stop()
    journal = Journal(tmp_path)
    try:
        assert journal.entries() == []
    finally:
        journal.close()


def test_the_journal_replays_from_postgresql(policy, postgres_url, tmp_path, one_torch_thread):
    """--state-store postgresql://...: the same replay from a PostgreSQL journal (two
    in-process servers on one state folder, the first stopped without finishing)."""
    first = start_server(Engine(BASE, tmp_path, policy=policy, torch_threads=one_torch_thread),
                         port=0, state_store=postgres_url, verbose=False)
    try:
        _, session = post_tinker(first.url, "/create_session", {"sdk_version": tinker.__version__})
        _, created = post_tinker(first.url, "/create_model", {
            "session_id": session["session_id"], "model_seq_id": 0, "base_model": BASE,
            "lora_config": {"rank": 4, "seed": 3}})
        answer_of(first.url, created["request_id"])
        _, saved = post_tinker(first.url, "/save_weights", {"model_id": created["model_id"],
                                                     "seq_id": 1, "path": "pg"})
        before = answer_of(first.url, saved["request_id"])
    finally:
        first.stop()
    assert not (tmp_path / "tinker-journal.sqlite").exists()
    second = start_server(Engine(BASE, tmp_path, policy=policy, torch_threads=one_torch_thread),
                          port=0, state_store=postgres_url, verbose=False)
    try:
        assert answer_of(second.url, saved["request_id"]) == before
        _, info = post_tinker(second.url, "/get_info", {"model_id": created["model_id"]})
        assert info["lora_rank"] == 4
    finally:
        second.stop()


def test_a_lapsed_session_is_dropped_from_the_journal(policy, tmp_path, one_torch_thread):
    """A session whose heartbeat lapses ends in the journal, and a restart replays none of
    it (its runs were cancelled); a live one is replayed under its old id."""
    from posttrain.http_core import Request
    from posttrain.service.protocols.tinker.replay import replay_journal
    from posttrain.service.protocols.tinker.routes import TinkerService, TinkerSettings

    def create_session(service: TinkerService) -> str:
        """POST /api/v1/create_session through the service's own route (journaled)."""
        handler = next(handler for method, path, handler in service.routes()
                       if path == "/api/v1/create_session")
        request = Request("POST", "/api/v1/create_session", {}, {}, {},
                          json.dumps({"sdk_version": tinker.__version__}).encode())
        return json.loads(handler(request).body)["session_id"]

    engine = Engine(BASE, tmp_path, policy=policy, torch_threads=one_torch_thread,
                    reap_interval_s=0.1)
    journal = Journal(tmp_path)
    short = TinkerService(engine, TinkerSettings(session_timeout_s=0.5), journal=journal)
    lapsing = create_session(short)
    deadline = time.monotonic() + 30
    while engine.get_session(lapsing)["status"] != "expired":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert [entry.route for entry in journal.entries()][-1] == "session_expired"
    engine.shutdown()
    journal.close()

    engine = Engine(BASE, tmp_path, policy=policy, torch_threads=one_torch_thread)
    journal = Journal(tmp_path)
    try:
        again = TinkerService(engine, journal=journal)
        report = replay_journal(again, journal)
        assert report.submissions == 0 and report.dropped >= 2, report
        assert journal.entries() == []
        with pytest.raises(Exception, match="no session"):
            engine.get_session(lapsing)
        live = create_session(again)
    finally:
        engine.shutdown()
        journal.close()
    engine = Engine(BASE, tmp_path, policy=policy, torch_threads=one_torch_thread)
    journal = Journal(tmp_path)
    try:
        report = replay_journal(TinkerService(engine, journal=journal), journal)
        assert report.submissions == 1 and not report.failures
        assert engine.get_session(live)["status"] == "open"
    finally:
        engine.shutdown()
        journal.close()


def test_a_damaged_journal_is_refused_with_what_to_do(policy, tmp_path, one_torch_thread):
    from posttrain.errors import PosttrainError

    (tmp_path / "tinker-journal.sqlite").write_bytes(b"not a database " * 100)
    engine = Engine(BASE, tmp_path, policy=policy, torch_threads=one_torch_thread)
    try:
        with pytest.raises(PosttrainError, match=r"tinker-journal\.sqlite cannot be opened.*"
                                                 r"move it aside"):
            start_server(engine, port=0, verbose=False)
    finally:
        engine.shutdown()


@pytest.mark.parametrize("run_id", ["../../escape", "/tmp/escape-abs", "a/b"])
def test_a_journal_whose_run_id_is_a_path_writes_nothing_outside(policy, tmp_path,
                                                                 one_torch_thread, run_id):
    """Issue #49, severe finding 3: a journal row whose run id was `../../X` or an absolute
    path made the replay write run.json, states/ and exports/ there. The id is refused by
    pattern, the replay goes on, and nothing lands outside the state folder."""
    from posttrain.service.protocols.tinker.journal import Entry
    from posttrain.service.protocols.tinker.replay import replay_journal
    from posttrain.service.protocols.tinker.routes import TinkerService

    state_dir = tmp_path / "state" / "deep"
    state_dir.mkdir(parents=True)
    journal = Journal(state_dir)
    session_id = "sess-0123456789abcdef"
    journal.append(Entry("create_session", {}, json.dumps(
        {"sdk_version": tinker.__version__}).encode(), None, None, [session_id], session_id))
    journal.append(Entry("create_model", {}, json.dumps(
        {"session_id": session_id, "model_seq_id": 0, "base_model": BASE,
         "lora_config": {"rank": 2, "seed": 0}}).encode(), None, None,
        [run_id, "req-0123456789abcdef0123456789abcdef"], session_id))
    journal.close()
    before = sorted(str(path) for path in tmp_path.rglob("*"))
    engine = Engine(BASE, state_dir, policy=policy, torch_threads=one_torch_thread)
    journal = Journal(state_dir)
    try:
        service = TinkerService(engine, journal=journal)
        report = replay_journal(service, journal)
        assert report.submissions == 2
        answer = service.futures.get("req-0123456789abcdef0123456789abcdef").wait(30)
        assert b"run id: expected a name" in answer.body
        assert engine.get_session(session_id)["status"] == "open"  # the rest replayed
    finally:
        engine.shutdown()
        journal.close()
    after = sorted(str(path) for path in tmp_path.rglob("*")
                   if not str(path).startswith(str(state_dir)))
    assert after == [path for path in before if not path.startswith(str(state_dir))]
    assert not Path("/tmp/escape-abs").exists()
    assert not (state_dir / "runs").exists() or not any(
        (state_dir / "runs").iterdir())


def test_a_replay_of_thousands_of_sessions_is_linear(policy, tmp_path, one_torch_thread,
                                                     monkeypatch):
    """Issue #49: the replay heartbeat every open session after every entry (3,000 sessions
    took 20 s, 20,000 never started listening in 120 s). Keep-alives now come at most once
    a second: the heartbeats grow with the sessions times the seconds, not the square."""
    from posttrain.service.protocols.tinker.journal import Entry
    from posttrain.service.protocols.tinker.replay import replay_journal
    from posttrain.service.protocols.tinker.routes import TinkerService

    count = 3000
    journal = Journal(tmp_path)
    body = json.dumps({"sdk_version": tinker.__version__}).encode()
    for number in range(count):
        session_id = f"sess-{number:016x}"
        journal.append(Entry("create_session", {}, body, None, None, [session_id], session_id))
    journal.close()
    engine = Engine(BASE, tmp_path, policy=policy, torch_threads=one_torch_thread)
    beats = []
    real_heartbeat = engine.heartbeat
    monkeypatch.setattr(engine, "heartbeat", lambda session_id: (beats.append(session_id),
                                                                 real_heartbeat(session_id))[1])
    journal = Journal(tmp_path)
    try:
        started = time.monotonic()
        report = replay_journal(TinkerService(engine, journal=journal), journal)
        seconds = time.monotonic() - started
        assert report.submissions == count and not report.failures
        assert len(engine.sessions()) == count
        assert seconds < 60, seconds
        assert len(beats) <= count * (seconds + 2), (len(beats), seconds)
    finally:
        engine.shutdown()
        journal.close()


def test_a_second_server_on_one_state_folder_stops_before_loading(starter_2m_folder,
                                                                  tmp_path):
    """Issue #49: two servers on one state folder replayed one journal and wrote the same
    runs. The folder's serve.lock is held for a server's life; a second server says so in
    one line, exit 2, before its model loads; once the first is killed (SIGKILL too) the
    folder is free again."""
    state_dir = tmp_path / "state"
    first = ServeProcess(state_dir, free_port(), tmp_path / "first.log")
    first.start()
    try:
        started = time.monotonic()
        second = subprocess.run(
            [sys.executable, "-m", "posttrain", "serve", "--base-model", BASE,
             "--port", str(free_port()), "--state-dir", str(state_dir)],
            capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and "another server is using the state folder" in lines[0]
        assert "--state-dir" in lines[0]
        assert time.monotonic() - started < 60
        first.kill()
        again = ServeProcess(state_dir, free_port(), tmp_path / "again.log")
        again.start()  # the kernel let the killed server's lock go
        again.stop()
    finally:
        first.stop()


def test_journal_rows_that_are_not_entries_are_said_and_skipped(policy, tmp_path,
                                                                one_torch_thread):
    """Issue #49, class 3: journal values that are not JSON gave tracebacks at start. Each
    row is checked for an entry's shape on read; a damaged one is named by its position
    in one line and left out, and the rest replays."""
    import sqlite3

    from posttrain.service.protocols.tinker.journal import JOURNAL_FILE, Entry
    from posttrain.service.protocols.tinker.replay import replay_journal
    from posttrain.service.protocols.tinker.routes import TinkerService

    journal = Journal(tmp_path)
    good = "sess-00000000000000aa"
    journal.append(Entry("create_session", {}, json.dumps(
        {"sdk_version": tinker.__version__}).encode(), None, None, [good], good))
    service = journal.service
    journal.close()
    with sqlite3.connect(tmp_path / JOURNAL_FILE) as db:
        insert = ("INSERT INTO tinker_journal (service, route, path_match, body, "
                  "content_encoding, caller, choices, session_id, at) "
                  "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)")
        db.execute(insert, (service, "create_session", "{}", b"{}", None, None,
                            "not json", "sess-1"))
        db.execute(insert, (service, "create_session", "{}", b"{}", None, "../root",
                            "[]", "sess-2"))
        db.execute(insert, (service, "../../x", "{}", b"{}", None, None, "[]", "sess-3"))
        db.execute(insert, (service, "create_session", "[1, 2]", b"{}", None, None,
                            "[]", "sess-4"))
    engine = Engine(BASE, tmp_path, policy=policy, torch_threads=one_torch_thread)
    journal = Journal(tmp_path)
    try:
        report = replay_journal(TinkerService(engine, journal=journal), journal)
        assert report.submissions == 1
        damaged = [line for line in report.failures if "damaged, not replayed" in line]
        assert len(damaged) == 4 and all("\n" not in line for line in damaged)
        assert any("not JSON" in line for line in damaged)
        assert any("caller" in line for line in damaged)
        assert engine.get_session(good)["status"] == "open"
    finally:
        engine.shutdown()
        journal.close()
