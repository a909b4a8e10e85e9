// CUDA decode against the float64 reference and the CPU backend, over a case table built from the
// shared generator (tests/common/cases.h): q/KV dtypes (bf16, f16, fp8 KV with a scale) x layout,
// head dims 64/128/256, group sizes 1..16 (3, 5, 7 included) and beyond (20, 32: several CTAs per
// KV head), page sizes 1..256 with allocation pages 4x larger, lengths around the page edges,
// padding, soft-cap, sliding window, explicit sm_scale, and long requests that take the split-KV
// path (B = 1, and mixed with empty requests; fp8 KV too, through the merge kernel). Each case
// varies one axis around a base so the table stays small enough for compute-sanitizer. Outputs
// are poisoned (0xFF) before each run.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/scoped_env.h"
#include "common/test_util.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_test_util.h"
#include "cuda/launch_test_kernels.h"
#include "cuda/workspace.h"

namespace pagedattn::testing {
namespace {

std::vector<int32_t> edge_lengths(int32_t page_size, int32_t long_len) {
  return {1, std::max(1, page_size - 1), page_size, page_size + 1, long_len};
}

CaseSpec base_decode() {
  CaseSpec spec;
  spec.op = OpKind::kDecode;
  spec.q_dtype = DType::kBF16;
  spec.kv_dtype = DType::kBF16;
  spec.num_qo_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim_qk = spec.head_dim_vo = 128;
  spec.page_size = 16;
  spec.kv_lens = edge_lengths(16, 300);
  return with_power(spec);  // logits of std 2.5, dominant keys, V with a mean (cases.h)
}

std::vector<CaseSpec> cuda_decode_cases() {
  std::vector<CaseSpec> cases;
  const std::pair<DType, DType> dtypes[] = {{DType::kBF16, DType::kBF16},
                                            {DType::kF16, DType::kF16},
                                            {DType::kBF16, DType::kFP8E4M3},
                                            {DType::kF16, DType::kFP8E4M3}};
  for (auto [q, kv] : dtypes) {
    for (KvLayout layout : {KvLayout::kNHD, KvLayout::kHND}) {
      CaseSpec spec = base_decode();
      spec.q_dtype = q;
      spec.kv_dtype = kv;
      spec.layout = layout;
      if (kv == DType::kFP8E4M3) spec.kv_scale = 0.25f;
      cases.push_back(spec);
    }
  }
  for (int32_t dim : {64, 256}) {
    for (DType kv : {DType::kBF16, DType::kFP8E4M3}) {
      CaseSpec spec = base_decode();
      spec.head_dim_qk = spec.head_dim_vo = dim;
      spec.kv_dtype = kv;
      spec.kv_lens = {1, 33, 190};
      cases.push_back(spec);
    }
  }
  // Group sizes 1, 3, 5, 7, 12, 16, 4 (Llama 3 8B: 32/8), 20 and 32 (more than one CTA per head).
  for (auto [hq, hkv] :
       {std::pair{4, 4}, {6, 2}, {10, 2}, {14, 2}, {12, 1}, {16, 1}, {32, 8}, {40, 2}, {32, 1}}) {
    CaseSpec spec = base_decode();
    spec.num_qo_heads = hq;
    spec.num_kv_heads = hkv;
    spec.head_dim_qk = spec.head_dim_vo = hq > 16 ? 64 : 128;
    spec.kv_lens = {1, 17, 150};
    cases.push_back(spec);
  }
  for (int32_t page : {1, 3, 16, 64, 256}) {
    for (int32_t ratio : {1, 4}) {
      CaseSpec spec = base_decode();
      spec.page_size = page;
      spec.alloc_page_size = page * ratio;
      spec.kv_lens = edge_lengths(page, 200);
      spec.layout = ratio == 4 ? KvLayout::kHND : KvLayout::kNHD;
      cases.push_back(spec);
    }
  }
  {
    CaseSpec spec = base_decode();  // padding requests: out 0, lse -inf
    spec.padded_batch = 8;
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base_decode();  // every request empty
    spec.kv_lens = {0, 0, 0};
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base_decode();  // sequential pages, no lse
    spec.shuffle_pages = false;
    spec.with_lse = false;
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base_decode();  // explicit sm_scale, lse checked against float64
    spec.sm_scale = 0.3f;
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base_decode();  // soft-cap on large logits
    spec.logits_soft_cap = 5.0f;
    spec.value_range = 3.0f;
    cases.push_back(spec);
  }
  for (int32_t window : {0, 37, 1000}) {
    CaseSpec spec = base_decode();
    spec.window_left = window;
    spec.kv_lens = {1, 40, 300};
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base_decode();  // soft-cap and window, fp8
    spec.kv_dtype = DType::kFP8E4M3;
    spec.kv_scale = 0.5f;
    spec.logits_soft_cap = 20.0f;
    spec.window_left = 100;
    cases.push_back(spec);
  }
  // Split-KV: one long request (every SM busy), and long requests mixed with empty ones, P = 1.
  {
    CaseSpec spec = base_decode();
    spec.num_qo_heads = 32;
    spec.num_kv_heads = 8;
    spec.kv_lens = {12000};
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base_decode();
    spec.page_size = 1;
    spec.alloc_page_size = 16;
    spec.kv_lens = {5000, 0, 1, 2600};
    spec.padded_batch = 6;
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base_decode();  // split with a window that empties some chunks
    spec.kv_lens = {6000, 3000};
    spec.window_left = 700;
    cases.push_back(spec);
  }
  // Tensor-core path (KV of q's dtype): the remaining group sizes 2, 8 and 24 (a partial second
  // row tile), f16 at every head dim and layout, each warp's shared-memory ring wrapping several
  // times (lengths of many 16- or 32-token steps), soft-cap and window on f16, split f16 at D 256.
  for (auto [hq, hkv] : {std::pair{16, 8}, {16, 2}, {24, 1}}) {
    CaseSpec spec = base_decode();
    spec.num_qo_heads = hq;
    spec.num_kv_heads = hkv;
    spec.kv_lens = {1, 17, 150, 777};
    cases.push_back(spec);
  }
  for (int32_t dim : {64, 128, 256}) {
    CaseSpec spec = base_decode();
    spec.q_dtype = spec.kv_dtype = DType::kF16;
    spec.head_dim_qk = spec.head_dim_vo = dim;
    spec.layout = dim == 128 ? KvLayout::kNHD : KvLayout::kHND;
    spec.num_qo_heads = 10;  // group 5
    spec.kv_lens = {1, 31, 33, 900};
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base_decode();
    spec.q_dtype = spec.kv_dtype = DType::kF16;
    spec.head_dim_qk = spec.head_dim_vo = 64;
    spec.page_size = 1;
    spec.alloc_page_size = 4;
    spec.logits_soft_cap = 10.0f;
    spec.value_range = 3.0f;
    spec.window_left = 250;
    spec.kv_lens = {5, 300, 1100};
    cases.push_back(spec);
  }
  // Every group size 1 .. 16 and two past one row tile (17, 33) on two KV heads, layouts and
  // dtypes alternating: rows of the MMA past the group are padding that must stay out.
  for (int32_t group : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 33}) {
    CaseSpec spec = base_decode();
    spec.num_qo_heads = 2 * group;
    spec.num_kv_heads = 2;
    spec.q_dtype = spec.kv_dtype = group % 2 == 1 ? DType::kF16 : DType::kBF16;
    spec.layout = group % 4 < 2 ? KvLayout::kNHD : KvLayout::kHND;
    spec.kv_lens = {1, 70, 333};
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base_decode();
    spec.q_dtype = spec.kv_dtype = DType::kF16;
    spec.head_dim_qk = spec.head_dim_vo = 256;
    spec.num_qo_heads = 14;  // group 7
    spec.page_size = 64;
    spec.kv_lens = {4000, 0, 70};
    cases.push_back(spec);
  }
  // fp8 KV split (the CUDA-core kernel's partials, then the merge kernel, bf16 and f16 outputs;
  // appended last so the earlier cases keep their _c indices): one long request among an empty
  // and a short one, and f16 q with a soft-cap.
  for (DType q : {DType::kBF16, DType::kF16}) {
    CaseSpec spec = base_decode();
    spec.q_dtype = q;
    spec.kv_dtype = DType::kFP8E4M3;
    spec.kv_scale = 0.25f;
    spec.num_qo_heads = 32;
    spec.num_kv_heads = 8;
    spec.kv_lens = {3000, 0, 40};
    if (q == DType::kF16) {
      spec.logits_soft_cap = 5.0f;
      spec.value_range = 3.0f;
    }
    cases.push_back(spec);
  }
  return cases;
}

class CudaDecodeTest : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CudaDecodeTest, MatchesReferenceAndCpu) {
  PA_REQUIRE_GPU();
  const std::string report = check_cuda_decode(GetParam(), fresh_seed());
  EXPECT_TRUE(report.empty()) << report;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaDecodeTest, ::testing::ValuesIn(cuda_decode_cases()),
                         [](const auto& info) {
                           return info.param.name() + "_c" + std::to_string(info.index);
                         });

