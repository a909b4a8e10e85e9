// Launch of the CUDA MLA kernels: the kernel for the cache dtype and row block over the split-KV
// partition, then the merge of split requests. No fmt here (nvcc host passes cannot compile it);
// launch failures become pagedattn::Error through check_launch.
//
// Kernel choice (the rule; launch_mla applies it, bench/RESULTS.md has the figures):
//   bf16 cache, 64-row blocks, a 9.x device with the binary's sm_90a code: the warp-specialized
//     wgmma kernel (kernel_sm90_ws.cuh);
//   bf16 cache, 16-row blocks (requests of <= 16 rows): the read-bound kernel (kernel_small.cuh),
//     on 9.x devices in clusters of CTAs where mla_cluster_limit allows and the batch leaves SMs;
//   everything else (fp8 caches, sm_80): the general mma.sync kernel (kernel.cuh, templated on the
//     row block).
// PAGEDATTN_MLA_KERNEL=mma forces the general kernel on bf16 too: the sm_80 path, tested on the
// Hopper test machine (tests/cuda/mla_test.cpp, CudaMlaOtherKernel); PAGEDATTN_MLA_KERNEL=seesaw
// runs the two-sided kernel (kernel_sm90_seesaw.cuh) where the warp-specialized one would: opt-in
// until it leads on every row (bench/RESULTS.md, under the MLA table); at page sizes that are a
// multiple of 64 it loads whole 64-token tiles by the copy engine (tensor maps encoded here, once
// per cache; PAGEDATTN_MLA_TMA=0 turns that off). Every PAGEDATTN_* switch is
// listed in ARCHITECTURE.md ("Switches"). Every kernel goes through launch_kernel (cuda/launch.h):
// programmatic dependent launch on 9.x devices, beside the cluster dimension where there is one.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "cuda/cuda_check.h"
#include "cuda/launch.h"
#include "cuda/mla/config.h"
#include "cuda/mla/kernel.cuh"
#include "cuda/mla/kernel_sm90_seesaw.cuh"
#include "cuda/mla/kernel_sm90_ws.cuh"
#include "cuda/mla/kernel_small.cuh"

namespace pagedattn::cuda::mla {
namespace {

template <class KVT, int kRows>
void launch_mma(const MlaParams& params, int grid_items, int row_blocks, cudaStream_t stream) {
  // Once per process and instantiation: the shared-memory opt-in beyond 48 KiB.
  static const cudaError_t attribute_status = cudaFuncSetAttribute(
      mla_kernel<KVT, kRows>, cudaFuncAttributeMaxDynamicSharedMemorySize, Smem<kRows>::kBytes);
  PA_CUDA_CHECK(attribute_status);
  launch_kernel(mla_kernel<KVT, kRows>, dim3(row_blocks, grid_items), kThreads, Smem<kRows>::kBytes,
                stream, params);
  check_launch("mla_kernel");
}

// PAGEDATTN_MLA_KERNEL=mma|seesaw (ARCHITECTURE.md, "Switches"): read once per call, so tests
// can switch.
enum class Forced { kNone, kMma, kSeesaw };
Forced forced_kernel() {
  const char* env = std::getenv("PAGEDATTN_MLA_KERNEL");
  if (env == nullptr) return Forced::kNone;
  if (std::strcmp(env, "mma") == 0) return Forced::kMma;
  if (std::strcmp(env, "seesaw") == 0) return Forced::kSeesaw;
  return Forced::kNone;
}

// The warp-specialized kernel (sm_90a code), checked once.
bool sm90_available() {
  static const bool available =
      hopper_code(reinterpret_cast<const void*>(sm90ws::mla_kernel_sm90_ws));
  return available;
}
// Clusters for the H <= 16 kernel: its sm_90 code on a 9.x device, checked once.
bool small_clusters_available() {
  static const bool available =
      hopper_code(reinterpret_cast<const void*>(small::mla_kernel_small));
  return available;
}

// The H <= 16 kernel's launch configuration on `grid`, in clusters of (1, cluster) CTAs when
// cluster > 1 (`attribute` holds the cluster dimension the configuration points to); the kernel's
// shared-memory opt-in, once per process.
cudaLaunchConfig_t small_config(dim3 grid, int cluster, cudaStream_t stream,
                                cudaLaunchAttribute& attribute) {
  static const cudaError_t attribute_status = cudaFuncSetAttribute(
      small::mla_kernel_small, cudaFuncAttributeMaxDynamicSharedMemorySize, small::Tile::kBytes);
  PA_CUDA_CHECK(attribute_status);
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = small::Tile::kBytes;
  config.stream = stream;
  attribute = cudaLaunchAttribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = 1;
  attribute.val.clusterDim.y = static_cast<unsigned>(cluster);
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = cluster > 1 ? 1 : 0;
  return config;
}

// grid.y = grid_items * params.cluster.
void launch_small(const MlaParams& params, int grid_items, int row_blocks, cudaStream_t stream) {
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config = small_config(
      dim3(row_blocks, grid_items * params.cluster), params.cluster, stream, attribute);
  launch_kernel(config, small::mla_kernel_small, params);
  check_launch("mla_kernel_small");
}

void launch_sm90_ws(const MlaParams& params, int grid_items, int row_blocks,
                    cudaStream_t stream) {
  static const cudaError_t attribute_status =
      cudaFuncSetAttribute(sm90ws::mla_kernel_sm90_ws, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           sm90ws::Ws::kSmemBytes);
  PA_CUDA_CHECK(attribute_status);
  launch_kernel(sm90ws::mla_kernel_sm90_ws, dim3(row_blocks, grid_items), sm90ws::Ws::kThreads,
                sm90ws::Ws::kSmemBytes, stream, params);
  check_launch("mla_kernel_sm90_ws");
}

// The driver's tensor-map encoder, through the runtime (no link against libcuda); null where the
// driver has none.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// `base` (bf16, `dim` columns of a token, tokens `stride_token` and alloc pages `stride_page`
// elements apart) as a 3-D tensor map {dim, alloc page tokens, alloc pages} with boxes of 64
// columns x 64 tokens x 1 page in the 128-byte swizzle (the seesaw kernel's stage layout) into
// `out`; false where the copy engine cannot address it (alignment, strides) or the driver has no
// encoder.
bool encode_latent_map(unsigned char (&out)[128], const void* base, int dim, int64_t stride_token,
                       int64_t stride_page, int64_t alloc_tokens, int64_t alloc_pages) {
  static_assert(sizeof(CUtensorMap) == 128, "MlaParams holds a tensor map in 128 bytes");
  PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr || base == nullptr || alloc_pages <= 0 || alloc_tokens < 64) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(dim), static_cast<cuuint64_t>(alloc_tokens),
                              static_cast<cuuint64_t>(alloc_pages)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(stride_token) * 2,
                                 static_cast<cuuint64_t>(stride_page) * 2};
  const cuuint32_t box[3] = {64, 64, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  CUtensorMap map;
  if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims, strides,
             box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    return false;
  }
  std::memcpy(out, &map, sizeof(map));
  return true;
}

