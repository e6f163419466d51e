# Finds the CUDA Toolkit and NCCL (on these machines both live in /usr/local/cuda).
#
# DDPRUN_WITH_CUDA = AUTO: use them when found; ON: fail when missing; OFF: never.
# Results: DDPRUN_HAVE_CUDA (a working nvcc: the CUDA language is enabled for the
# training kernels, and cuBLAS is used), DDPRUN_HAVE_NCCL (the CUDA runtime and
# NCCL: the NCCL backend), and when found the imported targets CUDA::* (from
# FindCUDAToolkit) and ddprun::nccl.

set(DDPRUN_HAVE_CUDA OFF)
set(DDPRUN_HAVE_NCCL OFF)

if(NOT DDPRUN_WITH_CUDA STREQUAL "OFF")
  if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    # The NCCL backend needs the CUDA runtime and NCCL, not a compiler.
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      set(DDPRUN_HAVE_NCCL ON)
      add_library(ddprun::nccl UNKNOWN IMPORTED)
      set_target_properties(ddprun::nccl PROPERTIES
        IMPORTED_LOCATION "${NCCL_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
    endif()
    # The training core's kernels (worker_runtime/src/train/device_cuda.cu) need an
    # nvcc that works with this host compiler: check_language tries it in a scratch
    # project, so a broken one leaves the kernels out (AUTO) instead of failing here.
    if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND CUDAToolkit_NVCC_EXECUTABLE)
      set(ENV{CUDACXX} "${CUDAToolkit_NVCC_EXECUTABLE}")
    endif()
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      # Turing (sm_75) is CUDA 13's oldest target; compute_90 PTX lets newer GPUs JIT.
      if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
        set(CMAKE_CUDA_ARCHITECTURES 75-real 80-real 86-real 89-real 90)
      endif()
      enable_language(CUDA)
      # CMake before 3.26 knows no C++20 flag for nvcc (which has one since CUDA 12).
      if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
        set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
        set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
      endif()
      set(DDPRUN_HAVE_CUDA ON)
    endif()
  endif()
  if(DDPRUN_WITH_CUDA STREQUAL "ON" AND NOT (DDPRUN_HAVE_CUDA AND DDPRUN_HAVE_NCCL))
    message(FATAL_ERROR "DDPRUN_WITH_CUDA=ON but not everything was found: CUDA runtime "
                        "${CUDAToolkit_FOUND}, a working nvcc ${DDPRUN_HAVE_CUDA}, NCCL ${DDPRUN_HAVE_NCCL} "
                        "(set CUDAToolkit_ROOT or CUDACXX, or use -DDDPRUN_WITH_CUDA=AUTO)")
  endif()
endif()
