// CUDA MLA (absorbed, bf16 queries, kv_lora_rank 512 + rope 64, bf16 and fp8 e4m3 caches) against
// the float64 reference and the CPU backend, over cases from the shared generator
// (tests/common/cases.h): heads 16/32/64/128 (and 20, 8: row blocks straddle tokens) x page sizes
// 1/16/64, lengths around the page edges and long (2000; 6000 and 3000 split the KV), allocation
// pages larger than P, padding and empty requests, speculative decoding (q_len 1..4, causal),
// extend (longer q_len, causal and not), no lse, explicit sm_scale, no max_q_len hint (split, and
// the unsplit fallback), the single [pages, alloc, 576] buffer and separate ckv / kpe buffers,
// CUDA-graph replay; the mma.sync kernel (the sm_80 path, PAGEDATTN_MLA_KERNEL=mma) forced where
// Hopper runs the warp-specialized and read-bound ones; clusters of 4 and 8 CTAs
// (PAGEDATTN_MLA_CLUSTER). Outputs are poisoned (0xFF = NaN) before each run, every element is
// compared, and NaN never passes. Bad arguments throw an Error naming the argument and write
// nothing. Skips where no GPU is usable.
#include "cuda/mla.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/scoped_env.h"
#include "common/test_util.h"
#include "cpu/cpu_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_test_util.h"
#include "reference/reference.h"

namespace pagedattn::testing {
namespace {

CaseSpec base_mla(int32_t heads, int32_t page_size) {
  CaseSpec spec;
  spec.op = OpKind::kMlaDecode;
  spec.q_dtype = DType::kBF16;
  spec.kv_dtype = DType::kBF16;
  spec.num_qo_heads = heads;
  spec.num_kv_heads = 1;
  spec.head_dim_qk = 576;
  spec.head_dim_vo = 512;
  spec.page_size = page_size;
  spec.kv_lens = {1, std::max(1, page_size - 1), page_size, page_size + 1, 300};
  spec.sm_scale = 1.0f / std::sqrt(192.0f);  // DeepSeek: from the unabsorbed head dim
  return with_power(spec);  // logits of std 2.5, dominant keys, V with a mean (cases.h)
}

// The case's inputs on the device. `split_buffers`: ckv and kpe in two buffers of their own
// instead of two slices of the case's [pages, alloc, 576] buffer.
struct DeviceMlaCase {
  DeviceMlaCase(const AttentionCase& c, bool split_buffers) : host(&c) {
    const MlaArgs h = c.mla_args();
    q_nope = DeviceTensor(h.q_nope);
    q_pe = DeviceTensor(h.q_pe);
    out = DeviceTensor::poisoned_like(h.out);
    if (h.lse.defined()) lse = DeviceTensor::poisoned_like(h.lse);
    qo_indptr = DeviceTensor(c.meta().qo_indptr);
    kv_indptr = DeviceTensor(c.meta().kv_indptr);
    kv_indices = DeviceTensor(c.meta().kv_indices);
    kv_last_page_len = DeviceTensor(c.meta().kv_last_page_len);
    if (!split_buffers) {
      latent = DeviceTensor(c.latent_tensor().view());
      ckv = latent.view();
      ckv.shape[2] = h.kv.ckv.shape[2];
      kpe = latent.view();
      kpe.shape[2] = h.kv.kpe.shape[2];
      kpe.data = static_cast<char*>(latent.view().data) + ckv.shape[2] * dtype_size(ckv.dtype);
    } else {
      ckv_host =
          HostTensor(h.kv.ckv.dtype, {h.kv.ckv.shape[0], h.kv.ckv.shape[1], h.kv.ckv.shape[2]});
      kpe_host =
          HostTensor(h.kv.kpe.dtype, {h.kv.kpe.shape[0], h.kv.kpe.shape[1], h.kv.kpe.shape[2]});
      copy_rows(h.kv.ckv, ckv_host.view());
      copy_rows(h.kv.kpe, kpe_host.view());
      ckv_buffer = DeviceTensor(ckv_host.view());
      kpe_buffer = DeviceTensor(kpe_host.view());
      ckv = ckv_buffer.view();
      kpe = kpe_buffer.view();
    }
  }