// The same logical KV with P = 1, 16 and 64 gives the same outputs (within rounding).
TEST(CudaDecode, PageSizeInvariance) {
  PA_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::vector<std::vector<double>> outputs, lses;
  for (int32_t page : {1, 16, 64}) {
    CaseSpec spec = base_decode();
    spec.page_size = page;
    spec.alloc_page_size = 64;
    spec.kv_lens = {700, 3, 64, 129};
    // Each P against float64 (out and lse) and the CPU backend, then run against run.
    EXPECT_EQ(check_cuda_decode(spec, seed), "") << "P " << page;
    const AttentionCase c(spec, seed);
    DeviceDecodeCase device_case(c);
    run_cuda_decode(device_case);
    device_case.out.copy_to(c.out());
    device_case.lse.copy_to(c.lse());
    outputs.push_back(to_doubles(c.out()));
    lses.push_back(to_doubles(c.lse()));
  }
  for (size_t i = 1; i < outputs.size(); ++i) {
    std::string report = compare_rows(outputs[i], outputs[0], 128,
                                      gpu_row_tolerance(DType::kBF16), "P vs P=1");
    report += compare(lses[i], lses[0], kGpuLseTolerance, "lse: P vs P=1");
    EXPECT_TRUE(report.empty()) << "seed " << seed << "\n" << report;
  }
}

