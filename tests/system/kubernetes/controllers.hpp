// The pods each Kubernetes controller makes for a PyTorch job: their names, the
// names the cluster DNS answers for them, and the environment the controller puts in
// the training container. Read from the controllers' sources:
//  - Kubeflow training-operator v1, PyTorchJob (pkg/controller.v1/pytorch/envvar.go,
//    master.go, elastic.go): one pod per replica, `<job>-master-0`, `<job>-worker-<i>`,
//    each with a headless Service of its own name.
//      Without elasticPolicy: MASTER_ADDR=<job>-master-0, MASTER_PORT=<the master's
//      container port>, WORLD_SIZE=<replicas × nprocPerNode>, RANK=<the pod's index,
//      master 0, worker i → i+1> (pod-level: a node rank and a process count, not a
//      worker's), PET_NPROC_PER_NODE, PET_NODE_RANK=RANK, PET_NNODES=<replicas>.
//      With elasticPolicy: PET_RDZV_ENDPOINT=<job>-worker-0:<port>, PET_RDZV_BACKEND=c10d,
//      PET_NNODES=<min>:<max>, and where set PET_MAX_RESTARTS, PET_NPROC_PER_NODE,
//      PET_RDZV_ID, PET_RDZV_CONF (k=v,...), PET_STANDALONE.
//      Always PYTHONUNBUFFERED=0.
//  - Kubeflow Trainer v2, TrainJob (pkg/runtime/framework/plugins/torch/torch.go) on a
//    JobSet: pods of the replicated job `node` get host name `<job>-node-0-<i>` and
//    subdomain `<job>` (JobSet's headless Service), so `<job>-node-0-0.<job>` names node
//    0; PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK=<the Job's completion index>,
//    PET_MASTER_ADDR=<job>-node-0-0.<job>, PET_MASTER_PORT=29500. The indexed Job adds
//    JOB_COMPLETION_INDEX.
#pragma once

#include <string>
#include <vector>

#include "pods.hpp"

namespace k8s {

// A pod set: the pods and the names the cluster DNS answers for them.
struct PodSet {
  std::vector<PodSpec> pods;
  std::vector<ServiceName> names;
};

struct PyTorchJobOptions {
  std::string job = "pt";
  int workers = 2;                  // worker replicas (plus master-0)
  int nproc_per_node = 2;           // spec.nprocPerNode
  int port = 23456;                 // the master container's port "pytorchjob-port" (the default)
  bool master_name_later = true;    // `<job>-master-0` resolves only once published
};

// PyTorchJob without elasticPolicy: master-0, then worker-0..N-1.
inline PodSet pytorchjob(const PyTorchJobOptions& o) {
  PodSet set;
  const int replicas = 1 + o.workers;
  for (int r = 0; r < replicas; ++r) {
    const std::string name = r == 0 ? o.job + "-master-0" : o.job + "-worker-" + std::to_string(r - 1);
    Env env = {{"PYTHONUNBUFFERED", "0"},
               {"MASTER_PORT", std::to_string(o.port)},
               {"MASTER_ADDR", o.job + "-master-0"},
               {"WORLD_SIZE", std::to_string(replicas * o.nproc_per_node)},
               {"RANK", std::to_string(r)},
               {"PET_NPROC_PER_NODE", std::to_string(o.nproc_per_node)},
               {"PET_NODE_RANK", std::to_string(r)},
               {"PET_NNODES", std::to_string(replicas)}};
    set.pods.push_back({name, env});
    set.names.push_back({name, r, r == 0 && o.master_name_later});
  }
  return set;
}

struct ElasticPyTorchJobOptions {
  std::string job = "el";
  int workers = 3;  // worker replicas
  int min_replicas = 2;
  int max_replicas = 3;
  int port = 23456;  // the workers' container port (elasticPolicy.rdzvPort unset)
  int nproc_per_node = 1;
  int max_restarts = 3;
  std::string rdzv_id = "el";                       // empty: elasticPolicy.rdzvId unset
  std::string rdzv_conf = "last_call_timeout=1";    // elasticPolicy.rdzvConf, as k=v,...
  bool endpoint_name_later = true;                  // `<job>-worker-0` resolves only once published
};

// PyTorchJob with elasticPolicy: worker-0..N-1, the c10d endpoint on worker-0.
inline PodSet elastic_pytorchjob(const ElasticPyTorchJobOptions& o) {
  PodSet set;
  for (int i = 0; i < o.workers; ++i) {
    const std::string name = o.job + "-worker-" + std::to_string(i);
    Env env = {{"PYTHONUNBUFFERED", "0"},
               {"PET_RDZV_ENDPOINT", o.job + "-worker-0:" + std::to_string(o.port)},
               {"PET_RDZV_BACKEND", "c10d"},
               {"PET_NNODES", std::to_string(o.min_replicas) + ":" + std::to_string(o.max_replicas)},
               {"PET_MAX_RESTARTS", std::to_string(o.max_restarts)},
               {"PET_NPROC_PER_NODE", std::to_string(o.nproc_per_node)}};
    if (!o.rdzv_id.empty()) env["PET_RDZV_ID"] = o.rdzv_id;
    if (!o.rdzv_conf.empty()) env["PET_RDZV_CONF"] = o.rdzv_conf;
    set.pods.push_back({name, env});
    set.names.push_back({name, i, i == 0 && o.endpoint_name_later});
  }
  return set;
}

struct TrainJobOptions {
  std::string job = "tj";
  int num_nodes = 2;
  int nproc_per_node = 2;
  bool master_name_later = true;  // `<job>-node-0-0.<job>` resolves only once published
};

// Trainer v2 TrainJob on a JobSet: node-0-0..node-0-(N-1).
inline PodSet trainjob(const TrainJobOptions& o) {
  PodSet set;
  const std::string master = o.job + "-node-0-0." + o.job;
  for (int i = 0; i < o.num_nodes; ++i) {
    const std::string host = o.job + "-node-0-" + std::to_string(i);
    Env env = {{"PET_NNODES", std::to_string(o.num_nodes)},
               {"PET_NPROC_PER_NODE", std::to_string(o.nproc_per_node)},
               {"PET_NODE_RANK", std::to_string(i)},
               {"PET_MASTER_ADDR", master},
               {"PET_MASTER_PORT", "29500"},
               {"JOB_COMPLETION_INDEX", std::to_string(i)}};
    set.pods.push_back({host, env});
    set.names.push_back({host + "." + o.job, i, i == 0 && o.master_name_later});
  }
  return set;
}

}  // namespace k8s
