// The training core's GPU side (device_ops.hpp): CUDA kernels over rules.hpp and
// cuBLAS GEMM, all on the legacy default stream of the current device.
//
// cuBLAS is column-major; a row-major m × n matrix is the column-major n × m
// transpose, so row-major C = op(A)·op(B) is computed as column-major
// Cᵀ = op(B)ᵀ·op(A)ᵀ by swapping the operands.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ddp/types.hpp"
#include "device_ops.hpp"

namespace ddp::detail::device {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;  // grid-stride loops cover the rest

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(rc));
}

// After a launch: a bad configuration shows at once; faults show at the next wait.
void launched(const char* kernel) { check(cudaGetLastError(), kernel); }

int blocks_for(size_t count) {
  return static_cast<int>(std::min<size_t>((count + kThreads - 1) / kThreads, kMaxBlocks));
}

// Per-thread device scratch that grows to the largest request and is reused. It lives
// on the device current at its allocation: one GPU per process (or per thread), as
// everywhere in the training core.
class Scratch {
 public:
  ~Scratch() {
    if (data_ != nullptr) cudaFree(data_);  // at exit CUDA may be gone: the error is moot
  }
  void* get(size_t bytes) {
    if (bytes > bytes_) {
      if (data_ != nullptr) cudaFree(data_);
      data_ = nullptr;
      bytes_ = 0;
      check(cudaMalloc(&data_, bytes), "cudaMalloc (scratch)");
      bytes_ = bytes;
    }
    return data_;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

thread_local Scratch labels_scratch;
thread_local Scratch results_scratch;

// --- Kernels -------------------------------------------------------------------------

#define DDP_GRID_STRIDE(i, n) \
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < (n); i += size_t{gridDim.x} * blockDim.x)

__global__ void fill_kernel(float* x, size_t n, float value) {
  DDP_GRID_STRIDE(i, n) x[i] = value;
}

__global__ void scale_kernel(float* x, size_t n, float factor) {
  DDP_GRID_STRIDE(i, n) x[i] *= factor;
}

__global__ void axpy_kernel(float* y, const float* x, size_t n, float alpha) {
  DDP_GRID_STRIDE(i, n) y[i] += alpha * x[i];
}

// Fixed grid (kMaxBlocks × kThreads at most, set by n alone): each block writes its
// partial sum, and the host adds the partials in block order.
__global__ void sum_squares_kernel(const float* x, size_t n, double* partials) {
  __shared__ double lane[kThreads];
  double s = 0;
  DDP_GRID_STRIDE(i, n) s += static_cast<double>(x[i]) * x[i];
  lane[threadIdx.x] = s;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) lane[threadIdx.x] += lane[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = lane[0];
}

__global__ void relu_forward_kernel(const float* x, float* y, size_t n) {
  DDP_GRID_STRIDE(i, n) y[i] = rules::relu(x[i]);
}

__global__ void relu_backward_kernel(const float* y, const float* dy, float* dx, size_t n) {
  DDP_GRID_STRIDE(i, n) dx[i] = rules::relu_grad(y[i], dy[i]);
}

__global__ void set_rows_kernel(float* y, const float* b, size_t rows, size_t cols) {
  DDP_GRID_STRIDE(i, rows * cols) y[i] = b[i % cols];
}

// One thread per column, adding the rows into db[j] in order: the host's
// db[j] += dy[r][j], row by row, so accumulated gradients round alike.
__global__ void add_column_sums_kernel(float* db, const float* dy, size_t rows, size_t cols) {
  DDP_GRID_STRIDE(j, cols) {
    float s = db[j];
    for (size_t r = 0; r < rows; ++r) s += dy[r * cols + j];
    db[j] = s;
  }
}

// One thread per row.
__global__ void softmax_xent_kernel(const float* logits, const int32_t* labels, size_t rows, size_t cols,
                                    float inv_batch, float* dlogits, double* row_loss) {
  DDP_GRID_STRIDE(r, rows) {
    row_loss[r] = rules::softmax_xent_row(logits + r * cols, cols, labels[r], inv_batch, dlogits + r * cols);
  }
}

__global__ void correct_kernel(const float* logits, const int32_t* labels, size_t rows, size_t cols,
                               int32_t* correct) {
  DDP_GRID_STRIDE(r, rows) {
    correct[r] = rules::argmax_row(logits + r * cols, cols) == static_cast<size_t>(labels[r]) ? 1 : 0;
  }
}

__global__ void sgd_kernel(float* w, const float* g, float* b, size_t n, rules::Sgd s, bool first) {
  DDP_GRID_STRIDE(i, n) {
    if (b == nullptr) {
      rules::sgd_plain(w[i], g[i], s);
    } else if (first) {
      rules::sgd_first(w[i], g[i], b[i], s);
    } else {
      rules::sgd_momentum(w[i], g[i], b[i], s);
    }
  }
}

__global__ void adamw_kernel(float* w, const float* g, float* m, float* v, size_t n, rules::AdamW s) {
  DDP_GRID_STRIDE(i, n) rules::adamw(w[i], g[i], m[i], v[i], s);
}

#undef DDP_GRID_STRIDE

// Copies host labels to the device scratch.
const int32_t* upload_labels(const int32_t* labels, size_t rows) {
  auto* d = static_cast<int32_t*>(labels_scratch.get(rows * sizeof(int32_t)));
  check(cudaMemcpy(d, labels, rows * sizeof(int32_t), cudaMemcpyHostToDevice), "cudaMemcpy (labels)");
  return d;
}

// One cuBLAS handle per thread and device, made at first use. Never destroyed: at
// process exit the CUDA runtime may already be torn down.
cublasHandle_t cublas_handle() {
  thread_local int device = -1;
  thread_local cublasHandle_t handle = nullptr;
  int current = 0;
  check(cudaGetDevice(&current), "cudaGetDevice");
  if (handle == nullptr || device != current) {
    cublasHandle_t h = nullptr;
    const cublasStatus_t rc = cublasCreate(&h);
    if (rc != CUBLAS_STATUS_SUCCESS) throw Error("cublasCreate: cuBLAS status " + std::to_string(static_cast<int>(rc)));
    handle = h;
    device = current;
  }
  return handle;
}

}  // namespace

