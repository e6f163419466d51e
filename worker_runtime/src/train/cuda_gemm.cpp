// ddp::DeviceTensor and CublasContext on CUDA (built only when CMake finds CUDA).
//
// cuBLAS is column-major; a row-major m × n matrix is the column-major n × m
// transpose, so row-major C = op(A)·op(B) is computed as column-major
// Cᵀ = op(B)ᵀ·op(A)ᵀ by swapping the operands.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "ddp/cuda_gemm.hpp"
#include "ddp/types.hpp"

namespace ddp {
namespace {

void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(rc));
}

void check_cublas(cublasStatus_t rc, const char* what) {
  if (rc != CUBLAS_STATUS_SUCCESS) {
    throw Error(std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(rc)));
  }
}

std::string shape(size_t r, size_t c) { return std::to_string(r) + "x" + std::to_string(c); }

}  // namespace

bool cuda_device_available(std::string* why) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    if (why != nullptr) *why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(rc);
    return false;
  }
  if (count == 0) {
    if (why != nullptr) *why = "no CUDA device";
    return false;
  }
  return true;
}

DeviceTensor::DeviceTensor(size_t rows, size_t cols) : rows_(rows), cols_(cols) {
  if (size() != 0) check_cuda(cudaMalloc(reinterpret_cast<void**>(&data_), size() * sizeof(float)), "cudaMalloc");
}

DeviceTensor::~DeviceTensor() {
  if (data_ != nullptr) cudaFree(data_);
}

DeviceTensor::DeviceTensor(DeviceTensor&& other) noexcept
    : data_(other.data_), rows_(other.rows_), cols_(other.cols_) {
  other.data_ = nullptr;
  other.rows_ = other.cols_ = 0;
}

DeviceTensor& DeviceTensor::operator=(DeviceTensor&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = other.data_;
    rows_ = other.rows_;
    cols_ = other.cols_;
    other.data_ = nullptr;
    other.rows_ = other.cols_ = 0;
  }
  return *this;
}

void DeviceTensor::upload(const Tensor& host) {
  if (host.size() != size()) {
    throw InvalidArgument("DeviceTensor::upload: host has " + std::to_string(host.size()) + " elements, device " +
                          std::to_string(size()));
  }
  if (size() != 0) {
    check_cuda(cudaMemcpy(data_, host.data(), size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
}

void DeviceTensor::download(Tensor& host) const {
  host.resize(rows_, cols_);
  if (size() != 0) {
    check_cuda(cudaMemcpy(host.data(), data_, size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  }
}

CublasContext::CublasContext() {
  std::string why;
  if (!cuda_device_available(&why)) throw Error("CublasContext: " + why);
  cublasHandle_t h = nullptr;
  check_cublas(cublasCreate(&h), "cublasCreate");
  handle_ = h;
}

CublasContext::~CublasContext() {
  if (handle_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(handle_));
}

void CublasContext::gemm(const DeviceTensor& a, Transpose ta, const DeviceTensor& b, Transpose tb, DeviceTensor& c,
                         float alpha, float beta) {
  const size_t m = ta == Transpose::Yes ? a.cols() : a.rows();
  const size_t k = ta == Transpose::Yes ? a.rows() : a.cols();
  const size_t kb = tb == Transpose::Yes ? b.cols() : b.rows();
  const size_t n = tb == Transpose::Yes ? b.rows() : b.cols();
  if (k != kb || c.rows() != m || c.cols() != n) {
    throw InvalidArgument("CublasContext::gemm: op(a) is " + shape(m, k) + ", op(b) is " + shape(kb, n) +
                          ", c is " + shape(c.rows(), c.cols()));
  }
  if (m == 0 || n == 0) return;
  const cublasOperation_t op_a = ta == Transpose::Yes ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = tb == Transpose::Yes ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int lda = static_cast<int>(std::max<size_t>(a.cols(), 1));
  const int ldb = static_cast<int>(std::max<size_t>(b.cols(), 1));
  check_cublas(cublasSgemm(static_cast<cublasHandle_t>(handle_), op_b, op_a, static_cast<int>(n),
                           static_cast<int>(m), static_cast<int>(k), &alpha, b.data(), ldb, a.data(), lda, &beta,
                           c.data(), static_cast<int>(n)),
               "cublasSgemm");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

}  // namespace ddp
