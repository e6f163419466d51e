"""The harness every scripts/bench/*_bench.py is built on (scripts/bench/README.md):

  paths     the build's programs (BUILD_DIR), the peers (DDPRUN_PEERS_DIR), require()
  runs      interleaved runs and their figures: median, min, max
  procs     running programs: the benches' environment, a program's result line, peak
            RSS, the ddp-rendezvous daemon
  hosts     test hosts: network namespaces on a subnet of their own (needs root)
  ssh_hosts sshd on such hosts

The benchmarks run as `python3 scripts/bench/NAME_bench.py`, so scripts/bench is on
sys.path and `from harness import ...` finds this package.
"""
