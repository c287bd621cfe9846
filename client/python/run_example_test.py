#!/usr/bin/env python3
"""CTest driver: start attnd on a small config with a fresh ipc:// socket, run example.py
against it, stop the daemon with SIGTERM and require exit status 0 from both."""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--lib", required=True)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="attnd-py-")
    sock = os.path.join(tmp, "attnd.sock")
    cfg = {"backend": "cpu", "threads": 2, "server": {"listen": f"ipc://{sock}"},
           "geometry": {"num_layers": 2, "num_q_heads": 8, "num_kv_heads": 2, "head_size": 64,
                        "block_size": 16, "cache_dtype": "bf16", "num_blocks": 256},
           "log": {"level": "warn", "stats_interval_s": 0}}
    path = os.path.join(tmp, "attnd.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    log = open(os.path.join(tmp, "attnd.log"), "w+")
    daemon = subprocess.Popen([args.daemon, "--config", path], stdout=log, stderr=log)
    rc = 1
    try:
        for _ in range(400):  # the socket appears once the daemon listens
            if os.path.exists(sock) or daemon.poll() is not None:
                break
            time.sleep(0.05)
        time.sleep(0.1)
        ex = subprocess.run([sys.executable, os.path.join(HERE, "example.py"),
                             "--url", f"ipc://{sock}", "--lib", args.lib], timeout=90)
        rc = ex.returncode
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            drc = daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            drc = -9
        if rc != 0 or drc != 0:
            log.seek(0)
            sys.stderr.write(f"example.py: {rc}, attnd: {drc}\n---- attnd log\n{log.read()}")
            rc = rc or 1
        log.close()
        if rc == 0:
            shutil.rmtree(tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
