"""The tinker SDK's ``RestClient`` on ``posttrain serve``: training runs, checkpoints, sessions.

What a self-hosted server can honour is served from the engine's state folder, so it
survives a restart (runs and their saves are files there):

=====================================================  ==================================
``RestClient`` call                                    here
=====================================================  ==================================
``list_training_runs(limit, offset)``                  every run, newest first, paged
``get_training_run(id)`` / ``..._by_tinker_path``      one run (id: its run id or the
                                                       training client's model id)
``list_checkpoints(id)``                               its ``save_weights`` states and
                                                       named sampler weights
``list_user_checkpoints(limit, offset)``               every run's, newest first, paged
``delete_checkpoint(...)`` / ``..._from_tinker_path``  removes the save's folder
``get_weights_info_by_tinker_path(path)``              base model, LoRA rank
``get_session(id)`` / ``list_sessions(limit, offset)``  runs and samplers of a session
=====================================================  ==================================

What cannot be honoured is refused with a 400 that says why (the SDK raises it as
``BadRequestError`` with the message): publishing or unpublishing a checkpoint (there is
no hub behind this server), checkpoint TTLs, copying weights into another project,
signed download URLs of external weights (``save_weights_external`` is not served; a
named ``save_weights_for_sampler`` is a PEFT folder in the state folder), the audit log
and session projects, search and trace export.

A run's ``model_owner`` is the token name that created it (``posttrain serve --tokens``),
else ``local``; a named token deletes only its own runs' checkpoints (403 otherwise), the
administrator's ``--token`` any; ``user_metadata`` is what
``create_lora_training_client(user_metadata=...)`` sent, kept in
``runs/<run_id>/tinker.json``.
"""

from __future__ import annotations

import datetime
import json
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posttrain.atomic import write_text_atomic
from posttrain.http_core import Request
from posttrain.service.engine import state
from posttrain.service.engine.errors import BadRequest, Conflict, NotFound, ServiceError
from posttrain.service.protocols.tinker.journal import Choices
from posttrain.service.protocols.tinker.requests import body_object, checkpoint_path

SIDE_RECORD = "tinker.json"
MAX_PAGE = 1000
MAX_METADATA_KEYS = 64
MAX_METADATA_CHARS = 1000
# what each checkpoint kind is called in a tinker path, and where the engine keeps it
KINDS = {"weights": ("training", "states"), "sampler_weights": ("sampler", "exports")}

REFUSALS = {
    "publish": "publishing a checkpoint is not served: this server has no hub to publish "
    "to; copy runs/<run_id>/exports/<name> from its state folder (a PEFT adapter) to share it",
    "ttl": "checkpoint TTLs are not served: checkpoints stay until deleted "
    "(RestClient.delete_checkpoint)",
    "external_weights_urls": "external weights are not served (save_weights_external is "
    "refused), so there are no download URLs; save_weights_for_sampler(name) writes a PEFT "
    "adapter folder, runs/<run_id>/exports/<name> in the server's state folder",
    "copy_weights": "copying weights into another project is not served: this server has "
    "one project; load the checkpoint by its tinker:// path instead",
    "audit_log": "the audit log is not served by posttrain serve",
    "project": "session projects are not served: this server has one project",
    "search": "session search is not served; list_sessions pages through every session",
    "trace_export": "trace export is not served by posttrain serve",
    "billing": "billing is not served: posttrain serve runs on your own machine and charges "
    "nothing; a checkpoint's size is in list_checkpoints",
}


def iso(moment: float) -> str:
    """Seconds since the epoch as the ISO 8601 time the SDK's models read (UTC)."""
    return datetime.datetime.fromtimestamp(moment, tz=datetime.timezone.utc).isoformat()


def check_user_metadata(value: Any) -> dict[str, str] | None:
    """``user_metadata`` of a create request: None, or an object of short strings (numbers
    and booleans are kept as their text)."""
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_METADATA_KEYS:
        raise BadRequest(f"user_metadata: expected an object of at most {MAX_METADATA_KEYS} "
                         "keys")
    kept = {}
    for key, item in value.items():
        if isinstance(item, bool):
            item = "true" if item else "false"
        elif isinstance(item, (int, float)):
            item = str(item)
        if not isinstance(key, str) or not isinstance(item, str) \
                or len(key) > MAX_METADATA_CHARS or len(item) > MAX_METADATA_CHARS:
            raise BadRequest(f"user_metadata: {key!r} must map a string to a string of at "
                             f"most {MAX_METADATA_CHARS} characters")
        kept[key] = item
    return kept


def write_side_record(state_dir: Path, run_id: str, record: dict[str, Any]) -> None:
    """Keep what the tinker routes know of a run (its client, owner, metadata) beside its
    ``run.json``, atomically."""
    path = state.run_folder(state_dir, run_id) / SIDE_RECORD
    write_text_atomic(path, json.dumps(record, indent=2, sort_keys=True) + "\n")


