// Metadata taken on trust by the CUDA backends (src/cuda/common/guard.h): each class of bad entry
// (a page id equal to the pool's size or -1, a decreasing kv_indptr, a kv_indptr past kv_indices,
// kv_last_page_len 0 or P + 1, q_len > kv_len) on a request in the middle of a batch whose long
// requests are split, through every op and kernel family: decode on tensor cores (bf16) and on
// CUDA cores (fp8 KV, then the merge kernel), prefill (wgmma on Hopper, split KV; bf16 and fp8
// caches), MLA decode (H 16: the read-bound kernel; H 128: the warp-specialized one; fp8:
// mma.sync; H 16 in clusters)
// and MLA extend, and the cuda_generic backend. Each run checks: check_device_errors() throws
// after the sync with the message naming the op, request, entry and value, and is clear after;
// the bad request's rows are exactly 0 with lse -inf; every other request's rows match the
// float64 reference of that request over the same (bad) metadata; a valid call on the same
// workspace afterwards matches the reference everywhere. The pools are allocated with a page of
// NaN after their last page (a read of it would show), and compute-sanitizer memcheck runs these
// tests (scripts/gpu-check): a read before the pool (page -1) is outside the allocation. Also: a
// bad call captured in a CUDA graph (reported after the replay, and a valid replay after it), and
// the validating mode (WorkspaceLimits::validate_metadata: the CPU backend's messages, nothing
// launched). Skips where no GPU is usable.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/scoped_env.h"
#include "common/test_util.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_test_util.h"
#include "cuda/fault_log.h"
#include "cuda/generic/generic.h"
#include "reference/reference.h"

