"""The recipes of scripts/bench/recipes: each row's hosts, command line and pod environment.

A row is what a user writes on each host, the same words for both launchers: only the
program differs (torchrun or ddprun). The Kubernetes rows carry no launcher flags at all:
each pod gets the variables its controller sets, read from the controllers' sources:
  training-operator v1 (pkg/controller.v1/pytorch/envvar.go, master.go, elastic.go):
    every pod: PYTHONUNBUFFERED=0; with a Master replica: MASTER_ADDR=<job>-master-0,
    MASTER_PORT=<the Master's pytorchjob-port, 23456 by default>, WORLD_SIZE=replicas x
    nprocPerNode, RANK=<replica index, workers after the master>, PET_NPROC_PER_NODE,
    PET_NODE_RANK=RANK; without elasticPolicy PET_NNODES=<replicas>. With elasticPolicy:
    PET_RDZV_ENDPOINT=<job>-worker-0:<port>, PET_RDZV_BACKEND=c10d, PET_NNODES=MIN:MAX,
    PET_MAX_RESTARTS, PET_NPROC_PER_NODE (elasticPolicy.nProcPerNode), and PET_RDZV_ID,
    PET_RDZV_CONF, PET_STANDALONE only when set in the policy.
  Trainer v2 (pkg/runtime/framework/plugins/torch/torch.go, JobSet pods of the replicated
    job "node"): PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK=<the Job completion index>,
    PET_MASTER_ADDR=<job>-node-0-0.<job>, PET_MASTER_PORT=29500; Kubernetes adds
    JOB_COMPLETION_INDEX to an indexed Job's pods.
A pod's host name is its pod name and its hosts file maps every pod's name (a headless
Service's records, resolvable from the start here).
"""
from typing import Callable, NamedTuple, Optional

NPROC = 2
JOB = "job"  # the Kubernetes job's name
OPERATOR_PORT = 23456  # training-operator's default pytorchjob-port
TRAINER_PORT = 29500  # Trainer v2's ContainerTrainerPort (constants.go)


class Row(NamedTuple):
    key: str
    title: str
    hosts: list  # per node: [host name, other names it resolves under]
    args: Callable[[int], list]  # node -> the launcher's arguments before the program
    env: Callable[[int], dict] = lambda n: {}  # node -> the pod's environment
    join: Optional[int] = None  # the node started once the others' workers run
    started: int = 0  # nodes started first (all when 0)
    torchrun_env: dict = {}  # what torchrun needs beyond the recipe (each entry says why)

    @property
    def world(self):
        return NPROC * len(self.hosts)

    def first_nodes(self):
        return list(range(self.started or len(self.hosts)))


def plain_hosts(count):
    return [[f"node{i}"] for i in range(count)]


def _static(n):
    return ["--nnodes=2", f"--nproc_per_node={NPROC}", f"--node_rank={n}", "--master_addr=node0",
            "--master_port=29500"]


def _c10d(nnodes):
    def args(n):
        return [f"--nnodes={nnodes}", f"--nproc_per_node={NPROC}", "--rdzv_id=100", "--rdzv_backend=c10d",
                "--rdzv_endpoint=node0:29400"] + (["--max_restarts=3"] if ":" in nnodes else [])
    return args


def _operator(n):
    """training-operator PyTorchJob, Master x1 + Worker x1, nprocPerNode 2, no elasticPolicy."""
    return {"PYTHONUNBUFFERED": "0", "MASTER_PORT": str(OPERATOR_PORT), "MASTER_ADDR": f"{JOB}-master-0",
            "WORLD_SIZE": str(2 * NPROC), "RANK": str(n), "PET_NPROC_PER_NODE": str(NPROC),
            "PET_NODE_RANK": str(n), "PET_NNODES": "2"}


def _operator_args(n):
    """The pod command's flags, as PyTorchJob manifests write them: torchrun reads
    PET_MASTER_ADDR/PET_MASTER_PORT, which this controller does not set, so with its
    environment alone pod 1 looks for node 0 at 127.0.0.1:29500 and waits (seen with
    torchrun 2.15): `torchrun --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT train.py`."""
    env = _operator(n)
    return [f"--master_addr={env['MASTER_ADDR']}", f"--master_port={env['MASTER_PORT']}"]


def _operator_elastic(n):
    """training-operator PyTorchJob, Worker x2, elasticPolicy {minReplicas 2, maxReplicas 2,
    maxRestarts 3, nProcPerNode 2}, the worker's pytorchjob-port 23456."""
    return {"PYTHONUNBUFFERED": "0", "PET_RDZV_ENDPOINT": f"{JOB}-worker-0:{OPERATOR_PORT}",
            "PET_RDZV_BACKEND": "c10d", "PET_NNODES": "2:2", "PET_MAX_RESTARTS": "3",
            "PET_NPROC_PER_NODE": str(NPROC)}


def _trainer(n):
    """Trainer v2 TrainJob (torch runtime), numNodes 2, numProcPerNode 2."""
    return {"PET_NNODES": "2", "PET_NPROC_PER_NODE": str(NPROC), "PET_NODE_RANK": str(n),
            "PET_MASTER_ADDR": f"{JOB}-node-0-0.{JOB}", "PET_MASTER_PORT": str(TRAINER_PORT),
            "JOB_COMPLETION_INDEX": str(n)}


ROWS = [
    Row("standalone", "standalone, 1 host", plain_hosts(1), lambda n: ["--standalone", f"--nproc_per_node={NPROC}"]),
    Row("static", "static, 2 nodes", plain_hosts(2), _static),
    Row("c10d", "c10d endpoint, 2 nodes", plain_hosts(2), _c10d("2")),
    # torch 2.15 keeps the bootstrap store info of its first round: in a later round the old
    # rank 0 never publishes MASTER_ADDR under the new round's keys and the joining node waits
    # for it until its store timeout (seen here, as in scripts/bench/elastic). Its documented
    # opt-out of the shared TCPStore rebuilds that info every round.
    Row("elastic", "c10d endpoint 1:3, node 1 joins", plain_hosts(2), _c10d("1:3"), join=1, started=1,
        torchrun_env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}),
    Row("pytorchjob", "PyTorchJob (training-operator)", [[f"{JOB}-master-0"], [f"{JOB}-worker-0"]],
        _operator_args, _operator),
    Row("pytorchjob-elastic", "PyTorchJob with elasticPolicy", [[f"{JOB}-worker-{i}"] for i in range(2)],
        lambda n: [], _operator_elastic),
    Row("trainer", "TrainJob (Trainer v2, JobSet)",
        [[f"{JOB}-node-0-{i}", f"{JOB}-node-0-{i}.{JOB}"] for i in range(2)], lambda n: [], _trainer),
]
BY_KEY = {r.key: r for r in ROWS}
