"""``posttrain env serve``: a posttrain environment served as an OpenEnv environment
(``posttrain.score.openenv_served``), for TRL's OpenEnv integration and any
OpenEnv client."""

from __future__ import annotations

import argparse

from posttrain.commands.env_flag import add_env_arg
from posttrain.data.prompts import load_prompts
from posttrain.envs import DEFAULT_ENV, get_env
from posttrain.envs.base import PromptWriter, require_hook
from posttrain.envs.ecosystem.openenv_server import free_port
from posttrain.errors import PosttrainError
from posttrain.score.openenv_served import openenv_app

LOOPBACK = ("127.0.0.1", "localhost", "::1")


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
        "openenv:URL drive it. Single-reply environments only.")
    serve.add_argument("--env", default=DEFAULT_ENV,
                       help=f"the environment to serve (a name, module:attribute, a file.py:"
                            f"ATTR, verifiers:ENV_ID or inspect:PKG/TASK; default {DEFAULT_ENV})")
    add_env_arg(serve)
    serve.add_argument("--prompts-file", default=None, metavar="FILE",
                       help="serve these prompt records (JSONL) instead of written ones")
    serve.add_argument("--prompts", type=int, default=400,
                       help="how many prompts the environment writes to serve (default 400)")
    serve.add_argument("--seed", type=int, default=0,
                       help="the prompt writer's seed (default 0): the same seed serves the "
                            "same prompts in the same order")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1; the server has no "
                            "tokens, so another address is refused unless --allow-remote)")
    serve.add_argument("--allow-remote", action="store_true",
                       help="allow a --host other than loopback (anyone who reaches it can "
                            "reset and step episodes; nothing they send is stored)")
    serve.add_argument("--port", type=int, default=8010, help="port (default 8010; 0: any "
                                                              "free one)")
    serve.add_argument("--max-concurrent-envs", type=int, default=8,
                       help="WebSocket sessions (one environment each) at once (default 8); "
                            "past it a new client is told the server is at capacity")
    serve.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    if args.host not in LOOPBACK and not args.allow_remote:
        raise PosttrainError(f"--host {args.host}: posttrain env serve has no tokens; listen "
                             "on loopback, or pass --allow-remote to serve others")
    if args.max_concurrent_envs < 1:
        raise PosttrainError("--max-concurrent-envs must be at least 1")
    if not 0 <= args.port <= 65535:
        raise PosttrainError(f"--port must be 0 to 65535, got {args.port}")
    if args.prompts < 1:
        raise PosttrainError(f"--prompts must be at least 1, got {args.prompts}")
    env = get_env(args.env)
    if args.prompts_file:
        records = load_prompts(args.prompts_file, env=env)
    else:
        writer = require_hook(env, PromptWriter, "writes no prompts",
                              "serve a file of them with --prompts-file")
        records = writer.write_prompts(args.prompts, seed=args.seed)
    app = openenv_app(env, records, max_concurrent_envs=args.max_concurrent_envs)
    import uvicorn  # the server extra, needed only here

    port = args.port or free_port()  # said below, so a client knows where to go
    config = uvicorn.Config(app, host=args.host, port=port, log_level="warning")
    server = uvicorn.Server(config)
    print(f"posttrain env serve: {env.name} as an OpenEnv environment, {len(records)} prompts "
          f"(reset(seed=i) -> prompt i), up to {args.max_concurrent_envs} sessions at once; "
          f"listening on http://{args.host}:{port} (Ctrl-C stops)", flush=True)
    server.run()
    return 0
