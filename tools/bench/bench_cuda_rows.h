// The hook through which `pagedattn bench decode|prefill|mla|plan --device cuda` runs the issues'
// rows on device-generated data (tools/bench/cuda/bench_cuda_device.h). bench_attention.cpp defines
// a weak default that says the CUDA benchmarks are not built in; bench_cuda_rows.cpp (CUDA builds
// only) overrides it. Plain C++: no CUDA types, so the driver compiles in every build.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/bench/bench_rows.h"

namespace pagedattn::tools {

enum class CudaBench : uint8_t { kDecode, kPrefill, kMla, kPlan };

// What the command line asked for; empty / 0 fields mean "the defaults".
struct CudaRowsOptions {
  CudaBench bench = CudaBench::kDecode;
  std::vector<BatchLen> rows;       // parse_batch_lens(); prefill also BxQ/L and raggedB/L
  std::vector<int32_t> heads;       // MLA: query heads (default 128 and 16)
  std::vector<int32_t> page_sizes;  // default: decode/prefill 16,1; MLA 64,1; plan 1,16,64
  int32_t reps = 0;                 // timed samples per figure (median)
  bool causal = true;               // prefill
  bool fp8_kv = false;              // prefill: also each row over an fp8 e4m3 cache, beside bf16
  // prefill: the shape (0: the issue's, 32 / 8 heads, head_dim 128; its targets apply to it only)
  int32_t qo_heads = 0, kv_heads = 0, head_dim = 0;
  bool graphs = true;               // decode: also the CUDA-graph step timing
  // How the L2 is flushed before each timed sample: "clean" (a 256 MiB streaming read: the L2
  // ends holding clean lines of another buffer), "dirty" (a 256 MiB memset: the L2 ends full of
  // dirty lines, written back to DRAM inside the timed call), or "off".
  std::string l2_flush = "clean";
  // plan: the grid (defaults: B 1,16,64,256,1024; kv_len 1024,8192,32768; block form; A 64).
  std::vector<int32_t> batches, kv_lens;
  std::vector<std::string> forms;
  int32_t alloc_page_size = 64;
  std::string json_path;
};

// What happened: ran = false with the reason when the rows could not run at all ("no usable
// CUDA device: ...", or a build without CUDA). Errors in the options throw pagedattn::Error.
struct CudaRowsStatus {
  bool ran = false;
  std::string note;
};

CudaRowsStatus run_cuda_rows(const CudaRowsOptions& options);

}  // namespace pagedattn::tools
