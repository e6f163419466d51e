// torch's TCPStore dialects on the store server, over raw sockets: detection beside
// ddprun's own clients on one port, every query of both dialects with the semantics of
// torch's libuv server, confinement to the torch namespace, caps and the memory budget,
// malformed input, and the CANCEL_WAIT race.
#include <algorithm>
#include <catch2/catch.hpp>
#include <thread>

#include "raw_client.hpp"
#include "server_fixture.hpp"
#include "server_core.hpp"  // waiter_key_checks
#include "session.hpp"  // the per-connection caps
#include "subprocess.hpp"
#include "torch_client.hpp"

using namespace std::chrono_literals;
using rdzv::Dialect;
using testing::eventually;
using testing::ServerThread;
using testing::TorchClient;
using Query = rdzv::torch_wire::Query;

namespace {

rdzv::ServerOptions torch_options(const std::string& ns = "job1") {
  rdzv::ServerOptions o;
  o.torch_namespace = ns;
  return o;
}

}  // namespace

TEST_CASE("torch 2.x: a ddprun client and a torch client share one port and the torch namespace", "[server][torch]") {
  ServerThread server(torch_options());
  auto ddprun = server.client("job1");
  TorchClient torch(server.port());
  torch.set("/from_torch", "t");
  ddprun->set("/from_ddprun", "d");
  CHECK(ddprun->get("/from_torch", 5s) == "t");
  CHECK(torch.get("/from_ddprun") == "d");
  CHECK(torch.num_keys() == 2);
  auto stats = server.stats();
  CHECK(stats.counters.connections_open[static_cast<size_t>(Dialect::kTorch)] == 1);
  CHECK(stats.counters.connections_total[static_cast<size_t>(Dialect::kTorch)] == 1);
  CHECK(stats.counters.torch_requests[static_cast<size_t>(Query::kSet)] == 1);
  CHECK(stats.counters.torch_requests[static_cast<size_t>(Query::kValidate)] == 1);
}

