// Parsing of the double's environment knobs.
#include "knobs.hpp"

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace gpu_double {
namespace {

const char* const kFaultNames[] = {"init_hang",    "init_error",  "unique_id_error", "async_error",
                                   "enqueue_error", "enqueue_pending", "event_error", "split_error",
                                   "split_hang",   "stream_error"};

bool known_fault(const std::string& name) {
  for (const char* n : kFaultNames)
    if (name == n) return true;
  return false;
}

bool parse_long(const std::string& text, long& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  out = std::strtol(text.c_str(), &end, 10);
  return end != nullptr && *end == '\0' && out >= 0;
}

// "name[@rank][=n]"; false when malformed.
bool parse_fault(const std::string& item, Fault& f) {
  std::string rest = item;
  long n = 0;
  if (auto eq = rest.find('='); eq != std::string::npos) {
    if (!parse_long(rest.substr(eq + 1), n)) return false;
    f.after = n;
    rest = rest.substr(0, eq);
  }
  if (auto at = rest.find('@'); at != std::string::npos) {
    if (!parse_long(rest.substr(at + 1), n)) return false;
    f.rank = static_cast<int>(n);
    rest = rest.substr(0, at);
  }
  f.name = rest;
  return known_fault(f.name);
}

Knobs read_knobs() {
  Knobs k;
  if (const char* d = std::getenv("DDP_GPU_DOUBLE_DEVICES")) {
    long n = 0;
    if (parse_long(d, n) && n <= 1024) {
      k.devices = static_cast<int>(n);
    } else {
      std::fprintf(stderr, "gpu double: DDP_GPU_DOUBLE_DEVICES=%s is not a count; using %d\n", d, k.devices);
    }
  }
  if (const char* t = std::getenv("DDP_GPU_DOUBLE_TRACE")) k.trace = std::string(t) == "1";
  if (const char* d = std::getenv("DDP_GPU_DOUBLE_DELAY_US")) {
    long n = 0;
    if (parse_long(d, n) && n <= 1000000) {
      k.delay_us = n;
    } else {
      std::fprintf(stderr, "gpu double: DDP_GPU_DOUBLE_DELAY_US=%s is not 0..1000000; using 0\n", d);
    }
  }
  if (const char* f = std::getenv("DDP_GPU_DOUBLE_FAULTS")) {
    std::stringstream in(f);
    std::string item;
    while (std::getline(in, item, ',')) {
      if (item.empty()) continue;
      Fault fault;
      if (parse_fault(item, fault)) {
        k.faults.push_back(fault);
      } else {
        std::fprintf(stderr, "gpu double: DDP_GPU_DOUBLE_FAULTS: ignoring '%s'\n", item.c_str());
      }
    }
  }
  return k;
}

}  // namespace

const Knobs& knobs() {
  static const Knobs* k = new Knobs(read_knobs());  // never freed: used by detached threads at exit
  return *k;
}

const Fault* find_fault(const std::string& name, int rank) {
  for (const Fault& f : knobs().faults)
    if (f.name == name && (f.rank < 0 || f.rank == rank)) return &f;
  return nullptr;
}

const Fault* find_process_fault(const std::string& name) {
  int rank = -1;
  if (const char* r = std::getenv("RANK")) {
    long n = 0;
    if (parse_long(r, n)) rank = static_cast<int>(n);
  }
  return find_fault(name, rank);
}

}  // namespace gpu_double
