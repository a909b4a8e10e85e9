// Tests of the CUDA prefill / extend kernel (src/cuda/prefill*): every element of out and lse
// against the float64 reference (tests/reference) and, where it serves the case, the CPU backend,
// over the shared paged cases (tests/common/cases.h: NaN in every slot that holds no token,
// shuffled pages), fresh seeds, outputs poisoned before each run. Parametrized over dtype (q and
// KV; KV of q's dtype or fp8 e4m3 with its scales) x head dims x group size x page size x causal,
// plus corner cases (padding, empty KV, one long request, HND, allocation pages larger than P,
// soft-cap, sliding window, split KV; the same for an fp8 cache), page-size invariance (bitwise),
// fp8 widened exactly (an fp8 cache and a bf16 / f16 cache of the same values agree), and
// argument errors. Skips, saying why, where no CUDA device is usable (CI).
//
// fp8 e4m3 caches: the reference dequantises each byte with fp8e4m3_to_float (checked against a
// float64 decode of every bit pattern in tests/core/dtype_test.cpp, not the kernels' device
// conversion) times the cache's k_scale / v_scale. The kernels widen the fp8 tiles to q's dtype
// exactly (every e4m3 value is a bf16 and an f16 value) and apply the scales in f32 (K's folded
// into sm_scale: one more f32 rounding of the logits, ~2^-24 relative; V's in the final 1 / l),
// so their error has the bf16 / f16 path's sources and size: P rounded to 16 bits for the P V
// product, f32 accumulation, the output's rounding. The bounds below (tolerance_for,
// gpu_row_tolerance, kLseTolerance) are therefore the same for both caches.
#include "cuda/prefill.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "common/cases.h"
#include "common/gpu_skip.h"
#include "common/scoped_env.h"
#include "common/test_util.h"
#include "cpu/cpu_backend.h"
#include "cuda/cuda_test_util.h"
#include "cuda/workspace.h"
#include "pagedattn/error.h"
#include "reference/reference.h"

namespace pagedattn::cuda {
namespace {

using testing::AttentionCase;
using testing::CaseSpec;
using testing::ScopedEnv;

// Empty when a CUDA device is usable, else why not (CI: "CUDA driver version is insufficient").
std::string gpu_missing() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status);
  }
  return count > 0 ? std::string() : std::string("no CUDA device");
}

#define SKIP_WITHOUT_GPU() PA_SKIP_OR_FAIL_WITHOUT_GPU(gpu_missing())

void check_cuda(cudaError_t status, const char* what) {
  ASSERT_EQ(status, cudaSuccess) << what << ": " << cudaGetErrorString(status);
}