// p.tma_ckv / p.tma_kpe for p's cache (whole pages of a multiple of 64 tokens); false where they
// cannot be made. A cache's maps are encoded once and kept while the same cache comes back (one
// per host thread: the layers of a step all read the same pool), not on every launch.
bool latent_maps(MlaParams& p) {
  struct Cache {
    const void* ckv;
    const void* kpe;
    int64_t ckv_stride_token, ckv_stride_page, kpe_stride_token, kpe_stride_page;
    int64_t alloc_tokens, alloc_pages;
    bool operator==(const Cache&) const = default;
  };
  const int64_t alloc_tokens = int64_t{p.page_size} * p.pages_per_alloc;
  const Cache key{p.ckv,
                  p.kpe,
                  p.ckv_stride_token,
                  p.ckv_stride_page,
                  p.kpe_stride_token,
                  p.kpe_stride_page,
                  alloc_tokens,
                  (int64_t{p.guard.pool_pages} + p.pages_per_alloc - 1) / p.pages_per_alloc};
  thread_local bool have = false, ok = false;
  thread_local Cache last{};
  thread_local unsigned char ckv_map[128], kpe_map[128];
  if (!have || !(last == key)) {
    ok = encode_latent_map(ckv_map, key.ckv, kRank, key.ckv_stride_token, key.ckv_stride_page,
                           key.alloc_tokens, key.alloc_pages) &&
         encode_latent_map(kpe_map, key.kpe, kRope, key.kpe_stride_token, key.kpe_stride_page,
                           key.alloc_tokens, key.alloc_pages);
    last = key;
    have = true;
  }
  if (!ok) return false;
  std::memcpy(p.tma_ckv, ckv_map, sizeof(ckv_map));
  std::memcpy(p.tma_kpe, kpe_map, sizeof(kpe_map));
  return true;
}

// PAGEDATTN_MLA_TMA=0 (ARCHITECTURE.md, "Switches"): the seesaw kernel gathers every tile with
// cp.async, as at page sizes that are not a multiple of 64.
bool tma_allowed() {
  const char* env = std::getenv("PAGEDATTN_MLA_TMA");
  return env == nullptr || std::strcmp(env, "0") != 0;
}

