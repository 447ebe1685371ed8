"""``posttrain ui``: serve the dashboard and the ingest API over a runs folder's store."""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading

from posttrain.access import load_tokens
from posttrain.commands.dataclass_args import whole_number
from posttrain.errors import PosttrainError
from posttrain.http_guard import is_loopback
from posttrain.interrupts import interruptible
from posttrain.runs.dashboard_link import announce_dashboard
from posttrain.runs.folder import runs_root
from posttrain.runs.store import DB_FILENAME, STORE_HELP, TOKEN_ENV, store_spec
from posttrain.ui.app import dashboard_server

DESCRIPTION = """\
Serve the live dashboard over <runs>/posttrain.db: the run list at /, each run's page
at /runs/<name> (curves while it trains, then the before/after verdict, the table by
category and the config), and the JSON API the pages read. Training processes on this
machine write the same file and need nothing else. Training elsewhere can send its run
here instead: start this with --host 0.0.0.0 --token SECRET and run training with
POSTTRAIN_SERVER=http://<this machine>:<port> POSTTRAIN_TOKEN=SECRET.

The token protects writes (POST /api/ingest); reading the pages and the API stays open
to whoever can reach the port, which is why a host other than 127.0.0.1 needs a token
and a network you trust (or a proxy that authenticates)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "ui",
        help="serve the live dashboard (run list, run pages) and the ingest API",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--runs-dir",
        default=None,
        help="folder holding posttrain.db and the run folders ($POSTTRAIN_RUNS or ./runs)",
    )
    parser.add_argument("--store", default=None, metavar="URL_OR_FILE", help=STORE_HELP)
    parser.add_argument(
        "--tokens", default=None, metavar="FILE",
        help="a JSON file of name -> token, one per person: a run records the name whose "
        "token sent it, every token reads all runs and deletes only its own (--token stays "
        "the administrator's, who may delete any)")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on; anything but a loopback address needs "
        "--token (default: 127.0.0.1)",
    )
    parser.add_argument(
        "--port",
        type=whole_number,
        default=8765,
        help="port to listen on; 0 picks a free one (default: 8765)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help=f"bearer token that POST /api/ingest must carry (default: ${TOKEN_ENV})",
    )
    parser.set_defaults(func=run)


def dashboard_url(host: str, port: int) -> str:
    """The URL to print: the machine's name when listening on every address."""
    if host in ("0.0.0.0", ""):
        host = socket.gethostname()
    return f"http://{host}:{port}/"


def run(args: argparse.Namespace) -> int:
    token = args.token or os.environ.get(TOKEN_ENV) or None
    tokens = load_tokens(args.tokens, admin_token=token) if args.tokens else None
    if not is_loopback(args.host) and not token and not tokens:
        raise PosttrainError(
            f"--host {args.host} would let other machines write runs here without a token: "
            f"pass --token SECRET (or set {TOKEN_ENV}), or keep the default --host 127.0.0.1"
        )
    if not 0 <= args.port <= 65535:
        raise PosttrainError(f"--port must be between 0 and 65535, got {args.port}")
    root = runs_root(args.runs_dir)
    store = store_spec(args.store) or str(root / DB_FILENAME)
    server = dashboard_server(store, args.host, args.port, token, runs_root=root,
                              tokens=tokens)
    port = server.server_address[1]
    url = dashboard_url(args.host, port)
    print(f"posttrain ui: serving {server.store.location} at {url}  (Ctrl-C to stop)",
          flush=True)
    damage = getattr(server.store, "damage", None)
    if damage is not None:  # serving anyway: the pages say it until it is fixed
        print(f"posttrain ui: {damage}", file=sys.stderr, flush=True)
    if token or tokens:
        print(
            f"  training elsewhere: POSTTRAIN_SERVER={url.rstrip('/')} "
            f"{TOKEN_ENV}=<your token> posttrain grpo ...",
            flush=True,
        )
    if tokens:
        print(f"  {len(tokens)} named tokens from {args.tokens}: each deletes only its own "
              f"runs", flush=True)
    try:
        # recipes started on this runs folder print their run page's URL; Ctrl-C and
        # SIGTERM stop it even when started in the background with SIGINT ignored
        with interruptible(), announce_dashboard(root, url):
            server.start()
            threading.Event().wait()
    except KeyboardInterrupt:
        print("posttrain ui: stopped", flush=True)
    finally:
        server.shutdown()
        server.server_close()
    return 0