// Device copies of host views (same shape and strides), freed with the mirror.
class DeviceMirror {
 public:
  ~DeviceMirror() {
    for (void* p : buffers_) cudaFree(p);
  }
  // Copies the whole extent of `view` (element 0 .. the last addressed one) to the device.
  TensorView copy(const TensorView& view) {
    if (!view.defined()) return view;
    TensorView out = view;
    const size_t bytes = extent_bytes(view);
    void* device = nullptr;
    if (cudaMalloc(&device, bytes == 0 ? 16 : bytes) != cudaSuccess) {
      throw Error("cudaMalloc failed in the test");
    }
    buffers_.push_back(device);
    if (bytes > 0 && cudaMemcpy(device, view.data, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
      throw Error("cudaMemcpy to the device failed in the test");
    }
    out.data = device;
    out.device = Device::cuda(0);
    return out;
  }
  // A device buffer like `view` filled with 0xff bytes (NaN in every float dtype).
  TensorView poisoned(const TensorView& view) {
    TensorView out = copy(view);
    if (out.defined() && cudaMemset(out.data, 0xff, extent_bytes(view)) != cudaSuccess) {
      throw Error("cudaMemset failed in the test");
    }
    return out;
  }
  static void copy_back(const TensorView& device, const TensorView& host) {
    if (!host.defined()) return;
    if (cudaMemcpy(host.data, device.data, extent_bytes(host), cudaMemcpyDeviceToHost) !=
        cudaSuccess) {
      throw Error("cudaMemcpy to the host failed in the test");
    }
  }
  static size_t extent_bytes(const TensorView& view) {
    if (view.numel() == 0) return 0;
    int64_t last = 0;
    for (int d = 0; d < view.ndim; ++d) last += (view.shape[d] - 1) * view.strides[d];
    return static_cast<size_t>((last + 1) * dtype_size(view.dtype));
  }

 private:
  std::vector<void*> buffers_;
};

// Device versions of a case's prefill arguments; out and lse poisoned.
PrefillArgs to_device(const PrefillArgs& host, DeviceMirror& mirror) {
  PrefillArgs args = host;
  args.q = mirror.copy(host.q);
  args.kv.k = mirror.copy(host.kv.k);
  args.kv.v = mirror.copy(host.kv.v);
  args.meta.qo_indptr = mirror.copy(host.meta.qo_indptr);
  args.meta.kv_indptr = mirror.copy(host.meta.kv_indptr);
  args.meta.kv_indices = mirror.copy(host.meta.kv_indices);
  args.meta.kv_last_page_len = mirror.copy(host.meta.kv_last_page_len);
  args.out = mirror.poisoned(host.out);
  args.lse = mirror.poisoned(host.lse);
  args.stream = nullptr;
  return args;
}

CudaWorkspace& workspace() {
  static CudaWorkspace ws{WorkspaceLimits{}};
  return ws;
}

// Runs the case on the GPU, leaves the results in the case's host out/lse, returns them.
struct Result {
  std::vector<double> out, lse;
};
// The kernels each case runs: "" the default choice, else PAGEDATTN_PREFILL_KERNEL's value
// (launch.cuh): "mma" the mma.sync kernel, "sm90" the one-warpgroup wgmma kernel, "ws" the
// warp-specialized kernel without turns (the default on Hopper for head dim 128 over a bf16 / f16
// cache is its "ws-pingpong" schedule). Where a forced kernel does not apply (the
// warp-specialized ones: other head dims, fp8 caches) the launcher falls back to the next.
// PAGEDATTN_TEST_PREFILL_KERNELS (a comma-separated list of those values) replaces the list.
std::vector<std::string> kernels_under_test() {
  // ws-persistent-3: the warp-specialized kernel on 3 persistent CTAs, each taking many units.
  std::vector<std::string> list = {"mma", "sm90", "ws", "ws-persistent-3", ""};
  if (const char* env = std::getenv("PAGEDATTN_TEST_PREFILL_KERNELS")) {
    list.clear();
    std::string all = env;
    for (size_t begin = 0; begin <= all.size();) {
      const size_t end = std::min(all.find(',', begin), all.size());
      list.push_back(all.substr(begin, end - begin));
      begin = end + 1;
    }
  }
  return list;
}
const std::vector<std::string> kKernelList = kernels_under_test();

// `kernel`: one of kernels_under_test()'s values.
// `drop_hint` clears meta.max_q_len (the grid is then bounded by T and B alone).
Result run_gpu_args(const PrefillArgs& host, const char* kernel = "", bool drop_hint = false) {
  DeviceMirror mirror;
  PrefillArgs args = to_device(host, mirror);
  if (drop_hint) args.meta.max_q_len = 0;
  {
    const ScopedEnv force("PAGEDATTN_PREFILL_KERNEL", std::string(kernel));
    run_prefill(workspace(), args);
  }
  if (cudaDeviceSynchronize() != cudaSuccess) throw Error("prefill kernel failed");
  DeviceMirror::copy_back(args.out, host.out);
  DeviceMirror::copy_back(args.lse, host.lse);
  Result result{testing::to_doubles(host.out), {}};
  if (host.lse.defined()) result.lse = testing::to_doubles(host.lse);
  return result;
}
Result run_gpu(const AttentionCase& c, const char* kernel = "", bool drop_hint = false) {
  return run_gpu_args(c.prefill_args(), kernel, drop_hint);
}

constexpr testing::Tolerance kLseTolerance{2e-4, 2e-4};

// Every kernel (kKernels: each forced one, then the default) vs the float64 reference, then (when
// the CPU backend serves the case) the default vs the CPU backend.
void check_case(const CaseSpec& spec) {
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (PAGEDATTN_TEST_SEED), case " + spec.name());
  const AttentionCase c(spec, seed);
  std::vector<double> ref_lse;
  const std::vector<double> ref = testing::reference_prefill(c.prefill_args(), &ref_lse);
  const testing::Tolerance tolerance = testing::tolerance_for(spec.q_dtype);
  Result gpu;
  for (const std::string& kernel_name : kKernelList) {
    const char* kernel = kernel_name.c_str();
    SCOPED_TRACE(std::string("kernel ") + (*kernel != '\0' ? kernel : "default"));
    gpu = run_gpu(c, kernel);
    EXPECT_EQ(testing::compare(gpu.out, ref, tolerance, "out vs reference"), "");
    EXPECT_EQ(testing::compare_rows(gpu.out, ref, spec.head_dim_vo,
                                    testing::gpu_row_tolerance(spec.q_dtype),
                                    "out vs reference (relative to the row)"),
              "");
    if (spec.with_lse) {
      EXPECT_EQ(testing::compare(gpu.lse, ref_lse, kLseTolerance, "lse"), "");
    }
  }

  auto cpu = cpu::make_backend();
  if (!cpu->supports(c.op_desc())) return;
  const AttentionCase cpu_case(spec, seed);  // same inputs, its own output buffers
  const PrefillArgs cpu_args = cpu_case.prefill_args();
  testing::poison(cpu_args.out);
  if (cpu_args.lse.defined()) testing::poison(cpu_args.lse);
  auto cpu_ws = cpu->create_workspace(WorkspaceLimits{});
  cpu->plan(*cpu_ws, cpu_case.op_desc(), cpu_args.meta);
  cpu->run_prefill(*cpu_ws, cpu_args);
  const testing::Tolerance twice{2 * tolerance.abs, 2 * tolerance.rel};
  EXPECT_EQ(testing::compare(gpu.out, testing::to_doubles(cpu_args.out), twice, "out vs CPU"), "");
  EXPECT_EQ(testing::compare_rows(gpu.out, testing::to_doubles(cpu_args.out), spec.head_dim_vo,
                                  testing::gpu_row_tolerance(spec.q_dtype),
                                  "out vs CPU (relative to the row)"),
            "");
  if (spec.with_lse) {
    EXPECT_EQ(testing::compare(gpu.lse, testing::to_doubles(cpu_args.lse), kLseTolerance,
                               "lse vs CPU"),
              "");
  }
}

// ---- parametrized sweep ----

struct SweepParam {
  DType dtype;  // q and out
  int head_dim_qk, head_dim_vo;
  int group;
  int page_size;
  bool causal;
  DType kv_dtype;  // dtype, or fp8 e4m3
};

std::string sweep_name(const ::testing::TestParamInfo<SweepParam>& info) {
  const SweepParam& p = info.param;
  return std::string(dtype_name(p.dtype)) + "_d" + std::to_string(p.head_dim_qk) + "v" +
         std::to_string(p.head_dim_vo) + "_g" + std::to_string(p.group) + "_P" +
         std::to_string(p.page_size) + (p.causal ? "_causal" : "_full") +
         (p.kv_dtype == DType::kFP8E4M3 ? "_kvfp8" : "");
}

std::vector<SweepParam> sweep_params() {
  std::vector<SweepParam> params;
  const int dims[][2] = {{64, 64}, {128, 128}, {256, 256}, {192, 128}};
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (DType kv : {dtype, DType::kFP8E4M3}) {
      for (const auto& d : dims) {
        for (int page : {1, 16, 64}) {
          for (bool causal : {true, false}) {
            const int group = d[0] == 128 ? 4 : (d[0] == 64 ? 7 : 2);  // 7: a group not 2^k
            params.push_back({dtype, d[0], d[1], group, page, causal, kv});
          }
        }
      }
    }
  }
  for (int group : {1, 3, 8, 16}) {
    params.push_back({DType::kBF16, 128, 128, group, 16, true, DType::kBF16});
  }
  params.push_back({DType::kF16, 128, 128, 8, 16, true, DType::kFP8E4M3});
  return params;
}

