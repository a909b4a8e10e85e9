// Thread block clusters (sm_90): the CTA's rank in its cluster, a barrier over the cluster, and
// reads of another CTA's shared memory (distributed shared memory). Used by MLA's H <= 16 kernel
// (mla/kernel_small.cuh) and the tensor-core decode kernel's cluster split
// (decode/decode_tc_kernel.cuh). Compiled for an older architecture the helpers trap: the
// launchers ask for clusters only where the kernel has sm_90 code (hopper_code, cuda/launch.h).
#pragma once

#include <cstdint>

namespace pagedattn::cuda {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define PAGEDATTN_NO_CLUSTERS  // the helpers trap (no launcher asks for a cluster there)
#endif
// This CTA's rank in its cluster (blockIdx.x % clusterDim.x for a cluster along x).
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t rank = 0;
#ifdef PAGEDATTN_NO_CLUSTERS
  __trap();
#else
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
#endif
  return rank;
}
// Every thread of the cluster's CTAs: shared memory writes before it are visible to the cluster's
// reads after it.
__device__ __forceinline__ void cluster_sync() {
#ifdef PAGEDATTN_NO_CLUSTERS
  __trap();
#else
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
#endif
}
// The address of this CTA's shared memory address `addr` in the CTA of rank `rank`.
__device__ __forceinline__ uint32_t map_cluster(uint32_t addr, int rank) {
  uint32_t out = addr;
#ifdef PAGEDATTN_NO_CLUSTERS
  (void)rank;
  __trap();
#else
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(addr), "r"(rank));
#endif
  return out;
}
// A load from a distributed shared memory address (map_cluster's).
__device__ __forceinline__ float ld_cluster_f32(uint32_t addr) {
  float v = 0.0f;
#ifdef PAGEDATTN_NO_CLUSTERS
  (void)addr;
  __trap();
#else
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
#endif
  return v;
}
__device__ __forceinline__ float4 ld_cluster_f32x4(uint32_t addr) {
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#ifdef PAGEDATTN_NO_CLUSTERS
  (void)addr;
  __trap();
#else
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
#endif
  return v;
}

#undef PAGEDATTN_NO_CLUSTERS

}  // namespace pagedattn::cuda
