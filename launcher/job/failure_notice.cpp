// FailureNotice's text form in the store: "node\nrank\nstatus\nkind\nhost\nwhat" (the last
// field may not hold newlines), and the escaping of what another node wrote.
#include "job/failure_notice.hpp"

#include <sstream>

namespace ddprun {
namespace {

// The length of the UTF-8 sequence at the start of `s` (1 to 4), or 0 when it is not
// one: a stray continuation byte, a truncated sequence, an overlong form, a surrogate
// or a code point past U+10FFFF.
size_t utf8_length(std::string_view s) {
  auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  unsigned char c = b(0);
  if (c < 0x80) return 1;
  size_t n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
  if (n == 0 || s.size() < n) return 0;
  for (size_t i = 1; i < n; ++i) {
    if ((b(i) & 0xC0) != 0x80) return 0;
  }
  if (c == 0xE0 && b(1) < 0xA0) return 0;  // overlong
  if (c == 0xED && b(1) > 0x9F) return 0;  // surrogate
  if (c == 0xF0 && b(1) < 0x90) return 0;  // overlong
  if (c == 0xF4 && b(1) > 0x8F) return 0;  // past U+10FFFF
  return n;
}

void append_escaped(std::string& out, std::string_view bytes) {
  static const char* kHex = "0123456789abcdef";
  for (unsigned char c : bytes) {
    out += "\\x";
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
}

}  // namespace

std::string printable_text(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  while (!bytes.empty()) {
    size_t n = utf8_length(bytes);
    auto c = static_cast<unsigned char>(bytes[0]);
    bool control = n == 1 ? (c < 0x20 || c == 0x7F) : n == 2 && c == 0xC2 && static_cast<unsigned char>(bytes[1]) < 0xA0;
    size_t take = n == 0 ? 1 : n;
    if (n == 0 || control) {
      append_escaped(out, bytes.substr(0, take));
    } else {
      out.append(bytes.substr(0, take));
    }
    bytes.remove_prefix(take);
  }
  return out;
}

std::string FailureNotice::encode() const {
  std::string line = what;
  for (char& c : line) {
    if (c == '\n') c = ' ';
  }
  return std::to_string(node) + "\n" + std::to_string(rank) + "\n" + std::to_string(status) + "\n" +
         notice_kind_name(kind) + "\n" + host + "\n" + line;
}

const char* notice_kind_name(NoticeKind kind) {
  switch (kind) {
    case NoticeKind::kWorker: return "worker";
    case NoticeKind::kNodeLost: return "lost";
    case NoticeKind::kStop: return "stop";
    case NoticeKind::kGrow: return "grow";
    case NoticeKind::kStoreLost: return "store-lost";
  }
  return "stop";
}

FailureNotice FailureNotice::decode(const std::string& text) {
  FailureNotice n;
  std::istringstream in(text);
  std::string node, rank, status, kind;
  std::getline(in, node);
  std::getline(in, rank);
  std::getline(in, status);
  std::getline(in, kind);
  std::getline(in, n.host);
  std::getline(in, n.what);
  n.host = printable_text(n.host);
  n.what = printable_text(n.what);
  try {
    n.node = std::stoi(node);
    n.rank = std::stoi(rank);
    n.status = std::stoi(status);
    // Anything else (another version's word, bytes that are no word) ends the job: the
    // safe reading of a notice this node does not understand.
    for (NoticeKind k : {NoticeKind::kWorker, NoticeKind::kNodeLost, NoticeKind::kGrow}) {
      if (kind == notice_kind_name(k)) n.kind = k;
    }
  } catch (const std::exception&) {
    n = FailureNotice{};
    n.what = "an unreadable failure notice: " + printable_text(std::string_view(text).substr(0, 200));
  }
  return n;
}

std::string FailureNotice::describe() const {
  // A node asking to join has no place in the attempt yet: its notice names it by host.
  if (kind == NoticeKind::kGrow) return what;
  std::string where = "node " + std::to_string(node) + (host.empty() ? "" : " (" + host + ")");
  return (rank >= 0 ? "rank " + std::to_string(rank) + " on " : "") + where + ": " + what;
}

}  // namespace ddprun
