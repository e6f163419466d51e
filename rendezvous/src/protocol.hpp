// The store's wire format (rendezvous/PROTOCOL.md is the reference).
//
// Every message is a frame: a 16-byte header, then `body_size` bytes of body.
//   magic u32 "DDPR" | version u8 | type u8 | reserved u16 (0) | request id u32 | body size u32
// Integers are little-endian. Bodies are sequences of fields: u32, i64, and bytes
// (u32 length + data). Every length is checked against limits before anything is
// allocated, so a hostile peer can make a decoder throw but never over-allocate.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "rdzv/store.hpp"

namespace rdzv::wire {

inline constexpr uint32_t kMagic = 0x52504444;  // "DDPR" read as little-endian bytes
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kHeaderSize = 16;
inline constexpr size_t kNonceSize = 32;
inline constexpr size_t kMacSize = 32;  // HMAC-SHA256

enum class Type : uint8_t {
  // server -> client, first frame on every connection
  kChallenge = 1,
  // client -> server
  kHello = 2,  // namespace, client nonce, mac
  kSet = 10,
  kGet = 11,
  kAdd = 12,
  kCompareSet = 13,
  kWait = 14,
  kCheck = 15,
  kDelete = 16,
  kNumKeys = 17,
  kMultiGet = 18,
  kMultiSet = 19,
  kAppend = 20,
  kSetWill = 21,   // key, value: the server compare_set()s it (if absent) when this connection drops
  kGoodbye = 22,   // clean close: the will is discarded
  kPing = 23,
  kSetWills = 24,  // keys, values, silence: several wills at once (replacing any held)
  // server -> client
  kOk = 64,
  kError = 65,
  kTimeout = 66,
};

// The most wills one connection may hold (SET_WILLS).
inline constexpr size_t kMaxWills = 16;

// Limits a decoder enforces. The server's come from its options.
struct Limits {
  uint32_t max_body = 64u << 20;      // bytes in one frame body
  uint32_t max_key = 4096;            // bytes in one key
  uint32_t max_keys = 1u << 16;       // keys in one multi-key request
};

// Thrown for any malformed input; the connection that sent it is closed.
class ProtocolError : public StoreError {
 public:
  using StoreError::StoreError;
};

struct Header {
  Type type = Type::kOk;
  uint32_t request_id = 0;
  uint32_t body_size = 0;
};

std::array<char, kHeaderSize> encode_header(const Header& h);
// Throws ProtocolError for a bad magic, version, reserved field, unknown type, or a
// body larger than limits.max_body.
Header decode_header(const char* bytes, const Limits& limits);

// A whole frame, header and body.
std::string make_frame(Type type, uint32_t request_id, std::string_view body);

// Builds a body.
class BodyWriter {
 public:
  BodyWriter& u32(uint32_t v);
  BodyWriter& i64(int64_t v);
  BodyWriter& bytes(std::string_view v);
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

// Reads a body, checking every length against what is left and the limits.
class BodyReader {
 public:
  BodyReader(std::string_view body, const Limits& limits) : rest_(body), limits_(limits) {}
  uint32_t u32();
  int64_t i64();
  std::string bytes();       // a value: bounded by what is left in the body
  std::string key();         // a key: also bounded by limits.max_key
  uint32_t count();          // a key count: bounded by limits.max_keys and what is left
  // True when the whole body was read.
  bool done() const { return rest_.empty(); }
  // Throws unless the whole body was read.
  void finish() const;

 private:
  std::string_view take(size_t n, const char* what);
  std::string_view rest_;
  Limits limits_;
};

// A decoded client request. Field use by type:
//   HELLO        values = {namespace, client nonce, mac (empty when the client has no token)}
//   SET, APPEND  keys = {key}, values = {value}
//   SET_WILL     keys = {key}, values = {value}, number = silence limit in ms (0: none)
//   SET_WILLS    keys, values (same length, at most kMaxWills), number = silence limit in ms
//   GET          keys = {key}, number = timeout in ms
//   ADD          keys = {key}, number = delta
//   COMPARE_SET  keys = {key}, values = {expected, desired}
//   WAIT, MULTI_GET         keys, number = timeout in ms
//   CHECK        keys;   MULTI_SET  keys, values (same length);   DELETE  keys = {key}
//   NUM_KEYS, GOODBYE, PING  nothing
struct Request {
  Type type = Type::kPing;
  std::vector<std::string> keys;
  std::vector<std::string> values;
  int64_t number = 0;
};

// Encodes a request body (the client side of decode_request).
std::string encode_request(const Request& q);

// Decodes one request body completely, throwing ProtocolError on any defect
// (wrong sizes, trailing bytes, a type a client may not send). The server's only
// parser, and the fuzzer's target.
Request decode_request(Type type, std::string_view body, const Limits& limits);

// A TIMEOUT reply body: a message for people, then the keys still missing as data
// (what StoreTimeout::missing_keys() reports).
struct TimeoutReply {
  std::string message;
  std::vector<std::string> missing_keys;
};
std::string encode_timeout(const TimeoutReply& t);
// Decodes a TIMEOUT body completely, throwing ProtocolError on any defect. The
// client's only parser of it, and the fuzzer's second target.
TimeoutReply decode_timeout(std::string_view body, const Limits& limits);

const char* type_name(Type t);

}  // namespace rdzv::wire
