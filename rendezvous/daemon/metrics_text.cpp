// The exposition: one family at a time, # HELP and # TYPE first, label values quoted
// as the format wants them (only names from fixed tables here: nothing to escape).
#include "metrics_text.hpp"

#include <array>
#include <string_view>

#include "protocol.hpp"
#include "torch_wire.hpp"

namespace rdzv::metrics {

namespace {

constexpr std::array<const char*, kDialects> kProtocols = {"ddprun", "torch", "torch_legacy"};

// torch's query types in its 2.x numbering (1.13's requests are counted under these
// too), named by the decoder's own table. A number without a name is shown as itself.
const char* torch_type_name(size_t t) {
  const char* name = torch_wire::query_name(static_cast<torch_wire::Query>(t));
  return std::string_view(name) == "unknown" ? nullptr : name;
}

// The requests a ddprun client may send.
constexpr std::array<wire::Type, 16> kDdprunTypes = {
    wire::Type::kHello,    wire::Type::kSet,      wire::Type::kGet,     wire::Type::kAdd,
    wire::Type::kCompareSet, wire::Type::kWait,   wire::Type::kCheck,   wire::Type::kDelete,
    wire::Type::kNumKeys,  wire::Type::kMultiGet, wire::Type::kMultiSet, wire::Type::kAppend,
    wire::Type::kSetWill,  wire::Type::kGoodbye,  wire::Type::kPing,    wire::Type::kSetWills};

class Writer {
 public:
  void family(std::string_view name, std::string_view type, std::string_view help) {
    text_.append("# HELP ").append(name).append(" ").append(help).append("\n");
    text_.append("# TYPE ").append(name).append(" ").append(type).append("\n");
  }
  // `labels`: empty, or `a="x",b="y"` without the braces.
  void sample(std::string_view name, std::string_view labels, uint64_t value) {
    text_.append(name);
    if (!labels.empty()) text_.append("{").append(labels).append("}");
    text_.append(" ").append(std::to_string(value)).append("\n");
  }
  void one(std::string_view name, std::string_view type, std::string_view help, uint64_t value) {
    family(name, type, help);
    sample(name, "", value);
  }
  void by_protocol(std::string_view name, std::string_view type, std::string_view help,
                   const std::array<uint64_t, kDialects>& values) {
    family(name, type, help);
    for (size_t d = 0; d < kDialects; ++d) sample(name, label("protocol", kProtocols[d]), values[d]);
  }
  std::string take() { return std::move(text_); }

  static std::string label(std::string_view key, std::string_view value) {
    return std::string(key) + "=\"" + std::string(value) + "\"";
  }

 private:
  std::string text_;
};

}  // namespace

std::string exposition(const ServerStats& s) {
  const ServerCounters& c = s.counters;
  Writer w;
  w.by_protocol("ddp_rendezvous_connections", "gauge", "Client connections admitted (authenticated, or a torch client in its job) and open now, by wire protocol.",
                c.connections_open);
  w.by_protocol("ddp_rendezvous_connections_total", "counter", "Client connections admitted since start, by wire protocol.",
                c.connections_total);
  w.one("ddp_rendezvous_jobs", "gauge", "Jobs (namespaces) with at least one connection.", s.namespaces);
  w.one("ddp_rendezvous_keys", "gauge", "Keys stored, all jobs together.", s.keys);
  w.one("ddp_rendezvous_stored_bytes", "gauge",
        "Bytes the stored keys, values, wills and namespaces take, charged to the memory budget.", s.bytes);
  w.one("ddp_rendezvous_held_bytes", "gauge",
        "Bytes held for connections, partly read requests, blocked requests and queued replies, charged to the "
        "memory budget.",
        s.held);
  w.one("ddp_rendezvous_memory_budget_bytes", "gauge", "The memory budget stored and held bytes count against (--max-memory-mib).",
        s.max_memory);

  const char* requests = "ddp_rendezvous_requests_total";
  w.family(requests, "counter", "Requests received since start, by wire protocol and request type.");
  for (wire::Type t : kDdprunTypes) {
    w.sample(requests, Writer::label("protocol", "ddprun") + "," + Writer::label("type", wire::type_name(t)),
             c.ddprun_requests[static_cast<uint8_t>(t)]);
  }
  for (size_t t = 0; t < c.torch_requests.size(); ++t) {
    const char* name = torch_type_name(t);
    if (name == nullptr && c.torch_requests[t] == 0) continue;
    std::string type = name != nullptr ? name : std::to_string(t);
    w.sample(requests, Writer::label("protocol", "torch") + "," + Writer::label("type", type), c.torch_requests[t]);
  }

  w.one("ddp_rendezvous_waits", "gauge", "Requests blocked now until their keys exist (GET, WAIT, MULTI_GET).",
        s.waiters);
  w.one("ddp_rendezvous_waits_started_total", "counter", "Requests that blocked since start.", c.waits_started);
  w.one("ddp_rendezvous_waits_timed_out_total", "counter", "Blocked requests that ended in a timeout since start.",
        c.waits_timed_out);

  const char* refusals = "ddp_rendezvous_refusals_total";
  w.family(refusals, "counter",
           "Refusals since start: server_full (--max-connections), memory (a connection, job or request the memory "
           "budget could not hold), torch_not_admitted (a torch client where none may connect).");
  w.sample(refusals, Writer::label("reason", "server_full"), c.refused_full);
  w.sample(refusals, Writer::label("reason", "memory"), c.refused_memory);
  w.sample(refusals, Writer::label("reason", "torch_not_admitted"), c.refused_torch);

  w.one("ddp_rendezvous_auth_failures_total", "counter", "HELLOs refused since start: no token or credential matched.",
        c.auth_failures);
  w.one("ddp_rendezvous_protocol_errors_total", "counter", "Connections closed for malformed input since start.",
        c.protocol_errors);
  w.one("ddp_rendezvous_trims_total", "counter", "Times free heap memory was handed back to the system since start.",
        s.trims);
  return w.take();
}

}  // namespace rdzv::metrics