  // Copies the rows of a 3-D strided host view into a contiguous one of the same shape.
  static void copy_rows(const TensorView& from, const TensorView& to) {
    const int64_t bytes = from.shape[2] * dtype_size(from.dtype);
    for (int64_t a = 0; a < from.shape[0]; ++a) {
      for (int64_t t = 0; t < from.shape[1]; ++t) {
        const int64_t src = (a * from.strides[0] + t * from.strides[1]) * dtype_size(from.dtype);
        const int64_t dst = (a * to.strides[0] + t * to.strides[1]) * dtype_size(to.dtype);
        std::memcpy(static_cast<char*>(to.data) + dst, static_cast<const char*>(from.data) + src,
                    static_cast<size_t>(bytes));
      }
    }
  }

  MlaArgs args(void* stream = nullptr) const {
    MlaArgs a = host->mla_args();
    a.q_nope = q_nope.view();
    a.q_pe = q_pe.view();
    a.kv.ckv = ckv;
    a.kv.kpe = kpe;
    a.out = out.view();
    a.lse = a.lse.defined() ? lse.view() : TensorView{};
    a.meta.qo_indptr = qo_indptr.view();
    a.meta.kv_indptr = kv_indptr.view();
    a.meta.kv_indices = kv_indices.view();
    a.meta.kv_last_page_len = kv_last_page_len.view();
    a.stream = stream;
    return a;
  }

  OpDesc op() const {
    OpDesc desc = host->op_desc();
    desc.device = Device::cuda(0);
    return desc;
  }

