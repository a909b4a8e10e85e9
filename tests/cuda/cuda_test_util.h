// Helpers of the CUDA tests: the skip-when-no-GPU guard, device copies of host tensors, and a
// generated case (tests/common/cases.h) mirrored onto the device and run through the cuda backend,
// then compared with the float64 reference and with the CPU backend.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "common/cases.h"
#include "common/gpu_skip.h"
#include "common/test_util.h"
#include "cuda/cuda_backend.h"
#include "cuda/workspace.h"

// Skips the test, with the reason, where no CUDA device can be used (as in CI); fails it instead
// under PAGEDATTN_REQUIRE_GPU=1 (scripts/gpu-check), see common/gpu_skip.h.
#define PA_REQUIRE_GPU() PA_SKIP_OR_FAIL_WITHOUT_GPU(::pagedattn::testing::gpu_unusable_reason())

namespace pagedattn::testing {

// Why no CUDA device can be used here, or "" when one can.
inline std::string gpu_unusable_reason() {
  const Support support = cuda::device_available();
  if (support) return {};
  return support.reason.empty() ? std::string("no usable CUDA device") : support.reason;
}

// lse from the GPU kernels against float64: looser than the CPU's kLseTolerance (5e-5 + 1e-5 rel)
// because some kernels sum l from bf16-rounded probabilities (relative error up to ~2^-9 /
// sqrt(effective keys)); a dropped key of weight > ~2e-3 or a logit scale error of ~1e-3 x mean
// logit still shows. Tighten once the H200 run reports the kernels' actual lse error.
inline constexpr Tolerance kGpuLseTolerance{2e-3, 2e-4};

// Output tolerance of the GPU kernels relative to each row: twice the CPU's (row_tolerance_for)
// in element_rel and row L2, for the probabilities the tensor cores take rounded to bf16/fp16 (an
// error of ~2^-9 relative per weight, ~1e-3 of the row in L2). The floor for elements near 0 is
// eight times the CPU's: a rounded weight p_i errs by ~2^-9 p_i, so an element's error scales with
// sum p_i |v_i|, which for V of mean ~0.5 and spread 1 is ~30x the row's rms when the softmax is
// flat; the H200 (2026-12-04, prefill and the decode graph replay, logits of std 2.5) showed
// scattered elements at up to 0.0075 x rms (bf16) and 0.00105 x rms (f16) against floors of
// 0.004 and 0.0006, never a whole row; 8x leaves twice that.
// A dropped key, page or scale moves the row's L2, which stays at twice the CPU's bound.
inline RowTolerance gpu_row_tolerance(DType out_dtype) {
  RowTolerance tolerance = row_tolerance_for(out_dtype);
  tolerance.element_rel *= 2;
  tolerance.row_floor *= 8;
  tolerance.row_rel_l2 *= 2;
  return tolerance;
}

// Bytes spanned by a view (its extent through the strides).
int64_t extent_bytes(const TensorView& view);

// A device buffer holding a copy of a host view, with the same shape and strides.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  // Copies `host` (its whole extent) to the device.
  explicit DeviceTensor(const TensorView& host);
  // Same shape/strides as `host`, every byte 0xFF (NaN in every float dtype), filled on return.
  static DeviceTensor poisoned_like(const TensorView& host);
  // A contiguous device tensor with these contents.
  static DeviceTensor from_vector(const std::vector<int32_t>& values);

  const TensorView& view() const { return view_; }
  void copy_to(const TensorView& host) const;  // device -> host, same layout
  void copy_from(const TensorView& host);      // host -> device, same layout

 private:
  cuda::DeviceBuffer buffer_;
  TensorView view_;
  int64_t bytes_ = 0;
};

// A decode case on the device: q, K/V, metadata and poisoned out/lse.
struct DeviceDecodeCase {
  explicit DeviceDecodeCase(const AttentionCase& c);
  DecodeArgs args(void* stream = nullptr) const;
  StepMetadata meta() const;

  const AttentionCase* host;
  DeviceTensor q, k, v, out, lse, qo_indptr, kv_indptr, kv_indices, kv_last_page_len;
};

// Runs plan + decode of `device_case` on the cuda backend (workspace from default limits sized
// for the case) and waits for it.
void run_cuda_decode(const DeviceDecodeCase& device_case, void* stream = nullptr);

// Runs the case on the CPU backend into the case's own host out/lse.
void run_cpu_case(const AttentionCase& c);

// The whole check of one decode spec: GPU vs float64 reference, and GPU vs CPU backend.
// Returns "" when all match, else a report naming the seed.
std::string check_cuda_decode(const CaseSpec& spec, uint64_t seed);

inline void PrintTo(const CaseSpec& spec, std::ostream* os) { *os << spec.name(); }

}  // namespace pagedattn::testing
