"""The benchmark behind scripts/bench/recipes (see there).

Terms used below:
  recipe     one row of recipes_rows.py: hosts, the words typed on each, a pod's environment
  launch     one recipe run by one launcher (torchrun 2.15 or ddprun) on fresh hosts
  record     what recipes_worker.py writes at its start: time.time(), host, pid, environment
  world      the records of one complete world: every RANK 0..W-1 of WORLD_SIZE W once, each
             host bringing its NPROC workers, stamped after the launch's last launcher start
  start time from the last launcher's start (or, for a joining node, its launcher's start)
             to the latest stamp of the world
"""
import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from harness import paths
from harness.hosts import Hosts
from harness.runs import figures, interleaved
from recipes_env import by_rank, compare, print_comparison
from recipes_rows import BY_KEY, NPROC, ROWS

WORKER = os.path.join(paths.BENCH_DIR, "recipes_worker.py")
LAUNCHERS = ("torchrun", "ddprun")
TARGET = 0.1  # ddprun's start time <= 1/10 of torchrun's
WRONG_WORLD_SETTLE = 10.0  # s without a new worker after every host ran workers of a wrong world
# The harness's own variables, taken out of the launchers' environment so that each
# launcher's workers show what that launcher sets.
SCRUB_PREFIXES = ("PET_", "DDPRUN_", "TORCHELASTIC_", "TORCH_ELASTIC_", "SLURM_", "OMPI_", "PMI_")
SCRUB = {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
         "OMP_NUM_THREADS", "PYTHONUNBUFFERED", "CUDA_VISIBLE_DEVICES"}
# Why a variable differs, where it is known; printed under the variable.
NOTES = {
    "MASTER_ADDR": "torchrun: rank 0's host name (socket.getfqdn); ddprun: rank 0's address; both reach rank 0",
    "MASTER_PORT": "both: the launcher's store serves the workers there (USE_AGENT_STORE=True); torchrun: a "
                   "port of its agent's; ddprun: --master_port (one node, static), the c10d endpoint's port when "
                   "a ddprun hosts it, else a torch-only store of the group-rank-0 ddprun on a free port",
    "TORCHELASTIC_USE_AGENT_STORE": "both True; ddprun --no_agent_store: False, rank 0 hosts its TCPStore on "
                                    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID": "torchrun: --rdzv_id, default 'none' (--standalone: a uuid); ddprun: generated "
                           "unless --rdzv_id or an endpoint is given",
    "TORCHELASTIC_ERROR_FILE": "each launcher's own per-run file name; the worker writes it, its launcher reads it",
    "OMP_NUM_THREADS": "both set 1 when nproc_per_node > 1 and it is unset",
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "the harness sets it for torchrun alone (its scale-up hangs without)",
    "DDPRUN_*": "ddprun's own: where its worker runtime finds the agent's store; torch ignores it",
}


class LaunchFailed(Exception):
    """A launch that did not bring up its world: the launcher cannot do the recipe (yet)."""


def say(text):
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


