#include "protocol.hpp"

#include <cstring>

namespace rdzv::wire {
namespace {

void put_le(char* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t get_le(const char* in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}

bool known_type(uint8_t t) {
  return (t >= 1 && t <= 2) || (t >= 10 && t <= 24) || (t >= 64 && t <= 66);
}

}  // namespace

std::array<char, kHeaderSize> encode_header(const Header& h) {
  std::array<char, kHeaderSize> out{};
  put_le(out.data(), kMagic, 4);
  out[4] = static_cast<char>(kVersion);
  out[5] = static_cast<char>(h.type);
  put_le(out.data() + 6, 0, 2);
  put_le(out.data() + 8, h.request_id, 4);
  put_le(out.data() + 12, h.body_size, 4);
  return out;
}

Header decode_header(const char* b, const Limits& limits) {
  if (get_le(b, 4) != kMagic) throw ProtocolError("not a ddprun store frame (bad magic)");
  if (static_cast<uint8_t>(b[4]) != kVersion) {
    throw ProtocolError("unsupported protocol version " + std::to_string(static_cast<uint8_t>(b[4])));
  }
  uint8_t type = static_cast<uint8_t>(b[5]);
  if (!known_type(type)) throw ProtocolError("unknown frame type " + std::to_string(type));
  if (get_le(b + 6, 2) != 0) throw ProtocolError("reserved header bits set");
  Header h;
  h.type = static_cast<Type>(type);
  h.request_id = static_cast<uint32_t>(get_le(b + 8, 4));
  h.body_size = static_cast<uint32_t>(get_le(b + 12, 4));
  if (h.body_size > limits.max_body) {
    throw ProtocolError("frame body of " + std::to_string(h.body_size) + " bytes exceeds the limit of " +
                        std::to_string(limits.max_body));
  }
  return h;
}

std::string make_frame(Type type, uint32_t request_id, std::string_view body) {
  auto header = encode_header({type, request_id, static_cast<uint32_t>(body.size())});
  std::string frame;
  frame.reserve(kHeaderSize + body.size());
  frame.append(header.data(), header.size());
  frame.append(body);
  return frame;
}

BodyWriter& BodyWriter::u32(uint32_t v) {
  char b[4];
  put_le(b, v, 4);
  out_.append(b, 4);
  return *this;
}

BodyWriter& BodyWriter::i64(int64_t v) {
  char b[8];
  put_le(b, static_cast<uint64_t>(v), 8);
  out_.append(b, 8);
  return *this;
}

BodyWriter& BodyWriter::bytes(std::string_view v) {
  u32(static_cast<uint32_t>(v.size()));
  out_.append(v);
  return *this;
}

std::string_view BodyReader::take(size_t n, const char* what) {
  if (n > rest_.size()) {
    throw ProtocolError(std::string("truncated body: ") + what + " needs " + std::to_string(n) + " bytes, " +
                        std::to_string(rest_.size()) + " left");
  }
  std::string_view out = rest_.substr(0, n);
  rest_.remove_prefix(n);
  return out;
}

uint32_t BodyReader::u32() { return static_cast<uint32_t>(get_le(take(4, "u32").data(), 4)); }
int64_t BodyReader::i64() { return static_cast<int64_t>(get_le(take(8, "i64").data(), 8)); }

std::string BodyReader::bytes() {
  uint32_t n = u32();
  return std::string(take(n, "bytes field"));  // take() checked n against the body first
}

std::string BodyReader::key() {
  uint32_t n = u32();
  if (n > limits_.max_key) {
    throw ProtocolError("key of " + std::to_string(n) + " bytes exceeds the limit of " +
                        std::to_string(limits_.max_key));
  }
  return std::string(take(n, "key"));
}

uint32_t BodyReader::count() {
  uint32_t n = u32();
  // Each key needs at least its 4-byte length, so a count the body cannot hold is refused up front.
  if (n > limits_.max_keys || static_cast<uint64_t>(n) * 4 > rest_.size()) {
    throw ProtocolError("key count " + std::to_string(n) + " is more than the body can hold or the limit allows");
  }
  return n;
}

void BodyReader::finish() const {
  if (!rest_.empty()) throw ProtocolError(std::to_string(rest_.size()) + " unexpected bytes after the body");
}

std::string encode_request(const Request& q) {
  BodyWriter w;
  auto key_list = [&](bool with_values) {
    w.u32(static_cast<uint32_t>(q.keys.size()));
    for (size_t i = 0; i < q.keys.size(); ++i) {
      w.bytes(q.keys[i]);
      if (with_values) w.bytes(q.values.at(i));
    }
  };
  switch (q.type) {
    case Type::kHello:
      w.bytes(q.values.at(0)).bytes(q.values.at(1)).bytes(q.values.at(2));
      break;
    case Type::kSet:
    case Type::kAppend:
      w.bytes(q.keys.at(0)).bytes(q.values.at(0));
      break;
    case Type::kSetWill:
      w.bytes(q.keys.at(0)).bytes(q.values.at(0)).i64(q.number);
      break;
    case Type::kGet:
    case Type::kAdd:
      w.bytes(q.keys.at(0)).i64(q.number);
      break;
    case Type::kCompareSet:
      w.bytes(q.keys.at(0)).bytes(q.values.at(0)).bytes(q.values.at(1));
      break;
    case Type::kWait:
    case Type::kMultiGet:
      key_list(false);
      w.i64(q.number);
      break;
    case Type::kCheck:
      key_list(false);
      break;
    case Type::kMultiSet:
      key_list(true);
      break;
    case Type::kSetWills:
      key_list(true);
      w.i64(q.number);
      break;
    case Type::kDelete:
      w.bytes(q.keys.at(0));
      break;
    default:
      break;
  }
  return w.take();
}

Request decode_request(Type type, std::string_view body, const Limits& limits) {
  BodyReader r(body, limits);
  Request q;
  q.type = type;
  auto keys = [&](bool with_values) {
    uint32_t n = r.count();
    q.keys.reserve(n);  // bounded by count(): at most body_size / 4
    for (uint32_t i = 0; i < n; ++i) {
      q.keys.push_back(r.key());
      if (with_values) q.values.push_back(r.bytes());
    }
  };
  switch (type) {
    case Type::kHello:
      q.values.push_back(r.bytes());
      q.values.push_back(r.bytes());
      q.values.push_back(r.bytes());
      if (q.values[0].size() > limits.max_key) throw ProtocolError("hello: namespace too long");
      if (q.values[1].size() != kNonceSize) throw ProtocolError("hello: bad nonce size");
      if (!q.values[2].empty() && q.values[2].size() != kMacSize) throw ProtocolError("hello: bad mac size");
      break;
    case Type::kSet:
    case Type::kAppend:
      q.keys.push_back(r.key());
      q.values.push_back(r.bytes());
      break;
    case Type::kSetWill:
      q.keys.push_back(r.key());
      q.values.push_back(r.bytes());
      q.number = r.i64();
      break;
    case Type::kGet:
    case Type::kAdd:
      q.keys.push_back(r.key());
      q.number = r.i64();
      break;
    case Type::kCompareSet:
      q.keys.push_back(r.key());
      q.values.push_back(r.bytes());
      q.values.push_back(r.bytes());
      break;
    case Type::kWait:
    case Type::kMultiGet:
      keys(false);
      q.number = r.i64();
      break;
    case Type::kCheck:
      keys(false);
      break;
    case Type::kMultiSet:
      keys(true);
      break;
    case Type::kSetWills:
      keys(true);
      q.number = r.i64();
      if (q.keys.size() > kMaxWills) throw ProtocolError("set_wills: more than " + std::to_string(kMaxWills) + " wills");
      break;
    case Type::kDelete:
      q.keys.push_back(r.key());
      break;
    case Type::kNumKeys:
    case Type::kGoodbye:
    case Type::kPing:
      break;
    default:
      throw ProtocolError(std::string("a client may not send ") + type_name(type));
  }
  r.finish();
  if ((type == Type::kGet || type == Type::kWait || type == Type::kMultiGet || type == Type::kSetWill ||
       type == Type::kSetWills) &&
      q.number < 0) {
    throw ProtocolError("negative timeout");
  }
  return q;
}

std::string encode_timeout(const TimeoutReply& t) {
  BodyWriter w;
  w.bytes(t.message).u32(static_cast<uint32_t>(t.missing_keys.size()));
  for (const auto& k : t.missing_keys) w.bytes(k);
  return w.take();
}

TimeoutReply decode_timeout(std::string_view body, const Limits& limits) {
  BodyReader r(body, limits);
  TimeoutReply t;
  t.message = r.bytes();
  if (r.done()) return t;  // a server older than the key list: no keys to report
  uint32_t n = r.count();
  t.missing_keys.reserve(n);  // bounded by count(): at most body_size / 4
  for (uint32_t i = 0; i < n; ++i) t.missing_keys.push_back(r.key());
  r.finish();
  return t;
}

const char* type_name(Type t) {
  switch (t) {
    case Type::kChallenge: return "CHALLENGE";
    case Type::kHello: return "HELLO";
    case Type::kSet: return "SET";
    case Type::kGet: return "GET";
    case Type::kAdd: return "ADD";
    case Type::kCompareSet: return "COMPARE_SET";
    case Type::kWait: return "WAIT";
    case Type::kCheck: return "CHECK";
    case Type::kDelete: return "DELETE";
    case Type::kNumKeys: return "NUM_KEYS";
    case Type::kMultiGet: return "MULTI_GET";
    case Type::kMultiSet: return "MULTI_SET";
    case Type::kAppend: return "APPEND";
    case Type::kSetWill: return "SET_WILL";
    case Type::kSetWills: return "SET_WILLS";
    case Type::kGoodbye: return "GOODBYE";
    case Type::kPing: return "PING";
    case Type::kOk: return "OK";
    case Type::kError: return "ERROR";
    case Type::kTimeout: return "TIMEOUT";
  }
  return "?";
}

}  // namespace rdzv::wire