TEST_CASE("torch 2.x: each query answers as torch's libuv server does", "[server][torch]") {
  ServerThread server(torch_options());
  TorchClient keeper(server.port());  // keeps the namespace (and its keys) while others come and go
  TorchClient t(server.port());
  SECTION("SET, GET (a missing key reads empty), ADD as decimal text") {
    t.set("k", "v1");
    CHECK(t.get("k") == "v1");
    CHECK(t.get("missing").empty());
    CHECK(t.add("n", 5) == 5);
    CHECK(t.add("n", -2) == 3);
    CHECK(t.get("n") == "3");
  }
  SECTION("COMPARE_SET: a missing key with empty expected is set, with other expected it comes back unset") {
    CHECK(t.compare_set("cs", "", "x") == "x");
    CHECK(t.compare_set("cs2", "e", "x") == "e");
    CHECK_FALSE(t.check({"cs2"}));
    CHECK(t.compare_set("cs", "x", "y") == "y");
    CHECK(t.compare_set("cs", "zz", "q") == "y");
  }
  SECTION("CHECK, GETNUMKEYS, DELETE_KEY") {
    t.set("a", "1");
    CHECK(t.check({"a"}));
    CHECK_FALSE(t.check({"a", "b"}));
    CHECK(t.num_keys() == 1);
    t.send(TorchClient::q(Query::kDeleteKey, {"a"}));
    CHECK(t.i64() == 1);
    t.send(TorchClient::q(Query::kDeleteKey, {"a"}));
    CHECK(t.i64() == 0);
  }
  SECTION("APPEND, MULTI_SET, MULTI_GET (no count; missing keys read empty), LIST_KEYS") {
    t.send(TorchClient::q(Query::kAppend, {"ap"}, {"ab"}));
    t.send(TorchClient::q(Query::kAppend, {"ap"}, {"cd"}));
    t.send(TorchClient::q(Query::kMultiSet, {"m1", "m2"}, {"a", "b"}));
    t.send(TorchClient::q(Query::kMultiGet, {"m1", "m2", "ap", "none"}));
    CHECK(t.bytes() == "a");
    CHECK(t.bytes() == "b");
    CHECK(t.bytes() == "abcd");
    CHECK(t.bytes().empty());
    t.send(TorchClient::q(Query::kListKeys));
    REQUIRE(t.i64() == 3);
    std::vector<std::string> keys{t.bytes(), t.bytes(), t.bytes()};
    std::sort(keys.begin(), keys.end());
    CHECK(keys == std::vector<std::string>{"ap", "m1", "m2"});
  }
  SECTION("QUEUE_PUSH, QUEUE_LEN, QUEUE_POP (length before the pop, then the item), CHECK sees a queue") {
    t.send(TorchClient::q(Query::kQueuePush, {"q"}, {"e1"}));
    t.send(TorchClient::q(Query::kQueuePush, {"q"}, {"e2"}));
    t.send(TorchClient::q(Query::kQueueLen, {"q"}));
    CHECK(t.i64() == 2);
    CHECK(t.check({"q"}));
    t.send(TorchClient::q(Query::kQueuePop, {"q"}));
    CHECK(t.i64() == 2);
    CHECK(t.bytes() == "e1");
    t.send(TorchClient::q(Query::kQueuePop, {"q"}));
    CHECK(t.i64() == 1);
    CHECK(t.bytes() == "e2");
    t.send(TorchClient::q(Query::kQueuePop, {"q"}));
    CHECK(t.i64() == 0);
    CHECK_FALSE(t.check({"q"}));
    CHECK(t.num_keys() == 0);  // queues are not keys
  }
  SECTION("PING echoes its nonce; a second VALIDATE closes") {
    t.send(TorchClient::q(Query::kPing, {}, {}, 0xdeadbeef));
    CHECK(t.u32() == 0xdeadbeef);
    t.send(TorchClient::q(Query::kValidate, {}, {}, rdzv::torch_wire::kValidateMagic));
    CHECK(t.closed());
  }
  SECTION("ADD on a value that is not an integer closes the connection, as torch's server does") {
    t.set("text", "abc");
    t.send(TorchClient::q(Query::kAdd, {"text"}, {}, 1));
    CHECK(t.closed());
    TorchClient again(server.port());
    CHECK(again.get("text") == "abc");
  }
}

TEST_CASE("torch 2.x: WAIT is answered only once every key exists, woken by each kind of write", "[server][torch]") {
  ServerThread server(torch_options());
  TorchClient waiter(server.port());
  TorchClient writer(server.port());
  waiter.send(TorchClient::q(Query::kWait, {"a", "b", "c", "d", "e", "f"}));
  writer.set("a", "1");
  writer.add("b", 1);
  writer.send(TorchClient::q(Query::kAppend, {"c"}, {"x"}));
  writer.compare_set("d", "", "y");
  writer.send(TorchClient::q(Query::kMultiSet, {"e"}, {"z"}));
  CHECK(writer.num_keys() == 5);
  CHECK(waiter.silent());
  CHECK(server.stats().waiters == 1);
  writer.send(TorchClient::q(Query::kQueuePush, {"f"}, {"item"}));  // a queue counts as there
  CHECK(waiter.u8() == rdzv::torch_wire::kStopWaiting);
  CHECK(eventually([&] { return server.stats().waiters == 0; }));
  CHECK(server.stats().counters.waits_started == 1);
  SECTION("a WAIT on keys that exist is answered at once") {
    waiter.send(TorchClient::q(Query::kWait, {"a", "b"}));
    CHECK(waiter.u8() == rdzv::torch_wire::kStopWaiting);
  }
}

