// libFuzzer target: arbitrary bytes through the store's frame parsing (header, then
// the body of the type the header names: a request, as the server parses it, or a
// TIMEOUT reply, as the client parses it). Malformed input must end in ProtocolError,
// never a crash, an over-read or an oversized allocation.
#include <cstddef>
#include <cstdint>

#include "protocol.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rdzv::wire;
  Limits limits;
  limits.max_body = 1 << 20;  // also catches allocations sized from unchecked lengths
  const char* bytes = reinterpret_cast<const char*>(data);
  while (size >= kHeaderSize) {
    try {
      Header h = decode_header(bytes, limits);
      size_t available = size - kHeaderSize;
      size_t body = h.body_size <= available ? h.body_size : available;
      std::string_view text(bytes + kHeaderSize, body);
      // Round trip: what decodes must encode back to the same body (a TIMEOUT from a
      // server before the key list has no list: it comes back with an empty one).
      std::string again = h.type == Type::kTimeout ? encode_timeout(decode_timeout(text, limits))
                                                   : encode_request(decode_request(h.type, text, limits));
      const bool same =
          again == text || (h.type == Type::kTimeout && again == std::string(text) + std::string(4, '\0'));
      if (body == h.body_size && !same) __builtin_trap();
      bytes += kHeaderSize + body;
      size -= kHeaderSize + body;
    } catch (const ProtocolError&) {
      return 0;
    }
  }
  return 0;
}