bool available(std::string* why) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    cudaGetLastError();  // leave no sticky error for later calls
    if (why != nullptr) {
      *why = rc == cudaErrorNoDevice            ? std::string("no CUDA device")
             : rc == cudaErrorInsufficientDriver ? std::string("no NVIDIA driver new enough for this CUDA runtime")
                                                 : std::string("CUDA reports no usable device");
      *why += std::string(" (cudaGetDeviceCount: ") + cudaGetErrorString(rc) + ")";
    }
    return false;
  }
  if (count == 0) {
    if (why != nullptr) *why = "no CUDA device";
    return false;
  }
  return true;
}

float* alloc(size_t count) {
  void* p = nullptr;
  check(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(float)), "cudaMalloc");
  return static_cast<float*>(p);
}

void release(float* p) noexcept {
  if (p != nullptr) cudaFree(p);
}

void copy(float* dst, const float* src, size_t count) {
  if (count == 0 || dst == src) return;
  check(cudaMemcpy(dst, src, count * sizeof(float), cudaMemcpyDefault), "cudaMemcpy");
}

void fill(float* x, size_t count, float value) {
  if (count == 0) return;
  if (value == 0.0f && !signbit(value)) {  // +0.0 is all zero bytes; -0.0 is not
    check(cudaMemsetAsync(x, 0, count * sizeof(float), cudaStreamLegacy), "cudaMemsetAsync");
    return;
  }
  fill_kernel<<<blocks_for(count), kThreads>>>(x, count, value);
  launched("fill kernel");
}

void scale(float* x, size_t count, float factor) {
  if (count == 0) return;
  scale_kernel<<<blocks_for(count), kThreads>>>(x, count, factor);
  launched("scale kernel");
}

void axpy(float* y, const float* x, size_t count, float alpha) {
  if (count == 0) return;
  axpy_kernel<<<blocks_for(count), kThreads>>>(y, x, count, alpha);
  launched("axpy kernel");
}

