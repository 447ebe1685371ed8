"""``posttrain serve``: the training-primitives server (see docs/service.md)."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

from posttrain.access import load_tokens
from posttrain.commands.dataclass_args import add_dataclass_args, settings_from_args
from posttrain.errors import PosttrainError
from posttrain.runs.postgres_store import is_postgres_url, redacted
from posttrain.service.engine.requests import Limits
from posttrain.service.server import serve

DESCRIPTION = """\
Serve one base model and any number of LoRA runs over HTTP. Clients create a session, a
LoRA run, then send ordered primitives (save_weights_for_sampler, sample, logprobs,
forward_backward, optim_step, save_state, load_state, export_lora, finish) and poll their
results; the caller owns rewards, advantages and the loss payload. GET
/v1/training/capabilities lists everything. Binds 127.0.0.1 unless --host says otherwise,
and then a --token is required. Runs that were active when the server stopped are listed
as dormant at the next start and can be resumed from their last save_state. The tinker SDK's
sessions, training clients and futures are journaled (--state-store): a restarted server
replays them and the SDK's client carries on where it was."""


@dataclass
class ServeSettings:
    base_model: str = field(
        default="starter",
        metadata={"help": "base model: starter, starter-2m, smollm2, a local folder, a hub id"},
    )
    host: str = field(
        default="127.0.0.1",
        metadata={"help": "address to bind; anything but loopback needs --token"},
    )
    port: int = field(default=8400, metadata={"help": "port to listen on (0: any free one)"})
    token: str | None = field(
        default=None,
        metadata={"help": "bearer token every request must send (Authorization: Bearer ...)"},
    )
    tokens: str | None = field(
        default=None,
        metadata={"help": "a JSON file of name -> token, one per person (tokens the tinker "
                  "SDK sends start with tml-): a training client records the name whose "
                  "token created it, every token reads all runs and deletes only its own "
                  "checkpoints (--token stays the administrator's)"},
    )
    state_dir: str | None = field(
        default=None,
        metadata={
            "help": "folder for run records, saved states and exports "
            "(default ~/.cache/posttrain/service)"
        },
    )
    torch_threads: int | None = field(
        default=None,
        metadata={
            "help": "torch intra-op threads (default: torch's choice; 1 is steadier on "
            "a busy machine with few cores)"
        },
    )
    operation_retention: float = field(
        default=600.0,
        metadata={"help": "seconds a finished operation and its result stay retrievable, "
                  "then they are dropped from memory (a retry of its seq gets 409)"},
    )
    state_store: str | None = field(
        default=None,
        metadata={"help": "where the tinker routes keep their journal (sessions, training "
                  "clients, sampling sessions, futures), so a restarted server answers the "
                  "SDK as if nothing happened: a postgresql://user@host/db URL (needs "
                  "posttrain[postgres]); default: tinker-journal.sqlite in --state-dir"},
    )
    no_journal: bool = field(
        default=False,
        metadata={"help": "keep the tinker routes' state in memory only (a restart forgets "
                  "sessions, clients and futures; saved checkpoints stay)"},
    )
    max_tokens_per_call: int = field(
        default=Limits.max_tokens_per_call,
        metadata={"help": "most input tokens one forward_backward, forward or logprobs call "
                  "may carry in all (what one request costs in time; its memory is one "
                  "pass's of at most 2,048 tokens: 1.4 GB for 32,768 on the starter)",
                  "range": (1, 10_000_000)},
    )
    max_sequence_tokens: int = field(
        default=Limits.max_sequence_tokens,
        metadata={"help": "most tokens in one sequence (capped by the model's context); a "
                  "client's text longer than this many tokens could spell is refused "
                  "before it is tokenised", "range": (1, 10_000_000)},
    )
    quiet: bool = field(default=False, metadata={"help": "do not log each request"})


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve training primitives (sample, forward_backward, optim_step, ...) over HTTP",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_dataclass_args(parser, ServeSettings)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(ServeSettings, args)
    # refused before the model loads (a bad port was a traceback from bind())
    if not 0 <= settings.port <= 65535:
        raise PosttrainError(f"--port must be between 0 and 65535, got {settings.port}")
    if settings.torch_threads is not None and settings.torch_threads < 1:
        raise PosttrainError(f"--torch-threads must be at least 1, got {settings.torch_threads}")
    if not (math.isfinite(settings.operation_retention) and settings.operation_retention > 0):
        raise PosttrainError("--operation-retention must be a positive number of seconds, "
                             f"got {settings.operation_retention}")
    if settings.state_store is not None:
        if settings.no_journal:
            raise PosttrainError("--state-store names where the journal goes; it cannot go "
                                 "with --no-journal")
        if not is_postgres_url(settings.state_store):
            raise PosttrainError(f"--state-store: expected a postgresql://user@host/db URL, "
                                 f"got {redacted(settings.state_store)!r} (leave it out for "
                                 "the SQLite journal in --state-dir)")
    serve(
        settings.base_model,
        host=settings.host,
        port=settings.port,
        token=settings.token,
        tokens=(load_tokens(settings.tokens, admin_token=settings.token) if settings.tokens
                else None),
        state_dir=settings.state_dir,
        verbose=not settings.quiet,
        torch_threads=settings.torch_threads,
        limits=Limits(operation_retention_s=settings.operation_retention,
                      max_tokens_per_call=settings.max_tokens_per_call,
                      max_sequence_tokens=settings.max_sequence_tokens),
        journal=not settings.no_journal,
        state_store=settings.state_store,
    )
    return 0
