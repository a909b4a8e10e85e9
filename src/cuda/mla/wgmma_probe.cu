// probe_wgmma_rates (wgmma_probe.h): one kernel, one launch per sequence. Every warpgroup that
// takes part issues `groups` groups of its sequence back to back (fence, the wgmmas, commit, wait
// for them), between two clock64 reads; the figure of a CTA is its slowest warpgroup. Operands
// are zeros in shared memory and in registers loaded from it (distinct registers, as in the
// kernels); the descriptors walk the same strides as the MLA kernels' so that operand fetches are
// alike.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/mla/config.h"
#include "cuda/mla/sm90_ws.h"
#include "cuda/mla/wgmma.cuh"
#include "cuda/mla/wgmma_probe.h"
#include "cuda/workspace.h"

namespace pagedattn::cuda::mla {
namespace {

using namespace sm90;  // NOLINT: the wgmma wrappers
using prefill::sm90::rs_m64n64k16_bf16;
using prefill::sm90::ss_m64n64k16_bf16;

using sm90ws::Ws;
constexpr int kProbeThreads = Ws::kThreads;  // the ws kernel's three warpgroups
constexpr int kProbeSmemBytes = 64 * 1024;
constexpr int kRegSteps = Ws::kRegSteps;  // S steps with A from registers, as in the ws kernel
// With 64-token tiles S takes 32 accumulators instead of 16: 20 steps' A fit beside them.
constexpr int kN64RegSteps = 20;

enum Sequence : int {
  kSn32 = 0,  // WG 0: S of a 32-token tile, 28 RS + 8 SS m64n32k16 (the ws kernel)
  kSn32Ss,    // WG 0: the same product with A from shared memory throughout (36 SS)
  kSn64,      // WG 0: S of a 64-token tile, 20 RS + 16 SS m64n64k16
  kSn64Ss,    // WG 0: 36 SS m64n64k16
  kPv32,      // WG 1, WG 2: P V of a 32-token tile, 2 SS m64n256k16 each
  kMix32,     // WG 0 kSn32 beside WG 1, WG 2 kPv32: the ws kernel's tensor work per tile
  kMix64,     // WG 0 kSn64 beside WG 1, WG 2 with 4 SS m64n256k16 each: a 64-token tile
  kSequences
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
// One S k16 step into 16 (n32) or 32 (n64) accumulators, A from registers (rs) or shared memory.
__device__ __forceinline__ void rs_step(float (&d)[16], const uint32_t (&a)[4], uint64_t b) {
  rs_m64n32k16_bf16(d, a, b, 1);
}
__device__ __forceinline__ void rs_step(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  rs_m64n64k16_bf16(d, a, b);
}
__device__ __forceinline__ void ss_step(float (&d)[16], uint64_t a, uint64_t b) {
  ss_m64n32k16_bf16(d, a, b, 1);
}
__device__ __forceinline__ void ss_step(float (&d)[32], uint64_t a, uint64_t b) {
  ss_m64n64k16_bf16(d, a, b, 1);
}

// `groups` groups of S over one tile of kN tokens (36 k16 steps, the first kRs with A from
// registers); returns the sum of the accumulators (zero) so that nothing is elided.
template <int kN, int kRs>
__device__ __forceinline__ float s_groups(int groups, const uint32_t (&qa)[kRegSteps][4],
                                          uint64_t a0, uint64_t b0) {
  float s[kN / 2] = {};
  for (int g = 0; g < groups; ++g) {
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kDimQk / 16; ++k) {
      const uint32_t kb = ((k >> 2) & (kN == 32 ? 3 : 1)) * (kN * 128) + (k & 3) * 32;
      const uint32_t qb = ((k >> 2) & 1) * 8192 + (k & 3) * 32;
      if (k < kRs) {
        rs_step(s, qa[k < kRegSteps ? k : 0], b0 + (kb >> 4));
      } else {
        ss_step(s, a0 + (qb >> 4), b0 + (kb >> 4));
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
  }
  fence_registers(s);
  float sum = 0.0f;
  for (float x : s) sum += x;
  return sum;
}

// `groups` groups of kSteps m64n256k16 (P from shared memory, V N-major as in the ws kernel).
template <int kSteps>
__device__ __forceinline__ float pv_groups(int groups, uint64_t a0, uint64_t v0) {
  float o[128] = {};
  for (int g = 0; g < groups; ++g) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      ss_m64n256k16_bf16(o, a0 + ((kk * 32) >> 4), v0 + (((kk & 1) * 16 * 128) >> 4));
    }
    wgmma_commit();
    wgmma_wait<0>();
  }
  fence_registers(o);
  float sum = 0.0f;
  for (float x : o) sum += x;
  return sum;
}
#endif

__global__ void __launch_bounds__(kProbeThreads, 1)
    wgmma_probe_kernel(int sequence, int groups, long long* cycles) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = nullptr;
  const uint32_t base = aligned_smem(smem_raw, smem);
  for (int i = static_cast<int>(threadIdx.x); i < kProbeSmemBytes / 16; i += kProbeThreads) {
    reinterpret_cast<uint4*>(smem)[i] = make_uint4(0, 0, 0, 0);
  }
  fence_proxy_async();  // the zeros, visible to the tensor cores
  __syncthreads();
  const int wg = static_cast<int>(threadIdx.x) / 128;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const bool s_role = wg == 0 && sequence != kPv32;
  const bool pv_role = wg > 0 && (sequence == kPv32 || sequence == kMix32 || sequence == kMix64);
  // The ws kernel's register split.
  if (wg == 0) {
    regs_increase<Ws::kSoftmaxRegs>();
  } else {
    regs_decrease<Ws::kOutputRegs>();
  }
  float sink = 0.0f;
  long long start = clock64();
  if (s_role) {
    uint32_t qa[kRegSteps][4];
    const uint32_t* words = reinterpret_cast<const uint32_t*>(smem);
#pragma unroll
    for (int k = 0; k < kRegSteps; ++k) {
#pragma unroll
      for (int i = 0; i < 4; ++i) qa[k][i] = words[(k * 4 + i) * 32 + lane];
    }
    const uint64_t a0 = descriptor(base, 16, 1024);              // Q: 64 rows x 128 bytes
    const uint64_t b0 = descriptor(base + 32 * 1024, 16, 1024);  // K: tokens x 128 bytes
    start = clock64();
    switch (sequence) {
      case kSn32Ss:
        sink = s_groups<32, 0>(groups, qa, a0, b0);
        break;
      case kSn64:
      case kMix64:
        sink = s_groups<64, kN64RegSteps>(groups, qa, a0, b0);
        break;
      case kSn64Ss:
        sink = s_groups<64, 0>(groups, qa, a0, b0);
        break;
      default:
        sink = s_groups<32, kRegSteps>(groups, qa, a0, b0);
        break;
    }
  } else if (pv_role) {
    const uint64_t a0 = descriptor(base, 16, 1024);                     // P: 64 rows x 128 bytes
    const uint64_t v0 = descriptor(base + wg * 16 * 1024, 4096, 1024);  // V: 256 columns
    start = clock64();
    sink = sequence == kMix64 ? pv_groups<4>(groups, a0, v0) : pv_groups<2>(groups, a0, v0);
  }
  const long long end = clock64();
  if ((threadIdx.x & 127) == 0) {
    cycles[blockIdx.x * 3 + wg] = s_role || pv_role ? end - start : 0;
  }
  if (sink != 0.0f) cycles[blockIdx.x * 3 + wg] = -1;  // zeros in, zeros out: keeps the products
#else
  (void)sequence;
  (void)groups;
  if (threadIdx.x == 0) cycles[blockIdx.x * 3] = -2;  // no sm_90a code in this binary
#endif
}

struct SequenceInfo {
  const char* name;
  const char* role;
  int wgmmas;
  double flops;
};

SequenceInfo info(int sequence) {
  constexpr double kS32 = 2.0 * 64 * 32 * 16 * 36, kS64 = 2.0 * kS32;
  constexpr double kPv = 2.0 * 64 * 256 * 16;  // one m64n256k16
  switch (sequence) {
    case kSn32:
      return {"28 RS + 8 SS m64n32k16", "S of a 32-token tile (ws kernel, WG 0)", 36, kS32};
    case kSn32Ss:
      return {"36 SS m64n32k16", "S of a 32-token tile, Q from shared memory", 36, kS32};
    case kSn64:
      return {"20 RS + 16 SS m64n64k16", "S of a 64-token tile", 36, kS64};
    case kSn64Ss:
      return {"36 SS m64n64k16", "S of a 64-token tile, Q from shared memory", 36, kS64};
    case kPv32:
      return {"2 x 2 SS m64n256k16", "P V of a 32-token tile (WG 1 and WG 2)", 4, 4 * kPv};
    case kMix32:
      return {"S n32 beside 2 x 2 n256", "a 32-token tile of the ws kernel", 40, kS32 + 4 * kPv};
    default:
      return {"S n64 beside 2 x 4 n256", "a 64-token tile", 44, kS64 + 8 * kPv};
  }
}

}  // namespace

