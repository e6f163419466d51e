"""The torch init benchmark behind scripts/bench/torch_init (see there for usage).

PyTorch 2.15 workers (../shared/peers/torch2) on ddprun's agent store against the same
workers under torchrun 2.15, whose agent serves them its own store: the seeds-style
script tests/launcher/e2e/torch_agent_store_probe.py (init from the environment,
DistributedSampler, DDP, gloo). First the checks, under ddprun: the script plain and
with rank 0 killed after init under --max_restarts 1 (attempt 1 on the same
MASTER_PORT). Then the figure: 8 workers, time from the launcher's start to every rank
past init_process_group (each rank stamps the wall clock when init returns), runs
alternated, medians and the ratio of the medians."""
import argparse
import os
import re
import socket
import subprocess
import sys
import time

from harness import paths
from harness.runs import Samples, interleaved

WHO = "torch init bench"
PROBE = os.path.join(paths.ROOT, "tests", "launcher", "e2e", "torch_agent_store_probe.py")
STAMP = re.compile(r"init_done (\d+\.\d+)")
RESULT = re.compile(r"rank=(\d+) .*")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch2_env():
    p = subprocess.run([paths.TORCH2, "env"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{WHO}: {paths.TORCH2} env failed:\n{p.stderr}")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)
    return env


def command(launcher, nproc, port, extra=()):
    if launcher == "ddprun":
        return [paths.DDPRUN, f"--nproc_per_node={nproc}", f"--master_port={port}", "--monitor_interval=0.1",
                *extra, PROBE]
    return [paths.TORCH2, "torchrun", f"--nproc_per_node={nproc}", f"--master_port={port}",
            "--monitor_interval=0.1", *extra, PROBE]


def run(argv, env, probe_args=(), timeout=300):
    p = subprocess.run([*argv, *probe_args], env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def fields(line):
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)


def results(text):
    """Each rank's result line (the probe's last), as fields, by rank."""
    out = {}
    for line in text.splitlines():
        m = RESULT.search(line)
        if m:
            out[int(m.group(1))] = fields(line[m.start():])
    return out


def check(env, name, extra, probe_args, attempt):
    port = free_port()
    rc, text = run(command("ddprun", 2, port, extra), env, probe_args)
    res = results(text)
    problems = []
    if rc != 0:
        problems.append(f"exit status {rc}")
    if sorted(res) != [0, 1]:
        problems.append(f"result lines of ranks {sorted(res)}")
    for rank, f in res.items():
        want = {"attempt": str(attempt), "master_port": str(port), "listener": "launcher", "own_key": "True",
                "earlier_key": "False", "agent_keys": "False", "allreduce": "3"}
        bad = {k: f.get(k) for k, v in want.items() if f.get(k) != v}
        if bad:
            problems.append(f"rank {rank}: {bad}")
    if "Address already in use" in text:
        problems.append("'Address already in use' in the output")
    print(f"check {name}: {'ok' if not problems else 'FAILED: ' + '; '.join(problems)}")
    if problems:
        print("\n".join("    " + line for line in text.splitlines()[-30:]))
    return not problems


def time_to_init(launcher, env, nproc):
    port = free_port()
    argv = command(launcher, nproc, port)
    start = time.time()
    rc, text = run(argv, env, ["--stamp"])
    stamps = [float(m.group(1)) for m in STAMP.finditer(text)]
    if rc != 0 or len(stamps) != nproc:
        sys.exit(f"{WHO}: {launcher} ended with status {rc} and {len(stamps)} of {nproc} init stamps:\n"
                 + "\n".join(text.splitlines()[-30:]))
    return max(stamps) - start


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=8)
    parser.add_argument("--no-checks", action="store_true", help="only the timing")
    a = parser.parse_args()
    paths.require(WHO, paths.DDPRUN)
    paths.require_peers(WHO, paths.TORCH2)
    env = torch2_env()
    version = subprocess.run([env["PYTHON_EXEC"], "-c", "import torch; print(torch.__version__)"], env=env,
                             capture_output=True, text=True).stdout.strip()
    print(f"torch {version} ({env['PYTHON_EXEC']})")

    ok = True
    if not a.no_checks:
        ok &= check(env, "plain, 2 workers", [], [], 0)
        ok &= check(env, "rank 0 killed after init, --max_restarts 1", ["--max_restarts=1"],
                    ["--kill-rank0-attempt", "0"], 1)

    launchers = ["ddprun", "torchrun"]
    for name in launchers:  # one warm-up each (page cache, pyc files)
        time_to_init(name, env, a.nproc)
    t = Samples()
    for _, order in interleaved(a.runs, launchers, alternate=True, progress=True):
        for name in order:
            t[name].append(time_to_init(name, env, a.nproc))
    print(f"{a.nproc} torch {version} workers (gloo): launch -> every rank past init_process_group, "
          f"median of {a.runs} alternated runs")
    print(f"{'launcher':<10} {'median s':>9} {'min s':>7} {'max s':>7}")
    for name in launchers:
        f = t.figures(name)
        print(f"{name:<10} {f.median:>9.3f} {f.min:>7.3f} {f.max:>7.3f}")
    print(f"ddprun / torchrun: {t.median('ddprun') / t.median('torchrun'):.2f}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
