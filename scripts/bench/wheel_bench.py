"""The wheel benchmark behind scripts/bench/wheel (see there for usage)."""
import argparse
import glob
import os
import resource
import subprocess
import sys
import tempfile
import time

from harness import paths
from harness.runs import figures

PY = paths.PY  # Debian's python3: the venvs see its torch (--system-site-packages), as a user's would


def timed(argv, what, **kwargs):
    """Runs argv to completion; returns (seconds, stdout). A failure ends the benchmark."""
    start = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    seconds = time.perf_counter() - start
    if r.returncode != 0:
        sys.exit(f"wheel bench: {what} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return seconds, r.stdout


def children_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def build_wheel(out_dir):
    """Returns the wheel, the build's wall seconds and its CPU seconds (pip, CMake, the compilers)."""
    cpu_before = children_cpu_seconds()
    seconds, _ = timed([PY, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-w", out_dir,
                        paths.ROOT], "pip wheel", timeout=3600)
    wheels = glob.glob(os.path.join(out_dir, "*.whl"))
    if len(wheels) != 1:
        sys.exit(f"wheel bench: pip wheel made {wheels} in {out_dir}")
    return wheels[0], seconds, children_cpu_seconds() - cpu_before


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--wheel", help="a built wheel to measure (default: build one from this checkout)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="wheel-bench-") as tmp:
        build_s = None
        wheel = args.wheel
        if wheel is None:
            wheel, build_s, build_cpu_s = build_wheel(os.path.join(tmp, "dist"))
        size = os.path.getsize(wheel)

        venv_s, install_s, version_s, versions = [], [], [], set()
        for i in range(args.runs):
            venv = os.path.join(tmp, f"venv{i}")
            s, _ = timed([PY, "-m", "venv", "--system-site-packages", venv], "python3 -m venv")
            venv_s.append(s)
            s, _ = timed([os.path.join(venv, "bin", "pip"), "install", "--no-index", "--no-deps",
                          "--disable-pip-version-check", wheel], "pip install")
            install_s.append(s)
            s, out = timed([os.path.join(venv, "bin", "ddprun"), "--version"], "ddprun --version")
            version_s.append(s)
            versions.add(out.strip())
            print(f"run {i + 1}/{args.runs} done", file=sys.stderr, flush=True)

    def row(name, values, unit="s", scale=1.0):
        f = figures(values)
        print(f"{name:<34} {f.median * scale:>9.3f} {f.min * scale:>9.3f} {f.max * scale:>9.3f}  {unit}, {f.runs} runs")

    print(f"wheel: {os.path.basename(wheel)}")
    print(f"wheel size: {size} bytes ({size / 2**20:.2f} MiB)")
    if build_s is not None:
        launcher = os.environ.get("CMAKE_CXX_COMPILER_LAUNCHER", "none")
        print(f"wheel build (pip wheel, once, compiler launcher: {launcher}): {build_s:.1f} s wall, "
              f"{build_cpu_s:.1f} s CPU (user + sys), on {os.cpu_count()} CPUs")
    print(f"{'':<34} {'median':>9} {'min':>9} {'max':>9}")
    row("fresh venv (python3 -m venv)", venv_s)
    row("pip install of the wheel into it", install_s)
    row("ddprun --version from the venv", version_s, "ms", 1000)
    print(f"ddprun --version printed: {' | '.join(sorted(versions))}")


if __name__ == "__main__":
    main()