// fp8 scales of the tests: K's and V's differ (a swapped pair shows), neither is a power of two
// nor 1, and V / 3 puts most of V's stored values below e4m3's smallest normal (2^-6) or near it,
// so the subnormals' widening is exercised too.
constexpr float kFp8KScale = 0.375f, kFp8VScale = 3.0f;

CaseSpec with_fp8_cache(CaseSpec spec) {
  spec.kv_dtype = DType::kFP8E4M3;
  spec.kv_scale = kFp8KScale;
  spec.v_scale = kFp8VScale;
  return spec;
}

class PrefillSweep : public ::testing::TestWithParam<SweepParam> {};

TEST_P(PrefillSweep, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const SweepParam& p = GetParam();
  CaseSpec spec;
  spec.op = OpKind::kPrefill;
  spec.q_dtype = spec.kv_dtype = p.dtype;
  if (p.kv_dtype == DType::kFP8E4M3) spec = with_fp8_cache(spec);
  spec.head_dim_qk = p.head_dim_qk;
  spec.head_dim_vo = p.head_dim_vo;
  spec.num_kv_heads = 2;
  spec.num_qo_heads = 2 * p.group;
  spec.page_size = p.page_size;
  spec.causal = p.causal;
  // Ragged: an extend over a long prefix, a full prefill crossing tiles, a short extend, a
  // one-token step, and padding.
  spec.kv_lens = {300, 133, 70, 9};
  spec.q_lens = {37, 133, 5, 1};
  spec.padded_batch = 6;
  check_case(spec);
}

