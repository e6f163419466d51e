#!/usr/bin/env python3
"""Drives torch.distributed.TCPStore, as a client, through every call the installed
torch offers, against the store server at HOST:PORT, and prints one JSON record per
call on stdout:

  {"call": "get('absent') after set_timeout(1s)", "error": ["DistStoreError", "wait timeout ..."],
   "asked": 1.0, "seconds": 1.0}

A record holds the call (a fixed description), its result ("result": a JSON form of
the value; bytes as latin-1 text, or their length and sha256 when long) or the
exception it raised ("error": its type and its message with addresses, ports and
file descriptors replaced), and for a call that must wait out a timeout the timeout
asked ("asked") and the time it took ("seconds", to 0.01 s). A wake-up (a call that
blocks until a second client sets what it waits for) records "woke": whether it
returned before half its timeout. A call after which torch's client finds its
connection gone records "reconnect": the calls after it use a new client.

Run against two servers, the same client gives the same records when the servers
behave alike: the records carry nothing that depends on the server's address or on
chance, only the durations of timeouts vary, within the machine's noise.

The store must be fresh (no keys). The driver opens at most a few clients at once
(PyTorch 2.x's client process cannot hold many). Every call is bounded: the clients
carry a timeout, and a watchdog ends the process with status 3 after --deadline
seconds. The calls a torch version lacks are skipped (their records say so), so one
client version prints the same list whatever the server.
"""
import argparse
import datetime
import gc
import hashlib
import json
import os
import re
import sys
import threading
import time

import torch
import torch.distributed as dist

SHORT = 1.0  # seconds: the timeout asked of calls that must time out
DEFAULT = 5.0  # seconds: every other call's bound
LATER = 0.4  # seconds: when the second client acts in a wake-up


# What torch's client says when the server dropped its connection.
DROPPED = re.compile(r"Broken pipe|Connection reset|Connection was likely closed|Socket Timeout")


def td(seconds):
    return datetime.timedelta(seconds=seconds)


