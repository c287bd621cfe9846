"""A private attnd daemon for a test: started on a fresh ipc:// socket in a temporary
directory with the given config, stopped with SIGTERM (its exit status checked)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Any

DAEMON_ENV = "ATTND_DAEMON"


def daemon_path() -> str:
    path = os.environ.get(DAEMON_ENV)
    if not path:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))))
        path = os.path.join(root, "build", "daemon", "attnd")
    return path


class Daemon:
    """`with Daemon(geometry={...}) as d: attnd.Client(d.url)`; extra top-level keys merge in."""

    def __init__(self, geometry: dict[str, Any], threads: int = 2, **extra: Any) -> None:
        self.tmp = tempfile.mkdtemp(prefix="attnd-pytest-")
        self.sock = os.path.join(self.tmp, "attnd.sock")
        self.url = f"ipc://{self.sock}"
        # ATTND_TEST_BACKEND=cuda runs the same tests against the CUDA backend (GPU machine)
        self.config = {"backend": os.environ.get("ATTND_TEST_BACKEND", "cpu"), "threads": threads,
                       "server": {"listen": self.url},
                       "geometry": geometry,
                       "log": {"level": os.environ.get("ATTND_TEST_LOG_LEVEL", "warn"),
                               "stats_interval_s": 0}}
        for k, v in extra.items():
            if isinstance(v, dict):
                self.config.setdefault(k, {}).update(v)
            else:
                self.config[k] = v
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Daemon:
        path = os.path.join(self.tmp, "attnd.json")
        with open(path, "w") as f:
            json.dump(self.config, f)
        self.log = open(os.path.join(self.tmp, "attnd.log"), "w+")
        self.proc = subprocess.Popen([daemon_path(), "--config", path], stdout=self.log,
                                     stderr=self.log)
        deadline = time.monotonic() + 20
        while not os.path.exists(self.sock):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"attnd did not start:\n{self.logs()}")
            time.sleep(0.02)
        time.sleep(0.05)
        return self

    def logs(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = -9
        logs = self.logs()
        self.log.close()
        keep = os.environ.get("ATTND_TEST_LOG_DIR")  # e.g. the GPU machine's $OUT
        if keep:
            shutil.copy(os.path.join(self.tmp, "attnd.log"),
                        os.path.join(keep, f"attnd-{os.path.basename(self.tmp)}.log"))
        shutil.rmtree(self.tmp, ignore_errors=True)
        if rc != 0 and exc[0] is None:
            raise RuntimeError(f"attnd exited with {rc}:\n{logs}")
