// contract::JobKeys and group_keys: the store's layout for a job, built in one place.
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "ddp/contract/store_keys.hpp"

using ddp::contract::JobKeys;
namespace group_keys = ddp::contract::group_keys;

TEST_CASE("an attempt's keys live under attempt/<k>/ and never collide", "[store_keys]") {
  const JobKeys k(3);
  CHECK(k.attempt() == 3);
  CHECK(k.node(0) == "attempt/3/node/0");
  CHECK(k.master_port() == "attempt/3/master_port");
  CHECK(k.failure() == "attempt/3/failure");
  CHECK(k.done(2) == "attempt/3/done/2");
  CHECK(k.left(2) == "attempt/3/left/2");
  CHECK(k.exit_count() == "attempt/3/exits");
  CHECK(k.exit_slot(7) == "attempt/3/exit/7");
  CHECK(k.stall_report(2) == "attempt/3/stall/2");
  CHECK(k.progress(7) == "attempt/3/progress/7");
  CHECK(k.process_groups() == "attempt/3/pg/");
  CHECK(JobKeys::run_id() == "run_id");
  CHECK(JobKeys::shape() == "shape");
  CHECK(JobKeys::node_shape(2) == "shape/node/2");
  CHECK(JobKeys::node_shape(2) != JobKeys::node_shape(12));

  // Distinct across kinds, ranks and attempts.
  std::set<std::string> all;
  size_t made = 0;
  for (int attempt : {0, 1, 10}) {
    const JobKeys a(attempt);
    for (int r : {0, 1, 12}) {
      for (const auto& key : {a.node(r), a.done(r), a.left(r), a.exit_slot(r), a.progress(r), a.stall_report(r)}) {
        all.insert(key);
        ++made;
      }
    }
    all.insert(a.failure());
    all.insert(a.master_port());
    made += 2;
  }
  CHECK(all.size() == made);
}

TEST_CASE("a node rank is read back from its registration key, and only from one", "[store_keys]") {
  const JobKeys k(1);
  CHECK(k.node_rank_of(k.node(0)) == 0);
  CHECK(k.node_rank_of(k.node(41)) == 41);
  CHECK(k.node_rank_of(JobKeys(2).node(4)) == -1);  // another attempt
  CHECK(k.node_rank_of(k.done(4)) == -1);
  CHECK(k.node_rank_of("attempt/1/node/") == -1);
  CHECK(k.node_rank_of("attempt/1/node/x") == -1);
  CHECK(k.node_rank_of("attempt/1/node/-3") == -1);
  CHECK(k.node_rank_of("attempt/1/node/99999999999999999999") == -1);
}

TEST_CASE("an elastic job's keys: job-wide ones outside the attempts, forming ones inside", "[store_keys]") {
  CHECK(JobKeys::elastic_ticket() == "elastic/ticket");
  CHECK(JobKeys::elastic_lost(7) == "elastic/lost/7");
  CHECK(JobKeys::elastic_round() == "elastic/round");
  CHECK(JobKeys::elastic_end() == "elastic/end");
  const JobKeys k(2);
  CHECK(k.joined() == "attempt/2/joined");
  CHECK(k.member(7) == "attempt/2/member/7");
  CHECK(k.members() == "attempt/2/members");
  CHECK(k.closing() == "attempt/2/closing");
  // A member's registration is never taken for a fixed node's, nor one attempt's for another's.
  CHECK(k.node_rank_of(k.member(7)) == -1);
  std::set<std::string> all{JobKeys::elastic_ticket(), JobKeys::elastic_lost(1), JobKeys::elastic_lost(12),
                            JobKeys::elastic_round(), JobKeys::elastic_end()};
  for (int attempt : {0, 1, 10}) {
    const JobKeys a(attempt);
    for (const auto& key : {a.joined(), a.member(1), a.member(12), a.members(), a.closing(), a.node(1)}) all.insert(key);
  }
  CHECK(all.size() == 5 + 3 * 6);
}

TEST_CASE("workers without ddprun keep their groups per run and restart", "[store_keys]") {
  CHECK(JobKeys::standalone_process_groups("job7", 0) == "ddp/job7/0/pg/");
  CHECK(JobKeys::standalone_process_groups("job7", 1) != JobKeys::standalone_process_groups("job7", 0));
}

TEST_CASE("a group's exchanges are <topic>/<rank> under the group's prefix", "[store_keys]") {
  CHECK(group_keys::record(group_keys::kInfo, 3) == "info/3");
  CHECK(group_keys::exchange(group_keys::kWatch) + "5" == group_keys::record(group_keys::kWatch, 5));
  CHECK(group_keys::backend("cpu") == "cpu/");
  CHECK(group_keys::subgroup(2) == "sub2/");
  CHECK(group_keys::subgroup(2) != group_keys::subgroup(20));
  std::set<std::string> topics;
  for (auto t : {group_keys::kAutoNccl, group_keys::kInfo, group_keys::kShmReady, group_keys::kShmMapped,
                 group_keys::kCma, group_keys::kWatch}) {
    topics.insert(group_keys::record(t, 0));
  }
  topics.insert(group_keys::failure());
  topics.insert(group_keys::nccl_unique_id());
  CHECK(topics.size() == 8);
}
