// Helpers of the CUDA model's kernel tests (gemv, MoE, sampling): the skip-when-no-GPU guard and a
// typed device array with host copies in and out. Failures are test failures, not exceptions.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/gpu_skip.h"
#include "cuda/cuda_backend.h"

namespace pagedattn::testing {

// Why no CUDA device can be used here, or "" when one can.
inline std::string model_gpu_unusable() {
  const Support support = ::pagedattn::cuda::device_available();
  return support ? std::string() : support.reason;
}

template <class T>
struct DeviceArray {
  T* data = nullptr;
  size_t count = 0;
  explicit DeviceArray(size_t n) : count(n) {
    if (cudaMalloc(reinterpret_cast<void**>(&data), std::max<size_t>(n, 1) * sizeof(T)) !=
        cudaSuccess) {
      ADD_FAILURE() << "cudaMalloc failed";
      data = nullptr;
    }
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    EXPECT_EQ(cudaMemcpy(data, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  ~DeviceArray() { cudaFree(data); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  std::vector<T> host() const {
    std::vector<T> out(count);
    EXPECT_EQ(cudaMemcpy(out.data(), data, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
};

}  // namespace pagedattn::testing

// Skips the test where no CUDA device can be used; fails it under PAGEDATTN_REQUIRE_GPU=1.
#define REQUIRE_GPU() PA_SKIP_OR_FAIL_WITHOUT_GPU(::pagedattn::testing::model_gpu_unusable())