TEST_CASE("torch 2.x: CANCEL_WAIT is always answered WAIT_CANCELED, after a STOP_WAITING already sent", "[server][torch]") {
  ServerThread server(torch_options());
  TorchClient waiter(server.port());
  TorchClient writer(server.port());
  SECTION("the wait is still pending: it is dropped") {
    waiter.send(TorchClient::q(Query::kWait, {"never"}));
    CHECK(waiter.silent());
    waiter.send(TorchClient::q(Query::kCancelWait));
    CHECK(waiter.u8() == rdzv::torch_wire::kWaitCanceled);
    CHECK(eventually([&] { return server.stats().waiters == 0; }));
    writer.set("never", "1");
    CHECK(waiter.silent());  // nothing more for the cancelled wait
    CHECK(waiter.get("never") == "1");
  }
  SECTION("the key arrived before the cancel: STOP_WAITING, then WAIT_CANCELED") {
    waiter.send(TorchClient::q(Query::kWait, {"late"}));
    CHECK(waiter.silent());
    writer.set("late", "1");
    CHECK(writer.num_keys() == 1);  // the set is done before the cancel goes out
    waiter.send(TorchClient::q(Query::kCancelWait));
    CHECK(waiter.u8() == rdzv::torch_wire::kStopWaiting);
    CHECK(waiter.u8() == rdzv::torch_wire::kWaitCanceled);
  }
  SECTION("a client that closes mid-wait leaves no waiter behind") {
    {
      TorchClient gone(server.port());
      gone.send(TorchClient::q(Query::kWait, {"x"}));
      CHECK(eventually([&] { return server.stats().waiters == 1; }));
    }
    CHECK(eventually([&] { return server.stats().waiters == 0; }));
  }
}

TEST_CASE("torch 2.x: BARRIER answers everyone when the last arrives", "[server][torch]") {
  ServerThread server(torch_options());
  TorchClient a(server.port()), b(server.port()), c(server.port());
  a.send(TorchClient::q(Query::kBarrier, {"bar"}, {}, 3));
  b.send(TorchClient::q(Query::kBarrier, {"bar"}, {}, 3));
  CHECK(a.silent());
  CHECK(b.silent());
  c.send(TorchClient::q(Query::kBarrier, {"bar"}, {}, 3));
  CHECK(c.u8() == rdzv::torch_wire::kStopWaiting);
  CHECK(a.u8() == rdzv::torch_wire::kStopWaiting);
  CHECK(b.u8() == rdzv::torch_wire::kStopWaiting);
  CHECK(c.get("bar") == "3");
}

TEST_CASE("torch 2.x: a blocking QUEUE_POP's wait is woken for one item by one push", "[server][torch]") {
  ServerThread server(torch_options());
  TorchClient p1(server.port()), p2(server.port()), pusher(server.port());
  p1.send(TorchClient::q(Query::kWait, {"q"}));
  p2.send(TorchClient::q(Query::kWait, {"q"}));
  CHECK(eventually([&] { return server.stats().waiters == 2; }));
  pusher.send(TorchClient::q(Query::kQueuePush, {"q"}, {"one"}));
  CHECK(eventually([&] { return server.stats().waiters == 1; }));
  pusher.send(TorchClient::q(Query::kQueuePush, {"q"}, {"two"}));
  CHECK(p1.u8() == rdzv::torch_wire::kStopWaiting);
  CHECK(p2.u8() == rdzv::torch_wire::kStopWaiting);
}

TEST_CASE("torch 1.13: its numbering and no VALIDATE, and WATCH_KEY closes the connection", "[server][torch]") {
  ServerThread server(torch_options());
  TorchClient t(server.port(), Dialect::kTorchLegacy);
  t.set("k", "v");  // first byte 0 without the magic after it: 1.13's SET
  CHECK(t.get("k") == "v");
  CHECK(t.add("n", 7) == 7);
  CHECK(t.compare_set("k", "v", "w") == "w");
  CHECK(t.check({"k", "n"}));
  t.send(TorchClient::q(Query::kWait, {"k"}));
  CHECK(t.u8() == rdzv::torch_wire::kStopWaiting);
  CHECK(t.num_keys() == 2);
  t.send(TorchClient::q(Query::kDeleteKey, {"k"}));
  CHECK(t.i64() == 1);
  CHECK(server.stats().counters.connections_open[static_cast<size_t>(Dialect::kTorchLegacy)] == 1);
  SECTION("a legacy client's first request may be any of its types") {
    TorchClient other(server.port(), Dialect::kTorchLegacy);
    CHECK(other.add("n", 1) == 8);
  }
  SECTION("WATCH_KEY") {
    t.send(TorchClient::q(Query::kLegacyWatchKey, {"n"}));
    CHECK(t.closed());
  }
  SECTION("a 2.x-only query number is unknown in 1.13") {
    t.send_raw(std::string(1, '\x0b'));
    CHECK(t.closed());
  }
}

