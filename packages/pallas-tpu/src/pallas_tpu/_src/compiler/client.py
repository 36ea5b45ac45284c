"""The parent's side of the compiler child process (see :mod:`.worker`).

One child per process, started on first use and kept for the next compiles (starting
it, which imports JAX and loads libtpu, takes seconds; a compile then takes well under
one). When the child dies (a compiler ``CHECK`` failure aborts it) or runs past the
timeout, the compile is reported as a crash with the last lines libtpu logged, and the
next compile starts a fresh child.
"""

from __future__ import annotations

import atexit
import os
import re
import select
import subprocess
import sys
import tempfile
import threading
import time

from pallas_tpu._src.compiler.protocol import HEADER, read_message, write_message

# Per compile, in seconds (a large kernel's whole pipeline takes a few seconds here).
TIMEOUT_S = float(os.environ.get("PALLAS_TPU_COMPILE_TIMEOUT", "600"))
# glog's prefix of libtpu's log lines: severity, date, time, thread.
_GLOG = re.compile(r"^([FEW])\d{4} [\d:.]+\s+\d+ ")


class WorkerCrashed(Exception):
    """The child process died or timed out; ``args[0]`` is libtpu's last message."""


def libtpu_available() -> bool:
    """Whether libtpu (``pip install 'pallas-tpu[compile]'``) is installed."""
    import importlib.util

    return importlib.util.find_spec("libtpu") is not None


class _Worker:
    def __init__(self):
        self.log = tempfile.NamedTemporaryFile(prefix="pallas-tpu-compile-", suffix=".log",
                                               delete=False)
        user_args = os.environ.get("LIBTPU_INIT_ARGS", "")
        env = dict(os.environ)
        m = re.search(r"--xla_mosaic_dump_to=(\S+)", user_args)
        if m:  # the user's own dump directory: read from it, leave the files there
            self.dump_dir, own = m.group(1), False
        else:
            self.dump_dir, own = tempfile.mkdtemp(prefix="pallas-tpu-mosaic-dump-"), True
            env["LIBTPU_INIT_ARGS"] = f"{user_args} --xla_mosaic_dump_to={self.dump_dir}"
        self.own_dumps = own
        env.update(
            PALLAS_TPU_DUMP_DIR=self.dump_dir, PALLAS_TPU_OWN_DUMPS="1" if own else "0",
            # Several processes may hold libtpu (this child beside the parent's own, or
            # pytest -n 2's workers' children).
            ALLOW_MULTIPLE_LIBTPU_LOAD="1",
            # Compiling needs no TPU; JAX in the child never initialises one.
            JAX_PLATFORMS="cpu",
        )
        # On a host without a TPU, libtpu asks the metadata server and complains about
        # missing worker hostnames; these quiet it (the log keeps the rest).
        env.setdefault("TPU_SKIP_MDS_QUERY", "1")
        env.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pallas_tpu._src.compiler.worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env)
        self._call(None, TIMEOUT_S)  # the "ready" message: JAX imported

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _read_exact(self, n: int, deadline: float) -> bytes:
        fd, chunks, got = self.proc.stdout.fileno(), [], 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, n - got)
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _call(self, msg, timeout: float):
        import io

        start = os.path.getsize(self.log.name)
        try:
            if msg is not None:
                write_message(self.proc.stdin, msg)
            deadline = time.monotonic() + timeout
            head = self._read_exact(HEADER.size, deadline)
            (n,) = HEADER.unpack(head)
            return read_message(io.BytesIO(head + self._read_exact(n, deadline)))
        except (EOFError, BrokenPipeError, TimeoutError) as e:
            timed_out = isinstance(e, TimeoutError)
            self.close(kill=True)
            message = self._last_message(start, timed_out, timeout)
            self.remove_files()
            raise WorkerCrashed(message) from None

    def _last_message(self, start: int, timed_out: bool, timeout: float) -> str:
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            f.seek(start)
            lines = [ln.rstrip() for ln in f.read().splitlines() if ln.strip()]
        # The first fatal line (a CHECK failure), else the last error that is not the
        # crash handler's own, else the last line.
        fatal = [ln for ln in lines if ln.startswith("F") and _GLOG.match(ln)]
        errors = [ln for ln in lines if _GLOG.match(ln) and "RAW:" not in ln]
        last = (fatal[:1] or errors[-1:] or lines[-1:] or [""])[0]
        last = _GLOG.sub("", last).strip()
        if timed_out:
            return f"the compiler ran past {timeout:.0f} s (killed); last log line: {last}"
        code = self.proc.returncode
        if code is not None and code < 0:
            import signal

            how = f"{signal.Signals(-code).name}"
        else:
            how = f"exit status {code}"
        return f"the compiler aborted ({how}): {last or 'no message'}"

    def compile(self, msg: dict, timeout: float = TIMEOUT_S) -> dict:
        return self._call(msg, timeout)

    def remove_files(self) -> None:
        if self.own_dumps:
            import shutil

            shutil.rmtree(self.dump_dir, ignore_errors=True)
        try:
            os.remove(self.log.name)
        except OSError:
            pass

    def close(self, kill: bool = False) -> None:
        if self.proc.poll() is None:
            if kill:
                self.proc.kill()
            else:
                try:
                    self.proc.stdin.close()
                    self.proc.wait(timeout=10)
                except Exception:  # noqa: BLE001 - best effort at exit
                    self.proc.kill()
            self.proc.wait()


_LOCK = threading.Lock()
_WORKER: list[_Worker] = []


def compile_in_child(msg: dict, timeout: float = TIMEOUT_S) -> dict:
    """Compiles ``msg`` (see :mod:`.worker`) in the child, starting one if needed;
    raises :class:`WorkerCrashed` when the child dies or times out."""
    with _LOCK:
        if _WORKER and not _WORKER[0].alive():
            _WORKER.pop()
        if not _WORKER:
            _WORKER.append(_Worker())
        try:
            return _WORKER[0].compile(msg, timeout)
        except WorkerCrashed:
            _WORKER.clear()
            raise


@atexit.register
def shutdown() -> None:
    """Ends the child (it ends by itself too, when this process closes its stdin)."""
    with _LOCK:
        while _WORKER:
            w = _WORKER.pop()
            w.close()
            w.remove_files()
