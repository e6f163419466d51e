// Decoding torch's TCPStore requests (torch_wire.hpp): one scan that checks every
// length and finds where the request ends, then, only for a complete request, a
// second pass that copies its fields out.
#include "torch_wire.hpp"

#include <array>
#include <cstring>

namespace rdzv::torch_wire {

namespace {

using wire::ProtocolError;

// 1.13's numbering (its TCPStore.cpp): SET, COMPARE_SET, GET, ADD, CHECK, WAIT,
// GETNUMKEYS, WATCH_KEY, DELETE_KEY.
constexpr std::array<Query, 9> kLegacyQueries = {Query::kSet,  Query::kCompareSet, Query::kGet,
                                                 Query::kAdd,  Query::kCheck,      Query::kWait,
                                                 Query::kGetNumKeys, Query::kLegacyWatchKey, Query::kDeleteKey};
constexpr uint8_t kLastQuery = static_cast<uint8_t>(Query::kBarrier);

// The bytes of a request are not all there yet: at least `needed` in all are.
struct Short {
  size_t needed;
};

// Reads fields at a position, bounded by the request limit; `copy` false only checks.
class Cursor {
 public:
  Cursor(std::string_view in, const wire::Limits& limits, bool copy) : in_(in), limits_(limits), copy_(copy) {}

  size_t pos() const { return pos_; }
  bool copying() const { return copy_; }

  template <typename T>
  T value() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  // A u64-length-prefixed string; keys are also bounded by max_key.
  void bytes(std::string* out, bool is_key) {
    uint64_t size = value<uint64_t>();
    if (is_key && size > limits_.max_key) {
      throw ProtocolError("torch request: a key of " + std::to_string(size) + " bytes (limit " +
                          std::to_string(limits_.max_key) + ")");
    }
    need(size);
    if (out != nullptr) out->assign(in_.data() + pos_, size);
    pos_ += size;
  }

  uint64_t count() {
    uint64_t n = value<uint64_t>();
    if (n > limits_.max_keys) {
      throw ProtocolError("torch request: " + std::to_string(n) + " keys (limit " + std::to_string(limits_.max_keys) +
                          ")");
    }
    return n;
  }

 private:
  // Throws Short when fewer than `n` more bytes are buffered, ProtocolError when they
  // would make the request longer than a request may be.
  void need(uint64_t n) {
    if (n > limits_.max_body || pos_ + n > limits_.max_body + size_t{16}) {
      throw ProtocolError("torch request longer than " + std::to_string(limits_.max_body) + " bytes");
    }
    if (in_.size() - pos_ < n) throw Short{pos_ + static_cast<size_t>(n)};
  }