namespace pagedattn::testing {
namespace {

// ---- the cases ----

CaseSpec with_lengths(CaseSpec spec, std::vector<int32_t> kv_lens, std::vector<int32_t> q_lens) {
  spec.kv_lens = std::move(kv_lens);
  spec.q_lens = std::move(q_lens);
  return spec;
}

// Decode, five requests; request 2 (3000 tokens) and 4 are split into many items on any GPU.
CaseSpec decode_spec(DType kv_dtype) {
  CaseSpec spec;
  spec.op = OpKind::kDecode;
  spec.q_dtype = DType::kBF16;
  spec.kv_dtype = kv_dtype;
  spec.num_qo_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim_qk = spec.head_dim_vo = 128;
  spec.page_size = 16;
  if (kv_dtype == DType::kFP8E4M3) spec.kv_scale = 0.25f;
  return with_power(with_lengths(spec, {300, 40, 3000, 17, 2500}, {}));
}

// Prefill / extend: four requests with cached prefixes; the query tiles cover far fewer CTAs than
// the SMs, so the KV is split (params.h). Request 1 has 30 rows over 40 keys.
CaseSpec prefill_spec() {
  CaseSpec spec;
  spec.op = OpKind::kPrefill;
  spec.q_dtype = spec.kv_dtype = DType::kBF16;
  spec.num_qo_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim_qk = spec.head_dim_vo = 128;
  spec.page_size = 16;
  return with_power(with_lengths(spec, {100, 40, 700, 60}, {20, 30, 60, 40}));
}

CaseSpec mla_spec(OpKind op, int32_t heads, DType kv_dtype) {
  CaseSpec spec;
  spec.op = op;
  spec.q_dtype = DType::kBF16;
  spec.kv_dtype = kv_dtype;
  spec.num_qo_heads = heads;
  spec.num_kv_heads = 1;
  spec.head_dim_qk = 576;
  spec.head_dim_vo = 512;
  spec.page_size = 16;
  spec.sm_scale = 1.0f / std::sqrt(192.0f);
  if (kv_dtype == DType::kFP8E4M3) spec.kv_scale = 0.5f;
  if (op == OpKind::kMlaExtend) {
    return with_power(with_lengths(spec, {100, 40, 700, 60}, {20, 30, 60, 40}));
  }
  return with_power(with_lengths(spec, {300, 40, 3000, 17, 2000}, {}));
}

// ---- metadata, host side ----

struct HostMeta {
  std::vector<int32_t> qo, kv_indptr, kv_indices, last;
};

HostMeta host_meta(const AttentionCase& c) {
  return {c.qo_indptr(), c.kv_indptr(), c.kv_indices(), c.kv_last_page_len()};
}

int64_t pool_pages(const AttentionCase& c) {
  return is_mla(c.spec().op) ? c.mla_args().kv.num_attention_pages()
                             : c.decode_args().kv.num_attention_pages();
}

// A bad entry: what it does to the metadata, the request whose rows must then be 0 / -inf, and
// the pieces of check_device_errors()'s message that name it.
struct Mutation {
  std::string name;
  std::function<std::vector<std::string>(HostMeta&, const AttentionCase&)> apply;
  int32_t bad_request;
};

std::string op_text(const AttentionCase& c) { return std::string(op_name(c.spec().op)); }

// kv_indices[kv_indptr[r] + offset] = the pool's size (one past the last page), or -1.
Mutation page_id(int32_t r, int32_t offset, bool negative) {
  return {
      negative ? "PageMinusOne" : "PageIsPoolSize",
      [=](HostMeta& m, const AttentionCase& c) {
        const int64_t index = m.kv_indptr[r] + offset;
        const int64_t pool = pool_pages(c);
        const int32_t page = negative ? -1 : static_cast<int32_t>(pool);
        m.kv_indices[static_cast<size_t>(index)] = page;
        return std::vector<std::string>{
            fmt::format("{}: meta.kv_indices[{}] = {} of request {}", op_text(c), index, page, r),
            fmt::format("outside the pool's {} attention pages", pool)};
      },
      r};
}

// kv_indptr[r + 1] = kv_indptr[r] - 1: request r has -1 pages, and request r + 1 starts a page
// early, at request r - 1's last page, and spans request r's pages before its own. Those entries
// (r - 1's last, all of r's) are made request r's first page (a full page: r has at least two),
// so that r - 1 and r + 1 read only written slots (the pool's unwritten slots are NaN, and r's
// last page is partly unwritten) and each still has a defined reference over the bad metadata.
Mutation kv_indptr_decreasing(int32_t r) {
  return {"KvIndptrDecreasing",
          [=](HostMeta& m, const AttentionCase& c) {
            const int32_t begin = m.kv_indptr[r], end = m.kv_indptr[r + 1];
            EXPECT_GE(end - begin, 2) << "request r needs a full first page";
            const int32_t full = m.kv_indices[static_cast<size_t>(begin)];
            for (int32_t i = begin - 1; i < end; ++i) m.kv_indices[static_cast<size_t>(i)] = full;
            m.kv_indptr[r + 1] = begin - 1;
            return std::vector<std::string>{
                fmt::format("{}: meta.kv_indptr decreases at request {} ({} then {})", op_text(c),
                            r, begin, begin - 1)};
          },
          r};
}

// The last request's pages run past kv_indices.
Mutation kv_indptr_past_indices(int32_t batch) {
  const int32_t r = batch - 1;
  return {"KvIndptrPastIndices",
          [=](HostMeta& m, const AttentionCase& c) {
            const int32_t size = static_cast<int32_t>(m.kv_indices.size());
            m.kv_indptr[r + 1] = size + 5;
            return std::vector<std::string>{fmt::format(
                "{}: meta.kv_indptr gives request {} the pages [{}, {}) of meta.kv_indices, which "
                "has {} entries",
                op_text(c), r, m.kv_indptr[r], size + 5, size)};
          },
          r};
}

Mutation last_page_len(int32_t r, int32_t value) {
  return {fmt::format("LastPageLen{}", value),
          [=](HostMeta& m, const AttentionCase& c) {
            m.last[r] = value;
            return std::vector<std::string>{fmt::format(
                "{}: meta.kv_last_page_len[{}] = {} is out of range", op_text(c), r, value)};
          },
          r};
}

// Request r takes 10 query rows more than its KV holds from request r + 1 (qo_indptr[r + 1]).
Mutation q_len_over_kv_len(int32_t r) {
  return {"QLenOverKvLen",
          [=](HostMeta& m, const AttentionCase& c) {
            const int32_t kv_len = c.kv_lens()[r];
            m.qo[r + 1] = m.qo[r] + kv_len + 10;
            EXPECT_LE(m.qo[r + 1], m.qo[r + 2]) << "the case leaves request r + 1 no rows";
            return std::vector<std::string>{
                fmt::format("{}: request {} has {} query rows but {} KV tokens", op_text(c), r,
                            kv_len + 10, kv_len)};
          },
          r};
}

// ---- device side ----

const Backend& cuda_backend() {
  static const std::unique_ptr<Backend> backend = cuda::make_backend();
  return *backend;
}

// A device copy of a cache view whose dimension 0 is the allocation pages, followed by one more
// page of 0xff bytes (NaN): the guard page. The view covers the pool alone.
class GuardedPool {
 public:
  GuardedPool() = default;
  explicit GuardedPool(const TensorView& host) : view_(host) {
    const int64_t bytes = extent_bytes(host);
    const int64_t page_bytes = host.strides[0] * dtype_size(host.dtype);
    buffer_ = cuda::DeviceBuffer(static_cast<size_t>(bytes + page_bytes));
    PA_CUDA_CHECK(cudaMemcpy(buffer_.data(), host.data, bytes, cudaMemcpyHostToDevice));
    PA_CUDA_CHECK(cudaMemset(static_cast<char*>(buffer_.data()) + bytes, 0xff, page_bytes));
    view_.data = buffer_.data();
    view_.device = Device::cuda(0);
  }
  // `host` is a slice of the tensor this pool copied (MLA: ckv / kpe of the latent rows).
  TensorView slice(const TensorView& host, const TensorView& whole) const {
    TensorView out = host;
    out.data = static_cast<char*>(buffer_.data()) +
               (static_cast<const char*>(host.data) - static_cast<const char*>(whole.data));
    out.device = Device::cuda(0);
    return out;
  }
  const TensorView& view() const { return view_; }

