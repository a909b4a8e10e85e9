// The shared case generator (see common/cases.h): logical data first (seeded, independent of the
// page layout), then scattered into a NaN-filled paged pool through shuffled allocation pages.
#include "common/cases.h"
#include "reference/reference.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

namespace pagedattn::testing {
namespace {

[[noreturn]] void fail(const std::string& message) { throw_error("test case: " + message); }

// Stores `value` (already divided by the fp8 scale where applicable) at element `offset`.
void store(const TensorView& view, int64_t offset, float value) {
  char* base = static_cast<char*>(view.data);
  switch (view.dtype) {
    case DType::kF32:
      reinterpret_cast<float*>(base)[offset] = value;
      break;
    case DType::kF16:
      reinterpret_cast<uint16_t*>(base)[offset] = float_to_half(value);
      break;
    case DType::kBF16:
      reinterpret_cast<uint16_t*>(base)[offset] = float_to_bf16(value);
      break;
    case DType::kFP8E4M3:
      reinterpret_cast<uint8_t*>(base)[offset] = float_to_fp8e4m3(value);
      break;
    default:
      fail("store: not a floating dtype");
  }
}

void fill_nan(const HostTensor& tensor) {
  std::memset(tensor.view().data, 0xff, static_cast<size_t>(tensor.bytes()));  // NaN in all
}

// Fills a contiguous host tensor with uniform values.
void fill(const HostTensor& tensor, std::mt19937_64& rng, float range, float scale = 1.0f) {
  std::uniform_real_distribution<float> dist(-range, range);
  for (int64_t i = 0; i < tensor.numel(); ++i) store(tensor.view(), i, dist(rng) / scale);
}

HostTensor index_tensor(const std::vector<int32_t>& values) {
  HostTensor tensor(DType::kI32, {std::max<int64_t>(1, static_cast<int64_t>(values.size()))});
  std::copy(values.begin(), values.end(), tensor.data<int32_t>());
  return tensor;
}

TensorView sized(const HostTensor& tensor, int64_t n) {
  TensorView view = tensor.view();
  view.shape[0] = n;
  return view;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Local spellings (not the library's op_name/layout_name) keep this file independent of them.
const char* op_label(OpKind op) {
  switch (op) {
    case OpKind::kDecode:
      return "decode";
    case OpKind::kPrefill:
      return "prefill";
    case OpKind::kMlaDecode:
      return "mla_decode";
    case OpKind::kMlaExtend:
      return "mla_extend";
  }
  return "op";
}

}  // namespace

std::vector<double> AttentionCase::reference(std::vector<double>* lse) const {
  switch (spec_.op) {
    case OpKind::kDecode:
      return reference_decode(decode_args(), lse);
    case OpKind::kPrefill:
      return reference_prefill(prefill_args(), lse);
    case OpKind::kMlaDecode:
    case OpKind::kMlaExtend:
      break;
  }
  return reference_mla(mla_args(), lse);
}

std::string CaseSpec::name() const {
  std::string lens;
  for (size_t i = 0; i < kv_lens.size() && i < 4; ++i) {
    lens += fmt::format("_{}", kv_lens[i]);
    if (i < q_lens.size()) lens += fmt::format("q{}", q_lens[i]);
  }
  if (kv_lens.size() > 4) lens += fmt::format("_n{}", kv_lens.size());
  std::string text =
      fmt::format("{}_q{}_kv{}_h{}x{}_d{}{}_P{}{}_{}{}", op_label(op), dtype_name(q_dtype),
                  dtype_name(kv_dtype), num_qo_heads, num_kv_heads, head_dim_qk,
                  head_dim_vo != head_dim_qk ? fmt::format("v{}", head_dim_vo) : "", page_size,
                  alloc_page_size > page_size ? fmt::format("a{}", alloc_page_size) : "",
                  layout == KvLayout::kNHD ? "NHD" : "HND", lens);
  if (padded_batch > 0) text += fmt::format("_pad{}", padded_batch);
  if (logits_soft_cap > 0) text += "_cap";
  if (window_left >= 0) text += fmt::format("_win{}", window_left);
  if (!causal) text += "_noncausal";
  if (logit_std > 0) text += fmt::format("_std{}", static_cast<int>(logit_std * 10));
  if (dominant_keys > 0) text += fmt::format("_dom{}", dominant_keys);
  if (v_mean > 0) text += "_vmean";
  if (v_scale > 0) text += "_vscale";
  for (char& c : text) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return text;
}

AttentionCase::AttentionCase(const CaseSpec& spec, uint64_t seed) : spec_(spec) {
  const bool mla = is_mla(spec.op);
  const bool one_row_each = is_decode_like(spec.op) && spec.q_lens.empty();
  const int32_t num_reqs = static_cast<int32_t>(spec.kv_lens.size());
  if (!one_row_each && spec.q_lens.size() != spec.kv_lens.size()) {
    fail("q_lens must have one entry per request");
  }
  if (spec.page_size < 1) fail("page_size must be >= 1");
  const int32_t alloc = spec.alloc_page_size == 0 ? spec.page_size : spec.alloc_page_size;
  if (alloc % spec.page_size != 0) fail("alloc_page_size must be a multiple of page_size");
  if (mla && spec.num_kv_heads != 1) fail("MLA cases have one KV head");
  if (mla && spec.v_scale > 0) fail("v_scale: MLA has one latent scale (kv_scale)");
  batch_ = std::max(num_reqs, spec.padded_batch);
  const int32_t ratio = alloc / spec.page_size;

  // Lengths and qo_indptr.
  kv_lens_.assign(batch_, 0);
  q_lens_.assign(batch_, one_row_each ? 1 : 0);
  for (int32_t r = 0; r < num_reqs; ++r) {
    kv_lens_[r] = spec.kv_lens[r];
    if (!one_row_each) q_lens_[r] = spec.q_lens[r];
  }
  qo_indptr_.assign(batch_ + 1, 0);
  for (int32_t r = 0; r < batch_; ++r) qo_indptr_[r + 1] = qo_indptr_[r] + q_lens_[r];
  rows_ = qo_indptr_[batch_];

  // Allocation pages (shuffled, from their own stream) and attention-page metadata.
  std::vector<int64_t> alloc_pages_of(batch_ + 1, 0);
  for (int32_t r = 0; r < batch_; ++r) {
    alloc_pages_of[r + 1] = alloc_pages_of[r] + ceil_div(kv_lens_[r], alloc);
  }
  num_alloc_pages_ = alloc_pages_of[batch_] + spec.spare_pages;
  std::vector<int32_t> pool(static_cast<size_t>(num_alloc_pages_));
  std::iota(pool.begin(), pool.end(), 0);
  if (spec.shuffle_pages) {
    std::mt19937_64 shuffle_rng(seed ^ 0x9e3779b97f4a7c15ull);
    std::shuffle(pool.begin(), pool.end(), shuffle_rng);
  }
  kv_indptr_.assign(batch_ + 1, 0);
  kv_last_page_len_.assign(batch_, 0);
  for (int32_t r = 0; r < batch_; ++r) {
    const int64_t pages = ceil_div(kv_lens_[r], spec.page_size);
    for (int64_t j = 0; j < pages; ++j) {
      kv_indices_.push_back(pool[alloc_pages_of[r] + j / ratio] * ratio + j % ratio);
    }
    kv_indptr_[r + 1] = static_cast<int32_t>(kv_indices_.size());
    kv_last_page_len_[r] =
        pages == 0 ? 0 : kv_lens_[r] - static_cast<int32_t>(pages - 1) * spec.page_size;
  }

  // Tensors: queries, outputs, and a NaN-filled pool.
  std::mt19937_64 rng(seed);
  const int64_t heads = spec.num_qo_heads;
  const int64_t kv_heads = spec.num_kv_heads;
  const float range = spec.value_range;
  // Logit spread: q.k over D dims of uniform q in [-a, a), k in [-b, b) has std sqrt(D) a b / 3.
  const float sm_scale =
      spec.sm_scale > 0 ? spec.sm_scale : 1.0f / std::sqrt(float(spec.head_dim_qk));
  const float q_range =
      spec.logit_std > 0
          ? 3.0f * spec.logit_std / (sm_scale * std::sqrt(float(spec.head_dim_qk)) * range)
          : range;
  // Power extras from their own stream (the main stream, and so page-size invariance, unchanged):
  // the shared direction u (entries +-c, sm_scale * D * c^2 = boost), each request's dominant key
  // positions and V mean.
  std::mt19937_64 extra_rng(seed ^ 0x5851f42d4c957f2dull);
  std::vector<float> direction;
  std::vector<std::vector<int32_t>> dominant(batch_);
  std::vector<float> v_means(batch_, 0.0f);
  if (spec.dominant_keys > 0) {
    const float c = std::sqrt(spec.dominant_boost / (sm_scale * float(spec.head_dim_qk)));
    for (int32_t d = 0; d < spec.head_dim_qk; ++d) direction.push_back(extra_rng() & 1 ? c : -c);
    for (int32_t r = 0; r < batch_; ++r) {
      if (kv_lens_[r] == 0) continue;
      dominant[r] = {0, kv_lens_[r] - 1};
      for (int32_t i = 2; i < spec.dominant_keys; ++i) {
        dominant[r].push_back(static_cast<int32_t>(extra_rng() % uint64_t(kv_lens_[r])));
      }
    }
  }
  if (spec.v_mean > 0) {
    std::uniform_real_distribution<float> magnitude(0.5f * spec.v_mean, spec.v_mean);
    for (float& mean : v_means) mean = (extra_rng() & 1 ? 1.0f : -1.0f) * magnitude(extra_rng);
  }
  auto is_dominant = [&](int32_t r, int32_t t) {
    return std::find(dominant[r].begin(), dominant[r].end(), t) != dominant[r].end();
  };
  // Adds u to every query row (q_nope then q_pe for MLA: u spans head_dim_qk).
  auto add_direction_to_queries = [&](const HostTensor& tensor, int64_t dim_offset) {
    if (direction.empty()) return;
    const TensorView view = tensor.view();
    const int64_t dim = view.shape[2];
    for (int64_t i = 0; i < view.numel(); ++i) {
      const double value = read_element(view, i) + direction[dim_offset + i % dim];
      store(view, i, static_cast<float>(value));
    }
  };
  if (mla) {
    const int64_t rank = spec.head_dim_vo, rope = spec.head_dim_qk - spec.head_dim_vo;
    if (rope <= 0) fail("MLA: head_dim_qk must exceed head_dim_vo (rank + rope)");
    q_ = HostTensor(spec.q_dtype, {rows_, heads, rank});
    q_pe_ = HostTensor(spec.q_dtype, {rows_, heads, rope});
    fill(q_, rng, q_range);
    fill(q_pe_, rng, q_range);
    add_direction_to_queries(q_, 0);
    add_direction_to_queries(q_pe_, rank);
    k_ = HostTensor(spec.kv_dtype, {num_alloc_pages_, alloc, rank + rope});
  } else {
    q_ = HostTensor(spec.q_dtype, {rows_, heads, spec.head_dim_qk});
    fill(q_, rng, q_range);
    add_direction_to_queries(q_, 0);
    const bool nhd = spec.layout == KvLayout::kNHD;
    k_ = nhd ? HostTensor(spec.kv_dtype, {num_alloc_pages_, alloc, kv_heads, spec.head_dim_qk})
             : HostTensor(spec.kv_dtype, {num_alloc_pages_, kv_heads, alloc, spec.head_dim_qk});
    v_ = nhd ? HostTensor(spec.kv_dtype, {num_alloc_pages_, alloc, kv_heads, spec.head_dim_vo})
             : HostTensor(spec.kv_dtype, {num_alloc_pages_, kv_heads, alloc, spec.head_dim_vo});
    fill_nan(v_);
  }
  fill_nan(k_);
  out_ = HostTensor(spec.q_dtype, {rows_, heads, spec.head_dim_vo});
  lse_ = HostTensor(DType::kF32, {rows_, heads});

  // Logical KV, token by token, stored at the token's slot.
  const bool fp8 = spec.kv_dtype == DType::kFP8E4M3;
  const float kv_div = fp8 ? spec.kv_scale : 1.0f;
  const float v_div = fp8 && spec.v_scale > 0 ? spec.v_scale : kv_div;
  std::uniform_real_distribution<float> dist(-range, range);
  for (int32_t r = 0; r < batch_; ++r) {
    for (int32_t t = 0; t < kv_lens_[r]; ++t) {
      const int64_t page = pool[alloc_pages_of[r] + t / alloc];
      const int64_t offset = t % alloc;
      const bool boost = !direction.empty() && is_dominant(r, t);
      if (mla) {
        // The latent is K and (its first rank columns) V: u on K, the mean on the V part.
        const TensorView& view = k_.view();
        const int64_t base = page * view.strides[0] + offset * view.strides[1];
        for (int64_t d = 0; d < view.shape[2]; ++d) {
          const float shift = (boost ? direction[d] : 0.0f) + (d < spec.head_dim_vo ? v_means[r] : 0);
          store(view, base + d, (dist(rng) + shift) / kv_div);
        }
        continue;
      }
      for (const HostTensor* tensor : {&k_, &v_}) {
        const TensorView& view = tensor->view();
        const bool nhd = spec.layout == KvLayout::kNHD;
        const bool is_k = tensor == &k_;
        for (int64_t h = 0; h < kv_heads; ++h) {
          const int64_t base =
              page * view.strides[0] + (nhd ? offset * view.strides[1] + h * view.strides[2]
                                            : h * view.strides[1] + offset * view.strides[2]);
          for (int64_t d = 0; d < view.shape[3]; ++d) {
            const float shift = is_k ? (boost ? direction[d] : 0.0f) : v_means[r];
            store(view, base + d, (dist(rng) + shift) / (is_k ? kv_div : v_div));
          }
        }
      }
    }
  }

  // Views.
  qo_indptr_t_ = index_tensor(qo_indptr_);
  kv_indptr_t_ = index_tensor(kv_indptr_);
  kv_indices_t_ = index_tensor(kv_indices_);
  kv_last_page_len_t_ = index_tensor(kv_last_page_len_);
  meta_.batch_size = batch_;
  meta_.qo_indptr = sized(qo_indptr_t_, batch_ + 1);
  meta_.kv_indptr = sized(kv_indptr_t_, batch_ + 1);
  meta_.kv_indices = sized(kv_indices_t_, static_cast<int64_t>(kv_indices_.size()));
  meta_.kv_last_page_len = sized(kv_last_page_len_t_, batch_);
  meta_.max_q_len = batch_ == 0 ? 0 : *std::max_element(q_lens_.begin(), q_lens_.end());
  meta_.num_pages_hint = static_cast<int64_t>(kv_indices_.size());
  if (mla) {
    const int64_t rank = spec.head_dim_vo, rope = spec.head_dim_qk - spec.head_dim_vo;
    latent_.ckv = k_.view();
    latent_.ckv.shape[2] = rank;
    latent_.kpe = k_.view();
    latent_.kpe.shape[2] = rope;
    latent_.kpe.data = static_cast<char*>(k_.view().data) + rank * dtype_size(spec.kv_dtype);
    latent_.page_size = spec.page_size;
    latent_.scale = spec.kv_scale;
  } else {
    kv_.k = k_.view();
    kv_.v = v_.view();
    kv_.layout = spec.layout;
    kv_.page_size = spec.page_size;
    kv_.k_scale = kv_div;
    kv_.v_scale = v_div;
  }
}

OpDesc AttentionCase::op_desc() const {
  OpDesc op;
  op.op = spec_.op;
  op.device = Device::cpu();
  op.q_dtype = spec_.q_dtype;
  op.kv_dtype = spec_.kv_dtype;
  op.num_qo_heads = spec_.num_qo_heads;
  op.num_kv_heads = spec_.num_kv_heads;
  op.head_dim_qk = spec_.head_dim_qk;
  op.head_dim_vo = spec_.head_dim_vo;
  op.page_size = spec_.page_size;
  op.layout = spec_.layout;
  op.causal = spec_.causal;
  op.soft_cap = spec_.logits_soft_cap > 0;
  op.sliding_window = spec_.window_left >= 0;
  return op;
}

namespace {
AttentionOptions options_of(const CaseSpec& spec) {
  AttentionOptions options;
  options.sm_scale = spec.sm_scale > 0 ? spec.sm_scale : 1.0f / std::sqrt(float(spec.head_dim_qk));
  options.logits_soft_cap = spec.logits_soft_cap;
  options.window_left = spec.window_left;
  options.causal = spec.causal;
  return options;
}
}  // namespace

DecodeArgs AttentionCase::decode_args() const {
  DecodeArgs args;
  args.q = q_.view();
  args.kv = kv_;
  args.meta = meta_;
  args.out = out_.view();
  args.lse = lse();
  args.options = options_of(spec_);
  return args;
}

PrefillArgs AttentionCase::prefill_args() const {
  PrefillArgs args;
  args.q = q_.view();
  args.kv = kv_;
  args.meta = meta_;
  args.out = out_.view();
  args.lse = lse();
  args.options = options_of(spec_);
  return args;
}

MlaArgs AttentionCase::mla_args() const {
  MlaArgs args;
  args.q_nope = q_.view();
  args.q_pe = q_pe_.view();
  args.kv = latent_;
  args.meta = meta_;
  args.out = out_.view();
  args.lse = lse();
  args.sm_scale = options_of(spec_).sm_scale;
  args.causal = spec_.causal;
  return args;
}

int64_t AttentionCase::kv_bytes() const {
  const int64_t tokens = std::accumulate(kv_lens_.begin(), kv_lens_.end(), int64_t{0});
  const int64_t per_token =
      is_mla(spec_.op) ? spec_.head_dim_qk
                       : int64_t{spec_.num_kv_heads} * (spec_.head_dim_qk + spec_.head_dim_vo);
  return tokens * per_token * dtype_size(spec_.kv_dtype);
}

double AttentionCase::flops() const {
  double pairs = 0;
  for (int32_t r = 0; r < batch_; ++r) {
    const int64_t kv_len = kv_lens_[r], q_len = q_lens_[r];
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t position = kv_len - q_len + i;
      int64_t hi =
          spec_.causal || is_decode_like(spec_.op) ? std::min(position, kv_len - 1) : kv_len - 1;
      int64_t lo = spec_.window_left >= 0 ? std::max<int64_t>(0, position - spec_.window_left) : 0;
      if (hi >= lo) pairs += static_cast<double>(hi - lo + 1);
    }
  }
  return 2.0 * pairs * spec_.num_qo_heads * (spec_.head_dim_qk + spec_.head_dim_vo);
}

CaseSpec with_power(CaseSpec spec, float logit_std) {
  spec.logit_std = logit_std;
  spec.dominant_keys = 3;
  spec.v_mean = 0.5f;
  return spec;
}

CaseSpec decode_target_case() {
  CaseSpec spec;
  spec.op = OpKind::kDecode;
  spec.q_dtype = DType::kBF16;
  spec.kv_dtype = DType::kBF16;
  spec.num_qo_heads = 32;
  spec.num_kv_heads = 8;
  spec.head_dim_qk = spec.head_dim_vo = 128;
  spec.page_size = 16;
  spec.kv_lens.assign(16, 4096);
  return spec;
}

CaseSpec prefill_target_case() {
  CaseSpec spec = decode_target_case();
  spec.op = OpKind::kPrefill;
  spec.kv_lens.assign(4, 2048);
  spec.q_lens.assign(4, 512);
  return spec;
}

CaseSpec mla_decode_target_case() {
  CaseSpec spec;
  spec.op = OpKind::kMlaDecode;
  spec.num_qo_heads = 128;
  spec.num_kv_heads = 1;
  spec.head_dim_qk = 576;
  spec.head_dim_vo = 512;
  spec.page_size = 64;
  spec.kv_lens.assign(16, 4096);
  spec.sm_scale = 1.0f / std::sqrt(192.0f);
  return spec;
}

}  // namespace pagedattn::testing
