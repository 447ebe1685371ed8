"""``posttrain env serve``: a posttrain environment served as an OpenEnv environment
(``posttrain.score.openenv_served``), for TRL's OpenEnv integration and any
OpenEnv client."""

from __future__ import annotations

import argparse
import os

from posttrain.access import load_tokens
from posttrain.commands.env_flag import add_env_arg
from posttrain.data.prompts import load_prompts
from posttrain.envs import DEFAULT_ENV, get_env
from posttrain.envs.base import PromptWriter, require_hook
from posttrain.envs.ecosystem.openenv_server import SERVE_TOKEN_ENV
from posttrain.errors import PosttrainError
from posttrain.http_core import IDLE_SOCKET_SECONDS, HttpServer, Rules, check_bind
from posttrain.score.openenv_served import MAX_REPLY_CHARS, openenv_app

#: the most prompts written to serve (the refund writer: 100,000 in a few seconds and
#: ~100 MB); more is a --prompts-file
MAX_PROMPTS = 100_000
MAX_SESSIONS = 256
MIN_IDLE_S, MAX_IDLE_S = 1.0, 86_400.0
#: a request or WebSocket message: a reply of MAX_REPLY_CHARS characters, each escaped
#: to at most 6 bytes of JSON, with room for the rest of the message
MAX_BODY_BYTES = 6 * MAX_REPLY_CHARS + 64 * 1024


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "env", help="serve a posttrain environment as an OpenEnv environment",
        description="Work with environments outside posttrain's own recipes.")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    serve = actions.add_parser(
        "serve", help="serve an environment over OpenEnv's HTTP and WebSocket protocol",
        description="Serve a posttrain environment (refund, a user's env file, an ecosystem "
        "adapter) as an OpenEnv environment: reset(seed=i) shows prompt i (or the one of "
        "scenario_id=...), step({'reply': ...}) grades the reply with the rule (reward = the "
        "rule's score, done = true; the category, pass and markers in its metadata). "
        "OpenEnv's GenericEnvClient, TRL's OpenEnv integration or posttrain's own --env "
        "openenv:URL drive it. A multi-turn rule plays a turn a step over the WebSocket. "
        "It runs on posttrain's HTTP core: a body limit, read deadlines, a Host/Origin "
        "guard, tokens beyond loopback, idle sessions closed.")
    serve.add_argument("--env", default=DEFAULT_ENV,
                       help=f"the environment to serve (a name, module:attribute, a file.py:"
                            f"ATTR, verifiers:ENV_ID or inspect:PKG/TASK; default {DEFAULT_ENV})")
    add_env_arg(serve)
    serve.add_argument("--prompts-file", default=None, metavar="FILE",
                       help="serve these prompt records (JSONL) instead of written ones")
    serve.add_argument("--prompts", type=int, default=400,
                       help=f"how many prompts the environment writes to serve (default 400, "
                            f"at most {MAX_PROMPTS:,})")
    serve.add_argument("--seed", type=int, default=0,
                       help="the prompt writer's seed (default 0): the same seed serves the "
                            "same prompts in the same order")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1); any other needs "
                            "--token or --tokens")
    serve.add_argument("--port", type=int, default=8010, help="port (default 8010; 0: any "
                                                              "free one)")
    serve.add_argument("--token", default=None,
                       help=f"bearer token every request and WebSocket must carry except "
                            f"GET /health (default: ${SERVE_TOKEN_ENV}); posttrain's --env "
                            f"openenv:URL sends ${SERVE_TOKEN_ENV}")
    serve.add_argument("--tokens", default=None, metavar="FILE",
                       help="a JSON file of name -> token, one per person, each allowed as "
                            "--token is (nothing served is stored, so names only identify)")
    serve.add_argument("--max-concurrent-envs", type=int, default=8,
                       help=f"WebSocket sessions (one environment each) at once (default 8, "
                            f"at most {MAX_SESSIONS}); past it a new client is told the "
                            "server is at capacity")
    serve.add_argument("--idle-timeout", type=float, default=IDLE_SOCKET_SECONDS,
                       metavar="SECONDS",
                       help=f"a session whose client sends nothing this long is closed and "
                            f"its slot freed (default {IDLE_SOCKET_SECONDS:g}, "
                            f"{MIN_IDLE_S:g} to {MAX_IDLE_S:g})")
    serve.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    token = args.token or os.environ.get(SERVE_TOKEN_ENV) or None
    tokens = load_tokens(args.tokens, admin_token=token) if args.tokens else None
    check_bind(args.host, token or ("named tokens" if tokens else None),
               "posttrain env serve's episodes")
    check_bounds(args)
    env = get_env(args.env)
    if args.prompts_file:
        records = load_prompts(args.prompts_file, env=env)
    else:
        writer = require_hook(env, PromptWriter, "writes no prompts",
                              "serve a file of them with --prompts-file")
        records = writer.write_prompts(args.prompts, seed=args.seed)
    server = HttpServer(args.host, args.port, Rules(
        token=token, tokens=tokens, needs_token=lambda method, path: path != "/health",
        max_body_bytes=MAX_BODY_BYTES, idle_socket_s=args.idle_timeout,
        name="posttrain env serve"))
    server.mount(openenv_app(env, records, max_concurrent_envs=args.max_concurrent_envs,
                             idle_timeout_s=args.idle_timeout))
    guarded = " (token required)" if token or tokens else ""
    print(f"posttrain env serve: {env.name} as an OpenEnv environment, {len(records)} prompts "
          f"(reset(seed=i) -> prompt i), up to {args.max_concurrent_envs} sessions at once; "
          f"listening on {server.url}{guarded} (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


def check_bounds(args: argparse.Namespace) -> None:
    """Every numeric flag inside the work it may ask for, before anything is built."""
    for flag, value, low, high in (
            ("--prompts", args.prompts, 1, MAX_PROMPTS),
            ("--seed", args.seed, 0, 2**32 - 1),
            ("--port", args.port, 0, 65535),
            ("--max-concurrent-envs", args.max_concurrent_envs, 1, MAX_SESSIONS),
            ("--idle-timeout", args.idle_timeout, MIN_IDLE_S, MAX_IDLE_S)):
        if not (low <= value <= high):  # NaN fails this too
            raise PosttrainError(f"{flag} must be {low:g} to {high:g}, got {value:g}")
