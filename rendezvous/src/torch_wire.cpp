// Decoding torch's TCPStore requests (torch_wire.hpp): one scan that checks every
// length and finds where the request ends, resumed where it stopped as more bytes
// arrive, then, only for a complete request, a second pass that copies its fields out.
#include "torch_wire.hpp"

#include <array>
#include <atomic>
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

std::atomic<uint64_t> g_field_steps{0};

// The bytes of a request are not all there yet: at least `needed` in all are.
struct Short {
  size_t needed;
};

Query query_of(uint8_t type, Dialect dialect) {
  if (dialect == Dialect::kTorchLegacy) {
    if (type < kLegacyQueries.size()) return kLegacyQueries[type];
  } else if (type <= kLastQuery) {
    return static_cast<Query>(type);
  }
  throw ProtocolError("torch request: unknown query type " + std::to_string(type));
}

// The kinds of field a request is made of, in order (the same order fields() reads).
enum class Field { kU32, kI64, kCount, kKey, kValue, kEnd };

// The field at `index` of a request of query `q`, with `count` keys where it has a count.
Field field_at(Query q, uint64_t index, uint64_t count) {
  switch (q) {
    case Query::kValidate:
    case Query::kPing:
      return index == 0 ? Field::kU32 : Field::kEnd;
    case Query::kSet:
    case Query::kAppend:
    case Query::kQueuePush:
      return index == 0 ? Field::kKey : index == 1 ? Field::kValue : Field::kEnd;
    case Query::kCompareSet:
      return index == 0 ? Field::kKey : index <= 2 ? Field::kValue : Field::kEnd;
    case Query::kGet:
    case Query::kDeleteKey:
    case Query::kQueuePop:
    case Query::kQueueLen:
    case Query::kLegacyWatchKey:
      return index == 0 ? Field::kKey : Field::kEnd;
    case Query::kAdd:
    case Query::kBarrier:
      return index == 0 ? Field::kKey : index == 1 ? Field::kI64 : Field::kEnd;
    case Query::kCheck:
    case Query::kWait:
    case Query::kMultiGet:
      return index == 0 ? Field::kCount : index <= count ? Field::kKey : Field::kEnd;
    case Query::kMultiSet:
      if (index == 0) return Field::kCount;
      if (index > 2 * count) return Field::kEnd;
      return index % 2 == 1 ? Field::kKey : Field::kValue;
    case Query::kGetNumKeys:
    case Query::kCancelWait:
    case Query::kListKeys:
      return Field::kEnd;
  }
  return Field::kEnd;
}

// Scans the fields of the request in `in` (its type byte first) from where `st` stopped,
// checking every length; throws Short at the first field not all there (st then says
// where to go on), ProtocolError for a length over a limit.
void scan(std::string_view in, Query q, const wire::Limits& limits, ScanState& st) {
  if (st.pos == 0) st.pos = 1;
  auto need = [&](size_t at, uint64_t n) {  // as Cursor::need, at a position after the type byte
    if (n > limits.max_body || at - 1 + n > limits.max_body + size_t{16}) {
      throw ProtocolError("torch request longer than " + std::to_string(limits.max_body) + " bytes");
    }
    if (in.size() - at < n) throw Short{at + static_cast<size_t>(n)};
  };
  auto u64_at = [&](size_t at) {
    need(at, 8);
    uint64_t v;
    std::memcpy(&v, in.data() + at, sizeof(v));
    return v;
  };
  for (Field f; (f = field_at(q, st.fields, st.count)) != Field::kEnd; ++st.fields) {
    g_field_steps.fetch_add(1, std::memory_order_relaxed);
    switch (f) {
      case Field::kU32:
        need(st.pos, 4);
        st.pos += 4;
        break;
      case Field::kI64:
        need(st.pos, 8);
        st.pos += 8;
        break;
      case Field::kCount: {
        uint64_t n = u64_at(st.pos);
        if (n > limits.max_keys) {
          throw ProtocolError("torch request: " + std::to_string(n) + " keys (limit " +
                              std::to_string(limits.max_keys) + ")");
        }
        st.count = n;
        st.pos += 8;
        break;
      }
      case Field::kKey:
      case Field::kValue: {
        uint64_t size = u64_at(st.pos);
        if (f == Field::kKey && size > limits.max_key) {
          throw ProtocolError("torch request: a key of " + std::to_string(size) + " bytes (limit " +
                              std::to_string(limits.max_key) + ")");
        }
        need(st.pos + 8, size);
        st.pos += 8 + size;
        break;
      }
      case Field::kEnd:
        break;
    }
  }
}

// Copies the fields of a request that scan() found whole.
Request copy_out(std::string_view in, Query q) {
  Request r;
  r.query = q;
  size_t pos = 1;
  auto u64_at = [&](size_t at) {
    uint64_t v;
    std::memcpy(&v, in.data() + at, sizeof(v));
    return v;
  };
  uint64_t count = 0;
  for (uint64_t i = 0;; ++i) {
    Field f = field_at(q, i, count);
    if (f == Field::kEnd) break;
    if (f == Field::kU32) {
      uint32_t v;
      std::memcpy(&v, in.data() + pos, sizeof(v));
      r.number = v;
      pos += 4;
    } else if (f == Field::kI64) {
      r.number = static_cast<int64_t>(u64_at(pos));
      pos += 8;
    } else if (f == Field::kCount) {
      count = u64_at(pos);
      r.keys.reserve(count);
      if (q == Query::kMultiSet) r.values.reserve(count);
      pos += 8;
    } else {
      size_t size = u64_at(pos);
      (f == Field::kKey ? r.keys : r.values).emplace_back(in.data() + pos + 8, size);
      pos += 8 + size;
    }
  }
  if (q == Query::kValidate && r.number != kValidateMagic) throw ProtocolError("torch VALIDATE with a wrong magic number");
  return r;
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

Decoded decode(std::string_view buffered, Dialect dialect, const wire::Limits& limits, ScanState& state) {
  Decoded d;
  if (buffered.empty()) {
    d.needed = 1;
    return d;
  }
  const Query query = query_of(static_cast<uint8_t>(buffered[0]), dialect);
  try {
    scan(buffered, query, limits, state);
  } catch (const Short& s) {
    d.needed = s.needed;
    return d;
  }
  d.consumed = state.pos;
  state = {};
  d.request = copy_out(buffered, query);
  return d;
}

Decoded decode(std::string_view buffered, Dialect dialect, const wire::Limits& limits) {
  ScanState fresh;
  return decode(buffered, dialect, limits, fresh);
}

uint64_t field_steps() { return g_field_steps.load(std::memory_order_relaxed); }

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
