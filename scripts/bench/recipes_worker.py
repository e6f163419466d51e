"""The worker of scripts/bench/recipes: writes its stamp and environment, then waits.

    recipes_worker.py DIR [--wait S]

At start it takes time.time() and writes DIR/w-<host>-<pid>.json ({"t", "host", "pid",
"env"}; written under a temporary name and renamed, so a reader never sees half a file).
Then it waits until DIR/stop exists (the benchmark saw the world it waited for) or S
seconds (default 300) passed, and exits 0. It imports nothing heavy, so the figure is the
launcher's, not an import's.
"""
import json
import os
import socket
import sys
import time


def main():
    t = time.time()
    out = sys.argv[1]
    wait = float(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--wait" else 300.0
    host = socket.gethostname()
    record = {"t": t, "host": host, "pid": os.getpid(), "env": dict(os.environ)}
    path = os.path.join(out, f"w-{host}-{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.rename(path + ".tmp", path)
    stop = os.path.join(out, "stop")
    deadline = time.monotonic() + wait
    while not os.path.exists(stop) and time.monotonic() < deadline:
        time.sleep(0.05)


if __name__ == "__main__":
    main()
