// ddp::DeviceTensor and CublasContext in a build without CUDA: nothing is usable,
// cuda_device_available() says why and everything else throws.
#include <string>

#include "ddp/cuda_gemm.hpp"
#include "ddp/types.hpp"

namespace ddp {
namespace {

[[noreturn]] void unavailable() { throw Error("ddprun was built without CUDA (no CUDA Toolkit found by CMake)"); }

}  // namespace

bool cuda_device_available(std::string* why) {
  if (why != nullptr) *why = "ddprun was built without CUDA";
  return false;
}

DeviceTensor::DeviceTensor(size_t, size_t) { unavailable(); }
DeviceTensor::~DeviceTensor() = default;
DeviceTensor::DeviceTensor(DeviceTensor&&) noexcept = default;
DeviceTensor& DeviceTensor::operator=(DeviceTensor&&) noexcept = default;
void DeviceTensor::upload(const Tensor&) { unavailable(); }
void DeviceTensor::download(Tensor&) const { unavailable(); }

CublasContext::CublasContext() { unavailable(); }
CublasContext::~CublasContext() = default;
void CublasContext::gemm(const DeviceTensor&, Transpose, const DeviceTensor&, Transpose, DeviceTensor&, float, float) {
  unavailable();
}

}  // namespace ddp
