// Whether this process runs on the GPU test double: for every test that runs a
// binary under it (LD_LIBRARY_PATH=<build>/tests/gpu_double/lib). A binary carrying
// RPATH (searched before LD_LIBRARY_PATH) instead of RUNPATH, or a lib dir missing
// from the path, would load the real libcudart/libnccl silently: this says so.
// Header-only, no test framework: include it and CHECK/REQUIRE the result.
#pragma once

#include <dlfcn.h>

#include <cstdlib>
#include <string>

namespace gpu_double_check {

// The file the loader took `symbol` from, or "" when no loaded object defines it.
inline std::string defining_file(const char* symbol) {
  void* p = dlsym(RTLD_DEFAULT, symbol);
  Dl_info info{};
  if (p == nullptr || dladdr(p, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

inline std::string directory_of(const std::string& file) {
  const auto slash = file.rfind('/');
  return slash == std::string::npos ? "" : file.substr(0, slash);
}

// "" when both the CUDA runtime and NCCL in use are the double's; else what is wrong.
inline std::string problem() {
  const std::string marker = defining_file("gpu_double_version");
  if (marker.empty())
    return "the CUDA runtime in use is not the double (gpu_double_version not found): run with "
           "LD_LIBRARY_PATH=<build>/tests/gpu_double/lib, and a binary with RUNPATH, not RPATH; cudaMalloc comes "
           "from '" + defining_file("cudaMalloc") + "'";
  const std::string nccl = defining_file("ncclGetUniqueId");
  if (!nccl.empty() && directory_of(nccl) != directory_of(marker))
    return "NCCL in use is '" + nccl + "', not the double's beside '" + marker + "' (RPATH, or a preloaded libnccl)";
  return "";
}

// What DDP_EXPECT_GPU_DOUBLE=1 (set by every test run under the double) finds wrong:
// "" when it is not set or the double is what got loaded, else
// "DDP_EXPECT_GPU_DOUBLE=1 but <problem()>".
inline std::string expected_problem() {
  const char* expect = std::getenv("DDP_EXPECT_GPU_DOUBLE");
  if (expect == nullptr || std::string(expect) != "1") return "";
  const std::string wrong = problem();
  return wrong.empty() ? "" : "DDP_EXPECT_GPU_DOUBLE=1 but " + wrong;
}

}  // namespace gpu_double_check
