"""A server on loopback for the e2e tests: uvicorn in a thread, on a free port, stopped on exit."""
import contextlib
import threading
import time


@contextlib.contextmanager
def running(app, start_timeout: float = 60.0):
    """Serve `app` on 127.0.0.1 (a free port) while the block runs; yields the port."""
    import uvicorn

    from specserve.server.http import uvicorn_config
    srv = uvicorn.Server(uvicorn_config(app, "127.0.0.1", 0, log_level="warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    deadline = time.time() + start_timeout
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    assert srv.started, f"the server did not start within {start_timeout} s"
    try:
        yield srv.servers[0].sockets[0].getsockname()[1]
    finally:
        srv.should_exit = True
        th.join(10)