 private:
  cuda::DeviceBuffer buffer_;
  TensorView view_;
};

// The case's inputs on the device, once; each call brings its own metadata and outputs.
struct DeviceInputs {
  explicit DeviceInputs(const AttentionCase& c) : c(&c) {
    if (is_mla(c.spec().op)) {
      const MlaArgs h = c.mla_args();
      q = DeviceTensor(h.q_nope);
      q_pe = DeviceTensor(h.q_pe);
      k = GuardedPool(c.latent_tensor().view());
      ckv = k.slice(h.kv.ckv, c.latent_tensor().view());
      kpe = k.slice(h.kv.kpe, c.latent_tensor().view());
    } else {
      const DecodeArgs h = c.decode_args();
      q = DeviceTensor(h.q);
      k = GuardedPool(h.kv.k);
      v = GuardedPool(h.kv.v);
    }
  }
  const AttentionCase* c;
  DeviceTensor q, q_pe;
  GuardedPool k, v;
  TensorView ckv, kpe;
};

struct Outputs {
  std::vector<double> out, lse;
};

// One call of the case's op over `meta` on `workspace` (plan, run on `stream`, sync); the
// outputs start poisoned (NaN).
Outputs run_op(const Backend& backend, Workspace& workspace, const DeviceInputs& d,
               const HostMeta& meta, void* stream = nullptr) {
  const AttentionCase& c = *d.c;
  const DeviceTensor qo = DeviceTensor::from_vector(meta.qo);
  const DeviceTensor kv_indptr = DeviceTensor::from_vector(meta.kv_indptr);
  const DeviceTensor kv_indices = DeviceTensor::from_vector(meta.kv_indices);
  const DeviceTensor last = DeviceTensor::from_vector(meta.last);
  const DeviceTensor out = DeviceTensor::poisoned_like(c.out());
  const DeviceTensor lse = DeviceTensor::poisoned_like(c.lse());
  StepMetadata m = c.meta();
  m.qo_indptr = qo.view();
  m.kv_indptr = kv_indptr.view();
  m.kv_indices = kv_indices.view();
  m.kv_last_page_len = last.view();
  if (auto* cuda_workspace = dynamic_cast<cuda::CudaWorkspace*>(&workspace)) {
    cuda_workspace->stream = stream;
  }
  const OpKind op = c.spec().op;
  if (is_mla(op)) {
    MlaArgs a = c.mla_args();
    a.q_nope = d.q.view();
    a.q_pe = d.q_pe.view();
    a.kv.ckv = d.ckv;
    a.kv.kpe = d.kpe;
    a.meta = m;
    a.out = out.view();
    if (a.lse.defined()) a.lse = lse.view();
    a.stream = stream;
    backend.plan(workspace, describe_op(a, op), a.meta);
    backend.run_mla(workspace, a);
  } else if (op == OpKind::kDecode) {
    DecodeArgs a = c.decode_args();
    a.q = d.q.view();
    a.kv.k = d.k.view();
    a.kv.v = d.v.view();
    a.meta = m;
    a.out = out.view();
    if (a.lse.defined()) a.lse = lse.view();
    a.stream = stream;
    backend.plan(workspace, describe_op(a), a.meta);
    backend.run_decode(workspace, a);
  } else {
    PrefillArgs a = c.prefill_args();
    a.q = d.q.view();
    a.kv.k = d.k.view();
    a.kv.v = d.v.view();
    a.meta = m;
    a.out = out.view();
    if (a.lse.defined()) a.lse = lse.view();
    a.stream = stream;
    backend.plan(workspace, describe_op(a), a.meta);
    backend.run_prefill(workspace, a);
  }
  PA_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  Outputs result;
  poison(c.out());
  out.copy_to(c.out());
  result.out = to_doubles(c.out());
  if (c.lse().defined()) {
    poison(c.lse());
    lse.copy_to(c.lse());
    result.lse = to_doubles(c.lse());
  }
  return result;
}

// Request r's query rows [first, last) under `meta`.
std::pair<int64_t, int64_t> rows_of(const AttentionCase& c, const HostMeta& meta, int32_t r) {
  if (c.spec().op == OpKind::kDecode) return {r, r + 1};
  return {meta.qo[r], meta.qo[r + 1]};
}

// The float64 reference of request r alone over `meta` (host arrays): out [T, H, Dvo] with only
// its rows filled, and lse.
Outputs reference_request(const AttentionCase& c, const HostMeta& meta, int32_t r) {
  std::vector<int32_t> qo = {0, 1}, kv_indptr = {meta.kv_indptr[r], meta.kv_indptr[r + 1]};
  std::vector<int32_t> last = {meta.last[r]}, indices = meta.kv_indices;
  const OpKind op = c.spec().op;
  if (op != OpKind::kDecode) qo = {meta.qo[r], meta.qo[r + 1]};
  StepMetadata m;
  m.batch_size = 1;
  m.qo_indptr = TensorView::contiguous(qo.data(), DType::kI32, {2});
  m.kv_indptr = TensorView::contiguous(kv_indptr.data(), DType::kI32, {2});
  m.kv_indices =
      TensorView::contiguous(indices.data(), DType::kI32, {static_cast<int64_t>(indices.size())});
  m.kv_last_page_len = TensorView::contiguous(last.data(), DType::kI32, {1});
  Outputs ref;
  if (op == OpKind::kDecode) {
    DecodeArgs a = c.decode_args();
    a.q.data = static_cast<char*>(a.q.data) + r * a.q.strides[0] * dtype_size(a.q.dtype);
    a.q.shape[0] = 1;
    a.meta = m;
    const std::vector<double> row = reference_decode(a, &ref.lse);
    const int64_t width = static_cast<int64_t>(row.size());
    ref.out.assign(static_cast<size_t>(c.num_rows() * width), 0.0);
    std::copy(row.begin(), row.end(), ref.out.begin() + r * width);
    std::vector<double> lse(static_cast<size_t>(c.num_rows() * c.spec().num_qo_heads),
                            -std::numeric_limits<double>::infinity());
    std::copy(ref.lse.begin(), ref.lse.end(), lse.begin() + r * c.spec().num_qo_heads);
    ref.lse = lse;
  } else if (is_mla(op)) {
    MlaArgs a = c.mla_args();
    a.meta = m;
    ref.out = reference_mla(a, &ref.lse);
  } else {
    PrefillArgs a = c.prefill_args();
    a.meta = m;
    ref.out = reference_prefill(a, &ref.lse);
  }
  return ref;
}

// Rows [first, last) of `values` (rows of `width`).
std::vector<double> rows(const std::vector<double>& values, int64_t first, int64_t last,
                         int64_t width) {
  return {values.begin() + first * width, values.begin() + last * width};
}

// Request r's rows of `got` against `expected`; "" when they match.
std::string compare_request(const AttentionCase& c, const Outputs& got, const Outputs& expected,
                            std::pair<int64_t, int64_t> span, const std::string& what) {
  const CaseSpec& s = c.spec();
  const int64_t width = int64_t{s.num_qo_heads} * s.head_dim_vo;
  const std::vector<double> g = rows(got.out, span.first, span.second, width);
  const std::vector<double> e = rows(expected.out, span.first, span.second, width);
  std::string report = compare(g, e, tolerance_for(s.q_dtype), what + " out");
  if (report.empty()) {
    report = compare_rows(g, e, s.head_dim_vo, gpu_row_tolerance(s.q_dtype), what + " out (rows)");
  }
  if (report.empty() && !got.lse.empty()) {
    report = compare(rows(got.lse, span.first, span.second, s.num_qo_heads),
                     rows(expected.lse, span.first, span.second, s.num_qo_heads), kGpuLseTolerance,
                     what + " lse");
  }
  return report;
}

// "" when `statement` throws Error with every needle in its message.
std::string throws_with(const std::function<void()>& statement,
                        const std::vector<std::string>& needles) {
  try {
    statement();
  } catch (const Error& error) {
    const std::string message = error.what();
    for (const std::string& needle : needles) {
      if (message.find(needle) == std::string::npos) {
        return fmt::format("the message lacks \"{}\": {}", needle, message);
      }
    }
    return "";
  }
  return "no Error thrown";
}

WorkspaceLimits limits_for(const AttentionCase& c) {
  WorkspaceLimits limits;
  limits.max_batch = std::max<int32_t>(64, c.batch_size());
  limits.max_qo_heads = 128;
  return limits;
}

// The whole check of one mutation on one case (see the file comment).
void check_mutation(const CaseSpec& spec, const Mutation& mutation,
                    const Backend& backend = cuda_backend()) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(fmt::format("{} / {} (seed {}; PAGEDATTN_TEST_SEED={} reproduces)", spec.name(),
                           mutation.name, seed, seed));
  const AttentionCase c(spec, seed);
  const DeviceInputs d(c);
  const HostMeta valid = host_meta(c);
  HostMeta bad = valid;
  const std::vector<std::string> needles = mutation.apply(bad, c);
  const std::unique_ptr<Workspace> workspace = backend.create_workspace(limits_for(c));