void launch_sm90_seesaw(const MlaParams& params, int grid_items, int row_blocks,
                        cudaStream_t stream) {
  static const cudaError_t attribute_status =
      cudaFuncSetAttribute(seesaw::mla_kernel_sm90_seesaw,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, seesaw::Layout::kSmemBytes);
  PA_CUDA_CHECK(attribute_status);
  // The fast path where attention pages hold whole 64-token tiles: ckv and kpe as tensor maps.
  MlaParams p = params;
  p.tma = p.page_size % 64 == 0 && tma_allowed() && latent_maps(p) ? 1 : 0;
  launch_kernel(seesaw::mla_kernel_sm90_seesaw, dim3(row_blocks, grid_items),
                seesaw::Layout::kThreads, seesaw::Layout::kSmemBytes, stream, p);
  check_launch("mla_kernel_sm90_seesaw");
}

}  // namespace

// Clusters of 2 by default: on the H200, H 16 64 x 16384 (2 CTAs a request) took 290.9 us in
// clusters against 297.8 us split in two items and merged; clusters of 8 (16 x 1024, 16 x 4096)
// were far slower (27.6 / 52.9 us against 17.5 / 38.2), as if not all sixteen clusters of eight
// one-CTA-per-SM CTAs fit on the GPU at once (bench/RESULTS.md, session 6, run 7).
constexpr int kDefaultClusterLimit = 2;

int mla_cluster_limit(bool fp8_kv) {
  if (fp8_kv || forced_kernel() == Forced::kMma || !small_clusters_available()) return 1;
  // PAGEDATTN_MLA_CLUSTER=N (ARCHITECTURE.md, "Switches"): read per call, so tests can switch.
  const char* env = std::getenv("PAGEDATTN_MLA_CLUSTER");
  if (env == nullptr || *env == '\0') return kDefaultClusterLimit;
  const int limit = std::atoi(env);
  return std::clamp(limit, 1, small::kMaxCluster);
}

std::vector<std::pair<int, int>> small_cluster_occupancy() {
  std::vector<std::pair<int, int>> out;
  if (!small_clusters_available()) return out;
  for (int cluster = 2; cluster <= small::kMaxCluster; cluster *= 2) {
    cudaLaunchAttribute attribute;
    const cudaLaunchConfig_t config =
        small_config(dim3(1, static_cast<unsigned>(cluster)), cluster, nullptr, attribute);
    int clusters = 0;
    PA_CUDA_CHECK(cudaOccupancyMaxActiveClusters(
        &clusters, reinterpret_cast<const void*>(small::mla_kernel_small), &config));
    out.emplace_back(cluster, clusters);
  }
  return out;
}

void launch_mla(const MlaParams& params, bool fp8_kv, int block_rows, int grid_items,
                int row_blocks, bool merge, int merge_rows, void* stream) {
  auto cuda_stream = static_cast<cudaStream_t>(stream);
  // The looping kernels take up to 65535 row blocks in grid.x (a CTA loops over the rest).
  const int grid_rows = std::min(row_blocks, 65535);
  // The rule (see the file comment): fp8 or PAGEDATTN_MLA_KERNEL=mma -> mma.sync; else 16-row
  // blocks -> the read-bound kernel, 64-row blocks -> the warp-specialized kernel where its sm_90a
  // code runs, mma.sync elsewhere (sm_80).
  const Forced forced = forced_kernel();
  const bool general = fp8_kv || forced == Forced::kMma;
  if (block_rows == 16) {
    if (params.cluster > 1) {  // planned for the H <= 16 kernel (mla_cluster_limit)
      launch_small(params, grid_items, grid_rows, cuda_stream);
    } else if (fp8_kv) {
      launch_mma<__nv_fp8_e4m3, 16>(params, grid_items, grid_rows, cuda_stream);
    } else if (general) {
      launch_mma<__nv_bfloat16, 16>(params, grid_items, grid_rows, cuda_stream);
    } else {
      launch_small(params, grid_items, grid_rows, cuda_stream);
    }
  } else if (fp8_kv) {
    launch_mma<__nv_fp8_e4m3, 64>(params, grid_items, grid_rows, cuda_stream);
  } else if (!general && sm90_available()) {
    // One row block per CTA, all of them in grid.x (up to 2^31 - 1 blocks: no loop needed). The
    // two-warpgroup kernel that took grids past 65535 row blocks lost to this one 1.22-1.25x
    // everywhere measured and is retired (bench/RESULTS.md, "Tried and retired").
    if (forced == Forced::kSeesaw) {
      launch_sm90_seesaw(params, grid_items, row_blocks, cuda_stream);
    } else {
      launch_sm90_ws(params, grid_items, row_blocks, cuda_stream);
    }
  } else {
    launch_mma<__nv_bfloat16, 64>(params, grid_items, grid_rows, cuda_stream);
  }
  if (merge) {
    launch_kernel(mla_merge_kernel, dim3(params.batch_size, merge_rows), kMergeThreads, 0,
                  cuda_stream, params);
    check_launch("mla_merge_kernel");
  }
}

}  // namespace pagedattn::cuda::mla
