"""A tinker SDK training client on the engine: model creation and its ``seq_id``'d requests.

A training client (``create_model``, or ``load_weights`` with a ``model_seq_id``) is an
engine run; its id is ``<session_id>:train:<model_seq_id>``. Its LoRA: the rank asked
for, alpha 32 whatever the rank, on the attention, MLP and unembedding layers that
``train_attn`` / ``train_mlp`` / ``train_unembed`` switch on.

Every ``seq_id``'d request becomes exactly one engine primitive with that same ``seq``,
handed to the engine as its typed request (``posttrain.service.engine.requests``), so the
run's ordered queue keeps the client's order, and retries of the same (model_id, seq_id)
find the first future:

=============================================  =========================================
tinker request                                 engine primitive
=============================================  =========================================
``forward_backward`` (``forward_only``)        ``forward_backward`` (``forward``)
``optim_step`` (AdamW)                         ``optim_step``
``save_weights`` (name)                        ``save_state``
``save_weights_for_sampler`` with a name       ``export_lora`` (a PEFT adapter folder)
``save_weights_for_sampler`` without           ``save_weights_for_sampler``, version = seq
``load_weights`` on the client                 ``load_state``
=============================================  =========================================

A request refused before it can be queued (an unsupported loss, a sparse tensor, a bad
field, a name in use) still takes its number: the engine records it as refused and
steps over it, since the SDK goes on counting after a refusal and the requests after it
would otherwise wait for it forever. The refusal reaches the caller as a failed future
(category "user").
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from posttrain.access import Caller
from posttrain.http_core import Request
from posttrain.service.engine import state
from posttrain.service.engine.checks import state_name
from posttrain.service.engine.engine import new_run_id
from posttrain.service.engine.errors import BadRequest, NotFound, TooLarge
from posttrain.service.engine.operations import fingerprint
from posttrain.service.engine.requests import (
    Datum,
    ForwardBackward,
    LoraSpec,
    SaveWeights,
    StateName,
)
from posttrain.service.protocols.json_bodies import adam_params
from posttrain.service.protocols.tinker.futures import (
    Answer,
    FutureStore,
    Waiter,
    digest_of,
    new_request_id,
    operation_waiter,
    task_waiter,
)
from posttrain.service.protocols.tinker.journal import Choices
from posttrain.service.protocols.tinker.proto import (
    ProtoError,
    encode_forward_backward_output,
    forward_backward_wire,
    read_forward_backward,
)
from posttrain.service.protocols.tinker.requests import (
    TINKER_LORA_ALPHA,
    body_object,
    check_optimizer_config,
    checkpoint_path,
    flag,
    lora_module_groups,
    lora_targets,
    model_id_for,
    whole,
)
from posttrain.service.protocols.tinker.rest import check_user_metadata, write_side_record
from posttrain.service.protocols.tinker.sampling import SamplerSource

SUPPORTED_LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo")
REFUSED_LOSSES = {
    "stable_reinforce": "its definition is not public, so it cannot be computed faithfully "
    "here; use importance_sampling, ppo or cispo (the cookbook's rl_loop takes "
    "loss_fn=importance_sampling)",
    "dro": "Tinker's DRO (its inputs, config and reduction) is not publicly pinned down, and "
    "this server will not pass its own DRO off as Tinker's; write it as a custom loss "
    "(forward_backward_custom)",
    "gspo": "its sequence-level importance ratio is not implemented here; write it as a "
    "custom loss (forward_backward_custom)",
    "custom": "server-side custom losses (create_custom_loss) are not served; "
    "forward_backward_custom runs your loss in the client and works here",
}


@dataclass
class TrainingModel:
    """One SDK training client: its model id and the engine run behind it."""

    model_id: str
    run_id: str
    session_id: str
    lora_rank: int
    saved_names: set[tuple[str, str]] = field(default_factory=set)  # (kind, name) submitted


def forward_backward_answer(result: dict[str, Any]) -> Answer:
    """An engine forward/forward_backward result as the SDK's ``ForwardBackwardOutput``."""
    metrics = result["metrics"]
    return Answer.proto(encode_forward_backward_output(
        [output["logprobs"] for output in result["loss_fn_outputs"]],
        {"loss:sum": result["loss"], "tokens:sum": metrics["tokens"],
         "datums:sum": metrics["datums"]}))


