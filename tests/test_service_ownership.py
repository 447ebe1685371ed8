"""Nobody touches what is not theirs, on ``posttrain serve`` (issue #49, the third hostile
probe's severe finding 1: another user's token ran forward_backward and optim_step on a run
it did not own, saved over its checkpoint, overwrote its sampler weights and finished its
session). Every write route of the three wings is enumerated: each one that changes a
session or a run refuses a token that did not create it with 403 and leaves the session,
the run and the state folder byte-identical; the others are listed with why they change
nothing of anyone's."""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request

import pytest

pytest.importorskip("torch")
tinker = pytest.importorskip("tinker")

from tinker import types  # noqa: E402

from posttrain.service.engine import Engine  # noqa: E402
from posttrain.service.server import start_server  # noqa: E402
from tests.tinker_wire import sdk_environment  # noqa: E402, F401 (fixture)

BASE = "starter-2m"
ALICE, BOB, ADMIN = "tml-alice-0123456789", "tml-bob-0123456789ab", "tml-admin-012345678"

#: write routes that change no session or run of anyone's, and why
CHANGES_NOTHING_OF_ANYONES = {
    ("POST", "/v1/training/tokenize"): "reads the tokenizer",
    ("POST", "/v1/training/detokenize"): "reads the tokenizer",
    ("POST", "/v1/training/sessions"): "opens a new session, the caller's",
    ("POST", "/v1/chat/completions"): "samples; changes no run",
    ("POST", "/api/v1/client/config"): "answers the feature flags",
    ("POST", "/api/v1/client/dynamic_config"): "answers the feature flags",
    ("POST", "/api/v1/telemetry"): "accepted and dropped",
    ("POST", "/api/v1/create_session"): "opens a new session, the caller's",
    ("POST", "/api/v1/get_info"): "reads a model's description",
    ("POST", "/api/v1/retrieve_future"): "reads an answer",
    ("POST", "/api/v1/weights_info"): "reads a checkpoint's description",
    ("POST", "/api/v1/sessions/search"): "refused to everyone (not served)",
    ("POST", "/api/v1/copy_weights"): "refused to everyone (not served)",
    ("POST", "/api/v1/sessions/{session_id}/project"): "refused to everyone (not served)",
    ("PUT", "/api/v1/sessions/{session_id}/project"): "refused to everyone (not served)",
    ("POST", "/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}/publish"):
        "refused to everyone (not served)",
    ("DELETE", "/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}/publish"):
        "refused to everyone (not served)",
    ("PUT", "/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}/ttl"):
        "refused to everyone (not served)",
}


