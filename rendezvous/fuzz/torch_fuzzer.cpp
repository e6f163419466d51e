// libFuzzer target: arbitrary bytes through the decoder of torch's TCPStore requests
// (torch_wire.hpp), in both dialects, as the server reads a connection: detection of
// the first bytes, then one request after another. Malformed input must end in
// ProtocolError, never a crash, an over-read or an allocation sized from an unchecked
// length; what decodes must encode back to the same bytes; and a request cut short
// must read as incomplete, asking for no more bytes than it really needs; a scan resumed
// after part of a request came decodes it as a fresh one does.
#include <cstddef>
#include <cstdint>

#include "torch_wire.hpp"

namespace {

void decode_stream(std::string_view bytes, rdzv::Dialect dialect, const rdzv::wire::Limits& limits) {
  using namespace rdzv::torch_wire;
  while (!bytes.empty()) {
    Decoded d = decode(bytes, dialect, limits);
    if (d.consumed == 0) {
      if (d.needed <= bytes.size()) __builtin_trap();  // incomplete, yet asks for what it has
      return;
    }
    if (encode(d.request, dialect) != bytes.substr(0, d.consumed)) __builtin_trap();
    Decoded cut = decode(bytes.substr(0, d.consumed - 1), dialect, limits);
    if (cut.consumed != 0 || cut.needed < d.consumed - 1 + 1 || cut.needed > d.consumed) __builtin_trap();
    ScanState state;  // a scan resumed where a shorter read left it decodes the same request
    decode(bytes.substr(0, d.consumed / 2), dialect, limits, state);
    Decoded resumed = decode(bytes.substr(0, d.consumed), dialect, limits, state);
    if (resumed.consumed != d.consumed || encode(resumed.request, dialect) != bytes.substr(0, d.consumed)) {
      __builtin_trap();
    }
    bytes.remove_prefix(d.consumed);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rdzv;
  wire::Limits limits;
  limits.max_body = 1 << 20;  // also catches allocations sized from unchecked lengths
  limits.max_keys = 1024;
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    torch_wire::detect(bytes);
  } catch (const wire::ProtocolError&) {
  }
  for (Dialect d : {Dialect::kTorch, Dialect::kTorchLegacy}) {
    try {
      decode_stream(bytes, d, limits);
    } catch (const wire::ProtocolError&) {
    }
  }
  return 0;
}
