#include "ddp/trace.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>

namespace ddp {

namespace {
// JSON string escaping for event names.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out + "\"";
}
}  // namespace

Trace::Trace(int rank) : rank_(rank), origin_(Clock::now()) {
  // Timestamps are wall-clock microseconds, so ranks line up with each other.
  const auto wall = std::chrono::system_clock::now().time_since_epoch();
  wall_origin_us_ = std::chrono::duration<double, std::micro>(wall).count();
}

void Trace::add(const std::string& name, Clock::time_point begin, Clock::time_point end, Track track) {
  const double ts = wall_origin_us_ + std::chrono::duration<double, std::micro>(begin - origin_).count();
  const double dur = std::chrono::duration<double, std::micro>(end - begin).count();
  events_.push_back(Event{name, ts, dur, track});
}

std::string Trace::json_events() const {
  std::string out;
  char buf[160];
  auto meta = [&](const char* what, int tid, const std::string& value) {
    if (!out.empty()) out += ",\n";
    std::snprintf(buf, sizeof(buf), "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"%s\",\"args\":{\"name\":", rank_,
                  tid, what);
    out += buf + quoted(value) + "}}";
  };
  meta("process_name", 0, "rank " + std::to_string(rank_));
  meta("thread_name", kCompute, "compute");
  meta("thread_name", kCommunication, "communication");
  for (const auto& e : events_) {
    std::snprintf(buf, sizeof(buf), ",\n{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"name\":", rank_,
                  static_cast<int>(e.track), e.ts_us, e.dur_us);
    out += buf + quoted(e.name) + "}";
  }
  return out;
}

void Trace::write(ProcessGroup& pg, const std::string& path) const {
  // Gather every rank's JSON text on rank 0: lengths first, then padded bytes.
  const std::string mine = json_events();
  int64_t len = static_cast<int64_t>(mine.size());
  std::vector<int64_t> lens(static_cast<size_t>(pg.size()));
  pg.all_gather(view(std::span<int64_t>(&len, 1)), view(lens));
  int64_t longest = 0;
  for (auto l : lens) longest = std::max(longest, l);
  std::vector<uint8_t> padded(static_cast<size_t>(longest), ' ');
  std::copy(mine.begin(), mine.end(), padded.begin());
  std::vector<uint8_t> all(pg.rank() == 0 ? static_cast<size_t>(longest) * lens.size() : 0);
  pg.gather(view(padded), view(all), 0);
  if (pg.rank() != 0) return;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) throw Error("trace: cannot write " + tmp);
    f << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
    for (size_t r = 0; r < lens.size(); ++r) {
      if (r > 0) f << ",\n";
      f.write(reinterpret_cast<const char*>(all.data()) + r * static_cast<size_t>(longest), lens[r]);
    }
    f << "\n]}\n";
    if (!f.flush()) throw Error("trace: cannot write " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error("trace: cannot rename " + tmp + " to " + path + ": " + ec.message());
}

}  // namespace ddp
