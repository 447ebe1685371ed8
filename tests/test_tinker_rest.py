"""The tinker SDK's unmodified ``RestClient`` on `posttrain serve`: training runs (paged),
one run, its checkpoints, deleting one, weights info, sessions; the calls that cannot be
honoured are refused with a message; tinker-cookbook's checkpoint utilities on top; all
of it still true after a server restart."""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")
tinker = pytest.importorskip("tinker")

from tinker import types  # noqa: E402

from posttrain.service.engine import Engine  # noqa: E402
from posttrain.service.server import start_server  # noqa: E402
from tests.tinker_wire import sdk_environment  # noqa: E402, F401 (fixture)

BASE = "starter-2m"
ADAM = types.AdamParams(learning_rate=5e-3)


def one_datum() -> types.Datum:
    ids = list(range(5, 25))
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * 19})


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("state")


@pytest.fixture(scope="module")
def trained(policy, state_dir, one_torch_thread):
    """Three training clients (one with user metadata), saves of both kinds; the server
    is stopped afterwards, so every test below starts its own on the same state folder."""
    server = start_server(Engine(BASE, state_dir, policy=policy,
                                 torch_threads=one_torch_thread), port=0)
    client = tinker.ServiceClient(base_url=server.url)
    session_id = client.holder.get_session_id()
    tagged = client.create_lora_training_client(
        base_model=BASE, rank=4, seed=0,
        user_metadata={"renderer_name": "role_colon", "team": "refunds"}).result()
    tagged.forward_backward([one_datum()], "cross_entropy")
    tagged.optim_step(ADAM).result()
    paths = {"state-1": tagged.save_state("state-1").result().path,
             "state-2": tagged.save_state("state-2").result().path,
             "sampler-1": tagged.save_weights_for_sampler("sampler-1").result().path}
    others = [client.create_lora_training_client(base_model=BASE, rank=2).result()
              for _ in range(2)]
    runs = {"tagged": paths["state-1"].split("/")[2]}
    yield {"server": server, "client": client, "session_id": session_id, "paths": paths,
           "runs": runs, "model_ids": [tagged.model_id] + [o.model_id for o in others]}
    client.close("success").result()
    server.stop()


def test_training_runs_are_listed_newest_first_and_paged(trained):
    rest = tinker.RestClient(base_url=trained["server"].url)
    first = rest.list_training_runs(limit=2, offset=0).result()
    second = rest.list_training_runs(limit=2, offset=2).result()
    assert first.cursor.total_count == 3 and (first.cursor.limit, first.cursor.offset) == (2, 0)
    assert len(first.training_runs) == 2 and len(second.training_runs) == 1
    ids = [run.training_run_id for run in first.training_runs + second.training_runs]
    assert len(set(ids)) == 3 and trained["runs"]["tagged"] in ids
    times = [run.last_request_time for run in first.training_runs + second.training_runs]
    assert times == sorted(times, reverse=True)
    assert all(run.base_model == BASE and run.is_lora and run.model_owner == "local"
               for run in first.training_runs)


def test_one_run_with_its_metadata_checkpoints_and_weights_info(trained):
    rest = tinker.RestClient(base_url=trained["server"].url)
    run_id = trained["runs"]["tagged"]
    run = rest.get_training_run(run_id).result()
    assert run.lora_rank == 4 and run.user_metadata == {"renderer_name": "role_colon",
                                                        "team": "refunds"}
    assert run.last_checkpoint.tinker_path == trained["paths"]["state-2"]
    assert run.last_sampler_checkpoint.tinker_path == trained["paths"]["sampler-1"]
    # a training client's model id names its run too
    assert rest.get_training_run(trained["model_ids"][0]).result().training_run_id == run_id
    by_path = rest.get_training_run_by_tinker_path(trained["paths"]["sampler-1"]).result()
    assert by_path.training_run_id == run_id
    listed = rest.list_checkpoints(run_id).result().checkpoints
    assert {(c.checkpoint_id, c.checkpoint_type) for c in listed} == {
        ("weights/state-1", "training"), ("weights/state-2", "training"),
        ("sampler_weights/sampler-1", "sampler")}
    assert all(c.size_bytes > 0 for c in listed)
    info = rest.get_weights_info_by_tinker_path(trained["paths"]["state-1"]).result()
    assert info.base_model == BASE and info.is_lora and info.lora_rank == 4
    everyone = rest.list_user_checkpoints(limit=2).result()
    assert everyone.cursor.total_count == 3 and len(everyone.checkpoints) == 2


def test_the_session_names_its_runs(trained):
    rest = tinker.RestClient(base_url=trained["server"].url)
    session = rest.get_session(trained["session_id"]).result()
    assert trained["runs"]["tagged"] in session.training_run_ids
    assert len(session.training_run_ids) == 3
    assert trained["session_id"] in rest.list_sessions(limit=50).result().sessions
    with pytest.raises(tinker.NotFoundError):
        rest.get_session("sess-nosuch").result()


