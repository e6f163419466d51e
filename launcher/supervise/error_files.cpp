#include "supervise/error_files.hpp"

#include <spdlog/spdlog.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <sstream>

namespace ddprun {
namespace {

constexpr size_t kMaxFileBytes = 1 << 20;
constexpr int kMaxDepth = 32;

// Just enough JSON for an error file: objects, arrays, strings, and the scalars
// skipped over. A malformed document parses to nothing.
struct Json {
  enum class Kind { Null, String, Object, Other } kind = Kind::Null;
  std::string text;                                     // String
  std::map<std::string, std::shared_ptr<Json>> fields;  // Object

  const Json* field(const std::string& name) const {
    auto it = fields.find(name);
    return it == fields.end() ? nullptr : it->second.get();
  }
};

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  std::shared_ptr<Json> document() {
    auto v = value(0);
    space();
    return v && pos_ == s_.size() ? v : nullptr;
  }

 private:
  void space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t')) ++pos_;
  }
  bool eat(char c) {
    space();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  std::shared_ptr<Json> value(int depth) {
    if (depth > kMaxDepth) return nullptr;
    space();
    if (pos_ >= s_.size()) return nullptr;
    auto v = std::make_shared<Json>();
    const char c = s_[pos_];
    if (c == '"') {
      v->kind = Json::Kind::String;
      return string(v->text) ? v : nullptr;
    }
    if (c == '{') {
      ++pos_;
      v->kind = Json::Kind::Object;
      if (eat('}')) return v;
      do {
        std::string name;
        space();
        if (!string(name) || !eat(':')) return nullptr;
        auto member = value(depth + 1);
        if (!member) return nullptr;
        v->fields[name] = std::move(member);
      } while (eat(','));
      return eat('}') ? v : nullptr;
    }
    if (c == '[') {
      ++pos_;
      v->kind = Json::Kind::Other;
      if (eat(']')) return v;
      do {
        if (!value(depth + 1)) return nullptr;
      } while (eat(','));
      return eat(']') ? v : nullptr;
    }
    // A number, true, false or null: not needed, only skipped.
    const size_t start = pos_;
    while (pos_ < s_.size() && (isalnum(static_cast<unsigned char>(s_[pos_])) || strchr("+-.", s_[pos_]))) ++pos_;
    if (pos_ == start) return nullptr;
    v->kind = Json::Kind::Other;
    return v;
  }

  bool string(std::string& out) {
    if (pos_ >= s_.size() || s_[pos_] != '"') return false;
    ++pos_;
    while (pos_ < s_.size()) {
      char c = s_[pos_++];
      if (c == '"') return true;
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= s_.size()) return false;
      char e = s_[pos_++];
      switch (e) {
        case 'n': out.push_back('\n'); break;
        case 't': out.push_back('\t'); break;
        case 'r': out.push_back('\r'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'u': {
          if (pos_ + 4 > s_.size()) return false;
          unsigned code = 0;
          for (int i = 0; i < 4; ++i) {
            const char h = s_[pos_++];
            code <<= 4;
            if (h >= '0' && h <= '9') code |= static_cast<unsigned>(h - '0');
            else if (h >= 'a' && h <= 'f') code |= static_cast<unsigned>(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F') code |= static_cast<unsigned>(h - 'A' + 10);
            else return false;
          }
          append_utf8(out, code);
          break;
        }
        default: out.push_back(e); break;  // \" \\ \/
      }
    }
    return false;
  }

  // A \uXXXX escape as UTF-8 (a surrogate half stands alone as U+FFFD).
  static void append_utf8(std::string& out, unsigned code) {
    if (code >= 0xD800 && code <= 0xDFFF) code = 0xFFFD;
    if (code < 0x80) {
      out.push_back(static_cast<char>(code));
    } else if (code < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (code >> 6)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xE0 | (code >> 12)));
      out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  while (!out.empty() && out.back().empty()) out.pop_back();
  return out;
}

}  // namespace

std::optional<WorkerError> parse_worker_error(std::string_view json) {
  auto doc = Parser(json).document();
  if (!doc || doc->kind != Json::Kind::Object) return std::nullopt;
  const Json* message = doc->field("message");
  if (!message) return std::nullopt;
  WorkerError e;
  if (message->kind == Json::Kind::String) {
    e.message = message->text;  // the plain form: {"message": "...", "timestamp": ...}
  } else if (message->kind == Json::Kind::Object) {
    const Json* text = message->field("message");
    if (text && text->kind == Json::Kind::String) e.message = text->text;
    const Json* extra = message->field("extraInfo");
    const Json* stack = extra ? extra->field("py_callstack") : nullptr;
    if (stack && stack->kind == Json::Kind::String) e.traceback = lines_of(stack->text);
  } else {
    return std::nullopt;
  }
  // The message may span lines: the first is the one-line form.
  if (auto nl = e.message.find('\n'); nl != std::string::npos) e.message.resize(nl);
  if (e.message.empty() && e.traceback.empty()) return std::nullopt;
  return e;
}

std::optional<WorkerError> read_worker_error(const std::string& path) {
  if (path.empty()) return std::nullopt;
  // The worker controls what lies at this path: never follow a link, never wait on a
  // FIFO or a device (ddprun reads it on its main thread), read a regular file only.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
      static_cast<uint64_t>(st.st_size) > kMaxFileBytes) {
    return std::nullopt;
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  return parse_worker_error(text);
}

ErrorFiles::~ErrorFiles() {
  if (private_dir_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(private_dir_, ignored);
}

std::string ErrorFiles::prepare(int attempt, int local_rank) {
  std::filesystem::path path;
  if (plan_.log_root) {
    path = worker_log_dir(plan_, attempt, local_rank) / "error.json";  // the folder exists: the logs are there
  } else {
    if (private_dir_.empty() && !private_failed_) {
      std::string templ = (std::filesystem::temp_directory_path() / ("ddprun-" + plan_.run_id + "-XXXXXX")).string();
      if (mkdtemp(templ.data()) != nullptr) {
        private_dir_ = templ;
      } else {
        private_failed_ = true;
        spdlog::warn("cannot make a folder for the workers' error files ({}); TORCHELASTIC_ERROR_FILE is not set",
                     strerror(errno));
      }
    }
    if (private_dir_.empty()) return "";
    path = std::filesystem::path(private_dir_) /
           ("attempt_" + std::to_string(attempt) + "_rank_" + std::to_string(local_rank) + "_error.json");
  }
  std::error_code ignored;
  std::filesystem::remove(path, ignored);  // an old attempt's exception is not this one's
  return path.string();
}

}  // namespace ddprun