INSTANTIATE_TEST_SUITE_P(Cuda, PrefillSweep, ::testing::ValuesIn(sweep_params()), sweep_name);

// ---- corner cases ----

CaseSpec base_spec() {
  CaseSpec spec;
  spec.op = OpKind::kPrefill;
  spec.num_qo_heads = 8;
  spec.num_kv_heads = 2;
  spec.page_size = 16;
  spec.kv_lens = {96, 40};
  spec.q_lens = {96, 17};
  return testing::with_power(spec);  // logits of std 2.5, dominant keys, V with a mean
}

TEST(CudaPrefill, LongRequestManyTiles) {
  SKIP_WITHOUT_GPU();
  CaseSpec spec = base_spec();
  spec.kv_lens = {1500};
  spec.q_lens = {700};
  check_case(spec);
  spec.causal = false;
  check_case(spec);
}

// The output as a view into a wider buffer (an engine writing attention into a slice): heads
// padded by 8 elements (each row still 16-byte aligned: the warp-specialized kernel's bulk copies
// out of shared memory) and by 2 (4-byte aligned only: its per-element stores), tokens by three
// more heads; every element against the float64 reference, and every element between the rows
// left as the poison put it (no copy runs past its row).
TEST(CudaPrefill, StridedOutput) {
  SKIP_WITHOUT_GPU();
  CaseSpec spec = base_spec();
  spec.kv_lens = {300, 133};
  spec.q_lens = {200, 133};
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (PAGEDATTN_TEST_SEED)");
  const AttentionCase c(spec, seed);
  std::vector<double> ref_lse;
  const std::vector<double> ref = testing::reference_prefill(c.prefill_args(), &ref_lse);
  const int64_t tokens = c.prefill_args().out.size(0), heads = spec.num_qo_heads;
  const int64_t dim = spec.head_dim_vo;
  for (const int64_t pad : {8, 2}) {
    SCOPED_TRACE("head stride " + std::to_string(dim + pad));
    const int64_t head_stride = dim + pad, token_stride = (heads + 3) * head_stride;
    HostTensor wide(spec.q_dtype, {tokens * token_stride});
    PrefillArgs args = c.prefill_args();
    args.out.data = wide.view().data;
    args.out.strides[0] = token_stride;
    args.out.strides[1] = head_stride;
    args.out.strides[2] = 1;
    for (const std::string& kernel : kKernelList) {
      SCOPED_TRACE("kernel " + (kernel.empty() ? std::string("default") : kernel));
      const Result gpu = run_gpu_args(args, kernel.c_str());
      EXPECT_EQ(testing::compare(gpu.out, ref, testing::tolerance_for(spec.q_dtype), "out"), "");
      EXPECT_EQ(testing::compare(gpu.lse, ref_lse, kLseTolerance, "lse"), "");
      // The copied-back extent: every 16-bit element outside the rows still 0xffff.
      const auto* bits = static_cast<const uint16_t*>(wide.view().data);
      const int64_t extent = (tokens - 1) * token_stride + (heads - 1) * head_stride + dim;
      int64_t touched = 0;
      for (int64_t i = 0; i < extent; ++i) {
        const int64_t in_token = i % token_stride;
        const bool in_row = in_token < heads * head_stride && in_token % head_stride < dim;
        if (!in_row && bits[i] != 0xffffu) ++touched;
      }
      EXPECT_EQ(touched, 0) << "elements written between the output rows";
    }
  }
}