def test_unknown_runs_and_checkpoints_are_404(trained):
    rest = tinker.RestClient(base_url=trained["server"].url)
    with pytest.raises(tinker.NotFoundError, match="nosuch"):
        rest.get_training_run("run-nosuch").result()
    with pytest.raises(tinker.NotFoundError, match="no checkpoint"):
        rest.delete_checkpoint_from_tinker_path(
            f"tinker://{trained['runs']['tagged']}/weights/never-saved").result()


def test_what_cannot_be_honoured_is_refused_with_why(trained):
    rest = tinker.RestClient(base_url=trained["server"].url)
    path = trained["paths"]["state-1"]
    with pytest.raises(tinker.BadRequestError, match="no hub to publish"):
        rest.publish_checkpoint_from_tinker_path(path).result()
    with pytest.raises(tinker.BadRequestError, match="no hub to publish"):
        rest.unpublish_checkpoint_from_tinker_path(path).result()
    with pytest.raises(tinker.BadRequestError, match="TTLs are not served"):
        rest.set_checkpoint_ttl_from_tinker_path(path, 3600).result()
    with pytest.raises(tinker.BadRequestError, match="external weights are not served"):
        rest.get_external_weights_urls(
            f"tinker://{trained['runs']['tagged']}/external_weights/x").result()
    admin = tinker.AdminClient(base_url=trained["server"].url)
    with pytest.raises(tinker.BadRequestError, match="billing is not served"):
        admin.get_billing_usage("2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z").result()
    with pytest.raises(tinker.BadRequestError, match="billing is not served"):
        admin.get_current_checkpoint_storage_usage().result()


def test_a_checkpoint_is_deleted_and_the_cookbook_reads_the_renderer(trained):
    from tinker_cookbook import checkpoint_utils

    client = trained["client"]
    path = trained["paths"]["sampler-1"]
    assert checkpoint_utils.get_renderer_name_from_checkpoint(client, path) == "role_colon"
    rest = tinker.RestClient(base_url=trained["server"].url)
    rest.delete_checkpoint_from_tinker_path(trained["paths"]["state-1"]).result()
    ids = {c.checkpoint_id for c in rest.list_checkpoints(trained["runs"]["tagged"]).result()
           .checkpoints}
    assert ids == {"weights/state-2", "sampler_weights/sampler-1"}
    with pytest.raises(tinker.TinkerError):
        client.create_training_client_from_state(trained["paths"]["state-1"]).result()


def test_runs_and_checkpoints_survive_a_restart(trained, policy, state_dir, one_torch_thread):
    from tinker_cookbook import checkpoint_utils

    trained["client"].close("success").result()  # its heartbeats would outlive the server
    trained["server"].stop()
    again = start_server(Engine(BASE, state_dir, policy=policy,
                                torch_threads=one_torch_thread), port=0)
    trained["server"] = again  # the fixture's teardown stops this one
    client = tinker.ServiceClient(base_url=again.url)
    trained["client"] = client
    rest = tinker.RestClient(base_url=again.url)
    runs = rest.list_training_runs(limit=10).result()
    assert runs.cursor.total_count == 3
    run = rest.get_training_run(trained["runs"]["tagged"]).result()
    assert run.user_metadata["renderer_name"] == "role_colon"
    assert run.last_checkpoint.tinker_path == trained["paths"]["state-2"]
    renderer = asyncio.run(checkpoint_utils.get_renderer_name_from_checkpoint_async(
        client, trained["paths"]["sampler-1"]))
    assert renderer == "role_colon"


def test_named_tokens_own_their_runs_and_delete_only_their_checkpoints(policy, tmp_path,
                                                                       one_torch_thread):
    alice, bob, admin = "tml-alice-0123456789", "tml-bob-0123456789ab", "tml-admin-012345678"
    server = start_server(Engine(BASE, tmp_path, policy=policy, torch_threads=one_torch_thread),
                          port=0, token=admin, tokens={alice: "alice", bob: "bob"})
    try:
        client = tinker.ServiceClient(base_url=server.url, api_key=alice)
        training = client.create_lora_training_client(base_model=BASE, rank=2).result()
        path = training.save_state("mine").result().path
        run_id = path.split("/")[2]
        as_bob = tinker.RestClient(base_url=server.url, api_key=bob)
        assert as_bob.get_training_run(run_id).result().model_owner == "alice"  # reads: all
        with pytest.raises(tinker.PermissionDeniedError, match="created by alice"):
            as_bob.delete_checkpoint_from_tinker_path(path).result()
        tinker.RestClient(base_url=server.url, api_key=alice).delete_checkpoint_from_tinker_path(
            path).result()
        second = training.save_state("again").result().path
        tinker.RestClient(base_url=server.url, api_key=admin).delete_checkpoint_from_tinker_path(
            second).result()
        assert tinker.RestClient(base_url=server.url, api_key=alice).list_checkpoints(
            run_id).result().checkpoints == []
        with pytest.raises(tinker.AuthenticationError):
            tinker.RestClient(base_url=server.url, api_key="tml-wrong-0123456789").\
                list_training_runs().result()
        client.close("success").result()
    finally:
        server.stop()
