// A process-wide state of the double that is never destroyed (stream worker threads
// may outlive static destructors) and whose lock `mu` is held across fork(), so a
// child never inherits it locked. `InChild` (optional) runs in the child, lock held.
#pragma once

#include <pthread.h>

namespace gpu_double {

template <typename T, void (*InChild)(T&) = nullptr>
class ForkSafe {
 public:
  static T& get() {
    static T* state = create();
    return *state;
  }

 private:
  static T* create() {
    auto* state = new T();
    pthread_atfork(&prepare, &parent, &child);
    return state;
  }
  static void prepare() { get().mu.lock(); }
  static void parent() { get().mu.unlock(); }
  static void child() {
    if constexpr (InChild != nullptr) InChild(get());
    get().mu.unlock();
  }
};

}  // namespace gpu_double