  const Outputs got = run_op(backend, *workspace, d, bad);
  EXPECT_EQ(throws_with([&] { workspace->check_device_errors(); }, needles), "");
  EXPECT_NO_THROW(workspace->check_device_errors()) << "the error was not cleared";

  // The bad request: exactly 0 and -inf.
  const int64_t width = int64_t{spec.num_qo_heads} * spec.head_dim_vo;
  const auto [first, last] = rows_of(c, bad, mutation.bad_request);
  EXPECT_LT(first, last) << "the bad request has no rows to check";
  for (int64_t i = first * width; i < last * width; ++i) {
    ASSERT_EQ(got.out[static_cast<size_t>(i)], 0.0) << "out element " << i << " of the bad request";
  }
  for (int64_t i = first * spec.num_qo_heads; i < last * spec.num_qo_heads && !got.lse.empty();
       ++i) {
    ASSERT_EQ(got.lse[static_cast<size_t>(i)], -std::numeric_limits<double>::infinity())
        << "lse element " << i << " of the bad request";
  }
  // Every other request: its reference over the same metadata.
  for (int32_t r = 0; r < c.batch_size(); ++r) {
    if (r == mutation.bad_request) continue;
    const std::string report = compare_request(c, got, reference_request(c, bad, r),
                                               rows_of(c, bad, r), fmt::format("request {}", r));
    EXPECT_EQ(report, "");
  }