def call(url: str, method: str, path: str, body: object, token: str,
         content_type: str = "application/json") -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method, headers={
        "Content-Type": content_type, "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def forward_backward_body(model_id: str, seq_id: int) -> bytes:
    from tinker.proto import tinker_public_pb2

    return tinker_public_pb2.ForwardBackwardRequest(model_id=model_id,
                                                    seq_id=seq_id).SerializeToString()


def snapshot(server, state_dir, session_ids: list[str], run_ids: list[str]) -> str:
    """What there is of alice's: her sessions and runs as the engine serves them (less the
    heartbeat clock) and every file under the state folder."""
    engine = server.engine
    parts = []
    for session_id in session_ids:
        parts.append(json.dumps(engine.get_session(session_id), sort_keys=True))
    for run_id in run_ids:
        run = engine.get_run(run_id)
        run.pop("updated_at", None)
        parts.append(json.dumps(run, sort_keys=True, default=str))
    for path in sorted(state_dir.rglob("*")):
        if path.is_file() and "journal" not in path.name:
            parts.append(f"{path.relative_to(state_dir)}:{hashlib.sha256(path.read_bytes()).hexdigest()}")
    return "\n".join(parts)


def test_every_write_route_refuses_a_token_that_did_not_create_the_session_or_run(
        policy, tmp_path, one_torch_thread):
    state_dir = tmp_path / "state"
    server = start_server(Engine(BASE, state_dir, policy=policy, torch_threads=one_torch_thread),
                          port=0, token=ADMIN, tokens={ALICE: "alice", BOB: "bob"})
    url = server.url
    try:
        # alice's: a native session and run, a tinker session, training client, saves and
        # a sampling session
        status, session = call(url, "POST", "/v1/training/sessions", {}, ALICE)
        assert status == 200 and session["owner"] == "alice"
        native_session = session["session_id"]
        status, run = call(url, "POST", "/v1/training/runs",
                           {"session_id": native_session, "rank": 2, "alpha": 4, "seed": 0},
                           ALICE)
        assert status == 200 and run["owner"] == "alice"
        native_run = run["run_id"]
        client = tinker.ServiceClient(base_url=url, api_key=ALICE)
        training = client.create_lora_training_client(base_model=BASE, rank=2).result()
        saved = training.save_state("mine").result().path
        sampler = training.save_weights_for_sampler("mine").result().path
        model_id = training.model_id
        tinker_run = saved.split("/")[2]
        tinker_session = model_id.split(":")[0]
        status, sampling = call(url, "POST", "/api/v1/create_sampling_session",
                                {"session_id": tinker_session, "sampling_session_seq_id": 900,
                                 "base_model": BASE}, ALICE)
        assert status == 200
        sampling_id = sampling["sampling_session_id"]
        sessions, runs = [native_session, tinker_session], [native_run, tinker_run]
        before = snapshot(server, state_dir, sessions, runs)

        # each route that changes a session or a run, with bodies aimed at alice's
        attempts = {
            ("POST", "/v1/training/sessions/{session_id}/heartbeat"): [
                (f"/v1/training/sessions/{native_session}/heartbeat", {})],
            ("POST", "/v1/training/sessions/{session_id}/close"): [
                (f"/v1/training/sessions/{native_session}/close", {})],
            ("POST", "/v1/training/runs"): [
                ("/v1/training/runs", {"session_id": native_session, "rank": 2})],
            ("POST", "/v1/training/runs/{run_id}/cancel"): [
                (f"/v1/training/runs/{native_run}/cancel", {})],
            ("POST", "/v1/training/runs/{run_id}/resume"): [
                (f"/v1/training/runs/{native_run}/resume", {"session_id": native_session})],
            ("POST", "/v1/training/runs/{run_id}/{primitive}"): [
                (f"/v1/training/runs/{native_run}/{primitive}", {"seq": 1})
                for primitive in ("forward_backward", "optim_step", "save_state",
                                  "load_state", "save_weights_for_sampler", "export_lora")],
            ("POST", "/api/v1/session_heartbeat"): [
                ("/api/v1/session_heartbeat", {"session_id": tinker_session})],
            ("POST", "/api/v1/sessions/{session_id}/finish"): [
                (f"/api/v1/sessions/{tinker_session}/finish", {})],
            ("POST", "/api/v1/create_model"): [
                ("/api/v1/create_model", {"session_id": tinker_session, "model_seq_id": 77,
                                          "base_model": BASE, "lora_config": {"rank": 2}})],
            ("POST", "/api/v1/forward_backward"): [
                ("/api/v1/forward_backward", forward_backward_body(model_id, 50))],
            ("POST", "/api/v1/optim_step"): [
                ("/api/v1/optim_step", {"model_id": model_id, "seq_id": 50,
                                        "adam_params": {"learning_rate": 1e-3}})],
            ("POST", "/api/v1/save_weights"): [
                ("/api/v1/save_weights", {"model_id": model_id, "seq_id": 50, "path": "mine"})],
            ("POST", "/api/v1/save_weights_for_sampler"): [
                ("/api/v1/save_weights_for_sampler",
                 {"model_id": model_id, "seq_id": 50, "path": "mine", "overwrite": True})],
            ("POST", "/api/v1/save_weights_external"): [
                ("/api/v1/save_weights_external", {"model_id": model_id, "seq_id": 50})],
            ("POST", "/api/v1/load_weights"): [
                ("/api/v1/load_weights", {"model_id": model_id, "seq_id": 50, "path": saved}),
                ("/api/v1/load_weights", {"session_id": tinker_session, "model_seq_id": 78,
                                          "path": saved})],
            ("POST", "/api/v1/create_sampling_session"): [
                ("/api/v1/create_sampling_session",
                 {"session_id": tinker_session, "sampling_session_seq_id": 901,
                  "base_model": BASE})],
            ("POST", "/api/v1/asample"): [
                ("/api/v1/asample", {"sampling_session_id": sampling_id, "seq_id": 0,
                                     "num_samples": 1, "prompt": {"chunks": []},
                                     "sampling_params": {"max_tokens": 1}})],
            ("DELETE", "/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}"): [
                (f"/api/v1/training_runs/{tinker_run}/checkpoints/weights/mine", b""),
                (f"/api/v1/training_runs/{tinker_run}/checkpoints/sampler_weights/mine", b"")],
        }
        served = {(method, route.path) for route in server.http.routes
                  for method in route.methods if method not in ("GET", "HEAD")}
        assert served == set(attempts) | set(CHANGES_NOTHING_OF_ANYONES), (
            "a write route neither tried here nor listed as changing nothing of anyone's: "
            f"{sorted(served ^ (set(attempts) | set(CHANGES_NOTHING_OF_ANYONES)))}")
        for (method, _route), tries in attempts.items():
            for path, body in tries:
                kind = ("application/x-protobuf" if path.endswith("/forward_backward")
                        and isinstance(body, bytes) and body else "application/json")
                status, answer = call(url, method, path, body, BOB, kind)
                assert status == 403, (path, status, answer)
                assert "alice" in json.dumps(answer), (path, answer)
                assert snapshot(server, state_dir, sessions, runs) == before, path
        # the routes not served are refused to everyone, and change nothing either
        for (method, route), why in CHANGES_NOTHING_OF_ANYONES.items():
            if why.startswith("refused"):
                path = (route.replace("{session_id}", tinker_session)
                        .replace("{run_id}", tinker_run).replace("{kind}", "weights")
                        .replace("{name}", "mine"))
                status, answer = call(url, method, path, {}, BOB)
                assert status == 400, (path, status, answer)
                assert snapshot(server, state_dir, sessions, runs) == before, path
        # the owner still trains, samples from and saves her own; the administrator may too
        result = training.forward_backward([types.Datum(
            model_input=types.ModelInput.from_ints(list(range(5, 15))),
            loss_fn_inputs={"target_tokens": list(range(6, 16)), "weights": [1.0] * 10})],
            "cross_entropy").result()
        assert result.metrics
        assert call(url, "POST", f"/v1/training/sessions/{native_session}/heartbeat", {},
                    ALICE)[0] == 200
        assert call(url, "POST", f"/v1/training/runs/{native_run}/cancel", {}, ADMIN)[0] == 200
        assert sampler.startswith("tinker://")
        client.close("success").result() if hasattr(client, "close") else None
    finally:
        server.stop()