TEST(CudaPrefill, HndLayoutAndLargeAllocationPages) {
  SKIP_WITHOUT_GPU();
  CaseSpec spec = base_spec();
  spec.layout = KvLayout::kHND;
  check_case(spec);
  spec.alloc_page_size = 64;  // 4 attention pages of 16 per allocation page
  check_case(spec);
  spec.layout = KvLayout::kNHD;
  spec.page_size = 1;
  spec.alloc_page_size = 16;
  check_case(spec);
}

TEST(CudaPrefill, EmptyAndPaddedRequests) {
  SKIP_WITHOUT_GPU();
  CaseSpec spec = base_spec();
  spec.kv_lens = {0, 50, 0};
  spec.q_lens = {0, 50, 0};
  spec.padded_batch = 5;
  check_case(spec);
  spec.kv_lens = {1};
  spec.q_lens = {1};
  spec.padded_batch = 0;
  check_case(spec);
}

TEST(CudaPrefill, SoftCapAndSlidingWindow) {
  SKIP_WITHOUT_GPU();
  CaseSpec spec = base_spec();
  spec.kv_lens = {300, 70};
  spec.q_lens = {150, 70};
  spec.value_range = 3.0f;  // logits large enough for the cap to matter
  spec.logits_soft_cap = 5.0f;
  check_case(spec);
  spec.logits_soft_cap = 0.0f;
  spec.value_range = 1.0f;
  for (int window : {0, 1, 47, 200}) {
    spec.window_left = window;
    check_case(spec);
  }
  spec.causal = false;
  spec.window_left = 31;
  check_case(spec);
}

// More requests than a CTA's scan covers at once (128), random lengths, and no max_q_len hint.
TEST(CudaPrefill, ManyRaggedRequestsWithoutHint) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  CaseSpec spec = base_spec();
  spec.kv_lens.clear();
  spec.q_lens.clear();
  for (int r = 0; r < 200; ++r) {
    const int kv_len = std::uniform_int_distribution<int>(0, 40)(rng);
    spec.kv_lens.push_back(kv_len);
    spec.q_lens.push_back(std::uniform_int_distribution<int>(0, std::min(kv_len, 6))(rng));
  }
  const AttentionCase c(spec, seed);
  std::vector<double> ref_lse;
  const std::vector<double> ref = testing::reference_prefill(c.prefill_args(), &ref_lse);
  for (const std::string& kernel_name : kKernelList) {
    const char* kernel = kernel_name.c_str();
    SCOPED_TRACE(std::string("kernel ") + (*kernel != '\0' ? kernel : "default"));
    const Result gpu = run_gpu(c, kernel, /*drop_hint=*/true);
    EXPECT_EQ(testing::compare(gpu.out, ref, testing::tolerance_for(spec.q_dtype), "out"), "");
    EXPECT_EQ(testing::compare(gpu.lse, ref_lse, kLseTolerance, "lse"), "");
  }
}

// A few short query rows over long KV (chunked prefill, speculative steps): the launcher splits
// the KV into chunks and merges the partials. Checked: that it does split, every element against
// the reference (both kernels) and the CPU backend, causal or not, window, soft-cap, P 1; and the
// same case without the max_q_len hint, which runs unsplit.
TEST(CudaPrefill, SplitKvForShortQueriesOverLongKv) {
  SKIP_WITHOUT_GPU();
  CaseSpec spec = base_spec();
  spec.kv_lens = {3000, 1700, 0, 900};
  spec.q_lens = {4, 1, 0, 3};
  spec.padded_batch = 6;
  {
    const AttentionCase c(spec, 1);
    EXPECT_GT(prefill_kv_chunks(workspace(), c.prefill_args()), 4);
    PrefillArgs no_hint = c.prefill_args();
    no_hint.meta.max_q_len = 0;
    EXPECT_EQ(prefill_kv_chunks(workspace(), no_hint), 1);
  }
  check_case(spec);
  spec.causal = false;
  check_case(spec);
  spec.causal = true;
  spec.window_left = 700;
  spec.value_range = 3.0f;
  spec.logits_soft_cap = 5.0f;
  check_case(spec);
  spec.window_left = -1;
  spec.value_range = 1.0f;
  spec.logits_soft_cap = 0.0f;
  spec.page_size = 1;
  check_case(spec);

  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + ", no max_q_len hint");
  const AttentionCase c(spec, seed);
  std::vector<double> ref_lse;
  const std::vector<double> ref = testing::reference_prefill(c.prefill_args(), &ref_lse);
  const Result gpu = run_gpu(c, "", /*drop_hint=*/true);
  EXPECT_EQ(testing::compare(gpu.out, ref, testing::tolerance_for(spec.q_dtype), "out"), "");
  EXPECT_EQ(testing::compare(gpu.lse, ref_lse, kLseTolerance, "lse"), "");
}

