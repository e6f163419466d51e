"""The benchmark behind scripts/bench/torch_store_compat (see there)."""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

from harness import paths
from harness.procs import Daemon

HERE = os.path.join(paths.ROOT, "tests", "system", "torch_store")
DRIVER = os.path.join(HERE, "tcpstore_calls.py")
SERVER = os.path.join(HERE, "torch_server.py")
TOLERANCE = 0.4  # seconds: how far a timeout may run over what was asked, and two servers' apart
JOB = "torchcheck"
# Records where torch's legacy server (1.13's only one) misses what its libuv server does,
# with libuv's answer: ddprun's server must give that one (as the CTest test requires).
LIBUV_ANSWERS = {
    "wait(['later3']) woken by a second client's compare_set": {
        "call": "wait(['later3']) woken by a second client's compare_set", "result": None, "woke": True},
}


class TorchServer(Daemon):
    """torch_server.py under `python` with `backend`, ready once it printed its port; stopped
    as the daemon is (SIGTERM, SIGKILL after 10 s) when the context ends."""

    LISTENING = re.compile(r"listening on \S+:(\d+) backend")

    def __init__(self, python, backend):  # pylint: disable=super-init-not-called
        self.own_log = True
        fd, self.log = tempfile.mkstemp(prefix="torch-server-", suffix=".log")
        os.close(fd)
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([*python, SERVER, "--backend", backend, "--lifetime", "900"],
                                         stdout=out, stderr=subprocess.STDOUT)
        self.port = self._wait_listening(120)


def drive(python, port, limits):
    argv = [*python, DRIVER, f"127.0.0.1:{port}"] + (["--limits"] if limits else [])
    p = subprocess.run(argv, capture_output=True, text=True, timeout=400)
    records = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not records or records[-1].get("call") != "done":
        print(f"  the driver ended with status {p.returncode} after {len(records)} records:\n"
              f"  {p.stderr.strip()[-1500:]}", file=sys.stderr)
    return records


def summary(record):
    """A short cell: the result, the exception, the time a timeout took."""
    if record is None:
        return "(no record)"
    if "skipped" in record:
        return "absent"
    if "error" in record:
        text = "%s: %s" % tuple(record["error"])
    else:
        text = json.dumps(record.get("result"))
    if "seconds" in record:
        text += " in %.2fs" % record["seconds"]
    if "woke" in record:
        text += " (woken)" if record["woke"] else " (not woken)"
    return text if len(text) <= 60 else text[:57] + "..."


def agree(want, got):
    if want is None or got is None:
        return False
    plain = lambda r: {k: v for k, v in r.items() if k != "seconds"}
    if plain(want) != plain(got):
        return False
    if "asked" in want:
        asked = want["asked"]
        for r in (want, got):
            if not asked - 0.02 <= r["seconds"] <= asked + TOLERANCE:
                return False
        return abs(want["seconds"] - got["seconds"]) <= TOLERANCE
    return True


def compare(title, columns, reference, details, libuv_answers=None):
    """Prints the table of `columns` (name -> records) against `reference`; returns the
    count of calls where ddprun's column differs from it. `libuv_answers`: records whose
    expected answer is libuv's, not the reference's."""
    names = list(columns)
    ref = columns[reference]
    rows = max(len(r) for r in columns.values())
    print(f"\n{title} (reference: {reference})\n")
    print("| call | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    differ = {n: 0 for n in names}
    notes = []
    for i in range(rows):
        want = ref[i] if i < len(ref) else None
        cells = []
        for n in names:
            got = columns[n][i] if i < len(columns[n]) else None
            libuv = (libuv_answers or {}).get((want or {}).get("call"))
            if n == reference:
                cells.append(summary(want))
            elif libuv is not None and agree(libuv, got):
                cells.append("agrees with libuv")
            elif agree(want, got):
                cells.append("agrees")
            else:
                differ[n] += 1
                cells.append("DIFFERS: " + summary(got))
                notes.append((i, n, want, got))
        call = (want or {}).get("call", "?")
        print(f"| {call[:70]} | " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    print("\n" + ", ".join(f"{n}: {differ[n]} of {rows} differ" for n in names if n != reference))
    if details:
        for i, n, want, got in notes:
            print(f"\nrecord {i}, {n}:\n  {reference}: {json.dumps(want)[:600]}\n  {n}: {json.dumps(got)[:600]}")
    return differ.get("ddprun", 0)


def ddprun_records(python, limits):
    with Daemon(["--host", "127.0.0.1", "--port", "0", "--torch-clients", JOB],
                env={k: v for k, v in os.environ.items() if k != "DDPRUN_TOKEN"}) as daemon:
        return drive(python, daemon.port, limits)


def main():
    parser = argparse.ArgumentParser(description="torch's TCPStore client: ddprun's server against torch's")
    parser.add_argument("--clients", default="2.15,1.13", help="torch versions whose client to run: 2.15, 1.13")
    parser.add_argument("--details", action="store_true", help="print both records of every difference")
    args = parser.parse_args()
    paths.require("torch_store_compat", paths.DAEMON)
    differing = 0
    for client in args.clients.split(","):
        if client == "2.15":
            python = [paths.TORCH2, "python"]
            columns = {}
            for backend in ("libuv", "legacy"):
                with TorchServer(python, backend) as server:
                    columns[f"torch {backend}"] = drive(python, server.port, True)
            columns["ddprun"] = ddprun_records(python, True)
            differing += compare("PyTorch 2.15's client", columns, "torch libuv", args.details)
        elif client == "1.13":
            python = [paths.PY]
            with TorchServer(python, "default") as server:
                columns = {"torch 1.13": drive(python, server.port, False)}
            columns["ddprun"] = ddprun_records(python, False)
            differing += compare("PyTorch 1.13's client", columns, "torch 1.13", args.details, LIBUV_ANSWERS)
        else:
            sys.exit(f"torch_store_compat: unknown client {client!r} (2.15 or 1.13)")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
