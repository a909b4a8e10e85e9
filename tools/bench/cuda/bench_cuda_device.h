// The CUDA benchmarks on data generated ON THE DEVICE (CUDA builds only), shared by the command
// line (`pagedattn bench decode|prefill|mla|plan --device cuda`,
// tools/bench/cuda/bench_cuda_rows.cpp) and pagedattn_bench_cuda_decode
// (tools/bench/cuda/bench_cuda_decode_main.cpp).
//
// The issues' rows hold up to 34 GB of KV: far too much for a host-generated case. Here one
// cache buffer sized for the largest row is filled once with random values by a device kernel
// (src/cuda/fill.h; never zeros, which run faster than real data), and each (row, page size)
// views its first pages. Every row's attention pages are a random permutation of the pool (the
// metadata is built on the host with a seeded generator and copied in), so the kernels gather
// scattered pages as in a serving engine. Each row is planned once; then run_* alone is timed
// with CUDA events, the L2 flushed before every sample (median_device_ns, bench_cuda_util.h).
// After timing, the row's lse is copied back and checked finite (a cheap guard against a broken
// kernel posting a fast time).
//
// Every bench_* function prints its table on stdout and returns its rows as JSON.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "cuda/workspace.h"
#include "pagedattn/backend.h"
#include "tools/bench/bench_rows.h"
#include "tools/bench/cuda/bench_cuda_util.h"

namespace pagedattn::tools {

// A host int32 array copied to the device, with its view.
struct DeviceI32 {
  cuda::DeviceBuffer buffer;
  TensorView view;
  DeviceI32() = default;
  explicit DeviceI32(const std::vector<int32_t>& host);
};

// The step metadata of requests with q_lens[i] query rows over kv_lens[i] tokens in pages of P
// tokens, on the device. Attention pages: a random permutation of [0, num_pages) where
// num_pages = sum of ceil(kv_len / P) (so the cache needs exactly num_pages pages).
struct DeviceStep {
  DeviceI32 qo_indptr, kv_indptr, kv_indices, kv_last_page_len;
  StepMetadata meta;
  int64_t num_pages = 0;
  int64_t num_rows = 0;  // sum of q_lens
};
DeviceStep make_device_step(const std::vector<int32_t>& q_lens, const std::vector<int32_t>& kv_lens,
                            int32_t page_size, std::mt19937_64& rng);

// A device buffer of `elements` bf16 values uniform in [-1, 1), generated on the device.
cuda::DeviceBuffer random_bf16(int64_t elements, uint64_t seed, void* stream);

// Copies `count` f32 from the device (after the stream's work) and returns how many are not
// finite (every benchmark request has KV, so no lse may be -inf).
int64_t count_not_finite(const void* device_f32, int64_t count, void* stream);

// Prints the ceilings measured in this run (one paragraph) and returns them as JSON.
nlohmann::json print_ceilings(const CudaCeilings& ceilings);

// The target of a row in the issues (0 = none), for the "target" column: issue 18's, as
// bench/targets.json holds them (the RESULTS tables read that file).
double issue_target(std::string_view bench, int32_t heads, const BatchLen& row);

// ---- issue 4: decode, Llama-3-8B shape (Hq 32, Hkv 8, D 128, bf16, NHD) ----
struct DecodeRowsConfig {
  std::vector<BatchLen> rows;       // default: the issue's six
  std::vector<int32_t> page_sizes;  // default: 16, 1 (P 1 compared with the first)
  int32_t reps = 20;
};
DecodeRowsConfig default_decode_rows();
nlohmann::json bench_decode_rows(const DecodeRowsConfig& config, const CudaCeilings& ceilings,
                                 void* stream);

// The decode step as an engine runs it: plan once, then 32 layers' decode (P 16), one CUDA graph
// per step vs the same launches made eagerly; host time and GPU wall time per step, per row.
struct GraphRow {
  int32_t batch = 1;
  int32_t kv_len = 1024;
};
// Issue 18's rows: B 1 x 1024 (the one with a target), B 1 x 4096, B 8 x 1024, B 64 x 1024.
std::vector<GraphRow> default_graph_rows();
nlohmann::json bench_decode_graphs(const std::vector<GraphRow>& rows, void* stream);

// ---- issue 4: prefill, causal, Hq 32 / Hkv 8, D 128, bf16 ----
struct PrefillRowsConfig {
  // default: 1x8192, 1x32768, ragged16/4096, then the extend rows 1x512/8192, 1x512/32768,
  // 8x256/8192 (printed in a table of their own)
  std::vector<BatchLen> rows;
  std::vector<int32_t> page_sizes;  // default: 16, 1
  bool causal = true;
  bool fp8_kv = false;  // each (row, P) also over an fp8 e4m3 cache, timed right after bf16's
  int32_t reps = 10;
  // The shape; the issue's targets are printed for the issue's shape (32 / 8, head_dim 128) only.
  int32_t qo_heads = 32, kv_heads = 8, head_dim = 128;
};
PrefillRowsConfig default_prefill_rows();
nlohmann::json bench_prefill_rows(const PrefillRowsConfig& config, const CudaCeilings& ceilings,
                                  void* stream);

// ---- issue 5: MLA decode over a bf16 latent cache [pages, P, 576] ----
struct MlaRowsConfig {
  std::vector<int32_t> heads;       // default: 128, 16
  std::vector<BatchLen> rows;       // empty: per heads, the issue's rows (see default_mla_rows)
  std::vector<int32_t> page_sizes;  // default: 64, 1
  int32_t reps = 20;
};
std::vector<BatchLen> default_mla_rows(int32_t heads);
nlohmann::json bench_mla_rows(const MlaRowsConfig& config, const CudaCeilings& ceilings,
                              void* stream);
// The tensor-core instruction rates behind the sm_90a MLA kernels (cuda/mla/wgmma_probe.h),
// printed as a table; [] where the device or binary has no sm_90a.
nlohmann::json bench_wgmma_rates(void* stream);
// How many clusters of 2, 4 and 8 CTAs of the H <= 16 MLA kernel the device runs at once (the
// cluster path takes every request of a batch in one cluster): printed, and returned as JSON.
nlohmann::json bench_cluster_occupancy();

// ---- issue 4: host planner vs GPU planner on the same table ----
struct PlannerBenchConfig {
  std::vector<int32_t> batches{1, 16, 64, 256, 1024};
  std::vector<int32_t> kv_lens{1024, 8192, 32768};
  std::vector<int32_t> page_sizes{1, 16, 64};
  std::vector<std::string> forms{"block"};  // block and/or slot
  int32_t alloc_page_size = 64;
  int32_t reps = 10;
};
nlohmann::json bench_planner(const PlannerBenchConfig& config, void* stream);

}  // namespace pagedattn::tools
