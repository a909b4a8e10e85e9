// One decode step through an installed pagedattn, as an engine would call it: a paged f32 KV cache
// (NHD, pages in a shuffled order), a block table planned by pagedattn::plan, the CPU backend
// chosen by the registry ("auto" on the CPU), run_decode. The output is checked against a few
// lines of naive attention in double (softmax(q k^T * scale) v per query head, GQA group g = Hq /
// Hkv); the program prints the largest difference and exits 1 when it is above 1e-4 (f32 math).
#include <pagedattn/backend.h>
#include <pagedattn/error.h>
#include <pagedattn/planner.h>
#include <pagedattn/registry.h>
#include <pagedattn/tensor.h>
#include <pagedattn/version.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

namespace {

constexpr int32_t kBatch = 3, kQoHeads = 8, kKvHeads = 2, kHeadDim = 64, kPageSize = 16;
constexpr int32_t kPages = 12;
const std::vector<int32_t> kSeqLens = {37, 1, 64};  // tokens per request

// K or V of token t of request r, head h, element d, read through the block table (NHD layout).
float cache_at(const std::vector<float>& pool, const std::vector<int32_t>& table, int32_t stride,
               int32_t r, int32_t t, int32_t h, int32_t d) {
  const int64_t page = table[r * stride + t / kPageSize];
  const int64_t offset = ((page * kPageSize + t % kPageSize) * kKvHeads + h) * kHeadDim + d;
  return pool[offset];
}

int run() {
  std::mt19937 rng(20261204);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const int64_t pool_elements = int64_t{kPages} * kPageSize * kKvHeads * kHeadDim;
  std::vector<float> k(pool_elements), v(pool_elements), q(kBatch * kQoHeads * kHeadDim);
  for (float& x : k) x = uniform(rng);
  for (float& x : v) x = uniform(rng);
  for (float& x : q) x = uniform(rng);

  // Block table: pages handed out in a shuffled order, 4 slots per request.
  constexpr int32_t kStride = 4;
  std::vector<int32_t> pages(kPages);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  std::vector<int32_t> table(kBatch * kStride, 0);
  for (int32_t r = 0, next = 0; r < kBatch; ++r) {
    for (int32_t b = 0; b < (kSeqLens[r] + kPageSize - 1) / kPageSize; ++b) {
      table[r * kStride + b] = pages[next++];
    }
  }

  pagedattn::PlanStorage storage(kBatch, kPages);
  pagedattn::PlanInput input;
  input.table = pagedattn::BlockTableInput{table, kStride};
  input.num_reqs = kBatch;
  input.seq_lens = kSeqLens;
  input.alloc_page_size = kPageSize;
  input.page_size = kPageSize;
  input.num_alloc_pages = kPages;
  const pagedattn::PlanSummary summary = pagedattn::plan(input, storage.buffers());

  using pagedattn::DType;
  using pagedattn::TensorView;
  pagedattn::DecodeArgs args;
  args.q = TensorView::contiguous(q.data(), DType::kF32, {kBatch, kQoHeads, kHeadDim});
  args.kv.k =
      TensorView::contiguous(k.data(), DType::kF32, {kPages, kPageSize, kKvHeads, kHeadDim});
  args.kv.v =
      TensorView::contiguous(v.data(), DType::kF32, {kPages, kPageSize, kKvHeads, kHeadDim});
  args.kv.page_size = kPageSize;
  std::vector<float> out(q.size(), 0.0f);
  args.out = TensorView::contiguous(out.data(), DType::kF32, {kBatch, kQoHeads, kHeadDim});
  args.meta.batch_size = summary.batch_size;
  args.meta.qo_indptr = TensorView::contiguous(storage.qo_indptr.data(), DType::kI32, {kBatch + 1});
  args.meta.kv_indptr = TensorView::contiguous(storage.kv_indptr.data(), DType::kI32, {kBatch + 1});
  args.meta.kv_indices =
      TensorView::contiguous(storage.kv_indices.data(), DType::kI32, {summary.num_pages});
  args.meta.kv_last_page_len =
      TensorView::contiguous(storage.kv_last_page_len.data(), DType::kI32, {kBatch});
  args.meta.max_q_len = 1;
  args.meta.num_pages_hint = summary.num_pages;
  args.options.sm_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));

  const pagedattn::OpDesc op = pagedattn::describe_op(args);
  const pagedattn::Backend& backend = pagedattn::select_backend(
      pagedattn::Registry::builtin(), pagedattn::Selection::parse("auto"), op);
  pagedattn::WorkspaceLimits limits;
  limits.max_batch = kBatch;
  limits.max_pages = kPages;
  const auto workspace = backend.create_workspace(limits);
  backend.plan(*workspace, op, args.meta);
  backend.run_decode(*workspace, args);

  double worst = 0.0;
  for (int32_t r = 0; r < kBatch; ++r) {
    for (int32_t h = 0; h < kQoHeads; ++h) {
      const int32_t kv_head = h / (kQoHeads / kKvHeads);
      const float* qh = &q[(r * kQoHeads + h) * kHeadDim];
      std::vector<double> score(kSeqLens[r]);
      double max_score = -INFINITY, sum = 0.0;
      for (int32_t t = 0; t < kSeqLens[r]; ++t) {
        double dot = 0.0;
        for (int32_t d = 0; d < kHeadDim; ++d) {
          dot += double{qh[d]} * cache_at(k, table, kStride, r, t, kv_head, d);
        }
        score[t] = dot / std::sqrt(double{kHeadDim});
        max_score = std::max(max_score, score[t]);
      }
      for (double& s : score) sum += (s = std::exp(s - max_score));
      for (int32_t d = 0; d < kHeadDim; ++d) {
        double expected = 0.0;
        for (int32_t t = 0; t < kSeqLens[r]; ++t) {
          expected += score[t] / sum * cache_at(v, table, kStride, r, t, kv_head, d);
        }
        worst = std::max(worst, std::abs(expected - out[(r * kQoHeads + h) * kHeadDim + d]));
      }
    }
  }
  std::printf(
      "pagedattn %s (CUDA %s, CPU SIMD %s): decode on '%.*s', %d requests, max |diff| %.3g\n",
      PAGEDATTN_VERSION_STRING, PAGEDATTN_BUILT_WITH_CUDA ? PAGEDATTN_CUDA_ARCHS : "off",
      PAGEDATTN_CPU_SIMD, static_cast<int>(backend.name().size()), backend.name().data(), kBatch,
      worst);
  if (!(worst <= 1e-4)) {
    std::fprintf(stderr, "decode_step: MISMATCH (max |diff| %.3g > 1e-4)\n", worst);
    return 1;
  }
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const pagedattn::Error& error) {
    std::fprintf(stderr, "decode_step: %s\n", error.what());
    return 1;
  }
}