def read_side_record(state_dir: Path, run_id: str) -> dict[str, Any]:
    """The side record of a run; empty when there is none or it cannot be read."""
    try:
        record = json.loads((state.run_folder(state_dir, run_id) / SIDE_RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _folder_size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


CHECKPOINT_ROUTE = "/training_runs/{run_id}/checkpoints/{kind}/{name}"


class TinkerRest:
    """The ``RestClient`` routes over the engine (module docstring).

    ``run_of_model(id)`` maps a training client's model id to its run id (None when it is
    not one); ``samplers_of(session_id)`` lists a session's sampling session ids; both
    come from the service that owns them."""

    def __init__(self, engine: Any, *, run_of_model: Callable[[str], str | None],
                 samplers_of: Callable[[str], list[str]]):
        self.engine = engine
        self._run_of_model = run_of_model
        self._samplers_of = samplers_of

    def routes(self) -> list[tuple[str, str, Callable[[Request], Any]]]:
        """(method, path, handler) under ``/api/v1``."""
        def refuse(what: str) -> Callable[[Request], Any]:
            def handler(request: Request) -> Any:
                raise BadRequest(REFUSALS[what])
            return handler

        # DELETE CHECKPOINT_ROUTE is delete_checkpoint, which the service journals
        checkpoint = CHECKPOINT_ROUTE
        return [
            ("GET", "/training_runs", self.list_training_runs),
            ("GET", "/training_runs/{run_id}", self.get_training_run),
            ("GET", "/training_runs/{run_id}/checkpoints", self.list_checkpoints),
            ("POST", checkpoint + "/publish", refuse("publish")),
            ("DELETE", checkpoint + "/publish", refuse("publish")),
            ("PUT", checkpoint + "/ttl", refuse("ttl")),
            ("GET", checkpoint + "/external_weights_urls", refuse("external_weights_urls")),
            ("GET", "/checkpoints", self.list_user_checkpoints),
            ("POST", "/weights_info", self.weights_info),
            ("POST", "/copy_weights", refuse("copy_weights")),
            ("GET", "/audit_log", refuse("audit_log")),
            ("GET", "/sessions", self.list_sessions),
            ("POST", "/sessions/search", refuse("search")),
            ("GET", "/sessions/{session_id}", self.get_session),
            ("PUT", "/sessions/{session_id}/project", refuse("project")),
            ("POST", "/sessions/{session_id}/project", refuse("project")),
            ("GET", "/sessions/{session_id}/trace_export", refuse("trace_export")),
            ("GET", "/billing/usage/events", refuse("billing")),
            ("GET", "/billing/usage/checkpoints/current", refuse("billing")),
        ]

    # ------------------------------------------------------------ runs

    def _run_id(self, name: str) -> str:
        """A run id, or a training client's model id, as the engine's run id."""
        run_id = self._run_of_model(name) or name
        self.engine.require_run(run_id)  # NotFound names it
        return run_id

    def _checkpoints(self, run_id: str) -> list[dict[str, Any]]:
        folder = state.run_folder(self.engine.state_dir, run_id)
        found = []
        for kind, (checkpoint_type, sub) in KINDS.items():
            place = folder / sub
            if not place.is_dir():
                continue
            for saved in place.iterdir():
                if saved.name.startswith(".") or not saved.is_dir():
                    continue  # a save in progress or a replaced one being removed
                found.append({
                    "checkpoint_id": f"{kind}/{saved.name}",
                    "checkpoint_type": checkpoint_type,
                    "time": saved.stat().st_mtime,
                    "tinker_path": f"tinker://{run_id}/{kind}/{saved.name}",
                    "size_bytes": _folder_size(saved),
                    "public": False,
                })
        return sorted(found, key=lambda item: item["time"])

    @staticmethod
    def _wire(checkpoint: dict[str, Any]) -> dict[str, Any]:
        return {**checkpoint, "time": iso(checkpoint["time"])}

    def _training_run(self, run_id: str) -> dict[str, Any]:
        run = self.engine.get_run(run_id)
        side = read_side_record(self.engine.state_dir, run_id)
        checkpoints = self._checkpoints(run_id)
        last = {kind: next((c for c in reversed(checkpoints)
                            if c["checkpoint_type"] == kind), None)
                for kind in ("training", "sampler")}
        record_file = state.run_folder(self.engine.state_dir, run_id) / "run.json"
        moments = [run.get("created_at") or 0.0] + [c["time"] for c in checkpoints]
        if record_file.is_file():
            moments.append(record_file.stat().st_mtime)
        return {
            "training_run_id": run_id,
            "base_model": self.engine.base_model,
            "model_owner": side.get("owner") or "local",
            "is_lora": True,
            "corrupted": False,
            "lora_rank": int(run["lora"]["rank"]),
            "last_request_time": iso(max(moments)),
            "last_checkpoint": self._wire(last["training"]) if last["training"] else None,
            "last_sampler_checkpoint": (self._wire(last["sampler"]) if last["sampler"]
                                        else None),
            "user_metadata": side.get("user_metadata"),
        }

    @staticmethod
    def _page(request: Request) -> tuple[int, int]:
        limit = request.int_param("limit", 20, 1, MAX_PAGE)
        offset = request.int_param("offset", 0, 0, 2**31)
        assert limit is not None and offset is not None
        return limit, offset

    def list_training_runs(self, request: Request) -> dict[str, Any]:
        """``GET /training_runs?limit&offset``: newest first."""
        limit, offset = self._page(request)
        runs = [self._training_run(run_id) for run_id in self.engine.run_ids()]
        runs.sort(key=lambda run: run["last_request_time"], reverse=True)
        return {"training_runs": runs[offset:offset + limit],
                "cursor": {"offset": offset, "limit": limit, "total_count": len(runs)}}

    def get_training_run(self, request: Request) -> dict[str, Any]:
        """``GET /training_runs/{id}``."""
        return self._training_run(self._run_id(request.match["run_id"]))

    def list_checkpoints(self, request: Request) -> dict[str, Any]:
        """``GET /training_runs/{id}/checkpoints``: oldest first."""
        run_id = self._run_id(request.match["run_id"])
        return {"checkpoints": [self._wire(c) for c in self._checkpoints(run_id)]}

    def list_user_checkpoints(self, request: Request) -> dict[str, Any]:
        """``GET /checkpoints?limit&offset``: every run's checkpoints, newest first."""
        limit, offset = self._page(request)
        every = [c for run_id in self.engine.run_ids() for c in self._checkpoints(run_id)]
        every.sort(key=lambda item: item["time"], reverse=True)
        return {"checkpoints": [self._wire(c) for c in every[offset:offset + limit]],
                "cursor": {"offset": offset, "limit": limit, "total_count": len(every)}}

    def delete_checkpoint(self, request: Request, choices: Choices) -> dict[str, Any]:
        """``DELETE /training_runs/{id}/checkpoints/{kind}/{name}``: the save's folder goes
        (renamed aside first, so a half-deleted save is never listed or loaded). Journaled
        with the session of the run it deletes from, so a replay deletes it again after
        re-making the saves before it, and forgets the deletion with that session."""
        run_id = self._run_id(request.match["run_id"])
        kind = request.match["kind"]
        path = f"tinker://{run_id}/{kind}/{request.match['name']}"
        side = read_side_record(self.engine.state_dir, run_id)
        choices.session_id = side.get("session_id")
        owner = side.get("owner")
        if not request.caller.may_delete(owner):
            made = f"created by {owner}" if owner else "not created with a named token"
            raise ServiceError(f"run {run_id} was {made}; a token deletes only its own "
                               "checkpoints (the server's --token may delete any)", status=403)
        saved = checkpoint_path(path, "checkpoint")
        folder = (state.run_folder(self.engine.state_dir, run_id) / KINDS[saved.kind][1]
                  / saved.name)
        if not folder.is_dir():
            raise NotFound(f"no checkpoint {path}")
        run = self.engine.get_run(run_id)
        last = run.get("last_state") or {}
        if saved.kind == "weights" and run.get("status") == "dormant" \
                and last.get("name") == saved.name:
            raise Conflict(f"{path} is where dormant run {run_id} resumes from; resume or "
                           "cancel the run first")
        aside = folder.parent / f".{folder.name}.deleting-{uuid.uuid4().hex[:8]}"
        folder.rename(aside)
        shutil.rmtree(aside, ignore_errors=True)
        return {}

    def weights_info(self, request: Request) -> dict[str, Any]:
        """``POST /weights_info`` ``{"tinker_path"}``: what loading that save needs."""
        saved = checkpoint_path(body_object(request.json()).get("tinker_path"), "tinker_path")
        run = self.engine.get_run(self._run_id(saved.run_id))
        folder = (state.run_folder(self.engine.state_dir, saved.run_id) / KINDS[saved.kind][1]
                  / saved.name)
        if not folder.is_dir():
            raise NotFound(f"no checkpoint {saved.path}")
        targets = set(run["lora"]["target_modules"])
        return {"base_model": self.engine.base_model, "is_lora": True,
                "lora_rank": int(run["lora"]["rank"]),
                "train_unembed": bool(targets & set(self.engine.optional_lora_targets)),
                "train_mlp": None, "train_attn": None}

    # ------------------------------------------------------------ sessions

    def get_session(self, request: Request) -> dict[str, Any]:
        """``GET /sessions/{id}``: its runs (as training run ids) and sampling sessions."""
        session_id = request.match["session_id"]
        session = self.engine.get_session(session_id)
        return {"training_run_ids": list(session["run_ids"]),
                "sampler_ids": self._samplers_of(session_id)}

    def list_sessions(self, request: Request) -> dict[str, Any]:
        """``GET /sessions?limit&offset``: session ids, newest first."""
        limit, offset = self._page(request)
        sessions = sorted(self.engine.sessions(), key=lambda s: s["created_at"], reverse=True)
        return {"sessions": [s["session_id"] for s in sessions[offset:offset + limit]]}