def normalise(message):
    """The first line of an exception's message, without what varies between runs."""
    text = message.split("\nException raised from")[0].strip()
    text = re.sub(r"\[?(?:[0-9a-fA-F]*:){2,}[0-9a-fA-F.:]*\]?:\d+", "ADDR", text)
    text = re.sub(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?", "ADDR", text)
    text = re.sub(r"fd=-?\d+", "fd=N", text)
    return text


def encode(value):
    """A JSON form of a call's result that two runs can compare exactly."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value)
        if len(value) > 256:
            return {"bytes": len(value), "sha256": hashlib.sha256(value).hexdigest()}
        return {"bytes": value.decode("latin-1")}
    if isinstance(value, str) and len(value) > 256:
        value = value.encode("utf-8", "surrogateescape")
        return {"str": len(value), "sha256": hashlib.sha256(value).hexdigest()}
    if isinstance(value, (list, tuple)):
        items = [encode(v) for v in value]
        if len(items) > 16:
            text = json.dumps(items, sort_keys=True).encode()
            return {"list": len(items), "sha256": hashlib.sha256(text).hexdigest()}
        return items
    if isinstance(value, datetime.timedelta):
        return {"seconds": value.total_seconds()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return type(value).__name__


class Driver:
    """The clients of one run (the main one, made again after a dropped connection, and
    second clients made on demand) and the records printed so far."""

    def __init__(self, host, port):
        self.host = host
        self.port = port
        self.records = 0
        self.main = None
        # A client connected from start to nearly the end, so that a dropped connection
        # shows in its own record and not in every later one through the keys a server
        # might drop with a job's last connection (checked once, last).
        self.keeper = None

    def client(self, timeout=DEFAULT):
        return dist.TCPStore(self.host, self.port, None, False, td(timeout))

    def emit(self, record):
        print(json.dumps(record, sort_keys=True), flush=True)
        self.records += 1

    def call(self, name, fn, asked=None, woke_within=None):
        """Runs fn(), records its result or exception; `asked`: the timeout it must wait out."""
        record = {"call": name}
        start = time.monotonic()
        try:
            record["result"] = encode(fn())
        except Exception as e:  # every exception is a result to compare
            record["error"] = [type(e).__name__, normalise(str(e))]
            if DROPPED.search(str(e)):
                self.main = None
                record["reconnect"] = True
        took = time.monotonic() - start
        if asked is not None:
            record["asked"] = asked
            record["seconds"] = round(took, 2)
        if woke_within is not None:
            record["woke"] = took < woke_within / 2
        self.emit(record)
        return record

    def absent(self, name):
        self.emit({"call": name, "skipped": "torch %s has no such call" % torch.__version__})

    def has(self, attribute):
        return hasattr(dist.TCPStore, attribute)

    @property
    def s(self):
        """The main client; a new one once torch's client saw its connection dropped."""
        if self.main is None:
            self.main = self.client()
        return self.main

    def later(self, action, delay=LATER):
        """Runs action() on a thread after `delay` seconds (the second client's part)."""
        def run():
            time.sleep(delay)
            action()
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread


def basic_calls(d):
    d.call("num_keys() of a fresh store", d.s.num_keys)
    d.call("set('a', 'v1')", lambda: d.s.set("a", "v1"))
    d.call("get('a')", lambda: d.s.get("a"))
    d.call("set('a', 'v2') overwrites", lambda: d.s.set("a", "v2"))
    d.call("get('a') after overwrite", lambda: d.s.get("a"))
    d.call("set('', 'empty key')", lambda: d.s.set("", "empty key"))
    d.call("get('')", lambda: d.s.get(""))
    d.call("set('ev', '') empty value", lambda: d.s.set("ev", ""))
    d.call("get('ev')", lambda: d.s.get("ev"))
    d.call("set('bin', NULs and 0xff)", lambda: d.s.set("bin", b"\x00\x01\x00\xff\xfe\x00"))
    d.call("get('bin')", lambda: d.s.get("bin"))
    d.call("set('k\\x00ey', 'nul in key')", lambda: d.s.set("k\x00ey", "nul in key"))
    d.call("get('k\\x00ey')", lambda: d.s.get("k\x00ey"))
    d.call("set('ключ/ü', utf-8)", lambda: d.s.set("ключ/ü", "значение"))
    d.call("get('ключ/ü')", lambda: d.s.get("ключ/ü"))
    big = bytes((i * 7 + 3) % 256 for i in range(4 << 20))
    d.call("set('big', 4 MiB)", lambda: d.s.set("big", big))
    d.call("get('big')", lambda: d.s.get("big"))
    d.call("num_keys() after sets", d.s.num_keys)


def add_calls(d):
    d.call("add('n', 5) creates", lambda: d.s.add("n", 5))
    d.call("add('n', -2)", lambda: d.s.add("n", -2))
    d.call("add('n', 0)", lambda: d.s.add("n", 0))
    d.call("get('n') after add", lambda: d.s.get("n"))
    d.call("add('neg', -7)", lambda: d.s.add("neg", -7))
    d.call("add('huge', 2**62)", lambda: d.s.add("huge", 1 << 62))
    d.call("add('huge', 2**62 - 1) to the int64 maximum", lambda: d.s.add("huge", (1 << 62) - 1))
    d.call("set('num', '41')", lambda: d.s.set("num", "41"))
    d.call("add('num', 1) on a set decimal", lambda: d.s.add("num", 1))
    d.call("set('padded', ' 8')", lambda: d.s.set("padded", " 8"))
    d.call("add('padded', 1)", lambda: d.s.add("padded", 1))
    d.call("get('padded')", lambda: d.s.get("padded"))


def compare_set_calls(d):
    d.call("compare_set('cs1', '', 'd') missing key, empty expected",
           lambda: d.s.compare_set("cs1", "", "d"))
    d.call("get('cs1')", lambda: d.s.get("cs1"))
    d.call("compare_set('cs2', 'x', 'd') missing key, non-empty expected",
           lambda: d.s.compare_set("cs2", "x", "d"))
    d.call("compare_set('cs1', 'd', 'e') matches", lambda: d.s.compare_set("cs1", "d", "e"))
    d.call("compare_set('cs1', 'zz', 'f') differs", lambda: d.s.compare_set("cs1", "zz", "f"))
    d.call("compare_set('cs1', '', 'g') existing key, empty expected",
           lambda: d.s.compare_set("cs1", "", "g"))
    d.call("get('cs1') after compare_sets", lambda: d.s.get("cs1"))
    d.call("compare_set('ev', '', 'filled') on an empty value",
           lambda: d.s.compare_set("ev", "", "filled"))
    d.call("num_keys() after compare_sets", d.s.num_keys)


def check_and_delete_calls(d):
    if d.has("check"):
        d.call("check(['a'])", lambda: d.s.check(["a"]))
        d.call("check(['absent'])", lambda: d.s.check(["absent"]))
        d.call("check(['a', 'absent'])", lambda: d.s.check(["a", "absent"]))
        d.call("check([])", lambda: d.s.check([]))
    else:
        d.absent("check")
    d.call("wait([]) returns at once", lambda: d.s.wait([]))
    d.call("wait(['a', 'n'])", lambda: d.s.wait(["a", "n"]))
    d.call("wait(['a'], 1s) with timeout", lambda: d.s.wait(["a"], td(SHORT)))
    d.call("set('gone', 'x')", lambda: d.s.set("gone", "x"))
    d.call("delete_key('gone')", lambda: d.s.delete_key("gone"))
    d.call("delete_key('gone') again", lambda: d.s.delete_key("gone"))
    d.call("delete_key('never')", lambda: d.s.delete_key("never"))
    d.call("num_keys() after deletes", d.s.num_keys)


def extended_calls(d):
    """The calls of torch 2.x's extended API (append, multi_*, queues, list_keys...)."""
    if d.has("append"):
        d.call("append('ap', 'x') creates", lambda: d.s.append("ap", "x"))
        d.call("append('ap', b'\\x00y')", lambda: d.s.append("ap", b"\x00y"))
        d.call("get('ap')", lambda: d.s.get("ap"))
        d.call("append('n', '0') on a counter", lambda: d.s.append("n", "0"))
        d.call("add('n', 1) after append", lambda: d.s.add("n", 1))
    else:
        d.absent("append")
    if d.has("multi_set"):
        d.call("multi_set(['m1', 'm2', 'a'], ['1', '', 'v3'])",
               lambda: d.s.multi_set(["m1", "m2", "a"], ["1", "", "v3"]))
        d.call("multi_get(['m1', 'm2', 'a'])", lambda: d.s.multi_get(["m1", "m2", "a"]))
        d.call("multi_get([])", lambda: d.s.multi_get([]))
        d.call("multi_set([], [])", lambda: d.s.multi_set([], []))
        d.call("multi_set(['x'], []) mismatched", lambda: d.s.multi_set(["x"], []))
        d.call("multi_set(['dup', 'dup'], ['1', '2'])", lambda: d.s.multi_set(["dup", "dup"], ["1", "2"]))
        d.call("get('dup')", lambda: d.s.get("dup"))
    else:
        d.absent("multi_set, multi_get")
    if d.has("queue_push"):
        d.call("queue_len('q') of no queue", lambda: d.s.queue_len("q"))
        d.call("queue_push('q', 'first')", lambda: d.s.queue_push("q", "first"))
        d.call("queue_push('q', b'sec\\x00ond')", lambda: d.s.queue_push("q", b"sec\x00ond"))
        d.call("queue_len('q')", lambda: d.s.queue_len("q"))
        d.call("check(['q']) of a queue", lambda: d.s.check(["q"]))
        d.call("queue_pop('q')", lambda: d.s.queue_pop("q"))
        d.call("queue_pop('q', block=False)", lambda: d.s.queue_pop("q", False))
        d.call("queue_pop('q', block=False) empty", lambda: d.s.queue_pop("q", False))
        d.call("queue_len('q') emptied", lambda: d.s.queue_len("q"))
        d.call("queue_push('a', 'x') onto a set key", lambda: d.s.queue_push("a", "x"))
    else:
        d.absent("queue_push, queue_pop, queue_len")
    if d.has("list_keys"):
        d.call("sorted(list_keys())", lambda: sorted(d.s.list_keys()))
    else:
        d.absent("list_keys")
    if d.has("has_extended_api"):
        d.call("has_extended_api()", d.s.has_extended_api)
    if d.has("barrier"):
        d.call("barrier('b1', 1)", lambda: d.s.barrier("b1", 1))
    else:
        d.absent("barrier")
    if d.has("clone"):
        def on_clone():
            c = d.s.clone()
            return [c.get("m1"), c.num_keys()]
        d.call("clone().get('m1'), num_keys()", on_clone)
    else:
        d.absent("clone")
    d.call("num_keys() after the extended calls", d.s.num_keys)
    d.call("timeout", lambda: d.s.timeout)
    d.call("set_timeout(3s), timeout", lambda: (d.s.set_timeout(td(3)), d.s.timeout)[1])
    d.call("set_timeout(10s)", lambda: d.s.set_timeout(td(DEFAULT)))


def many_keys_calls(d):
    count = 2000
    def set_many():
        for i in range(count):
            d.s.set("many/%d" % i, "v%d" % i)
        return count
    d.call("set 2000 keys 'many/i'", set_many)
    d.call("num_keys() with many", d.s.num_keys)
    d.call("get('many/1234')", lambda: d.s.get("many/1234"))
    if d.has("multi_get"):
        keys = ["many/%d" % i for i in range(count)]
        d.call("multi_get(2000 keys)", lambda: d.s.multi_get(keys))
    d.call("wait(2000 keys)", lambda: d.s.wait(["many/%d" % i for i in range(count)]))


def timeout_calls(d):
    """Calls that must wait out their timeout. A torch 2.x client cancels its wait on
    the server and goes on on the same connection; torch 1.13's client has no way to,
    so each of its timeouts gets a client of its own, dropped afterwards."""
    recovers = int(torch.__version__.split(".")[0]) >= 2
    spare = [None]

    def timing_out():
        if recovers:
            return d.s
        spare[0] = d.client()
        return spare[0]

    def short(name, fn):
        c = timing_out()
        c.set_timeout(td(SHORT))
        d.call(name, lambda: fn(c), asked=SHORT)
        c.set_timeout(td(DEFAULT))

    short("get('absent') after set_timeout(1s)", lambda c: c.get("absent"))
    if recovers:
        d.call("get('a') on the client whose get timed out", lambda: d.s.get("a"))
    short("wait(['absent']) after set_timeout(1s)", lambda c: c.wait(["absent"]))
    c = timing_out()
    d.call("wait(['absent'], 1s)", lambda: c.wait(["absent"], td(SHORT)), asked=SHORT)
    c = timing_out()
    d.call("wait(['a', 'absent'], 1s) one key there", lambda: c.wait(["a", "absent"], td(SHORT)),
           asked=SHORT)
    if d.has("multi_get"):
        short("multi_get(['a', 'absent']) after set_timeout(1s)", lambda c: c.multi_get(["a", "absent"]))
    if d.has("queue_pop"):
        short("queue_pop('never') after set_timeout(1s)", lambda c: c.queue_pop("never"))
    if d.has("barrier"):
        c = timing_out()
        d.call("barrier('alone', 2, 1s) with one member", lambda: c.barrier("alone", 2, td(SHORT)),
               asked=SHORT)
    # The key a timed-out get waited for comes later: the client is still in step.
    other = d.client()
    d.call("second client: set('absent', 'late')", lambda: other.set("absent", "late"))
    d.call("get('absent') after it came", lambda: d.s.get("absent"))
    d.call("get('n') after a late key", lambda: d.s.get("n"))
    spare[0] = None


def wakeup_calls(d):
    """A call blocked on keys and answered when a second client writes them."""
    b = d.client()
    d.later(lambda: b.set("later1", "one"))
    d.call("get('later1') woken by a second client's set", lambda: d.s.get("later1"), woke_within=DEFAULT)
    d.later(lambda: b.add("later2", 3))
    d.call("get('later2') woken by a second client's add", lambda: d.s.get("later2"), woke_within=DEFAULT)
    d.later(lambda: b.compare_set("later3", "", "cs"))
    d.call("wait(['later3']) woken by a second client's compare_set", lambda: d.s.wait(["later3"]),
           woke_within=DEFAULT)

    def both():
        b.set("w1", "1")
        time.sleep(LATER)
        b.set("w2", "2")
    d.later(both)
    start = time.monotonic()
    d.call("wait(['w1', 'w2']) answered only once both exist", lambda: d.s.wait(["w1", "w2"]),
           woke_within=DEFAULT)
    d.emit({"call": "wait(['w1', 'w2']) returned after the second key",
            "result": time.monotonic() - start >= 2 * LATER - 0.05})

    c = d.client()
    shared = {}
    waiter = threading.Thread(target=lambda: shared.update(c=c.get("shared")), daemon=True)
    waiter.start()
    d.later(lambda: b.set("shared", "both"))
    d.call("get('shared') by two clients, woken by one set", lambda: d.s.get("shared"), woke_within=DEFAULT)
    waiter.join(DEFAULT)
    d.emit({"call": "the other waiter of 'shared' got", "result": encode(shared.get("c"))})
    if d.has("append"):
        d.later(lambda: b.append("later4", "ap"))
        d.call("get('later4') woken by a second client's append", lambda: d.s.get("later4"),
               woke_within=DEFAULT)
    if d.has("multi_set"):
        d.later(lambda: b.multi_set(["later5", "later6"], ["5", "6"]))
        d.call("multi_get(['later5', 'later6']) woken by a multi_set", lambda: d.s.multi_get(["later5", "later6"]),
               woke_within=DEFAULT)
    if d.has("queue_push"):
        d.later(lambda: b.queue_push("wq", "pushed"))
        d.call("queue_pop('wq') woken by a second client's push", lambda: d.s.queue_pop("wq"),
               woke_within=DEFAULT)
    if d.has("barrier"):
        d.later(lambda: b.barrier("pair", 2))
        d.call("barrier('pair', 2) with a second client", lambda: d.s.barrier("pair", 2), woke_within=DEFAULT)
    d.call("num_keys() after the wake-ups", d.s.num_keys)


def broken_connection_calls(d, limits):
    """Calls after which torch's server drops the connection, or near that: add on a value
    that is not a decimal; a key of 8 KiB, the most the libuv server takes; with `limits`,
    a key or value over its limits (8 KiB keys, 8 MiB values; the legacy server has none),
    each on a client of its own."""
    s = d.client()
    d.call("set('text', 'abc')", lambda: s.set("text", "abc"))
    d.call("add('text', 1) on a non-integer value", lambda: s.add("text", 1))
    s = d.client()
    d.call("set('hollow', '')", lambda: s.set("hollow", ""))
    d.call("add('hollow', 1) on an empty value", lambda: s.add("hollow", 1))
    # The server reads a stored number as std::stoll does: leading blanks, a sign, digits,
    # then stops; only text with no number, or past int64, is not a number.
    for i, text in enumerate(["8 ", "+8", "8x", "0x10", "\t7", "99999999999999999999", " "]):
        s, key = d.client(), "num%d" % i

        def set_then_add():
            s.set(key, text)
            return s.add(key, 1)
        d.call("set(%r, %r), add(%r, 1)" % (key, text, key), set_then_add)
    s = d.client()
    long_key = "k" * (8192 - 1)  # with the client's '/' prefix: 8 KiB, the most torch's libuv server takes
    d.call("set(8 KiB key, 'x')", lambda: s.set(long_key, "x"))
    d.call("get(8 KiB key)", lambda: s.get(long_key))
    d.call("delete_key(8 KiB key)", lambda: s.delete_key(long_key))
    if limits:
        s = d.client()
        d.call("set(key of 8 KiB + 1, 'x') over the libuv server's limit", lambda: s.set("k" * 8192, "x"))
        d.call("get(key of 8 KiB + 1) on the same client", lambda: s.get("k" * 8192))
        s = d.client()
        over = b"v" * ((8 << 20) + 1)
        d.call("set('over', 8 MiB + 1) over the libuv server's limit", lambda: s.set("over", over))
        d.call("get('over') on the same client", lambda: s.get("over"))
    s = d.client()
    d.call("a new client: get('a') after the dropped connections", lambda: s.get("a"))
    d.call("a new client: get('text')", lambda: s.get("text"))
    # Every client leaves; the keys stay with the server.
    s = d.main = d.keeper = None
    gc.collect()
    time.sleep(0.3)
    s = d.client()
    d.call("get('a') by a new client after every client left", lambda: s.get("a"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("endpoint", help="HOST:PORT of the store server")
    parser.add_argument("--deadline", type=float, default=180, help="seconds before the watchdog ends the run")
    parser.add_argument("--limits", action="store_true",
                        help="also keys and values over the libuv server's limits (where torch's servers differ)")
    args = parser.parse_args()
    host, _, port = args.endpoint.rpartition(":")

    def watchdog():
        print(json.dumps({"call": "watchdog", "error": ["Deadline", "run not done after %gs" % args.deadline]}),
              flush=True)
        os._exit(3)
    timer = threading.Timer(args.deadline, watchdog)
    timer.daemon = True
    timer.start()

    d = Driver(host, int(port))
    try:
        d.s
    except Exception as e:
        d.emit({"call": "connect", "error": [type(e).__name__, normalise(str(e))]})
        return 1
    d.emit({"call": "connect", "result": True})
    d.keeper = d.client()
    d.call("a second client: num_keys()", d.keeper.num_keys)  # torch 1.13's client says nothing until asked
    for part in (basic_calls, add_calls, compare_set_calls, check_and_delete_calls, extended_calls,
                 many_keys_calls, timeout_calls, wakeup_calls):
        part(d)
    broken_connection_calls(d, args.limits)
    d.emit({"call": "done", "result": d.records})
    sys.stdout.flush()
    os._exit(0)  # no waiting on clients' destructors at exit


if __name__ == "__main__":
    sys.exit(main())