  const AttentionCase* host;
  DeviceTensor q_nope, q_pe, out, lse, qo_indptr, kv_indptr, kv_indices, kv_last_page_len;
  DeviceTensor latent, ckv_buffer, kpe_buffer;
  HostTensor ckv_host, kpe_host;
  TensorView ckv, kpe;
};

const Backend& cuda_backend() {
  static const std::unique_ptr<Backend> backend = cuda::make_backend();
  return *backend;
}

std::unique_ptr<Workspace> make_workspace(const AttentionCase& c) {
  WorkspaceLimits limits;
  limits.max_batch = std::max<int32_t>(64, c.batch_size());
  return cuda_backend().create_workspace(limits);
}

// Plan + run on the cuda backend, then wait.
void run_gpu(const DeviceMlaCase& d, const MlaArgs& args) {
  std::unique_ptr<Workspace> workspace = make_workspace(*d.host);
  cuda_backend().plan(*workspace, d.op(), args.meta);
  cuda_backend().run_mla(*workspace, args);
  PA_CUDA_CHECK(cudaDeviceSynchronize());
}

struct Outputs {
  std::vector<double> out, lse;
};

// The device outputs, through the case's host buffers (poisoned first so a short copy shows).
Outputs fetch(const DeviceMlaCase& d) {
  const AttentionCase& c = *d.host;
  Outputs result;
  poison(c.out());
  d.out.copy_to(c.out());
  result.out = to_doubles(c.out());
  if (c.lse().defined()) {
    poison(c.lse());
    d.lse.copy_to(c.lse());
    result.lse = to_doubles(c.lse());
  }
  return result;
}

// GPU outputs vs the float64 reference and the CPU backend; "" when all match.
std::string check_outputs(const AttentionCase& c, const Outputs& gpu) {
  std::vector<double> ref_lse;
  const std::vector<double> ref = reference_mla(c.mla_args(), &ref_lse);
  const Tolerance tolerance = tolerance_for(DType::kBF16);
  std::string report = compare(gpu.out, ref, tolerance, "out vs reference");
  auto append = [&report](const std::string& r) {
    if (!r.empty()) report += (report.empty() ? "" : "\n") + r;
  };
  const int64_t dim_vo = c.spec().head_dim_vo;
  append(compare_rows(gpu.out, ref, dim_vo, gpu_row_tolerance(DType::kBF16),
                      "out vs reference (relative to the row)"));
  if (c.lse().defined()) append(compare(gpu.lse, ref_lse, kGpuLseTolerance, "lse vs reference"));
  // The CPU backend on the same inputs (into the case's host buffers, poisoned first).
  static const std::unique_ptr<Backend> cpu = cpu::make_backend();
  WorkspaceLimits limits;
  limits.max_batch = std::max<int32_t>(64, c.batch_size());
  limits.max_qo_rows = std::max<int64_t>(1024, c.num_rows());
  std::unique_ptr<Workspace> workspace = cpu->create_workspace(limits);
  poison(c.out());
  if (c.lse().defined()) poison(c.lse());
  cpu->plan(*workspace, c.op_desc(), c.meta());
  cpu->run_mla(*workspace, c.mla_args());
  append(
      compare(gpu.out, to_doubles(c.out()), {2 * tolerance.abs, 2 * tolerance.rel}, "out vs cpu"));
  append(compare_rows(gpu.out, to_doubles(c.out()), dim_vo, gpu_row_tolerance(DType::kBF16),
                      "out vs cpu (relative to the row)"));
  if (c.lse().defined()) {
    append(compare(gpu.lse, to_doubles(c.lse()), kGpuLseTolerance, "lse vs cpu"));
  }
  return report;
}

// Builds the case, runs it on the GPU (`edit` may change the device arguments) and checks it.
template <class Edit>
std::string check_case(const CaseSpec& spec, bool split_buffers, Edit edit) {
  const uint64_t seed = fresh_seed();
  const AttentionCase c(spec, seed);
  DeviceMlaCase d(c, split_buffers);
  MlaArgs args = d.args();
  edit(args);
  run_gpu(d, args);
  const std::string report = check_outputs(c, fetch(d));
  if (report.empty()) return report;
  return spec.name() + " (seed " + std::to_string(seed) +
         "; PAGEDATTN_TEST_SEED=" + std::to_string(seed) + " reproduces)\n" + report;
}

std::string check_case(const CaseSpec& spec, bool split_buffers = false) {
  return check_case(spec, split_buffers, [](MlaArgs&) {});
}

// ---- the table ----

std::vector<CaseSpec> mla_cases() {
  std::vector<CaseSpec> cases;
  // Heads x page sizes, lengths around the page edges (the long one once per head count).
  for (int32_t heads : {16, 32, 64, 128}) {
    for (int32_t page : {1, 16, 64}) {
      CaseSpec spec = base_mla(heads, page);
      if (page == 16) spec.kv_lens.back() = 2000;
      cases.push_back(spec);
    }
  }
  // Allocation pages larger than P (attention page -> allocation page + offset).
  for (auto [page, alloc] : {std::pair{1, 16}, {16, 64}, {64, 128}}) {
    CaseSpec spec = base_mla(32, page);
    spec.alloc_page_size = alloc;
    cases.push_back(spec);
  }
  // fp8 e4m3 latent cache with a dequantisation scale (P = 1, 16, 64; speculative rows; split).
  {
    CaseSpec spec = base_mla(16, 16);
    spec.kv_dtype = DType::kFP8E4M3;
    spec.kv_scale = 0.5f;
    cases.push_back(spec);
    spec = base_mla(128, 64);
    spec.kv_dtype = DType::kFP8E4M3;
    spec.kv_scale = 0.25f;
    spec.q_lens = {1, 3, 4, 2, 4};
    cases.push_back(spec);
    spec = base_mla(32, 1);
    spec.alloc_page_size = 16;
    spec.kv_dtype = DType::kFP8E4M3;
    spec.kv_scale = 2.0f;
    spec.kv_lens = {3000, 7, 0};
    cases.push_back(spec);
  }
  // Speculative decoding: 1..4 query rows per request, causal.
  for (int32_t heads : {16, 128}) {
    CaseSpec spec = base_mla(heads, 16);
    spec.kv_lens = {4, 17, 1, 300, 64};
    spec.q_lens = {4, 2, 1, 3, 4};
    cases.push_back(spec);
  }
  // Head counts that are not a power of two: a 64-row block holds 3.2 tokens of 20 heads, or 8
  // tokens of 8, so blocks straddle tokens (and their causal limits).
  for (int32_t heads : {20, 8}) {
    CaseSpec spec = base_mla(heads, 16);
    spec.kv_lens = {50, 300, 17, 4};
    spec.q_lens = {3, 4, 1, 4};
    cases.push_back(spec);
  }
  // Requests of at most 16 rows run in 16-row blocks: 8 heads (half a block), and 4 heads of 1..4
  // speculative tokens (one block holds 4 tokens, each with its own causal limit).
  {
    CaseSpec spec = base_mla(8, 1);
    spec.kv_lens = {1, 700, 65, 0};
    cases.push_back(spec);
    spec = base_mla(4, 16);
    spec.kv_lens = {50, 300, 17, 4};
    spec.q_lens = {4, 1, 3, 2};
    cases.push_back(spec);
  }
  // Extend (longer q_len, a cached prefix), causal and not.
  for (bool causal : {true, false}) {
    for (int32_t heads : {16, 128}) {
      CaseSpec spec = base_mla(heads, 16);
      spec.op = OpKind::kMlaExtend;
      // Sized for the float64 reference: 128 heads get shorter requests.
      spec.kv_lens =
          heads == 16 ? std::vector<int32_t>{1, 30, 200, 70} : std::vector<int32_t>{1, 30, 90};
      spec.q_lens =
          heads == 16 ? std::vector<int32_t>{1, 15, 40, 70} : std::vector<int32_t>{1, 15, 20};
      spec.causal = causal;
      cases.push_back(spec);
    }
  }
  {
    CaseSpec spec = base_mla(16, 16);  // padding requests: out 0, lse -inf
    spec.padded_batch = 8;
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base_mla(64, 16);  // every request empty
    spec.kv_lens = {0, 0, 0};
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base_mla(32, 16);  // sequential pages, no lse
    spec.shuffle_pages = false;
    spec.with_lse = false;
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base_mla(32, 16);  // another sm_scale, lse checked against float64
    spec.sm_scale = 0.05f;
    cases.push_back(spec);
  }
  // Split-KV: one long request (every SM busy), and long requests among empty ones, P = 1.
  for (int32_t heads : {16, 128}) {
    CaseSpec spec = base_mla(heads, 16);
    spec.kv_lens = {heads == 16 ? 6000 : 3000};
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base_mla(64, 1);
    spec.alloc_page_size = 16;
    spec.kv_lens = {3000, 0, 1, 1500};
    spec.padded_batch = 6;
    cases.push_back(spec);
  }
  // Peaked logits (sm_scale 4: a row's max climbs by steps below and above the lazy-rescale
  // slack of the GPU kernels as the keys go by), with and without a split.
  for (int32_t heads : {16, 128}) {
    CaseSpec spec = base_mla(heads, 16);
    spec.sm_scale = 4.0f;
    spec.kv_lens = {700, heads == 16 ? 6000 : 3000, 33};
    cases.push_back(spec);
  }
  {
    CaseSpec spec = base_mla(16, 16);  // split and speculative rows together
    spec.kv_lens = {3000, 1200};
    spec.q_lens = {4, 3};
    cases.push_back(spec);
  }
  return cases;
}

class CudaMlaTest : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CudaMlaTest, MatchesReferenceAndCpu) {
  PA_REQUIRE_GPU();
  const std::string report = check_case(GetParam());
  EXPECT_TRUE(report.empty()) << report;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaMlaTest, ::testing::ValuesIn(mla_cases()),
                         [](const ::testing::TestParamInfo<CaseSpec>& info) {
                           return info.param.name() + "_c" + std::to_string(info.index);
                         });

// ckv and kpe in separate buffers (not slices of one 576-wide row).
TEST(CudaMla, SeparateCkvAndKpeBuffers) {
  PA_REQUIRE_GPU();
  for (CaseSpec spec : {base_mla(16, 16), base_mla(128, 64)}) {
    spec.q_lens = {1, 2, 1, 4, 3};
    const std::string report = check_case(spec, /*split_buffers=*/true);
    EXPECT_TRUE(report.empty()) << report;
  }
}

// Without the max_q_len hint the partials are sized for q_len <= T. A small step still splits; a
// batch of 48 at 128 heads does not fit the workspace's partials, so it runs unsplit (one item per
// request). Both must give the same results as with the hint.
TEST(CudaMla, WithoutMaxQLenHint) {
  PA_REQUIRE_GPU();
  CaseSpec spec = base_mla(64, 16);
  spec.kv_lens = {3000, 3, 500};
  spec.q_lens = {2, 1, 4};
  CaseSpec wide = base_mla(128, 16);
  wide.kv_lens.clear();
  for (int32_t r = 0; r < 48; ++r) wide.kv_lens.push_back(r == 5 ? 1500 : 1 + 3 * r);
  for (const CaseSpec& s : {spec, wide}) {
    const std::string report = check_case(s, false, [](MlaArgs& args) { args.meta.max_q_len = 0; });
    EXPECT_TRUE(report.empty()) << report;
  }
}

// The other kernels where the default ones run, over heads, page sizes, speculative rows, extend,
// split and peaked logits: PAGEDATTN_MLA_KERNEL=mma, the general mma.sync kernel (the sm_80 path,
// which the Hopper test machine does not take on its own) on the bf16 blocks that the
// warp-specialized wgmma kernel (64 rows) and the read-bound kernel (16 rows) take otherwise;
// PAGEDATTN_MLA_KERNEL=seesaw, the two-sided wgmma kernel (opt-in), on the 64-row blocks (odd
// and even tile counts, a last tile cut short, P 1 / 16 / 64 / 128, split requests), with its
// copy-engine path for whole 64-token tiles (P a multiple of 64) and without (PAGEDATTN_MLA_TMA=0).
struct OtherKernel {
  const char* label;
  std::vector<std::pair<const char*, const char*>> env;
};

class CudaMlaOtherKernel : public ::testing::TestWithParam<OtherKernel> {};

TEST_P(CudaMlaOtherKernel, MatchesReference) {
  PA_REQUIRE_GPU();
  ScopedEnv force;
  for (const auto& [name, value] : GetParam().env) force.set(name, value);
  CaseSpec spec = base_mla(128, 16);
  spec.kv_lens = {3000, 17, 1, 64};
  spec.q_lens = {1, 3, 1, 2};  // q_len <= kv_len (a request's new rows are the last of its KV)
  CaseSpec extend = base_mla(32, 1);
  extend.op = OpKind::kMlaExtend;
  extend.kv_lens = {1, 30, 200};
  extend.q_lens = {1, 15, 40};
  CaseSpec small = base_mla(16, 1);
  small.kv_lens = {3000, 1, 65, 0, 31};
  CaseSpec peaked = base_mla(128, 16);
  peaked.sm_scale = 4.0f;
  peaked.kv_lens = {700, 3000};
  // Pages of 64 and 128 tokens: the seesaw kernel's copy-engine path (whole 64-token tiles on one
  // page) beside its gather (a last tile cut short, KV chunks of split requests), with allocation
  // pages of two attention pages, and ckv / kpe in buffers of their own.
  CaseSpec whole = base_mla(128, 64);
  whole.kv_lens = {3000, 64, 129, 640};
  whole.q_lens = {1, 2, 1, 1};
  CaseSpec alloc = base_mla(64, 128);
  alloc.alloc_page_size = 256;
  alloc.kv_lens = {1000, 128, 300, 2049};
  for (const CaseSpec& s : {spec, extend, base_mla(64, 64), small, peaked, whole, alloc}) {
    const std::string report = check_case(s);
    EXPECT_TRUE(report.empty()) << GetParam().label << ": " << report;
  }
  const std::string report = check_case(whole, true);
  EXPECT_TRUE(report.empty()) << GetParam().label << " (ckv and kpe apart): " << report;
}

INSTANTIATE_TEST_SUITE_P(Kernels, CudaMlaOtherKernel,
                         ::testing::Values(OtherKernel{"mma", {{"PAGEDATTN_MLA_KERNEL", "mma"}}},
                                           OtherKernel{"seesaw",
                                                       {{"PAGEDATTN_MLA_KERNEL", "seesaw"}}},
                                           OtherKernel{"seesaw_gather",
                                                       {{"PAGEDATTN_MLA_KERNEL", "seesaw"},
                                                        {"PAGEDATTN_MLA_TMA", "0"}}}),
                         [](const auto& info) { return std::string(info.param.label); });

// Clusters of the H <= 16 kernel (C CTAs share a request's chunk and combine in distributed shared
// memory) with C = 2 (the default limit), 4 and 8 (PAGEDATTN_MLA_CLUSTER): the batch is chosen so
// that the device's SMs give C CTAs a request; ragged lengths with one long request, which is split
// into several items (clusters, then the merge kernel), and an empty one.
TEST(CudaMla, ClustersOfCtas) {
  PA_REQUIRE_GPU();
  int device = 0, sms = 0;
  PA_CUDA_CHECK(cudaGetDevice(&device));
  PA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  for (const auto& [cluster, limit] : {std::pair{2, ""}, std::pair{4, "4"}, std::pair{8, "8"}}) {
    const ScopedEnv set_limit("PAGEDATTN_MLA_CLUSTER",
                              *limit != '\0' ? std::optional<std::string>(limit) : std::nullopt);
    const int32_t batch = std::max(1, sms / cluster);
    for (int32_t page : {1, 16, 64}) {
      CaseSpec spec = base_mla(16, page);
      spec.kv_lens.clear();
      for (int32_t i = 0; i < batch; ++i) {
        spec.kv_lens.push_back(std::array{1, 17, 64, 300, 0, 129}[static_cast<size_t>(i % 6)]);
      }
      spec.kv_lens[0] = 3000;
      const std::string report = check_case(spec);
      EXPECT_TRUE(report.empty()) << "clusters of " << cluster << ", batch " << batch << ", P "
                                  << page << ": " << report;
    }
  }
}

// The same logical KV with P = 1, 16 and 64 gives the same outputs (within rounding).
TEST(CudaMla, PageSizeInvariance) {
  PA_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::vector<Outputs> outputs;
  for (int32_t page : {1, 16, 64}) {
    CaseSpec spec = base_mla(32, page);
    spec.alloc_page_size = 64;
    spec.kv_lens = {700, 3, 64, 129};
    const AttentionCase c(spec, seed);
    DeviceMlaCase d(c, false);
    run_gpu(d, d.args());
    outputs.push_back(fetch(d));
    // Each run against float64 too (not only run against run).
    const std::string report = check_outputs(c, outputs.back());
    EXPECT_TRUE(report.empty()) << "P " << page << ", seed " << seed << "\n" << report;
  }
  for (size_t i = 1; i < outputs.size(); ++i) {
    std::string report = compare_rows(outputs[i].out, outputs[0].out, 512,
                                      gpu_row_tolerance(DType::kBF16), "P vs P=1");
    report += compare(outputs[i].lse, outputs[0].lse, kGpuLseTolerance, "lse: P vs P=1");
    EXPECT_TRUE(report.empty()) << "seed " << seed << "\n" << report;
  }
}

// One workspace, two different steps in a row (other batch, heads' rows, page size and partition):
// each run recomputes its partition, so the second is not confused by the first's.
TEST(CudaMla, WorkspaceReusedAcrossSteps) {
  PA_REQUIRE_GPU();
  CaseSpec first = base_mla(32, 16);
  first.kv_lens = {2500, 40};
  CaseSpec second = base_mla(32, 64);
  second.kv_lens = {5, 130, 64, 1, 700, 2};
  second.q_lens = {2, 4, 1, 1, 3, 2};
  const uint64_t seed = fresh_seed();
  const AttentionCase a(first, seed), b(second, seed + 1);
  DeviceMlaCase da(a, false), db(b, false);
  std::unique_ptr<Workspace> workspace = make_workspace(b);
  for (const DeviceMlaCase* d : {&da, &db}) {
    const MlaArgs args = d->args();
    cuda_backend().plan(*workspace, d->op(), args.meta);
    cuda_backend().run_mla(*workspace, args);
  }
  PA_CUDA_CHECK(cudaDeviceSynchronize());
  for (const DeviceMlaCase* d : {&da, &db}) {
    const std::string report = check_outputs(*d->host, fetch(*d));
    EXPECT_TRUE(report.empty()) << "seed " << seed << ", " << d->host->spec().name() << "\n"
                                << report;
  }
}

// Captured into a CUDA graph on a stream and replayed twice: the same results as the reference.
// Replays of one captured step: H 64 and H 16 with the merge kernel; H 16 in clusters of 2 CTAs a
// request (a batch of half the SMs) with the merge kernel for the long one.
enum class GraphMode { kMergeKernel, kClusters };
class CudaMlaGraph : public ::testing::TestWithParam<std::pair<int32_t, GraphMode>> {};

TEST_P(CudaMlaGraph, Replay) {
  PA_REQUIRE_GPU();
  const GraphMode mode = GetParam().second;
  CaseSpec spec = base_mla(GetParam().first, 16);
  spec.kv_lens = {2500, 5, 300};
  if (mode == GraphMode::kClusters) {
    int device = 0, sms = 0;
    PA_CUDA_CHECK(cudaGetDevice(&device));
    PA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    spec.kv_lens.assign(static_cast<size_t>(std::max(1, sms / 2)), 40);
    spec.kv_lens[0] = 2500;
    spec.kv_lens[1] = 0;
  }
  const uint64_t seed = fresh_seed();
  const AttentionCase c(spec, seed);
  DeviceMlaCase d(c, false);
  cudaStream_t stream = nullptr;
  PA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const MlaArgs args = d.args(stream);
  std::unique_ptr<Workspace> workspace = make_workspace(c);
  static_cast<cuda::CudaWorkspace&>(*workspace).stream = stream;
  cuda_backend().plan(*workspace, d.op(), args.meta);
  cuda_backend().run_mla(*workspace, args);  // eager once (one-time kernel attributes)
  PA_CUDA_CHECK(cudaStreamSynchronize(stream));
  PA_CUDA_CHECK(cudaMemset(args.out.data, 0xff, static_cast<size_t>(extent_bytes(args.out))));
  if (args.lse.defined()) {
    PA_CUDA_CHECK(cudaMemset(args.lse.data, 0xff, static_cast<size_t>(extent_bytes(args.lse))));
  }
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  PA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cuda_backend().plan(*workspace, d.op(), args.meta);  // a step: its partition, then the layer
  cuda_backend().run_mla(*workspace, args);
  PA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  PA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    // out and lse poisoned before each replay: check_outputs compares both with float64.
    PA_CUDA_CHECK(
        cudaMemsetAsync(args.out.data, 0xff, static_cast<size_t>(extent_bytes(args.out)), stream));
    if (args.lse.defined()) {
      PA_CUDA_CHECK(cudaMemsetAsync(args.lse.data, 0xff,
                                    static_cast<size_t>(extent_bytes(args.lse)), stream));
    }
    PA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    PA_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::string report = check_outputs(c, fetch(d));
    EXPECT_TRUE(report.empty()) << "seed " << seed << ", replay " << replay << "\n" << report;
  }
  PA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  PA_CUDA_CHECK(cudaGraphDestroy(graph));
  PA_CUDA_CHECK(cudaStreamDestroy(stream));
}