TEST_CASE("torch clients are confined to the torch namespace", "[server][torch]") {
  ServerThread server(torch_options("job1"));
  auto other = server.client("job2");
  other->set("secret", "s");
  auto mine = server.client("job1");
  mine->set("shared", "1");
  TorchClient t(server.port());
  CHECK(t.num_keys() == 1);
  CHECK(t.get("secret").empty());
  CHECK_FALSE(t.check({"secret"}));
  t.send(TorchClient::q(Query::kListKeys));
  CHECK(t.i64() == 1);
  CHECK(t.bytes() == "shared");
  t.set("secret", "overwritten?");
  CHECK(other->get("secret", 5s) == "s");
}

TEST_CASE("where no torch namespace is set, torch clients are refused unanswered and ddprun's are greeted", "[server][torch]") {
  ServerThread server;
  auto ddprun = server.client("a");  // sends the frame magic first: greeted at once
  ddprun->set("k", "v");
  // No greeting that torch's client would read as its reply: the connection just closes.
  for (Dialect d : {Dialect::kTorchLegacy, Dialect::kTorch}) {
    testing::RawConnection raw(server.port());
    auto first = d == Dialect::kTorch ? TorchClient::q(Query::kValidate, {}, {}, rdzv::torch_wire::kValidateMagic)
                                      : TorchClient::q(Query::kGetNumKeys);
    raw.send_bytes(rdzv::torch_wire::encode(first, d));
    CHECK(raw.read_until_closed().empty());
  }
  CHECK(eventually([&] { return server.stats().counters.refused_torch == 2; }));
  testing::RawConnection raw(server.port());  // an older client that waits for the greeting
  auto t0 = std::chrono::steady_clock::now();
  auto challenge = raw.read_frame(2s);
  REQUIRE(challenge.has_value());
  CHECK(challenge->header.type == rdzv::wire::Type::kChallenge);
  CHECK(std::chrono::steady_clock::now() - t0 >= 150ms);  // after the grace for a first byte
  CHECK(ddprun->get("k", 5s) == "v");
}

TEST_CASE("where torch clients are admitted, a connection is greeted only after its first bytes", "[server][torch]") {
  ServerThread server(torch_options());
  testing::RawConnection raw(server.port());
  CHECK_FALSE(raw.read_frame(300ms).has_value());
  raw.send_bytes("DDPR");
  auto challenge = raw.read_frame(2s);
  REQUIRE(challenge.has_value());
  CHECK(challenge->header.type == rdzv::wire::Type::kChallenge);
  raw.send_bytes(testing::RawConnection::hello("job1").substr(4));
  auto ok = raw.reply_to(1);
  REQUIRE(ok.has_value());
  CHECK(ok->header.type == rdzv::wire::Type::kOk);
}

