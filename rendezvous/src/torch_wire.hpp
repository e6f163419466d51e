// PyTorch's TCPStore wire protocol, as the store server reads it (PROTOCOL.md, "torch's
// dialects"). Unframed: a request is one query-type byte and its fields, in the
// machine's byte order (little-endian here): integers of fixed size, and strings and
// byte vectors as a u64 length then the bytes. Replies are bare values of the same kinds.
//
// Two dialects, told apart by a connection's first bytes:
//   torch >= 2.1 ("2.x"): the first request is VALIDATE (type 0, then u32 0x3C85F7CE);
//   torch 1.13 ("legacy"): no VALIDATE, and its own numbering of the query types.
// The decoder maps both onto the 2.x numbering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "protocol.hpp"
#include "rdzv/server_counters.hpp"

namespace rdzv::torch_wire {

inline constexpr uint32_t kValidateMagic = 0x3C85F7CE;

// Query types in PyTorch 2.15's numbering (TCPStoreBackend.hpp); what 1.13 sends is
// mapped onto them. kLegacyWatchKey stands for 1.13's WATCH_KEY, which has no 2.x number.
enum class Query : uint8_t {
  kValidate = 0,
  kSet = 1,
  kCompareSet = 2,
  kGet = 3,
  kAdd = 4,
  kCheck = 5,
  kWait = 6,
  kGetNumKeys = 7,
  kDeleteKey = 8,
  kAppend = 9,
  kMultiGet = 10,
  kMultiSet = 11,
  kCancelWait = 12,
  kPing = 13,
  kQueuePush = 14,
  kQueuePop = 15,
  kQueueLen = 16,
  kListKeys = 17,
  kBarrier = 18,
  kLegacyWatchKey = 63,
};

// Reply bytes: CHECK's, and WAIT's / BARRIER's / CANCEL_WAIT's.
inline constexpr uint8_t kReady = 0, kNotReady = 1;
inline constexpr uint8_t kStopWaiting = 0, kWaitCanceled = 1;

// What a connection's first bytes say it speaks: kDdprun for ddprun's frames (first byte
// 'D'), kTorch / kTorchLegacy for torch's; `known` false while too few bytes arrived
// to tell. Throws wire::ProtocolError for bytes that are none of them.
struct Detection {
  bool known = false;
  Dialect dialect = Dialect::kDdprun;
};
Detection detect(std::string_view first_bytes);

// A decoded request. Field use by query:
//   VALIDATE, PING       number = the magic / the nonce (u32)
//   SET, APPEND, QUEUE_PUSH   keys = {key}, values = {value}
//   COMPARE_SET          keys = {key}, values = {expected, desired}
//   GET, DELETE_KEY, QUEUE_POP, QUEUE_LEN, WATCH_KEY   keys = {key}
//   ADD                  keys = {key}, number = delta
//   BARRIER              keys = {key}, number = world size
//   CHECK, WAIT, MULTI_GET   keys
//   MULTI_SET            keys, values (same length)
//   GETNUMKEYS, CANCEL_WAIT, LIST_KEYS   nothing
struct Request {
  Query query = Query::kPing;
  std::vector<std::string> keys;
  std::vector<std::string> values;
  int64_t number = 0;
};

// The result of one decode() call: `consumed` bytes made `request`; or, with consumed
// 0, the request is incomplete and at least `needed` bytes in all must be buffered
// before it can be decoded.
struct Decoded {
  size_t consumed = 0;
  size_t needed = 0;
  Request request;
};

// Where the scan of an incomplete request stopped, so that the next decode() of the
// same request goes on from there rather than from its first byte: `pos` bytes of it
// hold `fields` whole fields, `count` the key count once read. A fresh state starts a
// request; decode() resets it once a request is whole.
struct ScanState {
  size_t pos = 0;
  uint64_t fields = 0;
  uint64_t count = 0;
};

// Decodes the request at the start of `buffered`, incrementally: it allocates nothing
// for a request whose bytes have not all arrived, and checks every length against
// `limits` (keys against max_key, key counts against max_keys, the whole request
// against max_body) before allocating. Throws wire::ProtocolError for an unknown type,
// a length over a limit, a bad VALIDATE magic. `state` carries the scan from one call
// to the next while the request's bytes arrive (the same bytes, more of them).
Decoded decode(std::string_view buffered, Dialect dialect, const wire::Limits& limits, ScanState& state);
Decoded decode(std::string_view buffered, Dialect dialect, const wire::Limits& limits);

// Fields scanned by decode() in this process so far, all threads together (tests bound
// the work a request trickled in small pieces costs).
uint64_t field_steps();

// Encodes a request as the dialect's client sends it (tests and the fuzzer's round trip).
std::string encode(const Request& q, Dialect dialect);

// Reply building: a u64-length-prefixed byte string, and a fixed-size value.
void put_bytes(std::string& out, std::string_view v);
void put_i64(std::string& out, int64_t v);

const char* query_name(Query q);

}  // namespace rdzv::torch_wire