  // A valid call on the same workspace: no error, every row as the reference.
  const Outputs again = run_op(backend, *workspace, d, valid);
  EXPECT_NO_THROW(workspace->check_device_errors());
  Outputs ref;
  ref.out = c.reference(&ref.lse);
  EXPECT_EQ(compare_request(c, again, ref, {0, c.num_rows()}, "valid call after"), "");
}

// ---- the tests ----

TEST(CudaGuardDecode, TensorCoresSplit) {
  PA_REQUIRE_GPU();
  const CaseSpec spec = decode_spec(DType::kBF16);
  // The merge's two reads of the partials (PAGEDATTN_DECODE_MERGE_READ): a poisoned partial must
  // make its rows 0 / -inf either way.
  for (const char* merge_read : {"loads", "bulk"}) {
    SCOPED_TRACE(fmt::format("PAGEDATTN_DECODE_MERGE_READ={}", merge_read));
    const ScopedEnv env("PAGEDATTN_DECODE_MERGE_READ", merge_read);
    // Page 100 of request 2 lies in a middle item of its split.
    for (const Mutation& m :
         {page_id(2, 100, false), page_id(2, 100, true), kv_indptr_decreasing(2),
          kv_indptr_past_indices(5), last_page_len(2, 0), last_page_len(2, 17)}) {
      check_mutation(spec, m);
    }
  }
}

TEST(CudaGuardDecode, Fp8CudaCoresSplitAndMerge) {
  PA_REQUIRE_GPU();
  const CaseSpec spec = decode_spec(DType::kFP8E4M3);
  for (const Mutation& m : {page_id(2, 100, false), page_id(2, 100, true), kv_indptr_decreasing(2),
                            last_page_len(2, 17)}) {
    check_mutation(spec, m);
  }
}

TEST(CudaGuardPrefill, SplitKv) {
  PA_REQUIRE_GPU();
  const CaseSpec spec = prefill_spec();
  // The first page of request 2: every one of its rows (causal, no window) reads it.
  for (const Mutation& m : {page_id(2, 0, false), page_id(2, 0, true), kv_indptr_decreasing(2),
                            last_page_len(2, 17), q_len_over_kv_len(1)}) {
    check_mutation(spec, m);
  }
  // An fp8 cache (the kernels' fp8 instantiation: the same gather, widened in shared memory).
  CaseSpec fp8 = spec;
  fp8.kv_dtype = DType::kFP8E4M3;
  fp8.kv_scale = 0.5f;
  check_mutation(fp8, page_id(2, 0, false));
  check_mutation(fp8, kv_indptr_decreasing(2));
}

// The warp-specialized kernel on 2 persistent CTAs, each taking many units in turn (its page-fault
// slots reused unit after unit): 16 KV heads, so that the tiles cover the SMs and the KV is not
// split (a split grid is never persistent).
TEST(CudaGuardPrefill, PersistentWarpSpecialized) {
  PA_REQUIRE_GPU();
  const ScopedEnv force("PAGEDATTN_PREFILL_KERNEL", "ws-persistent-2");
  CaseSpec spec = prefill_spec();
  spec.num_qo_heads = 64;
  spec.num_kv_heads = 16;
  for (const Mutation& m : {page_id(2, 0, false), page_id(2, 0, true), kv_indptr_decreasing(2),
                            last_page_len(2, 17), q_len_over_kv_len(1)}) {
    check_mutation(spec, m);
  }
}

TEST(CudaGuardMla, DecodeEveryKernel) {
  PA_REQUIRE_GPU();
  // H 16: the read-bound kernel, split (and merged); H 128: the warp-specialized kernel; fp8: the
  // mma.sync kernel.
  for (const Mutation& m : {page_id(2, 100, false), page_id(2, 100, true), kv_indptr_decreasing(2),
                            last_page_len(2, 0)}) {
    check_mutation(mla_spec(OpKind::kMlaDecode, 16, DType::kBF16), m);
  }
  check_mutation(mla_spec(OpKind::kMlaDecode, 128, DType::kBF16), page_id(2, 100, false));
  check_mutation(mla_spec(OpKind::kMlaDecode, 128, DType::kBF16), kv_indptr_past_indices(5));
  check_mutation(mla_spec(OpKind::kMlaDecode, 16, DType::kFP8E4M3), page_id(2, 100, true));
}

// The opt-in two-sided H 128 kernel (PAGEDATTN_MLA_KERNEL=seesaw): its gather warpgroup meets the
// bad id; the math warpgroups write the block's rows as 0 / -inf (poisoned partials where split).
TEST(CudaGuardMla, DecodeTwoSidedKernel) {
  PA_REQUIRE_GPU();
  const ScopedEnv force("PAGEDATTN_MLA_KERNEL", "seesaw");
  for (const Mutation& m : {page_id(2, 100, false), page_id(2, 100, true), kv_indptr_decreasing(2),
                            kv_indptr_past_indices(5), last_page_len(2, 0)}) {
    check_mutation(mla_spec(OpKind::kMlaDecode, 128, DType::kBF16), m);
  }
}

TEST(CudaGuardMla, DecodeInClusters) {
  PA_REQUIRE_GPU();
  // SMs / 2 short requests: two CTAs per request, a cluster of 2 where the H 16 kernel takes
  // clusters (Hopper); the bad page in one of them.
  int sms = 0;
  PA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CaseSpec spec = mla_spec(OpKind::kMlaDecode, 16, DType::kBF16);
  spec.kv_lens.assign(static_cast<size_t>(std::max(4, sms / 2)), 300);
  const int32_t r = static_cast<int32_t>(spec.kv_lens.size() / 2);
  check_mutation(spec, page_id(r, 15, false));
}

TEST(CudaGuardMla, Extend) {
  PA_REQUIRE_GPU();
  const CaseSpec spec = mla_spec(OpKind::kMlaExtend, 16, DType::kBF16);
  for (const Mutation& m : {page_id(2, 0, false), kv_indptr_decreasing(2), q_len_over_kv_len(1),
                            last_page_len(2, 17)}) {
    check_mutation(spec, m);
  }
}

TEST(CudaGuardGeneric, DecodeAndPrefill) {
  PA_REQUIRE_GPU();
  const std::unique_ptr<Backend> generic = cuda::make_generic_backend();
  check_mutation(decode_spec(DType::kBF16), page_id(2, 100, false), *generic);
  check_mutation(decode_spec(DType::kBF16), kv_indptr_decreasing(2), *generic);
  check_mutation(prefill_spec(), q_len_over_kv_len(1), *generic);
}

// A bad run_decode captured in a CUDA graph: reported after the replay; the same graph replayed
// over valid metadata (written into the same buffers) then works.
TEST(CudaGuardGraph, ReportedAfterReplay) {
  PA_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  const AttentionCase c(decode_spec(DType::kBF16), seed);
  const DeviceInputs d(c);
  const HostMeta valid = host_meta(c);
  HostMeta bad = valid;
  const std::vector<std::string> needles = page_id(2, 100, false).apply(bad, c);
  cudaStream_t stream = nullptr;
  PA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::unique_ptr<Workspace> workspace = cuda_backend().create_workspace(limits_for(c));
  auto& ws = dynamic_cast<cuda::CudaWorkspace&>(*workspace);
  ws.stream = stream;
  DeviceTensor qo = DeviceTensor::from_vector(bad.qo);
  DeviceTensor kv_indptr = DeviceTensor::from_vector(bad.kv_indptr);
  DeviceTensor kv_indices = DeviceTensor::from_vector(bad.kv_indices);
  DeviceTensor last = DeviceTensor::from_vector(bad.last);
  const DeviceTensor out = DeviceTensor::poisoned_like(c.out());
  const DeviceTensor lse = DeviceTensor::poisoned_like(c.lse());
  DecodeArgs a = c.decode_args();
  a.q = d.q.view();
  a.kv.k = d.k.view();
  a.kv.v = d.v.view();
  a.meta.qo_indptr = qo.view();
  a.meta.kv_indptr = kv_indptr.view();
  a.meta.kv_indices = kv_indices.view();
  a.meta.kv_last_page_len = last.view();
  a.out = out.view();
  a.lse = lse.view();
  a.stream = stream;
  // One eager call first (kernel attributes set outside the capture), then the capture.
  cuda_backend().plan(ws, describe_op(a), a.meta);
  cuda_backend().run_decode(ws, a);
  PA_CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_EQ(throws_with([&] { ws.check_device_errors(); }, needles), "");
  cudaGraph_t graph = nullptr;
  PA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cuda_backend().plan(ws, describe_op(a), a.meta);
  cuda_backend().run_decode(ws, a);
  PA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  PA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  PA_CUDA_CHECK(cudaGraphDestroy(graph));
  EXPECT_NO_THROW(ws.check_device_errors()) << "capture alone must record nothing";
  for (int replay = 0; replay < 2; ++replay) {
    PA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    PA_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_EQ(throws_with([&] { ws.check_device_errors(); }, needles), "") << "replay " << replay;
  }
  // Valid metadata into the captured buffers: the replay matches the reference, no error.
  const std::vector<int32_t>& indices = valid.kv_indices;
  kv_indices.copy_from(TensorView::contiguous(const_cast<int32_t*>(indices.data()), DType::kI32,
                                              {static_cast<int64_t>(indices.size())}));
  PA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  PA_CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_NO_THROW(ws.check_device_errors());
  poison(c.out());
  out.copy_to(c.out());
  poison(c.lse());
  lse.copy_to(c.lse());
  Outputs got{to_doubles(c.out()), to_doubles(c.lse())};
  Outputs ref;
  ref.out = c.reference(&ref.lse);
  EXPECT_EQ(compare_request(c, got, ref, {0, c.num_rows()}, "valid replay"), "");
  PA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  PA_CUDA_CHECK(cudaStreamDestroy(stream));
}

// Validating mode: plan() and run_* check the metadata on the host with the CPU backend's
// messages and launch nothing (out stays poisoned).
TEST(CudaGuardValidating, CpuMessagesNothingLaunched) {
  PA_REQUIRE_GPU();
  struct Case {
    CaseSpec spec;
    Mutation mutation;
    std::string message;
  };
  const std::vector<Case> cases = {
      {decode_spec(DType::kBF16), page_id(2, 100, false), "page {} is out of range"},
      {decode_spec(DType::kBF16), kv_indptr_decreasing(2),
       "meta.kv_indptr: decreases at request 2"},
      {prefill_spec(), q_len_over_kv_len(1), "meta.qo_indptr: request 1 has 50 query rows"},
      {mla_spec(OpKind::kMlaExtend, 16, DType::kBF16), last_page_len(2, 17),
       "meta.kv_last_page_len[2]: 17 is out of range"},
  };
  for (const Case& k : cases) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(fmt::format("{} / {} (seed {})", k.spec.name(), k.mutation.name, seed));
    const AttentionCase c(k.spec, seed);
    const DeviceInputs d(c);
    HostMeta bad = host_meta(c);
    k.mutation.apply(bad, c);
    WorkspaceLimits limits = limits_for(c);
    limits.validate_metadata = true;
    const std::unique_ptr<Workspace> workspace = cuda_backend().create_workspace(limits);
    const std::string message = fmt::format(fmt::runtime(k.message), pool_pages(c));
    EXPECT_EQ(throws_with([&] { run_op(cuda_backend(), *workspace, d, bad); }, {message}), "");
    EXPECT_NO_THROW(workspace->check_device_errors()) << "nothing should have run";
    // A valid call in validating mode runs as usual.
    const Outputs got = run_op(cuda_backend(), *workspace, d, host_meta(c));
    Outputs ref;
    ref.out = c.reference(&ref.lse);
    EXPECT_EQ(compare_request(c, got, ref, {0, c.num_rows()}, "valid call"), "");
  }
}

