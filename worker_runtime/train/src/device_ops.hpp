// What the training core asks of the GPU: memory, copies, the kernels of the layers,
// the loss and the optimizers, and cuBLAS GEMM. Private to the library.
//
// Implemented by device_cuda.cu when CMake finds CUDA; by device_unavailable.cpp
// otherwise, where available() says why and everything else throws ddp::Error.
//
// Conventions:
//  - One GPU per process (or per thread): per-thread scratch buffers and the cuBLAS
//    handle belong to the device current when they were made.
//  - Everything runs on the calling thread's current device, on the legacy default
//    stream, in issue order. Kernels and GEMMs return before they finish; the calls
//    that hand a value or host memory back (copy, sum_squares, softmax_xent,
//    count_correct, synchronize) wait for the work queued before them. The NCCL
//    backend orders each collective after this stream's work the same way (see
//    src/nccl/nccl_backend.cpp), which is what lets DDP overlap them.
//  - A failed CUDA call throws ddp::Error naming it; an asynchronous kernel fault
//    surfaces at the next call that waits.
//  - Counts are elements (floats unless said otherwise).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ddp/gemm.hpp"
#include "rules.hpp"

namespace ddp::detail::device {

// Whether this build has CUDA and a device is usable; the reason in *why when not.
bool available(std::string* why);

float* alloc(size_t count);       // uninitialised device memory; throws Error when out of memory
void release(float* p) noexcept;  // nullptr is fine
// Copies count floats between any two of host and device memory (UVA tells which),
// on the default stream: work queued after it sees the copy, and a copy to the host
// has finished when it returns (cudaMemcpy's rules).
void copy(float* dst, const float* src, size_t count);
void fill(float* x, size_t count, float value);
void scale(float* x, size_t count, float factor);
void axpy(float* y, const float* x, size_t count, float alpha);  // y += alpha * x
// Sum of x[i]² in double, in an order fixed by count alone (so equal inputs give
// bit-equal sums on every rank).
double sum_squares(const float* x, size_t count);
void synchronize();

void relu_forward(const float* x, float* y, size_t count);
void relu_backward(const float* y, const float* dy, float* dx, size_t count);
// Every row of y (rows × cols) = b (1 × cols).
void set_rows(float* y, const float* b, size_t rows, size_t cols);
// db (1 × cols) += the column sums of dy (rows × cols), each summed in row order.
void add_column_sums(float* db, const float* dy, size_t rows, size_t cols);
// Softmax cross-entropy of device logits against host labels (already checked to be
// in range): writes dlogits and returns the sum of the rows' losses.
double softmax_xent(const float* logits, const int32_t* labels, size_t rows, size_t cols, float inv_batch,
                    float* dlogits);
// How many rows' first maximum equals their (host) label.
size_t count_correct(const float* logits, const int32_t* labels, size_t rows, size_t cols);

// Optimizer updates over one parameter (rules.hpp). b may be null for sgd without
// momentum; `first` selects the momentum buffer's first step.
void sgd(float* w, const float* g, float* b, size_t count, const rules::Sgd& s, bool first);
void adamw(float* w, const float* g, float* m, float* v, size_t count, const rules::AdamW& s);

// Row-major c = alpha * op(a) · op(b) + beta * c through cuBLAS (ddp::sgemm's contract).
void sgemm(Transpose ta, Transpose tb, size_t m, size_t n, size_t k, float alpha, const float* a, size_t lda,
           const float* b, size_t ldb, float beta, float* c, size_t ldc);

}  // namespace ddp::detail::device