def optim_step_answer(result: dict[str, Any]) -> Answer:
    """An engine optim_step result as the SDK's ``OptimStepResponse`` (its metrics)."""
    return Answer.json({"metrics": {
        "grad_norm:mean": result["grad_norm"], "learning_rate:mean": result["learning_rate"],
        "step:max": result["step"], "forward_backward_calls:sum":
        result["forward_backward_calls"]}})


class TinkerTraining:
    """The training clients of the tinker routes and their requests (module docstring).

    ``open_session(id, caller)`` checks a session is open and the caller's,
    ``check_base_model(name)`` that a name is the server's base model,
    ``register_sampling(session, seq, source, choices)`` opens a sampling session: the
    service that owns sessions passes them in.

    Every submission takes the ``Choices`` it makes its random and disk-dependent
    decisions through (``journal``), so that a replay of the journal decides the same."""

    def __init__(self, engine: Any, futures: FutureStore, *, model_name: str,
                 open_session: Callable[[Any, Caller], str],
                 check_base_model: Callable[[Any], None],
                 register_sampling: Callable[[str, int, SamplerSource, Choices], str]):
        self.engine = engine
        self.futures = futures
        self.model_name = model_name
        self._open_session = open_session
        self._check_base_model = check_base_model
        self._register_sampling = register_sampling
        self.lora_groups = lora_module_groups(engine.policy.model, engine.module_names,
                                              engine.optional_lora_targets)
        self._lock = threading.Lock()
        self._models: dict[str, TrainingModel] = {}

    def run_of_model(self, model_id: str) -> str | None:
        """The run behind training client ``model_id`` (None when it is not one)."""
        with self._lock:
            model = self._models.get(model_id)
        return model.run_id if model is not None else None

    def _remember(self, model: TrainingModel, user_metadata: dict[str, str] | None,
                  owner: str | None) -> None:
        """Add the client and keep its side record (model id, metadata, the tokens-file
        name that created it) with its run."""
        self._add_model(model)
        write_side_record(self.engine.state_dir, model.run_id, {
            "model_id": model.model_id, "session_id": model.session_id,
            "lora_rank": model.lora_rank, "user_metadata": user_metadata, "owner": owner})

    def _model(self, model_id: Any, changed_by: Caller | None = None) -> TrainingModel:
        """Training client ``model_id``; with ``changed_by``, the caller about to change it,
        ``Forbidden`` unless its run is that caller's (``Engine.check_change``)."""
        with self._lock:
            model = self._models.get(model_id) if isinstance(model_id, str) else None
        if model is None:
            raise NotFound(f"no training model {model_id!r} here (create_lora_training_client "
                           "makes one, create_training_client_from_state one from a save)")
        if changed_by is not None:
            self.engine.check_change(changed_by, run_id=model.run_id)
        return model

    def create_model(self, request: Request, choices: Choices) -> dict[str, Any]:
        """``POST /create_model``: a LoRA run for a new training client (a future)."""
        body = body_object(request.json())
        session_id = self._open_session(body.get("session_id"), request.caller)
        choices.session_id = session_id
        model_seq_id = whole(body, "model_seq_id", low=0)
        self._check_base_model(body.get("base_model"))
        lora = body.get("lora_config") or {}
        if not isinstance(lora, dict):
            raise BadRequest("lora_config: expected an object")
        rank = whole(lora, "rank", low=1, high=self.engine.limits.max_lora_rank, default=32,
                     where="lora_config.")
        seed = whole(lora, "seed", low=0, high=2**63 - 1, default=None, where="lora_config.")
        targets = lora_targets(lora, self.lora_groups)
        check_optimizer_config(body.get("optimizer_config"))
        user_metadata = check_user_metadata(body.get("user_metadata"))
        model_id = model_id_for(session_id, model_seq_id)
        if seed is None:
            seed = choices.pick(lambda: uuid.uuid4().int % 2**62)
        spec = LoraSpec(rank=rank, alpha=TINKER_LORA_ALPHA, target_modules=targets, seed=seed)
        run_id = choices.pick(new_run_id)

        def work() -> Answer:
            run = self.engine.create_run(session_id, spec, run_id=run_id)
            self._remember(TrainingModel(model_id, run["run_id"], session_id, rank),
                           user_metadata, request.caller.name or None)
            return Answer.json({"model_id": model_id, "type": "create_model"})

        future, _ = self.futures.submit(("model", session_id, model_seq_id), digest_of(body),
                                        "CreateModel", lambda: task_waiter(
                                            work, public_text=self.engine.public_text),
                                        lambda: choices.pick(new_request_id))
        return {"request_id": future.request_id, "model_id": model_id}

    def _add_model(self, model: TrainingModel) -> None:
        with self._lock:
            self._models[model.model_id] = model

    def get_info(self, request: Request) -> dict[str, Any]:
        """``POST /get_info``: the model, its LoRA rank and the tokenizer's folder."""
        model = self._model(body_object(request.json()).get("model_id"))
        config = self.engine.policy.model.config
        return {
            "type": "get_info", "model_id": model.model_id, "is_lora": True,
            "lora_rank": model.lora_rank, "model_name": self.model_name,
            "optimizer_config": {"type": "adamw"},
            "model_data": {"arch": getattr(config, "model_type", None),
                           "model_name": self.model_name, "tokenizer_id": self.model_name},
        }

    def load_weights(self, request: Request, choices: Choices) -> dict[str, Any]:
        """``POST /load_weights``: a new training client from a save (``model_seq_id``),
        or a client's own ``load_state`` (``model_id`` + ``seq_id``)."""
        body = body_object(request.json())
        if body.get("model_id") is not None:
            return self._load_in_place(body, choices, request.caller)
        session_id = self._open_session(body.get("session_id"), request.caller)
        choices.session_id = session_id
        model_seq_id = whole(body, "model_seq_id", low=0)
        source = checkpoint_path(body.get("path"))
        if source.kind != "weights":
            raise BadRequest(f"path: {source.path} holds sampler weights (an adapter, no "
                             "optimizer state); training resumes from a save_state path, "
                             "tinker://<run_id>/weights/<name>")
        if body.get("base_model") is not None:
            self._check_base_model(body["base_model"])
        check_optimizer_config(body.get("optimizer_config"))
        optimizer = flag(body, "optimizer")
        model_id = model_id_for(session_id, model_seq_id)
        run_id = choices.pick(new_run_id)

        def work() -> Answer:
            run = self.engine.create_run_from_state(session_id, source.run_id, source.name,
                                                    optimizer=optimizer, run_id=run_id)
            self._remember(TrainingModel(model_id, run["run_id"], session_id,
                                         run["lora"]["rank"]), None, request.caller.name or None)
            return Answer.json({"model_id": model_id, "path": source.path,
                                "type": "load_weights"})

        future, _ = self.futures.submit(("model", session_id, model_seq_id), digest_of(body),
                                        "LoadWeights", lambda: task_waiter(
                                            work, public_text=self.engine.public_text),
                                        lambda: choices.pick(new_request_id))
        return {"request_id": future.request_id, "model_id": model_id}

    # ------------------------------------------------------------ sequenced requests

    def _sequenced(self, model: TrainingModel, seq: int, request_type: str, primitive: str,
                   request: Any, convert: Callable[[dict[str, Any]], Answer],
                   digest: str, choices: Choices, refusal: str | None = None,
                   on_start: Callable[[], None] | None = None) -> dict[str, Any]:
        """Submit one request of a training client as engine primitive ``primitive`` (its
        typed ``request``) at ``seq``, or, with a ``refusal``, record ``seq`` as refused
        (module docstring). ``digest`` identifies the SDK's request, for retries."""
        # the engine compares this on a retry of seq; the SDK's request is what was sent
        sent = fingerprint(primitive, {"digest": digest})

        def start() -> Waiter:
            operation = None
            if refusal is None:
                try:
                    operation, _ = self.engine.submit(model.run_id, primitive, request, seq=seq,
                                                      fingerprint=sent)
                except (BadRequest, TooLarge) as error:
                    reason = error.message
                else:
                    if on_start is not None:
                        on_start()
            else:
                reason = refusal
            if operation is None:
                operation = self.engine.refuse(model.run_id, seq, primitive, reason,
                                               fingerprint=sent)
            return operation_waiter(self.engine, operation["operation_id"], convert)

        choices.session_id = model.session_id
        future, _ = self.futures.submit(("train", model.model_id, seq), digest, request_type,
                                        start, lambda: choices.pick(new_request_id))
        return {"request_id": future.request_id, "model_id": model.model_id}

    def forward_backward(self, request: Request, choices: Choices) -> dict[str, Any]:
        """``POST /forward_backward`` (protobuf): ``forward_backward`` or, with
        ``forward_only``, ``forward``."""
        message = read_forward_backward(request.body, request.headers.get("content-encoding"))
        model = self._model(message.model_id, request.caller)
        if message.seq_id < 1:
            raise BadRequest(f"seq_id: expected an integer from 1 up, got {message.seq_id}")
        primitive = "forward" if message.forward_only else "forward_backward"
        digest = digest_of(message.SerializeToString(deterministic=True))
        typed, refusal = None, None
        try:
            wire = forward_backward_wire(message)
            if wire.loss_fn not in SUPPORTED_LOSSES:
                why = REFUSED_LOSSES.get(wire.loss_fn, "it is not one this server computes")
                raise BadRequest(f"loss_fn {wire.loss_fn!r} is not supported: {why}. Supported: "
                                 f"{', '.join(SUPPORTED_LOSSES)}")
            # values as the wire holds them (int64 tensors are ints): the engine checks them
            config: dict[str, Any] = dict(wire.loss_fn_config)
            typed = ForwardBackward(
                data=tuple(Datum(tuple(datum.token_ids),
                                 {key: tuple(values) for key, values
                                  in datum.loss_fn_inputs.items()})
                           for datum in wire.data),
                loss_function=wire.loss_fn, loss_config=config,
                backward=not message.forward_only)
        except (ProtoError, BadRequest) as error:
            refusal = str(error)
        return self._sequenced(model, message.seq_id,
                               "Forward" if message.forward_only else "ForwardBackward",
                               primitive, typed, forward_backward_answer, digest, choices,
                               refusal)

    def optim_step(self, request: Request, choices: Choices) -> dict[str, Any]:
        """``POST /optim_step``: one AdamW step with the ``adam_params`` sent."""
        body = body_object(request.json())
        model, seq = self._model(body.get("model_id"), request.caller), whole(body, "seq_id", low=1)
        params, refusal = None, None
        if body.get("adam_params") is None:
            kind = (body.get("optimizer_params") or {}).get("type", "none") \
                if isinstance(body.get("optimizer_params"), dict) else "none"
            refusal = (f"optim_step: optimizer {kind!r} is not supported; this server steps "
                       "with AdamW: send AdamParams")
        else:
            try:
                params = adam_params(body["adam_params"])
            except BadRequest as error:
                refusal = error.message
        return self._sequenced(model, seq, "OptimStep", "optim_step", params,
                               optim_step_answer, digest_of(body), choices, refusal)

    def _name_refusal(self, model: TrainingModel, kind: str, name: Any, overwrite: bool
                      ) -> str | None:
        """Why a checkpoint name cannot be used (None when it can)."""
        try:
            state_name(name, "path")
        except BadRequest as error:
            return error.message
        sub = "states" if kind == "weights" else "exports"
        folder = state.run_folder(self.engine.state_dir, model.run_id) / sub / name
        with self._lock:
            taken = (kind, name) in model.saved_names or folder.exists()
        if taken and not overwrite:
            what = "a saved state" if kind == "weights" else "sampler weights"
            return (f"path: {what} {name!r} already exists in run {model.run_id}; choose "
                    "another name" + (" or pass overwrite=True" if kind == "weights" else ""))
        return None

    def _note_name(self, model: TrainingModel, kind: str, name: str) -> Callable[[], None]:
        def note() -> None:
            with self._lock:
                model.saved_names.add((kind, name))
        return note

    def save_weights(self, request: Request, choices: Choices) -> dict[str, Any]:
        """``POST /save_weights``: ``save_state`` under the name in ``path``."""
        body = body_object(request.json())
        model, seq = self._model(body.get("model_id"), request.caller), whole(body, "seq_id", low=1)
        name = body.get("path")
        # decided by the disk as it is now, which a replay finds changed: kept
        refusal = choices.pick(lambda: self._name_refusal(model, "weights", name,
                                                          flag(body, "overwrite")))
        path = f"tinker://{model.run_id}/weights/{name}"
        return self._sequenced(
            model, seq, "SaveWeights", "save_state", StateName(str(name)),
            lambda result: Answer.json({"path": path, "type": "save_weights"}),
            digest_of(body), choices, refusal, self._note_name(model, "weights", str(name)))

    def save_weights_for_sampler(self, request: Request, choices: Choices) -> dict[str, Any]:
        """``POST /save_weights_for_sampler``: a named PEFT export, or (no name) an
        in-memory snapshot with a sampling session on it."""
        body = body_object(request.json())
        model, seq = self._model(body.get("model_id"), request.caller), whole(body, "seq_id", low=1)
        digest = digest_of(body)
        name = body.get("path")
        if name is not None:  # a named, persistent save: a PEFT adapter folder
            refusal = choices.pick(lambda: self._name_refusal(model, "sampler_weights", name,
                                                              False))
            path = f"tinker://{model.run_id}/sampler_weights/{name}"
            return self._sequenced(
                model, seq, "SaveWeightsForSampler", "export_lora", StateName(str(name)),
                lambda result: Answer.json({"path": path, "type": "save_weights_for_sampler"}),
                digest, choices, refusal, self._note_name(model, "sampler_weights", str(name)))
        # unnamed: an in-memory snapshot (version = seq) and a sampling session on it. An
        # "inflight" client may get newer weights, never older: a snapshot keeps that promise
        refusal = None
        try:
            sampling_seq = whole(body, "sampling_session_seq_id", low=0)
            if body.get("kind", "snapshot") not in ("snapshot", "inflight"):
                raise BadRequest(f"kind: expected snapshot or inflight, got {body['kind']!r}")
            sampling_session_id = self._register_sampling(
                model.session_id, sampling_seq, SamplerSource("snapshot", model.run_id, seq),
                choices)
        except BadRequest as error:
            refusal, sampling_session_id = error.message, ""
        return self._sequenced(
            model, seq, "SaveWeightsForSampler", "save_weights_for_sampler", SaveWeights(seq),
            lambda result: Answer.json({"sampling_session_id": sampling_session_id,
                                        "type": "save_weights_for_sampler"}),
            digest, choices, refusal)

    def save_weights_external(self, request: Request, choices: Choices) -> dict[str, Any]:
        """``POST /save_weights_external``: refused (its seq is taken, see the docstring)."""
        body = body_object(request.json())
        model, seq = self._model(body.get("model_id"), request.caller), whole(body, "seq_id", low=1)
        return self._sequenced(
            model, seq, "SaveWeightsExternal", "export_lora", None, Answer.json,
            digest_of(body), choices,
            "save_weights_external is not served; save_weights_for_sampler(name) writes a PEFT "
            "adapter folder (runs/<run_id>/exports/<name> in the server's state folder)")

    def _load_in_place(self, body: dict[str, Any], choices: Choices,
                       caller: Caller) -> dict[str, Any]:
        model, seq = self._model(body.get("model_id"), caller), whole(body, "seq_id", low=1)
        refusal, target = None, None
        try:
            source = checkpoint_path(body.get("path"))
            if source.kind != "weights":
                raise BadRequest(f"path: {source.path} holds sampler weights; load a save_state "
                                 "path, tinker://<run_id>/weights/<name>")
            target = StateName(source.name, source.run_id, flag(body, "optimizer"))
        except BadRequest as error:
            refusal = error.message
        path = body.get("path")
        return self._sequenced(
            model, seq, "LoadWeights", "load_state", target,
            lambda result: Answer.json({"path": path, "model_id": model.model_id,
                                        "type": "load_weights"}),
            digest_of(body), choices, refusal)
