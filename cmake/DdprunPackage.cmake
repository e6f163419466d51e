# The installed package: what its config must find again.
#
# ddp_contract, ddp_comm, ddp_train and ddp_rendezvous are static libraries, so their private links (OpenSSL,
# OpenBLAS, zlib, CUDA, NCCL...) travel with them into the export set as $<LINK_ONLY:...>
# and every imported target named there must exist in the consumer's project too.
# ddprun_package_dependencies() reads the targets' link interfaces and writes the
# find_dependency() calls for them, so a dependency added to a component later is
# picked up without editing the config template.

# ddprun_package_dependencies(<out-var> <target>...): sets <out-var> to CMake code
# for ddprunConfig.cmake.in.
function(ddprun_package_dependencies out)
  set(names "")
  foreach(target IN LISTS ARGN)
    get_target_property(links ${target} INTERFACE_LINK_LIBRARIES)
    if(links)
      # Build-tree-only links do not reach the installed package.
      string(REGEX REPLACE "\\$<BUILD_INTERFACE:[^>]*>" "" links "${links}")
      string(REGEX MATCHALL "[A-Za-z0-9_.+-]+::[A-Za-z0-9_.+-]+" found "${links}")
      list(APPEND names ${found})
    endif()
  endforeach()
  list(REMOVE_DUPLICATES names)

  # Settings the components found their dependencies with (variables of their directories).
  get_directory_property(openssl_static DIRECTORY ${PROJECT_SOURCE_DIR}/rendezvous DEFINITION OPENSSL_USE_STATIC_LIBS)
  get_directory_property(bla_vendor DIRECTORY ${PROJECT_SOURCE_DIR}/worker_runtime/train DEFINITION BLA_VENDOR)

  set(packages "")
  foreach(name IN LISTS names)
    if(name MATCHES "^ddprun::(contract|comm|train|worker|rendezvous|warnings)$")
      # exported by this package
    elseif(name MATCHES "^Threads::")
      list(APPEND packages Threads)
    elseif(name MATCHES "^OpenSSL::")
      list(APPEND packages OpenSSL)
    elseif(name MATCHES "^BLAS::")
      list(APPEND packages BLAS)
    elseif(name MATCHES "^LAPACK::")
      list(APPEND packages LAPACK)
    elseif(name MATCHES "^ZLIB::")
      list(APPEND packages ZLIB)
    elseif(name MATCHES "^CUDA::")
      list(APPEND packages CUDAToolkit)
    elseif(name STREQUAL "ddprun::nccl")
      list(APPEND packages CUDAToolkit NCCL)
    elseif(name MATCHES "^Boost::")
      list(APPEND packages Boost)
    elseif(name MATCHES "^OpenMP::")
      list(APPEND packages OpenMP)
    else()
      message(WARNING "The installed ddprun package links ${name} but its config does not know "
                      "how to find it: add a rule in cmake/DdprunPackage.cmake")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES packages)

  set(code "")
  foreach(package IN LISTS packages)
    if(package STREQUAL "OpenSSL" AND openssl_static)
      # As rendezvous/ found it: static libcrypto. The caller's setting is restored after.
      string(APPEND code
        "set(_ddprun_saved \"\${OPENSSL_USE_STATIC_LIBS}\")\n"
        "set(OPENSSL_USE_STATIC_LIBS TRUE)\n"
        "find_dependency(OpenSSL)\n"
        "set(OPENSSL_USE_STATIC_LIBS \"\${_ddprun_saved}\")\n")
    elseif(package STREQUAL "BLAS" AND bla_vendor)
      # The same BLAS as the build (OpenBLAS: the library calls its own extensions).
      string(APPEND code
        "set(_ddprun_saved \"\${BLA_VENDOR}\")\n"
        "set(BLA_VENDOR ${bla_vendor})\n"
        "find_dependency(BLAS)\n"
        "set(BLA_VENDOR \"\${_ddprun_saved}\")\n")
    elseif(package STREQUAL "CUDAToolkit")
      if(CUDAToolkit_ROOT)
        string(APPEND code "if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS \"${CUDAToolkit_ROOT}\")\n"
                           "  set(CUDAToolkit_ROOT \"${CUDAToolkit_ROOT}\")\n"
                           "endif()\n")
      endif()
      string(APPEND code "find_dependency(CUDAToolkit)\n")
    elseif(package STREQUAL "NCCL")
      # ddprun::nccl is this project's own imported target (cmake/DdprunCuda.cmake).
      get_filename_component(nccl_dir "${NCCL_LIBRARY}" DIRECTORY)
      string(APPEND code
        "if(NOT TARGET ddprun::nccl)\n"
        "  find_library(DDPRUN_NCCL_LIBRARY nccl HINTS \"${nccl_dir}\" \${CUDAToolkit_LIBRARY_DIR})\n"
        "  if(NOT DDPRUN_NCCL_LIBRARY)\n"
        "    set(\${CMAKE_FIND_PACKAGE_NAME}_FOUND FALSE)\n"
        "    set(\${CMAKE_FIND_PACKAGE_NAME}_NOT_FOUND_MESSAGE \"ddprun was built with NCCL, but libnccl was not found\")\n"
        "    return()\n"
        "  endif()\n"
        "  add_library(ddprun::nccl UNKNOWN IMPORTED)\n"
        "  set_target_properties(ddprun::nccl PROPERTIES IMPORTED_LOCATION \"\${DDPRUN_NCCL_LIBRARY}\")\n"
        "endif()\n")
    else()
      string(APPEND code "find_dependency(${package})\n")
    endif()
  endforeach()
  set(${out} "${code}" PARENT_SCOPE)
endfunction()
