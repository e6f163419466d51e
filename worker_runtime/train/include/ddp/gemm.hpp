// Host matrix multiply (OpenBLAS cblas_sgemm) on Tensors, and its thread count.
//
// OpenBLAS is loaded at the first call. Two defaults suit DDP workers:
//  - single-threaded (one worker per core; OpenBLAS's own pool would oversubscribe)
//    unless OPENBLAS_NUM_THREADS / OMP_NUM_THREADS / GOTO_NUM_THREADS is set;
//    set_gemm_threads() changes it;
//  - kernels chosen from this CPU's instruction set (OPENBLAS_CORETYPE=SkylakeX with
//    AVX-512, Haswell with AVX2+FMA) unless OPENBLAS_CORETYPE is set: OpenBLAS's own
//    detection falls back to slow SSE3 kernels on CPU models it does not know.
// Both are process-wide. The first call may briefly set OPENBLAS_CORETYPE in the
// environment; make it before starting threads that read the environment.
#pragma once

#include <string>

#include "ddp/tensor.hpp"

namespace ddp {

enum class Transpose : uint8_t { No, Yes };

// c = alpha * op(a) · op(b) + beta * c, where op(x) is x or xᵀ. All tensors are
// row-major and on one device: OpenBLAS computes it on the host, cuBLAS on the GPU
// (asynchronously, on the default stream). c must already have the result's shape
// (rows of op(a) × cols of op(b)) and must not alias a or b. beta = 0 ignores c's
// old contents (even NaNs). Throws InvalidArgument when the shapes or devices do not
// agree, ddp::Error when OpenBLAS cannot be loaded (the message says which package
// to install) or cuBLAS fails.
void gemm(const Tensor& a, Transpose ta, const Tensor& b, Transpose tb, Tensor& c, float alpha = 1.0f,
          float beta = 0.0f);

// The raw row-major form of gemm(): c[m×n] = alpha * op(a)[m×k] · op(b)[k×n] + beta * c
// with leading dimensions lda, ldb, ldc. No checks beyond those cblas makes.
void sgemm(Transpose ta, Transpose tb, size_t m, size_t n, size_t k, float alpha, const float* a, size_t lda,
           const float* b, size_t ldb, float beta, float* c, size_t ldc);

// sgemm on `device`'s memory: the host sgemm above for Device::Cpu, cuBLAS for
// Device::Cuda.
void sgemm_on(Device device, Transpose ta, Transpose tb, size_t m, size_t n, size_t k, float alpha, const float* a,
              size_t lda, const float* b, size_t ldb, float beta, float* c, size_t ldc);

// Sets how many threads OpenBLAS uses from now on (n >= 1; throws InvalidArgument
// otherwise). Affects the whole process.
void set_gemm_threads(int n);

// One line describing the GEMM library in use, e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH
// ..., kernels SkylakeX (OPENBLAS_CORETYPE=SkylakeX set by ddp_worker)", for logs.
std::string gemm_backend();

}  // namespace ddp