std::vector<WgmmaRate> probe_wgmma_rates(void* stream_handle) {
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  int device = 0, major = 0, sms = 0;
  cudaFuncAttributes attributes{};
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      major != 9 || cudaFuncGetAttributes(&attributes, wgmma_probe_kernel) != cudaSuccess ||
      attributes.binaryVersion < 90) {
    cudaGetLastError();  // a failed query leaves nothing behind
    return {};
  }
  PA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  PA_CUDA_CHECK(cudaFuncSetAttribute(
      wgmma_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kProbeSmemBytes + 1024));
  DeviceBuffer cycles(sizeof(long long) * 3 * static_cast<size_t>(sms));
  std::vector<long long> host(3 * static_cast<size_t>(sms));
  constexpr int kGroups = 512;
  std::vector<WgmmaRate> rates;
  for (int sequence = 0; sequence < kSequences; ++sequence) {
    for (int groups : {8, kGroups}) {  // a warm-up launch, then the measured one
      wgmma_probe_kernel<<<sms, kProbeThreads, kProbeSmemBytes + 1024, stream>>>(
          sequence, groups, cycles.as<long long>());
      check_launch("wgmma_probe_kernel");
    }
    PA_CUDA_CHECK(cudaMemcpyAsync(host.data(), cycles.data(), cycles.bytes(),
                                  cudaMemcpyDeviceToHost, stream));
    PA_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<long long> per_cta(static_cast<size_t>(sms));
    for (int c = 0; c < sms; ++c) {
      per_cta[c] = std::max({host[3 * c], host[3 * c + 1], host[3 * c + 2]});
    }
    std::nth_element(per_cta.begin(), per_cta.begin() + sms / 2, per_cta.end());
    const SequenceInfo s = info(sequence);
    WgmmaRate rate;
    rate.name = s.name;
    rate.role = s.role;
    rate.wgmmas = s.wgmmas;
    rate.flops = s.flops;
    rate.cycles = static_cast<double>(per_cta[sms / 2]) / kGroups;
    rate.ideal_cycles = s.flops / 4096.0;
    rates.push_back(rate);
  }
  return rates;
}

}  // namespace pagedattn::cuda::mla
