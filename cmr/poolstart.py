"""How the CPU pool's processes start: forks of a fork server where there is one (Linux,
macOS), else spawned.

Not fork: forking a process that runs an event loop and SDK threads is unsafe. The fork
server is a process of its own, single-threaded, started once per worker process with
cmr's task modules loaded (``PRELOAD``); each pool process is a fork of it. A spawned pool
process cost ~0.25 CPU-s and ~0.4 s of wall time before its first task (its imports),
every time a pool started: each ``cmr.run``, and each restart after a timeout.

What a fork inherits from the server, and how each is made the worker's:

- the import path: the server starts with the worker's own ``sys.path`` and not the
  directory it happens to be in (Python 3.11's server ignores the path it is given and
  puts the working directory first, where a user's ``json.py`` would replace the
  standard library's, in the server and every pool process, or another cmr copy cmr's);
  each pool process then takes the worker's path of the moment, as spawn does;
- the working directory: the worker's, as spawn gives it (``multiprocessing``'s own);
- the environment: the worker's as of the pool's start (``cmr.pool``'s initializer);
- stdout and stderr: the server's, which are the worker's when the server started; a
  worker that points its fds 1 and 2 elsewhere later sends its pool's output there only
  with a fresh process (cmr never does; under pytest, the test that started the server
  holds what the pool processes print);
- the server lives as long as the worker (about 40 MB, its working directory in use),
  and a worker killed outright leaves its socket's directory (``$TMPDIR/pymp-*``) behind.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import tempfile
import time
from typing import Any

# What a pool process runs, imported once in the fork server. Not cmr.cpu.fixedsort: numpy,
# which only sorted fixed-size records need, would cost every worker process ~0.1 s more.
PRELOAD = ["cmr.pool", "cmr.cpu.mapping", "cmr.cpu.reducing"]
# The server listens on $TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX: a socket path has at most
# 107 bytes on Linux (sun_path, with its NUL), 103 on macOS.
_SOCKET_PATH_TAIL = len("/pymp-12345678/listener-12345678")
_SOCKET_PATH_MAX = 103 if sys.platform == "darwin" else 107


def context() -> Any:
    """The fork server's context, or spawn's where it cannot serve: no fork server (Windows),
    a TMPDIR too deep for its socket, or an interpreter that ignores the environment (-E,
    -I), by which the server is given the worker's import path."""
    spawn = multiprocessing.get_context("spawn")
    try:
        ctx = multiprocessing.get_context("forkserver")
    except ValueError:
        return spawn
    if sys.flags.ignore_environment:
        return spawn
    if len(os.fsencode(tempfile.gettempdir())) + _SOCKET_PATH_TAIL > _SOCKET_PATH_MAX:
        return spawn
    server = _server()
    if server._forkserver_pid is None:  # not running: ours to start, with the user's list too
        theirs = list(getattr(server, "_preload_modules", None) or [])
        ctx.set_forkserver_preload(list(dict.fromkeys([*theirs, *PRELOAD])))
    return ctx


def ensure_server(ctx: Any) -> None:
    """Start the fork server now if ``ctx`` is its and it is not running, with this
    process's import path rather than the working directory first (see the top)."""
    if ctx.get_start_method() != "forkserver" or _server()._forkserver_pid is not None:
        return
    names = ("PYTHONSAFEPATH", "PYTHONPATH")
    saved = {name: os.environ.get(name) for name in names}
    here = os.getcwd()
    os.environ["PYTHONSAFEPATH"] = "1"  # no working directory (nor script's) put first
    os.environ["PYTHONPATH"] = os.pathsep.join((p or here) for p in sys.path if isinstance(p, str))
    try:
        from multiprocessing import forkserver

        forkserver.ensure_running()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def leave_server() -> None:
    """In a pool process: close its copy of the pipe by which the fork server learns that
    the worker is gone. The server then exits when the worker dies, and with it (their
    parent: PR_SET_PDEATHSIG, Linux) every pool process, even one in a long task."""
    server = _server()
    if server is None or server._forkserver_pid is not None:
        return  # spawned (no server), or the worker itself
    fd = server._forkserver_alive_fd
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
        server._forkserver_alive_fd = None


def _forget_server_after_fork() -> None:
    """A process forked from the worker (os.fork, multiprocessing's fork) inherits the
    worker's record of its server, which it cannot use (waitpid on a process not its
    child fails) and the server's alive pipe, which would keep the server up after the
    worker died: it starts its own server if it needs one."""
    server = _server()
    if server is not None and server._forkserver_pid is not None:
        _forget(server)


def _forget(server: Any) -> None:
    """Drop this process's record of a running fork server, closing its end of the server's
    alive pipe (the server exits once no process holds one)."""
    with contextlib.suppress(OSError, TypeError):
        os.close(server._forkserver_alive_fd)
    server._forkserver_pid = None
    server._forkserver_alive_fd = None
    server._forkserver_address = None


def _server() -> Any:
    """multiprocessing's fork server record (private: no public way to reach it), or None."""
    try:
        from multiprocessing import forkserver
    except ImportError:  # Windows
        return None
    return forkserver._forkserver


def stop_server(timeout: float = 10.0) -> None:
    """End this process's fork server (once its pool processes are gone) and wait for it,
    so that its pool processes' CPU time counts in this process's RUSAGE_CHILDREN as a
    spawned pool's did (a benchmark measures it so); the next pool starts another. Only
    once every pool of this process is shut down: the server's end ends its processes."""
    server = _server()
    if server is None or server._forkserver_pid is None:
        return
    pid = server._forkserver_pid
    _forget(server)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == 0:
                time.sleep(0.01)
                continue
        return


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_server_after_fork)