TEST_CASE("malformed torch input closes only its own connection", "[server][torch][protocol]") {
  rdzv::ServerOptions o = torch_options();
  o.max_value = 1024;
  ServerThread server(o);
  TorchClient good(server.port());
  good.set("k", "v");
  auto bad_closes = [&](const std::string& bytes, Dialect d = Dialect::kTorch) {
    TorchClient bad(server.port(), d);
    bad.send_raw(bytes);
    return bad.closed();
  };
  std::string u64_huge(8, '\xff');
  CHECK(bad_closes("\x03" + u64_huge));                                   // GET with a key of 2^64-1 bytes
  CHECK(bad_closes("\x05" + u64_huge));                                   // CHECK with 2^64-1 keys
  CHECK(bad_closes("\x01" + std::string("\x01\0\0\0\0\0\0\0k", 9) + u64_huge));  // SET of a huge value
  CHECK(bad_closes(std::string("\x7f")));                                 // no such query
  {
    TorchClient big(server.port());  // a value over max_value: torch cannot be told, so it closes
    big.set("big", std::string(2000, 'x'));
    CHECK(big.closed());
  }
  {  // a first byte that is neither dialect's
    testing::RawConnection raw(server.port());
    raw.send_bytes("\xee");
    CHECK(raw.read_until_closed().empty());
  }
  // Byte 0 without VALIDATE's magic after it is 1.13's SET, here of a key far over the limit.
  CHECK(bad_closes(std::string("\0\xce\xf7\x85\x3d\0\0\0\0", 9), Dialect::kTorchLegacy));
  CHECK(good.get("k") == "v");
  CHECK(server.stats().counters.protocol_errors >= 5);
}

TEST_CASE("torch connections obey the memory budget and the per-connection wait caps", "[server][torch]") {
  SECTION("stored bytes") {
    rdzv::ServerOptions o = torch_options();
    o.max_memory = 4u << 20;
    ServerThread server(o);
    TorchClient keeper(server.port());
    TorchClient t(server.port());
    const std::string mib(1u << 20, 'x');
    bool closed = false;
    for (int i = 0; i < 8 && !closed; ++i) {
      // The server may reset the connection while a 1 MiB SET is still being sent.
      closed = !t.try_send(TorchClient::q(Query::kSet, {"k" + std::to_string(i)}, {mib})) ||
               !t.try_send(TorchClient::q(Query::kGetNumKeys)) || !t.read(8).has_value();
    }
    CHECK(closed);
    CHECK(server.stats().bytes <= o.max_memory);
    TorchClient after(server.port());  // the server and the keys stored in time stay
    CHECK(after.num_keys() >= 1);
  }
  SECTION("blocked WAITs on one connection") {
    ServerThread server(torch_options());
    TorchClient t(server.port());
    for (size_t i = 0; i < rdzv::kMaxWaitsPerConnection; ++i) t.send(TorchClient::q(Query::kWait, {"w" + std::to_string(i)}));
    CHECK(eventually([&] { return server.stats().waiters == rdzv::kMaxWaitsPerConnection; }));
    t.send(TorchClient::q(Query::kWait, {"one-too-many"}));
    CHECK(t.closed());
    CHECK(eventually([&] { return server.stats().waiters == 0; }));
  }
}

TEST_CASE("torch: ADD reads the stored value as std::stoll does", "[server][torch]") {
  ServerThread server(torch_options());
  TorchClient keeper(server.port());
  const std::vector<std::pair<std::string, int64_t>> readable = {
      {" 8", 9}, {"8 ", 9}, {"+8", 9}, {"8x", 9}, {"\t7", 8}, {"0x10", 1}, {"-0", 1}, {" \n-5z", -4}};
  for (const auto& [text, after] : readable) {
    INFO("stored '" << text << "'");
    TorchClient t(server.port());
    t.set("p", text);
    CHECK(t.add("p", 1) == after);
    CHECK(t.get("p") == std::to_string(after));
  }
  for (std::string text : {"", " ", "abc", "+", "+-1", "- 1", "99999999999999999999"}) {
    INFO("stored '" << text << "'");
    TorchClient t(server.port());
    t.set("bad", text);
    t.send(TorchClient::q(Query::kAdd, {"bad"}, {}, 1));
    CHECK(t.closed());
  }
  // ddprun's own ADD stays strict on the same namespace.
  auto ddprun = server.client("job1");
  ddprun->set("strict", "8x");
  CHECK_THROWS_AS(ddprun->add("strict", 1), rdzv::StoreError);
}

