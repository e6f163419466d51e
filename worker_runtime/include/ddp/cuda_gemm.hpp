// GPU matrix multiply through cuBLAS: a device float32 matrix and an sgemm on it.
//
// Built from src/train/cuda_gemm.cpp when CMake finds CUDA; otherwise every
// function here throws ddp::Error ("built without CUDA") and cuda_device_available()
// returns false. This header does not include CUDA headers.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "ddp/gemm.hpp"
#include "ddp/tensor.hpp"

namespace ddp {

// True when this build has CUDA and at least one device can be used; otherwise
// false with the reason in *why (when why is not null).
bool cuda_device_available(std::string* why = nullptr);

// A rows × cols row-major float32 matrix in device memory (cudaMalloc), owning.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  // Allocates (uninitialised). Throws ddp::Error when the allocation fails.
  DeviceTensor(size_t rows, size_t cols);
  ~DeviceTensor();
  DeviceTensor(DeviceTensor&& other) noexcept;
  DeviceTensor& operator=(DeviceTensor&& other) noexcept;
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;

  size_t rows() const { return rows_; }
  size_t cols() const { return cols_; }
  size_t size() const { return rows_ * cols_; }
  float* data() { return data_; }  // device pointer
  const float* data() const { return data_; }

  // Host → device; host must have size() elements (InvalidArgument otherwise).
  void upload(const Tensor& host);
  // Device → host; host is resized to rows × cols.
  void download(Tensor& host) const;

 private:
  float* data_ = nullptr;
  size_t rows_ = 0;
  size_t cols_ = 0;
};

// A cuBLAS handle on the current device, for device_gemm.
class CublasContext {
 public:
  // Throws ddp::Error when no device is usable or cublasCreate fails.
  CublasContext();
  ~CublasContext();
  CublasContext(const CublasContext&) = delete;
  CublasContext& operator=(const CublasContext&) = delete;

  // c = alpha * op(a) · op(b) + beta * c, row-major, with ddp::gemm's contract;
  // synchronous on return. Throws InvalidArgument for mismatched shapes and
  // ddp::Error when cuBLAS fails.
  void gemm(const DeviceTensor& a, Transpose ta, const DeviceTensor& b, Transpose tb, DeviceTensor& c,
            float alpha = 1.0f, float beta = 0.0f);

 private:
  void* handle_ = nullptr;  // cublasHandle_t
};

}  // namespace ddp
