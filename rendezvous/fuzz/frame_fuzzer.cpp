// libFuzzer target: arbitrary bytes through the server's frame parsing (header,
// then the request body of the type the header names). Malformed input must end
// in ProtocolError, never a crash, an over-read or an oversized allocation.
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
      Request q = decode_request(h.type, std::string_view(bytes + kHeaderSize, body), limits);
      // Round trip: what decodes must encode back to the same body.
      std::string again = encode_request(q);
      if (body == h.body_size && again != std::string_view(bytes + kHeaderSize, body)) __builtin_trap();
      bytes += kHeaderSize + body;
      size -= kHeaderSize + body;
    } catch (const ProtocolError&) {
      return 0;
    }
  }
  return 0;
}