TEST_CASE("torch: keys of up to 8 KiB on the wire, as torch's libuv server takes", "[server][torch]") {
  ServerThread server(torch_options());
  TorchClient t(server.port());
  const std::string longest(8192, 'k');
  t.set(longest, "v");
  CHECK(t.get(longest) == "v");
  CHECK(t.check({longest}));
  t.send(TorchClient::q(Query::kWait, {longest}));
  CHECK(t.u8() == rdzv::torch_wire::kStopWaiting);
  t.send(TorchClient::q(Query::kDeleteKey, {longest}));
  CHECK(t.i64() == 1);
  t.set(longest + "k", "v");
  CHECK(t.closed());
}

TEST_CASE("a held torch namespace keeps its keys with no connection until the next one is set", "[server][torch]") {
  rdzv::ServerOptions o = torch_options("attempt_0");
  o.hold_torch_namespace = true;
  ServerThread server(o);
  {
    TorchClient t(server.port());
    t.set("x", "1");
  }
  CHECK(eventually([&] { return server.stats().connections == 0; }));  // no connection left in it
  CHECK(server.stats().namespaces == 1);
  {
    TorchClient t(server.port());
    CHECK(t.get("x") == "1");
  }
  CHECK(server.stats().keys == 1);
  server.set_torch_namespace("attempt_1");
  CHECK(eventually([&] { return server.stats().keys == 0 && server.stats().namespaces == 1; }));
  TorchClient t(server.port());
  CHECK(t.get("x").empty());
}

TEST_CASE("without hold, a torch namespace goes with its last connection", "[server][torch]") {
  ServerThread server(torch_options());
  {
    TorchClient t(server.port());
    t.set("x", "1");
  }
  CHECK(eventually([&] { return server.stats().namespaces == 0; }));
  TorchClient t(server.port());
  CHECK(t.get("x").empty());
}

TEST_CASE("torch 1.13: a real client idle past the first-bytes deadline keeps both connections, spinning nothing",
          "[server][torch][slow]") {
  // 1.13 opens a request connection and a silent watch-key connection; closing the
  // silent one makes its watch thread spin a core, closing the other loses the store.
  ServerThread server(torch_options());
  std::string script =
      "import sys, time, datetime, torch.distributed as d\n"
      "s = d.TCPStore('127.0.0.1', int(sys.argv[1]), is_master=False, timeout=datetime.timedelta(seconds=10))\n"
      "before = time.process_time()\n"
      "time.sleep(12)\n"
      "used = time.process_time() - before\n"
      "s.set('k', 'v')\n"
      "assert s.get('k') == b'v'\n"
      "print('cpu', used)\n";
  auto r = testing::run({"/usr/bin/python3", "-c", script, std::to_string(server.port())}, {}, 60s);
  INFO(r.err);
  REQUIRE(r.status == 0);
  REQUIRE(r.out.rfind("cpu ", 0) == 0);
  double cpu = std::stod(r.out.substr(4));
  INFO("CPU seconds used while idle: " << cpu);
  CHECK(cpu < 0.5);
}

TEST_CASE("torch: a request's declared size allocates nothing until its bytes arrive", "[server][torch]") {
  ServerThread server(torch_options());
  TorchClient keeper(server.port());
  const size_t idle_held = server.stats().held;
  TorchClient t(server.port());
  const std::string value((16u << 20) - 64, 'v');
  std::string request = rdzv::torch_wire::encode(TorchClient::q(Query::kSet, {"big"}, {value}), rdzv::Dialect::kTorch);
  const size_t head = 1 + 8 + 3 + 8;  // type, key, the value's length
  t.send_raw(request.substr(0, head + 100));
  REQUIRE(eventually([&] { return server.stats().counters.connections_open[static_cast<size_t>(Dialect::kTorch)] == 2; }));
  std::this_thread::sleep_for(200ms);  // the server has read the bytes that came
  auto held = server.stats().held;
  INFO("held " << held << " bytes, " << idle_held << " with one idle connection");
  CHECK(held < idle_held + (256u << 10));
  t.send_raw(request.substr(head + 100));  // the rest: the buffer grows as it arrives
  CHECK(t.get("big").size() == value.size());
}