// The host's messages for every fault code (no device needed): the op, the request, the array
// entry and its value, what was expected and what was written.
TEST(CudaGuardMessages, EveryCodeNamesTheEntry) {
  auto message = [](cuda::FaultCode code, OpKind op, int32_t request, int64_t index, int64_t value,
                    int64_t limit) {
    cuda::FaultRecord record{};
    record.code = code;
    record.op = static_cast<int32_t>(op);
    record.request = request;
    record.index = index;
    record.value = value;
    record.limit = limit;
    return cuda::describe_fault(record);
  };
  EXPECT_EQ(message(cuda::kFaultPageOutOfRange, OpKind::kDecode, 2, 37, 4096, 4096),
            "decode: meta.kv_indices[37] = 4096 of request 2 is outside the pool's 4096 attention "
            "pages; it was not read, and the request's rows that needed it were written as 0 / "
            "-inf");
  EXPECT_EQ(message(cuda::kFaultKvIndptrDecreasing, OpKind::kPrefill, 3, 40, 39, 0),
            "prefill: meta.kv_indptr decreases at request 3 (40 then 39); the request's rows were "
            "written as 0 / -inf");
  EXPECT_EQ(message(cuda::kFaultKvIndptrPastIndices, OpKind::kMlaDecode, 4, 300, 305, 300),
            "mla_decode: meta.kv_indptr gives request 4 the pages [300, 305) of meta.kv_indices, "
            "which has 300 entries; the request's rows were written as 0 / -inf");
  EXPECT_EQ(message(cuda::kFaultLastPageLen, OpKind::kDecode, 2, 188, 17, 16),
            "decode: meta.kv_last_page_len[2] = 17 is out of range (expected [1, 16] for a request "
            "with 188 pages); the request's rows were written as 0 / -inf");
  EXPECT_NE(message(cuda::kFaultLastPageLen, OpKind::kDecode, 2, 0, 17, 16).find("[0, 16]"),
            std::string::npos);
  EXPECT_EQ(message(cuda::kFaultQoIndptr, OpKind::kMlaExtend, 1, 50, 20, 150),
            "mla_extend: meta.qo_indptr gives request 1 the query rows [50, 20) (expected an "
            "ordered range within q's 150 rows); nothing was written for the request");
  EXPECT_EQ(message(cuda::kFaultQLenOverMax, OpKind::kPrefill, 1, 0, 70, 60),
            "prefill: request 1 has 70 query rows, more than meta.max_q_len = 60 (the bound the "
            "launch was sized by); nothing was written for the request");
  EXPECT_EQ(message(cuda::kFaultQLenOverKvLen, OpKind::kMlaExtend, 1, 0, 50, 40),
            "mla_extend: request 1 has 50 query rows but 40 KV tokens (expected q_len <= kv_len: "
            "a request's new tokens are the last of its KV); the request's rows were written as "
            "0 / -inf");
}

}  // namespace
}  // namespace pagedattn::testing