// An fp8 e4m3 cache (bf16 and f16 q; K and V scales of their own) through the shapes the corner
// cases above cover for bf16: in one ragged batch an extend over a long cached prefix, an empty
// request, a plain prefill (q_len = kv_len) crossing tiles, a short extend and a one-token step,
// padded; P 16, 1 and 5 (not a power of two), HND with allocation pages of 4 P, non-causal,
// soft-cap, sliding window, no lse; then the split-KV path (short queries over long KV). Each
// against the reference and the CPU backend, both kernels (check_case).
TEST(CudaPrefill, Fp8CacheCornerCases) {
  SKIP_WITHOUT_GPU();
  for (DType q_dtype : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE("q " + std::string(dtype_name(q_dtype)));
    CaseSpec spec = with_fp8_cache(base_spec());
    spec.q_dtype = q_dtype;
    spec.kv_lens = {700, 0, 129, 64, 1};
    spec.q_lens = {45, 0, 129, 17, 1};
    spec.padded_batch = 7;
    check_case(spec);
    for (int page : {1, 5}) {
      spec.page_size = page;
      check_case(spec);
    }
    spec.page_size = 16;
    spec.layout = KvLayout::kHND;
    spec.alloc_page_size = 64;
    check_case(spec);
    spec.layout = KvLayout::kNHD;
    spec.alloc_page_size = 0;
    spec.causal = false;
    check_case(spec);
    spec.causal = true;
    spec.value_range = 3.0f;  // logits large enough for the cap to matter
    spec.logits_soft_cap = 5.0f;
    check_case(spec);
    spec.value_range = 1.0f;
    spec.logits_soft_cap = 0.0f;
    spec.window_left = 47;
    check_case(spec);
    spec.window_left = -1;
    spec.with_lse = false;
    check_case(spec);

    CaseSpec split = with_fp8_cache(base_spec());
    split.q_dtype = q_dtype;
    split.kv_lens = {3000, 1700, 0, 900};
    split.q_lens = {4, 1, 0, 3};
    split.padded_batch = 6;
    EXPECT_GT(prefill_kv_chunks(workspace(), AttentionCase(split, 1).prefill_args()), 4);
    check_case(split);
    split.page_size = 1;
    split.causal = false;
    check_case(split);
  }
}