  std::string_view in_;
  const wire::Limits& limits_;
  bool copy_;
  size_t pos_ = 0;
};

Query query_of(uint8_t type, Dialect dialect) {
  if (dialect == Dialect::kTorchLegacy) {
    if (type < kLegacyQueries.size()) return kLegacyQueries[type];
  } else if (type <= kLastQuery) {
    return static_cast<Query>(type);
  }
  throw ProtocolError("torch request: unknown query type " + std::to_string(type));
}

// One pass over a request whose type byte is already read.
void fields(Cursor& c, Request& q) {
  // The scan stores nothing: an incomplete request costs no allocation.
  auto key = [&] { c.bytes(c.copying() ? &q.keys.emplace_back() : nullptr, true); };
  auto value = [&] { c.bytes(c.copying() ? &q.values.emplace_back() : nullptr, false); };
  switch (q.query) {
    case Query::kValidate:
      q.number = c.value<uint32_t>();
      if (q.number != kValidateMagic) throw ProtocolError("torch VALIDATE with a wrong magic number");
      break;
    case Query::kPing:
      q.number = c.value<uint32_t>();
      break;
    case Query::kSet:
    case Query::kAppend:
    case Query::kQueuePush:
      key();
      value();
      break;
    case Query::kCompareSet:
      key();
      value();
      value();
      break;
    case Query::kGet:
    case Query::kDeleteKey:
    case Query::kQueuePop:
    case Query::kQueueLen:
    case Query::kLegacyWatchKey:
      key();
      break;
    case Query::kAdd:
    case Query::kBarrier:
      key();
      q.number = c.value<int64_t>();
      break;
    case Query::kCheck:
    case Query::kWait:
    case Query::kMultiGet:
      for (uint64_t i = 0, n = c.count(); i < n; ++i) key();
      break;
    case Query::kMultiSet:
      for (uint64_t i = 0, n = c.count(); i < n; ++i) {
        key();
        value();
      }
      break;
    case Query::kGetNumKeys:
    case Query::kCancelWait:
    case Query::kListKeys:
      break;
  }
}

const uint8_t* magic_bytes() {
  static const uint32_t magic = kValidateMagic;
  return reinterpret_cast<const uint8_t*>(&magic);
}

}  // namespace

Detection detect(std::string_view b) {
  if (b.empty()) return {};
  const auto first = static_cast<uint8_t>(b[0]);
  if (first == static_cast<uint8_t>(wire::kMagic & 0xff)) return {true, Dialect::kDdprun};
  if (first == 0) {  // 2.x's VALIDATE, or 1.13's SET (whose key length cannot be the magic)
    size_t have = std::min<size_t>(b.size() - 1, 4);
    if (std::memcmp(b.data() + 1, magic_bytes(), have) != 0) return {true, Dialect::kTorchLegacy};
    if (have < 4) return {};
    return {true, Dialect::kTorch};
  }
  if (first < kLegacyQueries.size()) return {true, Dialect::kTorchLegacy};
  throw ProtocolError("the first byte " + std::to_string(first) + " is neither ddprun's frame nor a torch request");
}

Decoded decode(std::string_view buffered, Dialect dialect, const wire::Limits& limits) {
  Decoded d;
  if (buffered.empty()) {
    d.needed = 1;
    return d;
  }
  Request scan;
  scan.query = query_of(static_cast<uint8_t>(buffered[0]), dialect);
  try {
    Cursor check(buffered.substr(1), limits, false);
    fields(check, scan);
  } catch (const Short& s) {
    d.needed = 1 + s.needed;
    return d;
  }
  d.request.query = scan.query;
  Cursor copy(buffered.substr(1), limits, true);
  fields(copy, d.request);
  d.consumed = 1 + copy.pos();
  return d;
}

void put_bytes(std::string& out, std::string_view v) {
  put_i64(out, static_cast<int64_t>(v.size()));
  out.append(v);
}

void put_i64(std::string& out, int64_t v) {
  char raw[8];
  std::memcpy(raw, &v, sizeof(raw));
  out.append(raw, sizeof(raw));
}

std::string encode(const Request& q, Dialect dialect) {
  std::string out;
  uint8_t type = static_cast<uint8_t>(q.query);
  if (dialect == Dialect::kTorchLegacy) {
    for (uint8_t i = 0; i < kLegacyQueries.size(); ++i) {
      if (kLegacyQueries[i] == q.query) type = i;
    }
  }
  out.push_back(static_cast<char>(type));
  auto u32 = [&](int64_t v) {
    auto n = static_cast<uint32_t>(v);
    out.append(reinterpret_cast<const char*>(&n), 4);
  };
  size_t next_value = 0;
  auto value = [&] { put_bytes(out, q.values.at(next_value++)); };
  switch (q.query) {
    case Query::kValidate:
    case Query::kPing:
      u32(q.number);
      break;
    case Query::kAdd:
    case Query::kBarrier:
      put_bytes(out, q.keys.at(0));
      put_i64(out, q.number);
      break;
    case Query::kCheck:
    case Query::kWait:
    case Query::kMultiGet:
      put_i64(out, static_cast<int64_t>(q.keys.size()));
      for (const auto& k : q.keys) put_bytes(out, k);
      break;
    case Query::kMultiSet:
      put_i64(out, static_cast<int64_t>(q.keys.size()));
      for (const auto& k : q.keys) {
        put_bytes(out, k);
        value();
      }
      break;
    default:  // a key (or none), then the values
      for (const auto& k : q.keys) put_bytes(out, k);
      for (size_t i = 0; i < q.values.size(); ++i) value();
      break;
  }
  return out;
}

const char* query_name(Query q) {
  switch (q) {
    case Query::kValidate: return "VALIDATE";
    case Query::kSet: return "SET";
    case Query::kCompareSet: return "COMPARE_SET";
    case Query::kGet: return "GET";
    case Query::kAdd: return "ADD";
    case Query::kCheck: return "CHECK";
    case Query::kWait: return "WAIT";
    case Query::kGetNumKeys: return "GETNUMKEYS";
    case Query::kDeleteKey: return "DELETE_KEY";
    case Query::kAppend: return "APPEND";
    case Query::kMultiGet: return "MULTI_GET";
    case Query::kMultiSet: return "MULTI_SET";
    case Query::kCancelWait: return "CANCEL_WAIT";
    case Query::kPing: return "PING";
    case Query::kQueuePush: return "QUEUE_PUSH";
    case Query::kQueuePop: return "QUEUE_POP";
    case Query::kQueueLen: return "QUEUE_LEN";
    case Query::kListKeys: return "LIST_KEYS";
    case Query::kBarrier: return "BARRIER";
    case Query::kLegacyWatchKey: return "WATCH_KEY";
  }
  return "unknown";
}

}  // namespace rdzv::torch_wire