// A cuda backend and a workspace on a non-blocking stream of their own, planned for the step of
// `device_case` (args: its arguments on that stream).
struct StepOnStream {
  explicit StepOnStream(const DeviceDecodeCase& device_case) : backend(cuda::make_backend()) {
    WorkspaceLimits limits;
    limits.max_batch = 64;
    workspace = backend->create_workspace(limits);
    PA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    static_cast<cuda::CudaWorkspace&>(*workspace).stream = stream;
    args = device_case.args(stream);
    backend->plan(*workspace, describe_op(args), args.meta);
  }
  ~StepOnStream() { cudaStreamDestroy(stream); }
  StepOnStream(const StepOnStream&) = delete;
  StepOnStream& operator=(const StepOnStream&) = delete;

  std::unique_ptr<Backend> backend;
  std::unique_ptr<Workspace> workspace;
  cudaStream_t stream = nullptr;
  DecodeArgs args;
};

// `out` and `lse` of a run of `c` (copied into the case's host buffers) against the float64
// reference: "" when both match.
std::string against_reference(const AttentionCase& c, const DeviceTensor& out,
                              const DeviceTensor& lse) {
  out.copy_to(c.out());
  lse.copy_to(c.lse());
  std::vector<double> expected_lse;
  const std::vector<double> expected = c.reference(&expected_lse);
  std::string report = compare_rows(to_doubles(c.out()), expected, c.spec().head_dim_vo,
                                    gpu_row_tolerance(c.spec().q_dtype), "out vs reference");
  report += compare(to_doubles(c.lse()), expected_lse, kGpuLseTolerance, "lse vs reference");
  return report;
}

// The tensor-core kernel's switches (ARCHITECTURE.md, "Switches"): the L2 prefetch of a later
// run's K / V and the merge's bulk read, each alone, both, and neither (the defaults).
const std::vector<std::vector<ScopedEnv::Setting>> kDecodeSwitches = {
    {{"PAGEDATTN_DECODE_KV_PREFETCH", std::nullopt}, {"PAGEDATTN_DECODE_MERGE_READ", std::nullopt}},
    {{"PAGEDATTN_DECODE_KV_PREFETCH", "lines"}, {"PAGEDATTN_DECODE_MERGE_READ", std::nullopt}},
    {{"PAGEDATTN_DECODE_KV_PREFETCH", "bulk"}, {"PAGEDATTN_DECODE_MERGE_READ", std::nullopt}},
    {{"PAGEDATTN_DECODE_KV_PREFETCH", std::nullopt}, {"PAGEDATTN_DECODE_MERGE_READ", "bulk"}},
    {{"PAGEDATTN_DECODE_KV_PREFETCH", "lines"}, {"PAGEDATTN_DECODE_MERGE_READ", "bulk"}},
};