// The fp8 path computes on exactly the tiles the bf16 / f16 path would: an fp8 cache with unit
// scales and a cache of q's dtype holding the same values (widened on the host with the library's
// fp8e4m3_to_float; the NaN of the empty slots stays NaN) give the same out and lse, both kernels,
// every head-dim pair, P 1 and 16. Expected bitwise equal (the same instructions on the same tile
// values); the bound admits one ulp of the output (2^-7 relative covers a bf16 ulp, 2^-10 an f16
// one) and 1e-6 of lse, in case the two instantiations' compilations contract a multiply-add
// differently. A misplaced or mis-widened element moves its row far more (it shows in the
// reference comparisons above too, at their looser bounds).
TEST(CudaPrefill, Fp8WidensExactly) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int dims[][2] = {{64, 64}, {128, 128}, {256, 256}, {192, 128}};
  for (DType q_dtype : {DType::kBF16, DType::kF16}) {
    for (const auto& d : dims) {
      for (int page : {1, 16}) {
        CaseSpec spec = base_spec();
        spec.kv_dtype = DType::kFP8E4M3;  // kv_scale 1: k_scale = v_scale = 1
        spec.q_dtype = q_dtype;
        spec.head_dim_qk = d[0];
        spec.head_dim_vo = d[1];
        spec.page_size = page;
        SCOPED_TRACE(spec.name());
        const AttentionCase c(spec, seed);
        auto widen = [&](const HostTensor& fp8) {
          const TensorView& from = fp8.view();
          HostTensor wide(q_dtype, {from.shape[0], from.shape[1], from.shape[2], from.shape[3]});
          const auto* bytes = fp8.data<const uint8_t>();
          auto* out = wide.data<uint16_t>();
          for (int64_t i = 0; i < fp8.numel(); ++i) {
            const float value = fp8e4m3_to_float(bytes[i]);
            out[i] = q_dtype == DType::kBF16 ? float_to_bf16(value) : float_to_half(value);
          }
          return wide;
        };
        const HostTensor k = widen(c.k_tensor()), v = widen(c.v_tensor());
        PrefillArgs same_values = c.prefill_args();
        same_values.kv.k = k.view();
        same_values.kv.v = v.view();
        const double ulp = q_dtype == DType::kBF16 ? 1.0 / 128 : 1.0 / 1024;
        for (const std::string& kernel_name : kKernelList) {
          const char* kernel = kernel_name.c_str();
          SCOPED_TRACE(std::string("kernel ") + (*kernel != '\0' ? kernel : "default"));
          const Result fp8 = run_gpu(c, kernel);
          // The same values through the kernel that served the fp8 cache: the warp-specialized
          // kernel takes no fp8 cache (its launcher falls back to the one-warpgroup kernel, which
          // sums its keys in another order), so the widened case is forced onto that one too.
          const std::string_view name = kernel;
          const char* wide_kernel = name == "mma" ? "mma" : "sm90";
          const Result wide = run_gpu_args(same_values, wide_kernel);
          EXPECT_EQ(testing::compare(fp8.out, wide.out, {1e-6, ulp}, "out, fp8 vs same values"),
                    "");
          EXPECT_EQ(testing::compare(fp8.lse, wide.lse, {1e-6, 1e-6}, "lse, fp8 vs same values"),
                    "");
        }
      }
    }
  }
}

TEST(CudaPrefill, WithoutLse) {
  SKIP_WITHOUT_GPU();
  CaseSpec spec = base_spec();
  spec.with_lse = false;
  check_case(spec);
}

// The same logical KV laid out with P = 1, 16, 64 gives bitwise the same output (the kernel's
// key order does not depend on the page size).
TEST(CudaPrefill, PageSizeInvariance) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (bool fp8 : {false, true}) {
    CaseSpec spec = fp8 ? with_fp8_cache(base_spec()) : base_spec();
    spec.kv_lens = {200, 77};
    spec.q_lens = {60, 77};
    std::vector<Result> results;
    for (const std::string& kernel_name : kKernelList) {
      const char* kernel = kernel_name.c_str();
      SCOPED_TRACE(std::string(fp8 ? "fp8 cache, " : "") + "kernel " + kernel);
      results.clear();
      for (int page : {1, 16, 64}) {
        spec.page_size = page;
        results.push_back(run_gpu(AttentionCase(spec, seed), kernel));
      }
      for (size_t i = 1; i < results.size(); ++i) {
        EXPECT_EQ(std::memcmp(results[i].out.data(), results[0].out.data(),
                              results[0].out.size() * sizeof(double)),
                  0);
        EXPECT_EQ(testing::compare(results[i].lse, results[0].lse, {0, 0}, "lse"), "");
      }
    }
  }
}

// ---- argument errors: an Error naming the argument, and nothing written ----

