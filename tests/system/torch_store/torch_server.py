#!/usr/bin/env python3
"""torch's own TCPStore server, in a process of its own that stays up: prints
"listening on HOST:PORT" once it serves, then serves until SIGTERM or --lifetime
seconds (so a forgotten one does not outlive its test for long).

  torch_server.py [--host H] [--port P] [--backend default|libuv|legacy]

--backend picks PyTorch 2.x's server (use_libuv=True or False); torch 1.13 has only
its one (legacy) server and accepts "default" alone.
"""
import argparse
import datetime
import signal
import sys
import threading

import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--backend", choices=["default", "libuv", "legacy"], default="default")
    parser.add_argument("--lifetime", type=float, default=600)
    args = parser.parse_args()
    extra = {}
    if args.backend != "default":
        extra["use_libuv"] = args.backend == "libuv"
    try:
        server = dist.TCPStore(args.host, args.port, None, True, datetime.timedelta(seconds=30),
                               wait_for_workers=False, **extra)
    except TypeError as e:
        print("torch_server.py: this torch has no backend choice: %s" % e, file=sys.stderr)
        return 2
    backend = getattr(server, "libuvBackend", None)
    print("listening on %s:%d backend %s" % (args.host, server.port,
                                             {None: "legacy", True: "libuv", False: "legacy"}[backend]),
          flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    done.wait(args.lifetime)
    return 0


if __name__ == "__main__":
    sys.exit(main())