std::string switches_name(const std::vector<ScopedEnv::Setting>& settings) {
  std::string name;
  for (const auto& [variable, value] : settings) {
    name += fmt::format("{}{}={}", name.empty() ? "" : " ", variable, value.value_or("unset"));
  }
  return name;
}

// A step's later layers: every run_decode after the first since plan() reads the partition and
// the metadata before it waits for the previous kernel (DecodeParams::early_metadata), the first
// one after that wait. Four runs on one plan, back to back on a stream (each run's predecessor
// is the previous decode, still draining), each into its own poisoned out / lse: runs 2-4 equal
// run 1 bit for bit, and run 1 matches the float64 reference. Split requests included; under
// each setting of the kernel's switches (the K / V prefetch, the merge's bulk read).
TEST(CudaDecode, LaterRunsOfOnePlanEqualTheFirst) {
  PA_REQUIRE_GPU();
  for (const auto& settings : kDecodeSwitches) {
    SCOPED_TRACE(switches_name(settings));
    const ScopedEnv env(settings);
    const uint64_t seed = fresh_seed();
    CaseSpec spec = base_decode();
    spec.kv_lens = {700, 3, 0, 129, 3000, 64};
    const AttentionCase c(spec, seed);
    const DeviceDecodeCase device_case(c);
    StepOnStream step(device_case);
    Backend* backend = step.backend.get();
    Workspace* workspace = step.workspace.get();
    cudaStream_t stream = step.stream;
    DecodeArgs args = step.args;
    std::vector<DeviceTensor> outs, lses;
    for (int run = 0; run < 4; ++run) {
      outs.push_back(DeviceTensor::poisoned_like(c.out()));
      lses.push_back(DeviceTensor::poisoned_like(c.lse()));
    }
    for (int run = 0; run < 4; ++run) {
      args.out = outs[static_cast<size_t>(run)].view();
      args.lse = lses[static_cast<size_t>(run)].view();
      backend->run_decode(*workspace, args);
    }
    PA_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_NO_THROW(workspace->check_device_errors());
    std::vector<std::vector<double>> out_runs, lse_runs;
    for (int run = 0; run < 4; ++run) {
      outs[static_cast<size_t>(run)].copy_to(c.out());
      lses[static_cast<size_t>(run)].copy_to(c.lse());
      out_runs.push_back(to_doubles(c.out()));
      lse_runs.push_back(to_doubles(c.lse()));
    }
    std::vector<double> expected_lse;
    const std::vector<double> expected = c.reference(&expected_lse);
    std::string report = compare_rows(out_runs[0], expected, spec.head_dim_vo,
                                      gpu_row_tolerance(spec.q_dtype), "run 1 vs reference");
    report += compare(lse_runs[0], expected_lse, kGpuLseTolerance, "run 1 lse vs reference");
    EXPECT_EQ(report, "") << "seed " << seed;
    const auto differ = [](const std::vector<double>& a, const std::vector<double>& b) {
      int64_t n = 0;
      for (size_t i = 0; i < a.size(); ++i) n += !(a[i] == b[i] || (a[i] != a[i] && b[i] != b[i]));
      return n;
    };
    for (int run = 1; run < 4; ++run) {
      EXPECT_EQ(differ(out_runs[static_cast<size_t>(run)], out_runs[0]), 0)
          << "out of run " << run + 1 << " differs from run 1 (seed " << seed << ")";
      EXPECT_EQ(differ(lse_runs[static_cast<size_t>(run)], lse_runs[0]), 0)
          << "lse of run " << run + 1 << " differs from run 1 (seed " << seed << ")";
    }
  }
}

