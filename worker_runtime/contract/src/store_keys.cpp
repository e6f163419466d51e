#include "ddp/contract/store_keys.hpp"

#include "ddp/contract/parse.hpp"

namespace ddp::contract {

JobKeys::JobKeys(int attempt) : attempt_(attempt), prefix_("attempt/" + std::to_string(attempt) + "/") {}

std::string JobKeys::at(std::string_view name) const { return prefix_ + std::string(name); }

std::string JobKeys::node(int node_rank) const { return at("node/" + std::to_string(node_rank)); }
std::string JobKeys::master_port() const { return at("master_port"); }
std::string JobKeys::failure() const { return at("failure"); }
std::string JobKeys::done(int node_rank) const { return at("done/" + std::to_string(node_rank)); }
std::string JobKeys::left(int node_rank) const { return at("left/" + std::to_string(node_rank)); }
std::string JobKeys::exit_count() const { return at("exits"); }
std::string JobKeys::exit_slot(int64_t n) const { return at("exit/" + std::to_string(n)); }
std::string JobKeys::progress(int rank) const { return at("progress/" + std::to_string(rank)); }
std::string JobKeys::stall_report(int node_rank) const { return at("stall/" + std::to_string(node_rank)); }
std::string JobKeys::process_groups() const { return at("pg/"); }
std::string JobKeys::joined() const { return at("joined"); }
std::string JobKeys::member(int64_t id) const { return at("member/" + std::to_string(id)); }
std::string JobKeys::members() const { return at("members"); }
std::string JobKeys::closing() const { return at("closing"); }

std::string JobKeys::elastic_lost(int64_t id) { return "elastic/lost/" + std::to_string(id); }

std::string JobKeys::standalone_process_groups(std::string_view run_id, int restart_count) {
  return "ddp/" + std::string(run_id) + "/" + std::to_string(restart_count) + "/pg/";
}

int JobKeys::node_rank_of(std::string_view key) const {
  const std::string head = at("node/");
  if (key.substr(0, head.size()) != head) return -1;
  auto r = parse_integer(key.substr(head.size()));
  return r && *r >= 0 && *r <= (1 << 30) ? static_cast<int>(*r) : -1;
}

namespace group_keys {

std::string exchange(std::string_view topic) { return std::string(topic) + "/"; }
std::string record(std::string_view topic, int rank) { return exchange(topic) + std::to_string(rank); }
std::string backend(std::string_view name) { return std::string(name) + "/"; }
std::string subgroup(int id) { return "sub" + std::to_string(id) + "/"; }
std::string failure() { return "failure"; }
std::string nccl_unique_id() { return "nccl/unique_id"; }

}  // namespace group_keys

}  // namespace ddp::contract
