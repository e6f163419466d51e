# Finds the CUDA Toolkit and NCCL (on these machines both live in /usr/local/cuda).
#
# DDPRUN_WITH_CUDA = AUTO: use them when found; ON: fail when missing; OFF: never.
# Results: DDPRUN_HAVE_CUDA, DDPRUN_HAVE_NCCL (ON/OFF) and, when found, the imported
# targets CUDA::cudart (from FindCUDAToolkit) and ddprun::nccl.

set(DDPRUN_HAVE_CUDA OFF)
set(DDPRUN_HAVE_NCCL OFF)

if(NOT DDPRUN_WITH_CUDA STREQUAL "OFF")
  if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(DDPRUN_HAVE_CUDA ON)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      set(DDPRUN_HAVE_NCCL ON)
      add_library(ddprun::nccl UNKNOWN IMPORTED)
      set_target_properties(ddprun::nccl PROPERTIES
        IMPORTED_LOCATION "${NCCL_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
    endif()
  endif()
  if(DDPRUN_WITH_CUDA STREQUAL "ON" AND NOT (DDPRUN_HAVE_CUDA AND DDPRUN_HAVE_NCCL))
    message(FATAL_ERROR "DDPRUN_WITH_CUDA=ON but the CUDA Toolkit or NCCL was not found "
                        "(set CUDAToolkit_ROOT, or use -DDDPRUN_WITH_CUDA=AUTO)")
  endif()
endif()