// A later run of a step starts while the kernel before it still runs (DecodeParams::
// early_metadata: it reads the metadata then), so its K / V reads must wait for that kernel: the
// step's store may still be writing the newest tokens' rows. Here those rows are NaN until a
// kernel that lets its dependents start at once rewrites them after 200 us; the run after it must
// see the rewritten rows (out and lse equal the float64 reference; a row read early would be NaN).
// Requests of one item and split ones, the newest token first, inside or last in its step. Under
// each setting of the kernel's switches too: a prefetch before the wait may meet the NaN rows, and
// must not make the run after the store read them.
TEST(CudaDecode, LaterRunsReadTheNewestTokenAfterTheStore) {
  PA_REQUIRE_GPU();
  for (const auto& settings : kDecodeSwitches) {
    SCOPED_TRACE(switches_name(settings));
    const ScopedEnv env(settings);
    const uint64_t seed = fresh_seed();
    for (const KvLayout layout : {KvLayout::kNHD, KvLayout::kHND}) {
      CaseSpec spec = base_decode();
      spec.layout = layout;
      spec.kv_lens = {700, 1, 0, 129, 3000, 64, 17};
      const AttentionCase c(spec, seed);
      const DeviceDecodeCase device_case(c);
      // Byte offsets of the newest token's rows (each KV head) in the K and V pools.
      const TensorView& k = device_case.k.view();
      const TensorView& v = device_case.v.view();
      ASSERT_EQ(k.strides, v.strides);
      const int64_t pages_per_alloc = k.shape[layout == KvLayout::kNHD ? 1 : 2] / spec.page_size;
      std::vector<int64_t> offsets;
      for (size_t r = 0; r < c.kv_lens().size(); ++r) {
        const int32_t kv_len = c.kv_lens()[r];
        if (kv_len == 0) continue;
        const int32_t pos = kv_len - 1;
        const int32_t page =
            c.kv_indices()[static_cast<size_t>(c.kv_indptr()[r] + pos / spec.page_size)];
        const int64_t alloc = page / pages_per_alloc;
        const int64_t token = (page % pages_per_alloc) * spec.page_size + pos % spec.page_size;
        for (int64_t h = 0; h < spec.num_kv_heads; ++h) {
          const int64_t element =
              alloc * k.strides[0] + (layout == KvLayout::kNHD
                                          ? token * k.strides[1] + h * k.strides[2]
                                          : h * k.strides[1] + token * k.strides[2]);
          offsets.push_back(element * dtype_size(k.dtype));
        }
      }
      const DeviceTensor device_offsets = DeviceTensor(TensorView::contiguous(
          offsets.data(), DType::kI64, {static_cast<int64_t>(offsets.size())}));
      const DeviceTensor good_k(c.k_tensor().view()), good_v(c.v_tensor().view());
      const DeviceTensor nan_k = DeviceTensor::poisoned_like(c.k_tensor().view());
      const DeviceTensor nan_v = DeviceTensor::poisoned_like(c.v_tensor().view());
      const int row_bytes = static_cast<int>(spec.head_dim_qk * dtype_size(k.dtype));
      const int count = static_cast<int>(offsets.size());
      const auto* rows = static_cast<const int64_t*>(device_offsets.view().data);

      StepOnStream step(device_case);
      Backend* backend = step.backend.get();
      Workspace* workspace = step.workspace.get();
      cudaStream_t stream = step.stream;
      DecodeArgs args = step.args;
      backend->run_decode(*workspace, args);  // the step's first run: it waits before any read
      launch_slow_rows_copy(nan_k.view().data, k.data, nan_v.view().data, v.data, rows, count,
                            row_bytes, 0, stream);
      launch_slow_rows_copy(good_k.view().data, k.data, good_v.view().data, v.data, rows, count,
                            row_bytes, 200'000, stream);
      const DeviceTensor out = DeviceTensor::poisoned_like(c.out());
      const DeviceTensor lse = DeviceTensor::poisoned_like(c.lse());
      args.out = out.view();
      args.lse = lse.view();
      backend->run_decode(*workspace, args);
      PA_CUDA_CHECK(cudaStreamSynchronize(stream));
      EXPECT_NO_THROW(workspace->check_device_errors());
      EXPECT_EQ(against_reference(c, out, lse), "") << layout_name(layout) << ", seed " << seed;
    }
  }
}

// q need not be 16-byte aligned (only K / V are): the kernel loads q in 16-byte pieces where its
// rows are aligned and element by element where not. Here q starts one element past an aligned
// address (then with a head stride of D + 1 elements): out and lse equal the float64 reference.
TEST(CudaDecode, UnalignedQ) {
  PA_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  for (const int64_t extra_stride : {0, 1}) {
    CaseSpec spec = base_decode();
    spec.kv_lens = {700, 1, 129, 3000};
    const AttentionCase c(spec, seed);
    const DeviceDecodeCase device_case(c);
    StepOnStream step(device_case);
    DecodeArgs args = step.args;
    const TensorView& q = device_case.q.view();
    const int64_t batch = q.shape[0], heads = q.shape[1], dim = q.shape[2];
    const int64_t head_stride = dim + extra_stride;
    const int64_t element = dtype_size(q.dtype);
    cuda::DeviceBuffer shifted(static_cast<size_t>((batch * heads * head_stride + 1) * element));
    auto* base = static_cast<unsigned char*>(shifted.data()) + element;  // one element in
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        const auto* src = static_cast<const unsigned char*>(q.data) +
                          (b * q.strides[0] + h * q.strides[1]) * element;
        PA_CUDA_CHECK(cudaMemcpyAsync(base + (b * heads + h) * head_stride * element, src,
                                      static_cast<size_t>(dim * element), cudaMemcpyDeviceToDevice,
                                      step.stream));
      }
    }
    args.q.data = base;
    args.q.strides = {heads * head_stride, head_stride, 1};
    step.backend->run_decode(*step.workspace, args);
    PA_CUDA_CHECK(cudaStreamSynchronize(step.stream));
    EXPECT_NO_THROW(step.workspace->check_device_errors());
    EXPECT_EQ(against_reference(c, device_case.out, device_case.lse), "")
        << "head stride D + " << extra_stride << ", seed " << seed;
  }
}