INSTANTIATE_TEST_SUITE_P(Heads, CudaMlaGraph,
                         ::testing::Values(std::pair{64, GraphMode::kMergeKernel},
                                           std::pair{16, GraphMode::kMergeKernel},
                                           std::pair{16, GraphMode::kClusters}),
                         [](const auto& info) {
                           const GraphMode mode = info.param.second;
                           // fmt, not string operator+: GCC 12 warns (-Wrestrict) falsely
                           // on the latter.
                           return fmt::format("h{}{}", info.param.first,
                                              mode == GraphMode::kClusters ? "_clusters" : "");
                         });

// Bad input: an Error naming the argument, and nothing written.
TEST(CudaMla, RejectsBadArguments) {
  PA_REQUIRE_GPU();
  const AttentionCase c(base_mla(16, 16), fresh_seed());
  DeviceMlaCase d(c, false);
  const MlaArgs args = d.args();
  std::unique_ptr<Workspace> workspace = make_workspace(c);
  EXPECT_EQ(error_containing([&] { cuda_backend().run_mla(*workspace, args); },  // not planned
                             {"run_mla: the workspace holds no MLA plan"}),
            "");
  cuda_backend().plan(*workspace, d.op(), args.meta);
  auto expect_error = [&](const MlaArgs& bad, const std::string& word) {
    try {
      cuda_backend().run_mla(*workspace, bad);
      ADD_FAILURE() << "accepted; expected an error naming " << word;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(word), std::string::npos) << error.what();
    }
  };
  MlaArgs bad = args;
  bad.sm_scale = 0.0f;
  expect_error(bad, "sm_scale");
  bad = args;
  bad.sm_scale = NAN;
  expect_error(bad, "sm_scale");
  bad = args;
  bad.q_pe = c.mla_args().q_pe;  // host memory
  expect_error(bad, "q_pe");
  bad = args;
  bad.out.shape[2] = 256;
  expect_error(bad, "out");
  bad = args;
  bad.lse.shape[1] = 8;
  expect_error(bad, "lse");
  bad = args;
  bad.kv.kpe.data = static_cast<char*>(bad.kv.kpe.data) + 2;  // not 16-byte aligned
  expect_error(bad, "kpe");
  bad = args;
  bad.kv.page_size = 3;  // does not divide the allocation page size 16
  expect_error(bad, "page");
  bad = args;
  bad.meta.kv_indptr.shape[0] = 2;
  expect_error(bad, "kv_indptr");
  bad = args;
  bad.meta.batch_size = 100000;
  expect_error(bad, "batch_size");
  bad = args;
  bad.q_nope.dtype = DType::kF16;  // f16 queries: not served
  expect_error(bad, "dtype");
  cudaStream_t other = nullptr;  // plan() ran the partition on the workspace's stream
  PA_CUDA_CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  bad = args;
  bad.stream = other;
  expect_error(bad, "stream");
  PA_CUDA_CHECK(cudaStreamDestroy(other));
  PA_CUDA_CHECK(cudaDeviceSynchronize());
  const Outputs outputs = fetch(d);
  for (double value : outputs.out) ASSERT_TRUE(std::isnan(value)) << "out was written";
  for (double value : outputs.lse) ASSERT_TRUE(std::isnan(value)) << "lse was written";
}

