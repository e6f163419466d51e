// device_ops.hpp in a build without CUDA: available() says why, and everything that
// would touch a GPU throws. Tensors only reach these functions when someone asked
// for Device::Cuda, so the message is what that caller sees.
#include <string>

#include "ddp/types.hpp"
#include "device_ops.hpp"

namespace ddp::detail::device {
namespace {

[[noreturn]] void unavailable() {
  throw Error("ddprun was built without CUDA (CMake found no CUDA Toolkit), so Device::Cuda is unavailable");
}

}  // namespace

bool available(std::string* why) {
  if (why != nullptr) *why = "ddprun was built without CUDA";
  return false;
}

float* alloc(size_t) { unavailable(); }
void release(float*) noexcept {}
void copy(float*, const float*, size_t) { unavailable(); }
void fill(float*, size_t, float) { unavailable(); }
void scale(float*, size_t, float) { unavailable(); }
void axpy(float*, const float*, size_t, float) { unavailable(); }
double sum_squares(const float*, size_t) { unavailable(); }
void synchronize() { unavailable(); }
void relu_forward(const float*, float*, size_t) { unavailable(); }
void relu_backward(const float*, const float*, float*, size_t) { unavailable(); }
void set_rows(float*, const float*, size_t, size_t) { unavailable(); }
void add_column_sums(float*, const float*, size_t, size_t) { unavailable(); }
double softmax_xent(const float*, const int32_t*, size_t, size_t, float, float*) { unavailable(); }
size_t count_correct(const float*, const int32_t*, size_t, size_t) { unavailable(); }
void sgd(float*, const float*, float*, size_t, const rules::Sgd&, bool) { unavailable(); }
void adamw(float*, const float*, float*, float*, size_t, const rules::AdamW&) { unavailable(); }
void sgemm(Transpose, Transpose, size_t, size_t, size_t, float, const float*, size_t, const float*, size_t, float,
           float*, size_t) {
  unavailable();
}

}  // namespace ddp::detail::device