TEST_CASE("torch: a request trickled in small pieces is scanned once, not from its start on every read", "[server][torch]") {
  std::vector<std::string> keys;
  for (int i = 0; i < 65536; ++i) keys.push_back("k" + std::to_string(100000 + i));
  const std::string request = rdzv::torch_wire::encode(TorchClient::q(Query::kWait, keys), rdzv::Dialect::kTorch);
  const uint64_t fields = 1 + keys.size();  // the count, then the keys
  const size_t piece = 8 + 7;               // about one key entry
  SECTION("the decoder, fed one piece more each time") {
    rdzv::wire::Limits limits;
    limits.max_key = 8192;
    limits.max_keys = 65536;
    rdzv::torch_wire::ScanState state;
    const uint64_t before = rdzv::torch_wire::field_steps();
    rdzv::torch_wire::Decoded d;
    size_t calls = 0;
    for (size_t have = 1; d.consumed == 0; have = std::min(request.size(), have + piece), ++calls) {
      d = rdzv::torch_wire::decode(std::string_view(request).substr(0, have), Dialect::kTorch, limits, state);
    }
    CHECK(d.consumed == request.size());
    CHECK(d.request.keys == keys);
    const uint64_t steps = rdzv::torch_wire::field_steps() - before;
    INFO(steps << " field steps in " << calls << " calls for " << fields << " fields");
    CHECK(steps <= fields + calls);  // each call resumes at the field it stopped in
  }
  SECTION("a server reading it from a socket in pieces") {
    ServerThread server(torch_options());
    TorchClient t(server.port());
    const uint64_t before = rdzv::torch_wire::field_steps();
    const size_t pieces = 1024;
    const size_t each = (request.size() + pieces - 1) / pieces;
    for (size_t at = 0; at < request.size(); at += each) {
      t.send_raw(request.substr(at, each));
      std::this_thread::sleep_for(100us);
    }
    REQUIRE(eventually([&] { return server.stats().waiters == 1; }));
    const uint64_t steps = rdzv::torch_wire::field_steps() - before;
    INFO(steps << " field steps for " << fields << " fields in " << pieces << " pieces");
    CHECK(steps <= fields + 2 * pieces);
  }
}

TEST_CASE("torch: waking a WAIT on many keys, set one by one in order, looks at each key about once", "[server][torch]") {
  ServerThread server(torch_options());
  TorchClient waiter(server.port());
  TorchClient setter(server.port());
  std::vector<std::string> keys;
  for (int i = 0; i < 65536; ++i) keys.push_back("w" + std::to_string(i));
  waiter.send(TorchClient::q(Query::kWait, keys));
  REQUIRE(eventually([&] { return server.stats().waiters == 1; }));
  const uint64_t before = rdzv::waiter_key_checks();
  setter.set(keys[0], "x");
  setter.send(TorchClient::q(Query::kDeleteKey, {keys[0]}));  // taken away again behind the cursor
  CHECK(setter.i64() == 1);
  std::string batch;
  for (size_t i = 1; i < keys.size(); ++i) {
    batch += rdzv::torch_wire::encode(TorchClient::q(Query::kSet, {keys[i]}, {"x"}), rdzv::Dialect::kTorch);
  }
  setter.send_raw(batch);
  CHECK(setter.num_keys() == static_cast<int64_t>(keys.size()) - 1);
  CHECK(waiter.silent());  // the key deleted before the last SET is still missing
  setter.set(keys[0], "x");
  CHECK(waiter.u8() == rdzv::torch_wire::kStopWaiting);
  const uint64_t checks = rdzv::waiter_key_checks() - before;
  INFO(checks << " key checks for " << keys.size() << " keys");
  CHECK(checks <= 6 * keys.size());
}
