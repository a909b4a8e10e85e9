# Writes pagedattn/version.h (from cmake/version.h.in) into PAGEDATTN_GENERATED_INCLUDE_DIR: the
# project version and what this build compiled in. The CPU SIMD line mirrors the condition in
# src/cpu/cpu_simd.cpp: GCC on x86-64 compiles the hot loops for x86-64-v4 (AVX-512),
# x86-64-v3 (AVX2 + FMA) and the baseline, picked at load time; elsewhere one portable version.
if(PAGEDATTN_WITH_CUDA)
  set(PAGEDATTN_VERSION_CUDA 1)
  list(JOIN PAGEDATTN_CUDA_ARCHS ";" PAGEDATTN_VERSION_CUDA_ARCHS)
else()
  set(PAGEDATTN_VERSION_CUDA 0)
  set(PAGEDATTN_VERSION_CUDA_ARCHS "")
endif()
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$" AND
   CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  set(PAGEDATTN_VERSION_CPU_SIMD "x86-64-v4,x86-64-v3,baseline (runtime dispatch)")
else()
  set(PAGEDATTN_VERSION_CPU_SIMD "portable")
endif()
if(OpenMP_CXX_FOUND)
  set(PAGEDATTN_VERSION_OPENMP 1)
else()
  set(PAGEDATTN_VERSION_OPENMP 0)
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/version.h.in
               ${PAGEDATTN_GENERATED_INCLUDE_DIR}/pagedattn/version.h @ONLY)