class RecipeHosts(Hosts):
    """The row's hosts, each with its own host name (a UTS namespace) and hosts file
    (/etc/netns/NS/hosts, which `ip netns exec` mounts over /etc/hosts)."""

    def __init__(self, row):
        super().__init__(len(row.hosts))
        self.names = [names[0] for names in row.hosts]
        lines = ["127.0.0.1 localhost"] + [f"{self.address(i)} {' '.join(names)}" for i, names in enumerate(row.hosts)]
        for i in range(self.count):
            os.makedirs(f"/etc/netns/{self.ns(i)}", exist_ok=True)
            with open(f"/etc/netns/{self.ns(i)}/hosts", "w") as f:
                f.write("\n".join(lines) + "\n")

    def on(self, i, argv):
        return super().on(i, ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', self.names[i], *argv])

    def close(self):
        for i in range(self.count):
            shutil.rmtree(f"/etc/netns/{self.ns(i)}", ignore_errors=True)
        super().close()


class Launch:
    """One recipe by one launcher: its hosts, launchers, logs and the workers' records."""

    def __init__(self, a, row, launcher, env, tag):
        self.a, self.row, self.launcher, self.env = a, row, launcher, env
        self.out = tempfile.mkdtemp(prefix="recipes-", dir=a.log_dir)
        self.logs = {n: os.path.join(a.log_dir, f"{tag}-n{n}.log") for n in range(len(row.hosts))}
        self.procs = {}
        self.hosts = None

    def argv(self, node):
        program = self.a.torchrun if self.launcher == "torchrun" else paths.DDPRUN
        return [program, *self.row.args(node), WORKER, self.out]

    def start(self, node):
        env = dict(self.env, **self.row.env(node), **(self.row.torchrun_env if self.launcher == "torchrun" else {}))
        with open(self.logs[node], "w") as log:
            self.procs[node] = subprocess.Popen(self.hosts.on(node, self.argv(node)), stdout=log,
                                                stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def records(self):
        out = []
        for path in glob.glob(os.path.join(self.out, "w-*.json")):
            with open(path) as f:
                out.append(json.load(f))
        return out

    def world(self, nodes, after):
        """The records of the first complete world of len(nodes) x NPROC stamped after `after`, or None."""
        size = NPROC * len(nodes)
        first = {}
        for r in sorted(self.records(), key=lambda r: r["t"]):
            env = r["env"]
            if r["t"] > after and env.get("WORLD_SIZE") == str(size) and env.get("RANK", "").isdigit():
                first.setdefault(int(env["RANK"]), r)
        if sorted(first) != list(range(size)):
            return None
        per_host = sorted(sum(r["host"] == self.hosts.names[n] for r in first.values()) for n in nodes)
        if per_host != [NPROC] * len(nodes):
            raise LaunchFailed(f"a world of {size} formed with {per_host} workers on the hosts")
        return list(first.values())

    def wait_world(self, nodes, after):
        deadline = time.monotonic() + self.a.timeout
        while time.monotonic() < deadline:
            world = self.world(nodes, after)
            if world is not None:
                return world
            self.check_wrong_world(nodes, after)
            for n in nodes:
                code = self.procs[n].poll()
                if code is not None:
                    raise LaunchFailed(f"node {n}'s {self.launcher} exited with status {code} before a world of "
                                       f"{NPROC * len(nodes)} was running{self.seen()}")
            time.sleep(0.02)
        raise LaunchFailed(f"no world of {NPROC * len(nodes)} within {self.a.timeout:g} s{self.seen()}")

    def check_wrong_world(self, nodes, after):
        """Raises LaunchFailed when workers started on every host of `nodes`, all in worlds of
        another size, and none started for WRONG_WORLD_SETTLE s: the hosts formed other jobs."""
        recs = [r for r in self.records() if r["t"] > after]
        hosts = {self.hosts.names[n] for n in nodes}
        if not recs or not hosts <= {r["host"] for r in recs}:
            return
        if time.time() - max(r["t"] for r in recs) < WRONG_WORLD_SETTLE:
            return
        if all(r["env"].get("WORLD_SIZE") != str(NPROC * len(nodes)) for r in recs):
            raise LaunchFailed(f"the workers ran, in worlds other than {NPROC * len(nodes)}{self.seen()}")

    def seen(self):
        """What the workers that did start were told: host, RANK/WORLD_SIZE."""
        got = sorted({(r["host"], r["env"].get("RANK", "-"), r["env"].get("WORLD_SIZE", "-")) for r in self.records()})
        if not got:
            return "; no worker started"
        return "; workers seen (host rank/world): " + ", ".join(f"{h} {rk}/{w}" for h, rk, w in got)

    def run(self):
        """(seconds from the last launcher start to the world running, the world's records)."""
        row = self.row
        self.hosts = RecipeHosts(row)
        try:
            first = row.first_nodes()
            for n in first:
                t0 = time.time()
                self.start(n)
            world = self.wait_world(first, t0)
            if row.join is not None:
                t0 = time.time()
                self.start(row.join)
                world = self.wait_world(first + [row.join], t0)
            return max(r["t"] for r in world) - t0, world
        except LaunchFailed as e:
            raise LaunchFailed(f"{e}\n{self.tails()}") from None
        finally:
            self.stop()

    def stop(self):
        open(os.path.join(self.out, "stop"), "w").close()
        deadline = time.monotonic() + self.a.finish_timeout
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.hosts.kill_every_host(self.procs.values())
        self.hosts.close()
        shutil.rmtree(self.out, ignore_errors=True)

    def tails(self, lines=6):
        text = []
        for n, path in self.logs.items():
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    tail = f.read().splitlines()[-lines:]
                text.append(f"    --- node {n} ({path}):\n" + "\n".join("    " + x for x in tail))
        return "\n".join(text)


def torch2_env():
    p = subprocess.run([paths.TORCH2, "env"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"recipes bench: {paths.TORCH2} env failed:\n{p.stderr}")
    return dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)


def launch_env(t2):
    env = {k: v for k, v in os.environ.items() if k not in SCRUB and not k.startswith(SCRUB_PREFIXES)}
    env.update(PYTHON_EXEC=t2["PYTHON_EXEC"], LD_LIBRARY_PATH=t2["LD_LIBRARY_PATH"])
    return env


def recipe_text(row, launcher):
    lines = []
    for n in range(len(row.hosts)):
        env = " ".join(f"{k}={v}" for k, v in row.env(n).items())
        words = " ".join([launcher, *row.args(n), "train.py"])
        join = " (joins later)" if n == row.join else ""
        lines.append(f"    {row.hosts[n][0]}{join}: {env + ' ' if env else ''}{words}")
    return "\n".join(lines)


def recipe_words(row):
    """Every value the recipe itself names: flag values and their HOST:PORT parts, pod variables."""
    words = set()
    for n in range(len(row.hosts)):
        values = list(row.env(n).values()) + [w.split("=", 1)[-1] for w in row.args(n)]
        words.update(values)
        words.update(part for v in values for part in v.split(":"))
    return words


def report(a, rows, results, failures, worlds):
    print(f"\nrecipe table: start = last launcher start -> every worker of the world running "
          f"(median of {a.runs} runs, min-max); {NPROC} workers per host; target ddprun/torchrun <= {TARGET:g}")
    print(f"{'row':<34} {'torchrun':>20} {'ddprun':>20} {'ratio':>7}  target")
    summary = {}
    for row in rows:
        cells, med = [], {}
        for launcher in LAUNCHERS:
            values = results.get((row.key, launcher), [])
            if launcher not in a.launchers:
                cells.append("-")
            elif not values:
                cells.append("cannot")
            else:
                f = figures(values)
                med[launcher] = f.median
                cells.append(f"{f.median:.3f}s ({f.min:.2f}-{f.max:.2f})")
        ratio, goal = "-", ""
        if len(med) == 2 and med["torchrun"] > 0:
            r = med["ddprun"] / med["torchrun"]
            ratio, goal = f"{r:.3f}", ("met" if r <= TARGET else "MISSED")
        elif "ddprun" in a.launchers and not results.get((row.key, "ddprun")):
            goal = "ddprun cannot run this recipe yet"
        print(f"{row.title:<34} {cells[0]:>20} {cells[1]:>20} {ratio:>7}  {goal}")
        summary[row.key] = {"title": row.title, "median": med, "ratio": ratio, "goal": goal,
                            "runs": {l: results.get((row.key, l), []) for l in LAUNCHERS}}
    print()
    for row in rows:
        print(f"{row.title}:")
        print(recipe_text(row, "LAUNCHER"))
        if row.torchrun_env:
            print("    torchrun also gets " + " ".join(f"{k}={v}" for k, v in row.torchrun_env.items()))
        for launcher in LAUNCHERS:
            if (row.key, launcher) in failures:
                print(f"    {launcher} FAILED: {failures[(row.key, launcher)]}")
        t, d = worlds.get((row.key, "torchrun")), worlds.get((row.key, "ddprun"))
        if t and d:
            differs, nature = compare(by_rank(t), by_rank(d), fixed=recipe_words(row))
            print_comparison(differs, nature, NOTES)
            summary[row.key]["env"] = {"differ": differs, "nature": nature}
        print()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": summary, "failures": {f"{k[0]}/{k[1]}": v for k, v in failures.items()},
                       "worlds": {f"{k[0]}/{k[1]}": v for k, v in worlds.items()}}, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description="torchrun recipes launched unchanged by torchrun 2.15 and ddprun: "
                                 "worker environments side by side and the start time")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rows", default=",".join(r.key for r in ROWS), help="comma list of " +
                    ", ".join(r.key for r in ROWS))
    ap.add_argument("--launchers", default="torchrun,ddprun", help="comma list of torchrun, ddprun")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds a launch may take to bring up its world")
    ap.add_argument("--finish_timeout", type=float, default=5.0,
                    help="seconds the launchers get to finish once the workers were told to exit")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when a launch failed (the smoke test's check); default: report it and exit 0")
    ap.add_argument("--json", help="write the figures, failures and worker records here")
    ap.add_argument("--log_dir", help="keep the launchers' logs here (default: a temporary folder, kept "
                    "only when a launch fails)")
    a = ap.parse_args()
    a.launchers = [x for x in a.launchers.split(",") if x]
    keys = [x for x in a.rows.split(",") if x]
    bad = [x for x in keys if x not in BY_KEY] + [x for x in a.launchers if x not in LAUNCHERS]
    if bad or a.runs < 1 or not keys or not a.launchers:
        sys.exit(f"recipes bench: bad arguments {bad or ''} (rows: {', '.join(BY_KEY)}; launchers: "
                 f"{', '.join(LAUNCHERS)}; --runs >= 1)")
    rows = [BY_KEY[k] for k in keys]
    paths.require_root("recipes bench")
    if "ddprun" in a.launchers:
        paths.require("recipes bench", paths.DDPRUN)
    if "torchrun" in a.launchers:
        paths.require_peers("recipes bench", paths.TORCH2)
        t2 = torch2_env()  # installs torch 2.15 on first use
    else:
        t2 = {"PYTHON_EXEC": paths.PY, "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", "")}
    # torch2's own torchrun, as `torch2 torchrun` execs it, without the wrapper's version check
    # in the timed path.
    a.torchrun = os.path.join(paths.TORCH2_VENV, "bin", "torchrun")
    env = launch_env(t2)
    keep_logs = a.log_dir is not None
    a.log_dir = a.log_dir or tempfile.mkdtemp(prefix="ddprun-recipes-bench-")
    os.makedirs(a.log_dir, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("recipes bench: terminated"))

    results, failures, worlds = {}, {}, {}
    for i, order in interleaved(a.runs, a.launchers, alternate=True):
        for row in rows:
            for launcher in order:
                key = (row.key, launcher)
                if key in failures:
                    continue  # a recipe a launcher cannot do is tried once
                try:
                    secs, world = Launch(a, row, launcher, env, f"{i + 1:02d}-{row.key}-{launcher}").run()
                except LaunchFailed as e:
                    failures[key] = str(e)
                    keep_logs = True
                    say(f"run {i + 1}/{a.runs} {row.key}, {launcher}: FAILED: {str(e).splitlines()[0]}")
                    continue
                results.setdefault(key, []).append(secs)
                worlds[key] = world
                say(f"run {i + 1}/{a.runs} {row.key}, {launcher}: world of {len(world)} running after {secs:.3f} s")
    report(a, rows, results, failures, worlds)
    if keep_logs:
        print(f"logs: {a.log_dir}")
    else:
        shutil.rmtree(a.log_dir, ignore_errors=True)
    if a.strict and failures:
        sys.exit(f"recipes bench: {len(failures)} recipe(s) failed: " + ", ".join(f"{r} by {l}" for r, l in failures))


if __name__ == "__main__":
    main()