TEST(CudaPrefill, RejectsBadArguments) {
  SKIP_WITHOUT_GPU();
  const AttentionCase c(base_spec(), testing::fresh_seed());
  DeviceMirror mirror;
  const PrefillArgs good = to_device(c.prefill_args(), mirror);
  auto expect_error = [&](PrefillArgs args, const std::string& needle) {
    try {
      run_prefill(workspace(), args);
      ADD_FAILURE() << "no error, expected one naming " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  PrefillArgs args = good;
  args.options.sm_scale = 0.0f;
  expect_error(args, "sm_scale");
  args = good;
  args.out.shape[2] = 64;
  expect_error(args, "out");
  args = good;
  args.lse.dtype = DType::kF16;
  expect_error(args, "lse");
  args = good;
  args.meta.qo_indptr.shape[0] = 1;
  expect_error(args, "qo_indptr");
  args = good;
  args.q.device = Device::cpu();
  expect_error(args, "cuda");
  args = good;
  args.options.window_left = -2;
  expect_error(args, "window_left");
  // Nothing was written: out is still all poison.
  std::vector<uint8_t> bytes(DeviceMirror::extent_bytes(good.out));
  check_cuda(cudaMemcpy(bytes.data(), good.out.data, bytes.size(), cudaMemcpyDeviceToHost),
             "copy out");
  for (uint8_t b : bytes) ASSERT_EQ(b, 0xff);
}

// Scales: an fp8 cache's must be finite and > 0, any other cache's 1; the K and V views must
// share the cache's dtype. Each an Error naming the argument, nothing written.
TEST(CudaPrefill, RejectsBadScalesAndMixedCaches) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = testing::fresh_seed();
  const AttentionCase fp8(with_fp8_cache(base_spec()), seed);
  const AttentionCase bf16(base_spec(), seed);
  DeviceMirror mirror;
  const PrefillArgs good_fp8 = to_device(fp8.prefill_args(), mirror);
  const PrefillArgs good_bf16 = to_device(bf16.prefill_args(), mirror);
  auto error = [&](PrefillArgs args, std::initializer_list<std::string_view> needles) {
    return testing::error_containing([&] { run_prefill(workspace(), args); }, needles);
  };
  PrefillArgs args = good_fp8;
  args.kv.k_scale = 0.0f;
  EXPECT_EQ(error(args, {"k_scale", "0"}), "");
  args = good_fp8;
  args.kv.v_scale = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(error(args, {"v_scale", "nan"}), "");
  args = good_fp8;
  args.kv.v_scale = -1.0f;
  EXPECT_EQ(error(args, {"v_scale", "-1"}), "");
  args = good_bf16;
  args.kv.k_scale = 0.5f;
  EXPECT_EQ(error(args, {"kv.k_scale: 0.5", "bf16"}), "");
  args = good_bf16;
  args.kv.v_scale = 2.0f;
  EXPECT_EQ(error(args, {"kv.v_scale: 2", "bf16"}), "");
  args = good_fp8;
  args.kv.v = good_bf16.kv.v;  // K fp8, V bf16
  EXPECT_EQ(error(args, {"v: dtype bf16, expected fp8_e4m3"}), "");
  for (const PrefillArgs* good : {&good_fp8, &good_bf16}) {
    std::vector<uint8_t> bytes(DeviceMirror::extent_bytes(good->out));
    check_cuda(cudaMemcpy(bytes.data(), good->out.data, bytes.size(), cudaMemcpyDeviceToHost),
               "copy out");
    for (uint8_t b : bytes) ASSERT_EQ(b, 0xff);
  }
}

TEST(CudaPrefill, SupportsNamesWhatIsMissing) {
  OpDesc op;
  op.op = OpKind::kPrefill;
  op.device = Device::cuda(0);
  EXPECT_TRUE(supports_prefill(op));
  op.kv_dtype = DType::kFP8E4M3;  // bf16 q over an fp8 cache
  EXPECT_TRUE(supports_prefill(op)) << supports_prefill(op).reason;
  op.q_dtype = DType::kF16;
  EXPECT_TRUE(supports_prefill(op)) << supports_prefill(op).reason;
  op.kv_dtype = DType::kBF16;  // f16 q over a bf16 cache: no; the reason lists what is
  EXPECT_NE(supports_prefill(op).reason.find("expected the q dtype or fp8_e4m3"), std::string::npos)
      << supports_prefill(op).reason;
  op.q_dtype = DType::kFP8E4M3;  // fp8 q: no
  EXPECT_NE(supports_prefill(op).reason.find("q dtype fp8_e4m3"), std::string::npos)
      << supports_prefill(op).reason;
  op.q_dtype = DType::kBF16;
  op.head_dim_qk = op.head_dim_vo = 96;
  EXPECT_NE(supports_prefill(op).reason.find("96"), std::string::npos);
  op.head_dim_qk = op.head_dim_vo = 128;
  op.num_qo_heads = 12;
  op.num_kv_heads = 8;
  EXPECT_FALSE(supports_prefill(op));
}

}  // namespace
}  // namespace pagedattn::cuda