// supports_mla itself needs no GPU: what is served and why the rest is not.
TEST(CudaMla, SupportsSaysWhy) {
  OpDesc op;
  op.op = OpKind::kMlaDecode;
  op.device = Device::cuda(0);
  op.q_dtype = op.kv_dtype = DType::kBF16;
  op.num_qo_heads = 128;
  op.num_kv_heads = 1;
  op.head_dim_qk = 576;
  op.head_dim_vo = 512;
  op.page_size = 1;
  EXPECT_TRUE(cuda::supports_mla(op).ok) << cuda::supports_mla(op).reason;
  op.op = OpKind::kMlaExtend;
  EXPECT_TRUE(cuda::supports_mla(op).ok) << cuda::supports_mla(op).reason;
  op.num_qo_heads = 20;
  EXPECT_TRUE(cuda::supports_mla(op).ok) << cuda::supports_mla(op).reason;
  auto expect_no = [](const OpDesc& desc, const std::string& word) {
    const Support answer = cuda::supports_mla(desc);
    EXPECT_FALSE(answer.ok) << desc.str();
    EXPECT_NE(answer.reason.find(word), std::string::npos) << answer.reason;
  };
  op.kv_dtype = DType::kFP8E4M3;
  EXPECT_TRUE(cuda::supports_mla(op).ok) << cuda::supports_mla(op).reason;
  OpDesc bad = op;
  bad.kv_dtype = DType::kF16;
  expect_no(bad, "f16");
  bad = op;
  bad.q_dtype = DType::kF16;
  expect_no(bad, "f16");
  bad = op;
  bad.head_dim_vo = 256;
  bad.head_dim_qk = 320;
  expect_no(bad, "256");
  bad = op;
  bad.num_kv_heads = 2;
  expect_no(bad, "KV heads");
  bad = op;
  bad.op = OpKind::kDecode;
  expect_no(bad, "not an MLA");
  bad = op;
  bad.device = Device::cpu();
  expect_no(bad, "not a CUDA device");
}

}  // namespace
}  // namespace pagedattn::testing