double sum_squares(const float* x, size_t count) {
  if (count == 0) return 0.0;
  const int blocks = blocks_for(count);
  auto* partials = static_cast<double*>(results_scratch.get(static_cast<size_t>(blocks) * sizeof(double)));
  sum_squares_kernel<<<blocks, kThreads>>>(x, count, partials);
  launched("sum_squares kernel");
  std::vector<double> host(static_cast<size_t>(blocks));
  check(cudaMemcpy(host.data(), partials, host.size() * sizeof(double), cudaMemcpyDeviceToHost), "cudaMemcpy");
  double s = 0;
  for (double p : host) s += p;
  return s;
}

void synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

void relu_forward(const float* x, float* y, size_t count) {
  if (count == 0) return;
  relu_forward_kernel<<<blocks_for(count), kThreads>>>(x, y, count);
  launched("relu kernel");
}

void relu_backward(const float* y, const float* dy, float* dx, size_t count) {
  if (count == 0) return;
  relu_backward_kernel<<<blocks_for(count), kThreads>>>(y, dy, dx, count);
  launched("relu backward kernel");
}

void set_rows(float* y, const float* b, size_t rows, size_t cols) {
  if (rows * cols == 0) return;
  set_rows_kernel<<<blocks_for(rows * cols), kThreads>>>(y, b, rows, cols);
  launched("bias kernel");
}

void add_column_sums(float* db, const float* dy, size_t rows, size_t cols) {
  if (rows * cols == 0) return;
  add_column_sums_kernel<<<blocks_for(cols), kThreads>>>(db, dy, rows, cols);
  launched("bias gradient kernel");
}

double softmax_xent(const float* logits, const int32_t* labels, size_t rows, size_t cols, float inv_batch,
                    float* dlogits) {
  if (rows == 0) return 0.0;
  const int32_t* d_labels = upload_labels(labels, rows);
  auto* row_loss = static_cast<double*>(results_scratch.get(rows * sizeof(double)));
  softmax_xent_kernel<<<blocks_for(rows), kThreads>>>(logits, d_labels, rows, cols, inv_batch, dlogits, row_loss);
  launched("softmax cross-entropy kernel");
  std::vector<double> host(rows);
  check(cudaMemcpy(host.data(), row_loss, rows * sizeof(double), cudaMemcpyDeviceToHost), "cudaMemcpy");
  double total = 0;
  for (double l : host) total += l;  // row order, as on the host
  return total;
}

size_t count_correct(const float* logits, const int32_t* labels, size_t rows, size_t cols) {
  if (rows == 0) return 0;
  const int32_t* d_labels = upload_labels(labels, rows);
  auto* correct = static_cast<int32_t*>(results_scratch.get(rows * sizeof(int32_t)));
  correct_kernel<<<blocks_for(rows), kThreads>>>(logits, d_labels, rows, cols, correct);
  launched("accuracy kernel");
  std::vector<int32_t> host(rows);
  check(cudaMemcpy(host.data(), correct, rows * sizeof(int32_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
  size_t n = 0;
  for (int32_t c : host) n += static_cast<size_t>(c);
  return n;
}

void sgd(float* w, const float* g, float* b, size_t count, const rules::Sgd& s, bool first) {
  if (count == 0) return;
  sgd_kernel<<<blocks_for(count), kThreads>>>(w, g, b, count, s, first);
  launched("SGD kernel");
}

void adamw(float* w, const float* g, float* m, float* v, size_t count, const rules::AdamW& s) {
  if (count == 0) return;
  adamw_kernel<<<blocks_for(count), kThreads>>>(w, g, m, v, count, s);
  launched("AdamW kernel");
}

void sgemm(Transpose ta, Transpose tb, size_t m, size_t n, size_t k, float alpha, const float* a, size_t lda,
           const float* b, size_t ldb, float beta, float* c, size_t ldc) {
  if (m == 0 || n == 0) return;
  const cublasOperation_t op_a = ta == Transpose::Yes ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = tb == Transpose::Yes ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasStatus_t rc =
      cublasSgemm(cublas_handle(), op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha,
                  b, static_cast<int>(std::max<size_t>(ldb, 1)), a, static_cast<int>(std::max<size_t>(lda, 1)), &beta,
                  c, static_cast<int>(std::max<size_t>(ldc, 1)));
  if (rc != CUBLAS_STATUS_SUCCESS) throw Error("cublasSgemm: cuBLAS status " + std::to_string(static_cast<int>(rc)));
}

}  // namespace ddp::detail::device