// Bad input: an Error naming the argument, and nothing launched.
TEST(CudaDecode, RejectsBadArguments) {
  PA_REQUIRE_GPU();
  CaseSpec spec = base_decode();
  const AttentionCase c(spec, fresh_seed());
  DeviceDecodeCase device_case(c);
  const std::unique_ptr<Backend> backend = cuda::make_backend();
  std::unique_ptr<Workspace> workspace = backend->create_workspace({});
  DecodeArgs args = device_case.args();
  // Not planned.
  EXPECT_EQ(error_containing([&] { backend->run_decode(*workspace, args); },
                             {"run_decode: the workspace holds no decode plan"}),
            "");
  backend->plan(*workspace, describe_op(args), args.meta);
  DecodeArgs bad = args;
  bad.options.sm_scale = 0.0f;
  try {
    backend->run_decode(*workspace, bad);
    ADD_FAILURE() << "sm_scale 0 accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("sm_scale"), std::string::npos) << error.what();
  }
  bad = args;
  bad.q = c.decode_args().q;  // host memory
  EXPECT_EQ(error_containing([&] { backend->run_decode(*workspace, bad); }, {"device cpu"}), "");
  bad = args;
  bad.out.shape[2] = 64;
  EXPECT_EQ(error_containing([&] { backend->run_decode(*workspace, bad); },
                             {"out: shape [5, 8, 64]"}),
            "");
  {
    const ScopedEnv env("PAGEDATTN_DECODE_KV_PREFETCH", "sideways");
    EXPECT_EQ(error_containing(
                  [&] { backend->run_decode(*workspace, args); },
                  {"PAGEDATTN_DECODE_KV_PREFETCH='sideways'", "expected one of lines, bulk, off"}),
              "");
  }
  {
    const ScopedEnv env("PAGEDATTN_DECODE_MERGE_READ", "tma");
    EXPECT_EQ(
        error_containing([&] { backend->run_decode(*workspace, args); },
                         {"PAGEDATTN_DECODE_MERGE_READ='tma'", "expected one of bulk, loads"}),
        "");
  }
  // The poisoned output is untouched.
  device_case.out.copy_to(c.out());
  for (double value : to_doubles(c.out())) ASSERT_TRUE(value != value);
}

TEST(CudaDecode, SupportsSaysWhy) {
  const std::unique_ptr<Backend> backend = cuda::make_backend();
  OpDesc op;
  op.device = Device::cuda(0);
  const Support device = cuda::device_available();
  if (!device) {
    const Support answer = backend->supports(op);
    EXPECT_FALSE(answer.ok);
    EXPECT_NE(answer.reason.find("no CUDA device"), std::string::npos) << answer.reason;
    PA_SKIP_OR_FAIL_WITHOUT_GPU(device.reason.empty() ? "unusable" : device.reason);
  }
  EXPECT_TRUE(backend->supports(op).ok) << backend->supports(op).reason;
  op.head_dim_qk = op.head_dim_vo = 96;
  const Support answer = backend->supports(op);
  EXPECT_FALSE(answer.ok);
  EXPECT_NE(answer.reason.find("96"), std::string::npos) << answer.reason;
  op.head_dim_qk = op.head_dim_vo = 128;
  op.q_dtype = op.kv_dtype = DType::kF32;
  EXPECT_FALSE(backend->supports(op).ok);
}

}  // namespace
}  // namespace pagedattn::testing
