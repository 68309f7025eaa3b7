"""``cmr dashboard``: serve a live web page of a store's jobs (cmr.dashboard).

It finds the store as ``cmr status`` does (flags, $CMR_STORE, the last run's store) and only
reads it. A page on a loopback address is for this machine's user alone; one on any other
address shows the store's job records to whoever can reach it, so it takes --allow-remote.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import typer
from rich.text import Text

from cmr.cli.options import StoreFlags, Verbose, configure_logs, err, fail, out, safe_text, shared
from cmr.settings import BackendName

EMBEDDED = (
    "the embedded backend keeps a job's state inside its own `cmr run` process, where no other "
    "process can read it: run the job on a store that keeps jobs (the local stack: "
    "`scripts/stack.sh start`, then `cmr run ... --store aws`; or --store aws://BUCKET/TABLE, "
    "azure://ACCOUNT/CONTAINER/TABLE) and point `cmr dashboard --store` at it"
)


@shared("store", StoreFlags)
def dashboard(
    store: StoreFlags,
    host: Annotated[
        str, typer.Option(help="the address to listen on (a loopback one unless --allow-remote)")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="the port to listen on (0: any free one)")] = 8765,
    open_page: Annotated[
        bool, typer.Option("--open", help="open the page in the default web browser")
    ] = False,
    allow_remote: Annotated[
        bool,
        typer.Option(
            "--allow-remote",
            help="listen on a --host that is not a loopback address: whoever reaches it sees "
            "every job of the store",
        ),
    ] = False,
    verbose: Verbose = 0,
) -> None:
    """A live web page of the store's jobs: state, progress, timings, each task's attempts on
    a timeline, failures, duplicates filtered, counters, workers, cost. Only reads the store.

    With no store given: $CMR_STORE, else the store of your last `cmr run`."""
    configure_logs(logging.WARNING - 10 * verbose)
    from cmr.cli.jobs import _opened, announce, shown, where
    from cmr.dashboard.server import Dashboard, is_loopback, listen

    if not 0 <= port <= 65535:
        fail(f"--port must be from 0 to 65535; got {port}")
    loopback = is_loopback(host)
    if not loopback and not allow_remote:
        fail(
            f"--host {host} is not a loopback address: the page would show every job of the "
            "store to whoever can reach it. Pass --allow-remote to serve it there anyway, or "
            "leave --host out (127.0.0.1) and reach it through an SSH tunnel"
        )
    w = where(store)
    if w.store.backend == BackendName.embedded:
        fail(EMBEDDED)
    announce(w)
    sock = listen(host, port)

    async def serve() -> None:
        async with _opened(w.store) as be:
            board = Dashboard(be, sock, store=shown(w.store), any_host=not loopback)
            out.print(
                Text.assemble(
                    "dashboard of ", safe_text(shown(w.store)), f" at {board.url} (Ctrl-C stops it)"
                ),
                highlight=False,
                soft_wrap=True,
            )
            if not loopback:
                err.print(
                    Text.assemble(
                        ("warning:", "bold yellow"),
                        f" listening on {safe_text(host)}, not a loopback address: anyone who "
                        "reaches it sees every job of the store (--allow-remote)",
                    ),
                    highlight=False,
                )
            if open_page:
                import webbrowser

                webbrowser.open(board.url)
            await board.serve()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        err.print("dashboard stopped", highlight=False)
    finally:
        sock.close()
