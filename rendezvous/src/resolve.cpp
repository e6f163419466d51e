// resolve (resolve.hpp): getaddrinfo on a thread of its own, waited for until a deadline.
#include "rdzv/resolve.hpp"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

namespace rdzv {
namespace {

using Clock = std::chrono::steady_clock;

// A finished lookup nobody has taken yet answers a caller for this long; an older one is
// redone, so a name that changed is seen.
constexpr std::chrono::seconds kFresh{2};

// What a caller waits at least: a local answer (/etc/hosts) takes a thread's start and a
// file read, and a try left with next to no budget should still get it.
constexpr std::chrono::milliseconds kLeastWait{20};

// One getaddrinfo call; its thread and every caller waiting for it share it.
struct Lookup {
  std::mutex m;
  std::condition_variable done_cv;
  bool done = false;
  int rc = 0;
  addrinfo* list = nullptr;
  Clock::time_point finished;
  ~Lookup() {
    if (list != nullptr) freeaddrinfo(list);
  }
};

// The lookups by host; never destroyed, since a lookup's thread may outlive main.
struct Registry {
  std::mutex m;
  std::map<std::string, std::shared_ptr<Lookup>> lookups;
};
Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

int system_lookup(const std::string& host, addrinfo** found, int flags = 0) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags;
  return getaddrinfo(host.c_str(), nullptr, &hints, found);
}

// The lookup to wait for: one running or freshly finished, or a new one started.
std::shared_ptr<Lookup> lookup_for(const std::string& host, const LookupFn& fn) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.m);
  auto& slot = r.lookups[host];
  if (slot) {
    std::lock_guard<std::mutex> l(slot->m);
    if (!slot->done || Clock::now() - slot->finished < kFresh) return slot;
  }
  slot = std::make_shared<Lookup>();
  std::thread([lookup = slot, host, fn = fn ? fn : LookupFn([](const std::string& h, addrinfo** f) {
                 return system_lookup(h, f);
               })] {
    addrinfo* list = nullptr;
    const int rc = fn(host, &list);
    std::lock_guard<std::mutex> l(lookup->m);
    lookup->rc = rc;
    lookup->list = rc == 0 ? list : nullptr;
    lookup->finished = Clock::now();
    lookup->done = true;
    lookup->done_cv.notify_all();
  }).detach();
  return slot;
}

// Forgets `lookup` once its answer is taken, so the next try asks again.
void taken(const std::string& key, const std::shared_ptr<Lookup>& lookup) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.m);
  auto it = r.lookups.find(key);
  if (it != r.lookups.end() && it->second == lookup) r.lookups.erase(it);
}

}  // namespace

Resolved resolve(const std::string& host, Clock::time_point deadline, const LookupFn& fn) {
  Resolved out;
  // An address needs no resolver: answered here, at once.
  if (addrinfo* numeric = nullptr; system_lookup(host, &numeric, AI_NUMERICHOST) == 0) {
    out.addresses = std::shared_ptr<const addrinfo>(numeric, freeaddrinfo);
    return out;
  }
  std::shared_ptr<Lookup> lookup = lookup_for(host, fn);
  deadline = std::max(deadline, Clock::now() + kLeastWait);
  {
    std::unique_lock<std::mutex> l(lookup->m);
    if (!lookup->done_cv.wait_until(l, deadline, [&] { return lookup->done; })) {
      out.why = "no answer yet from the resolver for '" + host + "'";
      return out;
    }
    if (lookup->rc != 0) out.why = std::string("cannot resolve '") + host + "': " + gai_strerror(lookup->rc);
  }
  taken(host, lookup);
  // The list lives as long as the lookup that owns it.
  if (out.why.empty()) out.addresses = std::shared_ptr<const addrinfo>(lookup, lookup->list);
  return out;
}

}  // namespace rdzv
