// ddp::gemm on the host through OpenBLAS (cblas_sgemm), loaded at first use.
//
// Why dlopen rather than linking: OpenBLAS picks its kernels once, in its library
// constructor, from the CPU model, and falls back to "Prescott" (SSE3) kernels on a
// CPU model it does not know — common in VMs (these machines' Xeon with AVX-512 gets
// Prescott from OpenBLAS 0.3.21, ~5x slower GEMM). OPENBLAS_CORETYPE overrides the
// choice but must be set before that constructor runs. Loading the library here
// lets us set it (from this CPU's features, only when the user did not) first.
//
// Threads: DDP runs one worker per core, so OpenBLAS's own pool (one thread per
// core in every worker) would oversubscribe. Unless OPENBLAS_NUM_THREADS,
// OMP_NUM_THREADS or GOTO_NUM_THREADS is set, OpenBLAS runs single-threaded.
#include <cblas.h>
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "ddp/gemm.hpp"
#include "ddp/types.hpp"
#include "device_ops.hpp"
#include "tensor_util.hpp"

#ifndef DDPRUN_OPENBLAS_LIBRARY
#define DDPRUN_OPENBLAS_LIBRARY "libopenblas.so"
#endif

namespace ddp {
namespace {

using SgemmFn = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint, float,
                         const float*, blasint, const float*, blasint, float, float*, blasint);
using SetThreadsFn = void (*)(int);
using GetStringFn = char* (*)();

struct OpenBlas {
  SgemmFn sgemm = nullptr;
  SetThreadsFn set_num_threads = nullptr;
  GetStringFn get_config = nullptr;
  GetStringFn get_corename = nullptr;
  std::string coretype;  // what we put in OPENBLAS_CORETYPE, empty when we did not
};

// The OpenBLAS kernel set this CPU can run best, by its instruction set.
const char* coretype_for_this_cpu() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return nullptr;  // let OpenBLAS detect
}

template <typename Fn>
Fn symbol(void* lib, const char* name) {
  void* p = dlsym(lib, name);
  if (p == nullptr) throw Error(std::string("OpenBLAS lacks ") + name + " (" + DDPRUN_OPENBLAS_LIBRARY + ")");
  return reinterpret_cast<Fn>(p);
}

OpenBlas load() {
  OpenBlas blas;
  const bool set_coretype = std::getenv("OPENBLAS_CORETYPE") == nullptr && coretype_for_this_cpu() != nullptr;
  if (set_coretype) {
    blas.coretype = coretype_for_this_cpu();
    setenv("OPENBLAS_CORETYPE", blas.coretype.c_str(), 1);
  }
  void* lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) lib = dlopen(DDPRUN_OPENBLAS_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  const std::string why = lib == nullptr ? dlerror() : "";
  if (set_coretype) unsetenv("OPENBLAS_CORETYPE");  // read by now; child processes should not inherit it
  if (lib == nullptr) throw Error("cannot load OpenBLAS (" + why + "): apt install libopenblas0");
  blas.sgemm = symbol<SgemmFn>(lib, "cblas_sgemm");
  blas.set_num_threads = symbol<SetThreadsFn>(lib, "openblas_set_num_threads");
  blas.get_config = symbol<GetStringFn>(lib, "openblas_get_config");
  blas.get_corename = symbol<GetStringFn>(lib, "openblas_get_corename");
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr && std::getenv("OMP_NUM_THREADS") == nullptr &&
      std::getenv("GOTO_NUM_THREADS") == nullptr) {
    blas.set_num_threads(1);
  }
  return blas;
}

// Loaded once, on the first call from any thread; never unloaded.
const OpenBlas& openblas() {
  static const OpenBlas blas = load();
  return blas;
}

using tensor_util::shape_text;

}  // namespace

void sgemm(Transpose ta, Transpose tb, size_t m, size_t n, size_t k, float alpha, const float* a, size_t lda,
           const float* b, size_t ldb, float beta, float* c, size_t ldc) {
  const SgemmFn f = openblas().sgemm;
  if (m == 0 || n == 0) return;
  f(CblasRowMajor, ta == Transpose::Yes ? CblasTrans : CblasNoTrans, tb == Transpose::Yes ? CblasTrans : CblasNoTrans,
    static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda),
    b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

void gemm(const Tensor& a, Transpose ta, const Tensor& b, Transpose tb, Tensor& c, float alpha, float beta) {
  const size_t m = ta == Transpose::Yes ? a.cols() : a.rows();
  const size_t k = ta == Transpose::Yes ? a.rows() : a.cols();
  const size_t kb = tb == Transpose::Yes ? b.cols() : b.rows();
  const size_t n = tb == Transpose::Yes ? b.rows() : b.cols();
  if (k != kb || c.rows() != m || c.cols() != n) {
    throw InvalidArgument("gemm: op(a) is " + shape_text(m, k) + ", op(b) is " + shape_text(kb, n) + ", c is " +
                          shape_text(c));
  }
  const Device device = c.device();
  if (a.device() != device || b.device() != device) {
    throw InvalidArgument(std::string("gemm: a is on ") + device_name(a.device()) + ", b on " +
                          device_name(b.device()) + ", c on " + device_name(device));
  }
  if (k == 0) {  // an empty sum: c = beta * c (beta = 0 clears, even NaNs)
    if (beta == 0.0f) {
      c.zero();
    } else {
      c.scale(beta);
    }
    return;
  }
  sgemm_on(device, ta, tb, m, n, k, alpha, a.data(), a.cols(), b.data(), b.cols(), beta, c.data(), c.cols());
}

void sgemm_on(Device device, Transpose ta, Transpose tb, size_t m, size_t n, size_t k, float alpha, const float* a,
              size_t lda, const float* b, size_t ldb, float beta, float* c, size_t ldc) {
  if (device == Device::Cuda) {
    detail::device::sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

void set_gemm_threads(int n) {
  if (n < 1) throw InvalidArgument("set_gemm_threads: " + std::to_string(n) + " threads");
  openblas().set_num_threads(n);
}

std::string gemm_backend() {
  const OpenBlas& blas = openblas();
  std::string s = blas.get_config();
  s += ", kernels ";
  s += blas.get_corename();
  if (!blas.coretype.empty()) s += " (OPENBLAS_CORETYPE=" + blas.coretype + " set by ddp_worker)";
  return s;
}

}  // namespace ddp
