// One decoder layer's sublayers on the device (state.h), the CUDA side of src/model/layers_gqa.cpp
// and layers_deepseek.cpp with the same arithmetic:
//
// GQA   qkv = x · Wqkvᵀ (one GEMM; f32 out, or the compute dtype past the GEMV's rows:
//       narrow_output); per head: + bias (Qwen2), q/k RMSNorm (Qwen3), RoPE; q converted to the
//       pool dtype (q, k and v's heads in one transform_heads launch); k / v written by that
//       launch straight into their slots where the pool holds q's dtype unscaled (else stored
//       from the f32 buffer by cuda::store_kv, one more launch); attention through the planned
//       backend (decode or prefill); o_proj. At batch 1 a launch costs more than its work, hence
//       the fused launches.
// MLA   q = q_b(norm(q_a(x))) or q_proj(x); kv_a = kv_a_proj(x): the latent normed, k_pe and q_pe
//       rotated (one launch), the latent and k_pe stored (cuda::store_latent: the 576-wide row,
//       one launch); q_latent_h = q_nope_h · W_UK_h for every head in one strided-batched GEMM;
//       run_mla over the latent cache; o_h = o_latent_h · W_UV_hᵀ (another batched GEMM); o_proj.
// MLP   gate_up = x · Wᵀ (f32 or the compute dtype, as qkv), SiLU·mul, down.
// Fused (a decode step of a dense GQA model, State::fused): the GEMV's fused forms (gemv.h) do
//       the input and post-attention norms in the prologues of qkv and gate_up, SiLU·mul in
//       gate_up's epilogue, and add o_proj's and down's outputs into the residual stream: per
//       layer qkv, the head transform, the store, attention, o_proj, gate_up, down.
// MoE   router logits in f32 (x in f32 · router f32). Steps of at most device_moe_max_tokens()
//       tokens (state.h; every step unless set lower) with 16-bit weights route on the device
//       (moe.h: ops::moe_route's algorithm, a counting sort by expert, two grouped GEMMs over
//       tiles of each expert's rows, 32 rows a tile at decode and 128 in prefill): no round
//       trip, so a decode step can be one graph. Other steps copy the logits to the
//       host and route there with ops::moe_route (the CPU model's routing), sort the (token,
//       expert) pairs by expert, and run each expert's rows through gate_up / SiLU·mul / down as
//       cuBLAS GEMMs. Either way the rows of x are gathered by expert and combined per token in a
//       fixed order with the weights, plus the shared experts.
#include <algorithm>
#include <numeric>

#include "core/check.h"
#include "model/cuda/gemv.h"
#include "model/cuda/kernels.h"
#include "model/cuda/moe.h"
#include "model/cuda/state.h"
#include "pagedattn/cuda_store.h"

namespace pagedattn::model::cuda {
namespace {

using State = CudaModel::State;

char* bytes(const DeviceBuffer& buffer) { return buffer.as<char>(); }

TensorView device_f32(const State& s, float* data, std::initializer_list<int64_t> shape,
                      std::initializer_list<int64_t> strides) {
  TensorView view = TensorView::contiguous(data, DType::kF32, shape, s.device);
  int d = 0;
  for (int64_t stride : strides) view.strides[d++] = stride;
  return view;
}

TensorView device_view(const State& s, void* data, DType dtype,
                       std::initializer_list<int64_t> shape) {
  return TensorView::contiguous(data, dtype, shape, s.device);
}

// y [rows, out] f32 = x · Wᵀ (+ bias).
void linear_f32(State& s, const DeviceLinear& linear, const void* x, int64_t rows, float* y,
                int64_t ldy) {
  s.blas->linear(rows, linear.out(), linear.in(), x, linear.in(), linear.weight.data(), linear.in(),
                 linear.weight.dtype, y, ldy, DType::kF32);
  if (linear.bias.data() != nullptr)
    add_bias(y, ldy, linear.bias_data(), rows, linear.out(), s.stream);
}

// A sublayer's last linear layer (o_proj, down_proj): its output added to the residual stream.
// Without a bias, in the GEMM's epilogue (Blas::linear_accumulate: no branch buffer written and
// read back); with one, into s.branch (then the bias), which the next add_rms_norm adds
// (s.branch_pending), so that the bias is added before the residual as the CPU model does.
void linear_to_residual(State& s, const DeviceLinear& linear, const void* x, int64_t rows) {
  const int64_t hidden = s.config.hidden_size;
  if (linear.bias.data() == nullptr) {
    s.blas->linear_accumulate(rows, linear.out(), linear.in(), x, linear.in(), linear.weight.data(),
                              linear.in(), linear.weight.dtype, ptr<float>(s.residual), hidden);
    return;
  }
  linear_f32(s, linear, x, rows, ptr<float>(s.branch), hidden);
  s.branch_pending = true;
}

// The output dtype of a GEMM whose consumer is an elementwise pass (the head transform, SiLU ·
// mul): the compute dtype where cuBLAS runs it anyway (more than kGemvMaxRows rows; the GEMV
// writes f32 only) and the weights are in that dtype, so the GEMM writes and the pass reads half
// the bytes of f32 (transformers' bf16 layers round their outputs the same way); else f32.
DType narrow_output(const State& s, const DeviceLinear& linear, int64_t rows) {
  const DType dtype = linear.weight.dtype;
  return rows > kGemvMaxRows && dtype == s.compute && dtype != DType::kF32 ? dtype : DType::kF32;
}

// What every fused form of a linear layer shares (gemv.h): its weights and bias, m = the step's
// rows, the grid's SM count and the stream; with_norm / into_residual set the input and output.
GemvArgs fused_linear(const State& s, const DeviceLinear& linear) {
  GemvArgs a;
  a.m = s.tokens;
  a.n = linear.out();
  a.k = linear.in();
  a.dtype = linear.weight.dtype;
  a.w = linear.weight.data();
  a.ldw = linear.in();
  a.bias = linear.bias_data();
  a.sm_count = s.blas->sm_count();
  a.stream = s.stream;
  return a;
}

GemvArgs with_norm(GemvArgs a, const State& s, const DeviceBuffer& norm_weight) {
  a.input = GemvInput::kRmsNorm;
  a.norm_in = ptr<const float>(s.residual);
  a.ld_norm_in = s.config.hidden_size;
  a.norm_weight = ptr<const float>(norm_weight);
  a.eps = s.eps;
  return a;
}

GemvArgs into_residual(GemvArgs a, const State& s) {
  a.output = GemvOutput::kAccumulate;
  a.y = ptr<float>(s.residual);
  a.ldy = s.config.hidden_size;
  return a;
}

// Layer `index`'s fused forms (State::fused_layers).
FusedLinears fused_linears(const State& s, size_t index) {
  const DecoderLayer& layer = s.layers[index];
  FusedLinears f;
  f.qkv = with_norm(fused_linear(s, layer.gqa.qkv), s, layer.input_norm);
  f.qkv.bias = nullptr;  // added by the head transform, with the q / k norms after it
  f.qkv.y = ptr<float>(s.qkv);
  f.qkv.ldy = layer.gqa.qkv.out();
  f.o = into_residual(fused_linear(s, layer.gqa.o), s);
  f.o.x = s.attention != s.compute ? s.attn_c.data() : s.attn.data();
  f.o.ldx = layer.gqa.o.in();
  f.gate_up = with_norm(fused_linear(s, layer.mlp.gate_up), s, layer.post_norm);
  f.gate_up.output = GemvOutput::kSiluPairs;
  f.gate_up.act = s.act.data();
  f.gate_up.ld_act = layer.mlp.down.in();
  f.down = into_residual(fused_linear(s, layer.mlp.down), s);
  f.down.x = s.act.data();
  f.down.ldx = layer.mlp.down.in();
  return f;
}

// An RMSNorm over the first `width` values of each of the step's rows of x (row stride `stride`),
// as a one-head transform: MLA's q_a and latent norms.
HeadTransformArgs row_norm_args(const State& s, float* x, int64_t stride, int64_t width,
                                const DeviceBuffer& weight) {
  HeadTransformArgs a;
  a.x = x;
  a.x_stride_row = stride;
  a.heads = 1;
  a.width = static_cast<int32_t>(width);
  a.rows = s.tokens;
  a.norm_weight = ptr<const float>(weight);
  a.eps = s.eps;
  return a;
}

HeadTransformArgs rope_args(const State& s) {
  HeadTransformArgs a;
  a.cos = ptr<const float>(s.rope_cos);
  a.sin = ptr<const float>(s.rope_sin);
  a.rotary_half = s.rope_half;
  a.interleaved = s.rope_interleaved;
  a.positions = ptr<const int32_t>(s.positions);
  a.rows = s.tokens;
  a.eps = s.eps;
  return a;
}

}  // namespace

void gqa_attention(State& s, const DecoderLayer& layer, int64_t index) {
  const GqaLayer& w = layer.gqa;
  const int64_t t = s.tokens, heads = s.config.num_attention_heads,
                kv_heads = s.config.num_key_value_heads, dim = s.config.head_dim;
  const int64_t width = (heads + 2 * kv_heads) * dim;
  const float* bias = w.qkv.bias_data();
  const PagedKv kv = s.pool->layer_kv(index);
  // K and V go straight into their slots from the transform (the store fused in) where the pool
  // holds q's dtype (never fp8, so unscaled: KvPool keeps scales at 1 for other dtypes); else k
  // is written back in f32 and cuda::store_kv stores both, scales applied.
  const bool fused_store = kv.k.dtype == s.attention && kv.v.dtype == s.attention;
  // qkv in the compute dtype (narrow_output) where nothing is written back to it in f32.
  const DType qkv_dtype = fused_store && !s.fused ? narrow_output(s, w.qkv, t) : DType::kF32;
  char* qkv = bytes(s.qkv);
  const int64_t qkv_size = dtype_size(qkv_dtype);
  if (s.fused) {
    gemv(s.fused_layers[static_cast<size_t>(index)].qkv);  // the input norm in the prologue
  } else {
    s.blas->linear(t, width, w.qkv.in(), s.x.data(), w.qkv.in(), w.qkv.weight.data(), w.qkv.in(),
                   s.compute, qkv, width, qkv_dtype);
  }
  timeline_mark(s, "qkv");
  // One launch for the head groups: q (bias, norm, RoPE, then converted into the attention's q
  // buffer), k (bias, norm, RoPE, in place: stored from f32 below) and, with a bias, v (the bias
  // only).
  HeadTransformArgs groups[3];
  HeadTransformArgs& q = groups[0];
  q = rope_args(s);
  q.x = qkv;
  q.x_dtype = qkv_dtype;
  q.x_stride_row = width;
  q.x_stride_head = dim;
  q.heads = static_cast<int32_t>(heads);
  q.width = static_cast<int32_t>(dim);
  q.bias = bias;
  q.norm_weight = ptr<const float>(w.q_norm);
  q.out = s.q.data();
  q.out_dtype = s.attention;
  q.out_stride_row = heads * dim;
  q.out_stride_head = dim;
  q.write_x = false;  // attention reads q from s.q only
  HeadTransformArgs& k = groups[1];
  k = q;
  k.write_x = true;  // k is stored from the f32 buffer
  k.x = qkv + heads * dim * qkv_size;
  k.heads = static_cast<int32_t>(kv_heads);
  k.bias = bias != nullptr ? bias + heads * dim : nullptr;
  k.norm_weight = ptr<const float>(w.k_norm);
  k.out = nullptr;
  size_t num_groups = 2;
  if (bias != nullptr || fused_store) {
    HeadTransformArgs& v = groups[num_groups++];
    v = k;
    v.x = qkv + (heads + kv_heads) * dim * qkv_size;
    v.bias = bias != nullptr ? bias + (heads + kv_heads) * dim : nullptr;
    v.norm_weight = nullptr;
    v.cos = v.sin = nullptr;
  }
  if (fused_store) {
    const bool nhd = kv.layout == KvLayout::kNHD;
    for (size_t g = 1; g < num_groups; ++g) {
      const TensorView& pool = g == 1 ? kv.k : kv.v;
      HeadTransformArgs& group = groups[g];
      group.write_x = false;
      group.out = pool.data;
      group.out_slots = ptr<const int64_t>(s.slots);
      group.out_alloc_page = kv.alloc_page_size();
      group.out_num_slots = kv.num_alloc_pages() * kv.alloc_page_size();
      group.out_stride_page = pool.strides[0];
      group.out_stride_row = nhd ? pool.strides[1] : pool.strides[2];
      group.out_stride_head = nhd ? pool.strides[2] : pool.strides[1];
    }
  }
  transform_heads(std::span<const HeadTransformArgs>(groups, num_groups), s.stream);
  timeline_mark(s, "head transform");
  if (!fused_store) {
    const TensorView slots = TensorView::contiguous(s.slots.data(), DType::kI64, {t}, s.device);
    float* qkv_f32 = ptr<float>(s.qkv);
    ::pagedattn::cuda::store_kv(
        kv, device_f32(s, qkv_f32 + heads * dim, {t, kv_heads, dim}, {width, dim, 1}),
        device_f32(s, qkv_f32 + (heads + kv_heads) * dim, {t, kv_heads, dim}, {width, dim, 1}),
        slots, s.stream);
    timeline_mark(s, "K / V store");
  }

  const StepContext& step = *s.step;
  AttentionOptions options;
  options.sm_scale = step.sm_scale;
  options.causal = true;
  const TensorView q_view = device_view(s, s.q.data(), s.attention, {t, heads, dim});
  const TensorView out_view = device_view(s, s.attn.data(), s.attention, {t, heads, dim});
  if (step.decode) {
    DecodeArgs args{q_view, kv, step.meta, out_view, {}, options, s.stream};
    step.backend->run_decode(*step.workspace, args);
  } else {
    PrefillArgs args{q_view, kv, step.meta, out_view, {}, options, s.stream};
    step.backend->run_prefill(*step.workspace, args);
  }
  timeline_mark(s, "attention");
  const void* attn = s.attn.data();
  if (s.attention != s.compute) {
    convert_rows(s.attn.data(), s.attention, heads * dim, s.attn_c.data(), s.compute, heads * dim,
                 t, heads * dim, s.stream);
    attn = s.attn_c.data();
    timeline_mark(s, "convert");
  }
  if (s.fused) {
    gemv(s.fused_layers[static_cast<size_t>(index)].o);  // residual += o_proj(attn)
  } else {
    linear_to_residual(s, w.o, attn, t);
  }
  timeline_mark(s, "o_proj");
}

void mla_attention(State& s, const DecoderLayer& layer, int64_t index) {
  const MlaLayer& w = layer.mla;
  const MlaConfig& m = *s.config.mla;
  const int64_t t = s.tokens, heads = s.config.num_attention_heads;
  const int64_t nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim, v = m.v_head_dim,
                rank = m.kv_lora_rank, qk = nope + rope, q_width = heads * qk;
  float* q = ptr<float>(s.mla_q);
  if (w.q_a.defined()) {
    const int64_t lora = m.q_lora_rank;
    linear_f32(s, w.q_a, s.x.data(), t, ptr<float>(s.qa), lora);
    HeadTransformArgs norm = row_norm_args(s, ptr<float>(s.qa), lora, lora, w.q_a_norm);
    norm.out = s.qa_c.data();
    norm.out_dtype = s.compute;
    norm.out_stride_row = lora;
    norm.write_x = false;  // q_b reads qa_c only
    transform_heads(norm, s.stream);
    linear_f32(s, w.q_b, s.qa_c.data(), t, q, q_width);
  } else {
    linear_f32(s, w.q_b, s.x.data(), t, q, q_width);
  }
  const int64_t kv_width = rank + rope;
  float* kv_a = ptr<float>(s.kv_a);
  linear_f32(s, w.kv_a, s.x.data(), t, kv_a, kv_width);
  timeline_mark(s, "q, kv_a projections");
  // One launch for three head groups: the latent's RMSNorm over its rank values and k_pe's RoPE,
  // both in place in kv_a (stored below), and q_pe's RoPE into the attention's q_pe [T, H, rope].
  HeadTransformArgs groups[3];
  groups[0] = row_norm_args(s, kv_a, kv_width, rank, w.kv_a_norm);
  HeadTransformArgs& k_pe = groups[1];
  k_pe = rope_args(s);
  k_pe.x = kv_a + rank;
  k_pe.x_stride_row = kv_width;
  k_pe.heads = 1;
  k_pe.width = static_cast<int32_t>(rope);
  HeadTransformArgs& q_pe = groups[2];
  q_pe = rope_args(s);
  q_pe.x = q + nope;
  q_pe.x_stride_row = q_width;
  q_pe.x_stride_head = qk;
  q_pe.heads = static_cast<int32_t>(heads);
  q_pe.width = static_cast<int32_t>(rope);
  q_pe.out = s.q_pe.data();
  q_pe.out_dtype = s.attention;
  q_pe.out_stride_row = heads * rope;
  q_pe.out_stride_head = rope;
  q_pe.write_x = false;  // the attention reads s.q_pe; q's f32 rope part is not read again
  transform_heads(groups, s.stream);
  timeline_mark(s, "latent norm, RoPE");
  const PagedLatent cache = s.pool->layer_latent(index);
  const TensorView slots = TensorView::contiguous(s.slots.data(), DType::kI64, {t}, s.device);
  ::pagedattn::cuda::store_latent(cache, device_f32(s, kv_a, {t, rank}, {kv_width, 1}),
                                  device_f32(s, kv_a + rank, {t, rope}, {kv_width, 1}), slots,
                                  s.stream);
  timeline_mark(s, "latent store");
  // q_nope into the compute dtype [T, H, nope], the batched GEMM's input.
  convert_rows(q, DType::kF32, qk, s.q_nope_c.data(), s.compute, nope, t * heads, nope, s.stream);
  // q_latent[t, h] = q_nope[t, h] · W_UK_h, W_UK_h = kv_b rows [h (nope + v), + nope).
  const int64_t c = s.compute_size(), head_rows = nope + v;
  // Written in the attention's dtype where cuBLAS can (it is the compute dtype, or f32): no f32
  // round trip through memory (16 x 512 tokens: 268 MB written and read again a layer).
  const bool staged = s.q_latent_f32.data() != nullptr;
  s.blas->batched(heads, t, rank, nope, {s.q_nope_c.data(), heads * nope, nope},
                  {w.kv_b.data(), rank, head_rows * rank}, /*transpose_w=*/false, s.compute,
                  staged ? s.q_latent_f32.data() : s.q_latent.data(), heads * rank, rank,
                  staged ? DType::kF32 : s.attention);
  if (staged) {
    convert_rows(s.q_latent_f32.data(), DType::kF32, rank, s.q_latent.data(), s.attention, rank,
                 t * heads, rank, s.stream);
  }
  void* q_latent = s.q_latent.data();
  timeline_mark(s, "q absorb (W_UK)");
  const StepContext& step = *s.step;
  MlaArgs args;
  args.q_nope = device_view(s, q_latent, s.attention, {t, heads, rank});
  args.q_pe = device_view(s, s.q_pe.data(), s.attention, {t, heads, rope});
  args.kv = cache;
  args.meta = step.meta;
  args.out = device_view(s, s.o_latent.data(), s.attention, {t, heads, rank});
  args.sm_scale = step.sm_scale;
  args.causal = true;
  args.stream = s.stream;
  step.backend->run_mla(*step.workspace, args);
  timeline_mark(s, "attention");
  const void* o_latent = s.o_latent.data();
  if (s.attention != s.compute) {
    convert_rows(s.o_latent.data(), s.attention, rank, s.o_latent_c.data(), s.compute, rank,
                 t * heads, rank, s.stream);
    o_latent = s.o_latent_c.data();
  }
  // o[t, h] = o_latent[t, h] · W_UV_hᵀ, W_UV_h = kv_b rows [h (nope + v) + nope, + v).
  s.blas->batched(
      heads, t, v, rank, {o_latent, heads * rank, rank},
      {static_cast<const char*>(w.kv_b.data()) + nope * rank * c, rank, head_rows * rank},
      /*transpose_w=*/true, s.compute, s.o.data(), heads * v, v, s.compute);
  timeline_mark(s, "o absorb (W_UV)");
  linear_to_residual(s, w.o, s.o.data(), t);
  timeline_mark(s, "o_proj");
}

namespace {

// moe_mlp without the host: routing, the sort and the tile table on the device (moe.h), then the
// two grouped GEMMs over the tiles instead of a GEMM per expert.
void moe_mlp_on_device(State& s, MoeLayer& moe) {
  const int64_t t = s.tokens, hidden = s.config.hidden_size;
  const int32_t experts = moe.routing.num_experts, k = moe.routing.top_k;
  // The tile height depends on the step's size only (a decode graph's launches stay fixed).
  const int64_t pairs = t * k;
  const int32_t tile_rows = moe_tile_rows(pairs, experts);
  const int64_t tiles = moe_max_tiles(pairs, experts, tile_rows);
  moe_route_device(ptr<float>(s.router_logits), t, moe.routing, ptr<float>(moe.bias_f32),
                   ptr<int32_t>(s.expert_ids), ptr<float>(s.route_weight), s.stream);
  moe_sort_device(ptr<int32_t>(s.expert_ids), pairs, k, experts, ptr<int32_t>(s.position),
                  ptr<int32_t>(s.source_row), ptr<int32_t>(s.moe_tiles), tiles, s.stream,
                  tile_rows);
  timeline_mark(s, "routing");
  const int64_t c = s.compute_size(), width = moe.experts.front().down.in();
  gather_rows(s.x.data(), ptr<int32_t>(s.source_row), s.expert_x.data(), pairs, hidden * c,
              s.stream);
  if (moe.pairs_interleaved) {  // act straight from the GEMM's epilogue
    moe_grouped_gemm_silu(s.expert_x.data(), hidden, moe.gate_up_weights.as<const void* const>(),
                          s.compute, 2 * width, hidden, ptr<int32_t>(s.moe_tiles), tiles,
                          s.expert_act.data(), width, s.stream, tile_rows);
  } else {
    moe_grouped_gemm(s.expert_x.data(), hidden, moe.gate_up_weights.as<const void* const>(),
                     s.compute, 2 * width, hidden, ptr<int32_t>(s.moe_tiles), tiles,
                     ptr<float>(s.expert_gate_up), 2 * width, s.stream, tile_rows);
    silu_mul(s.expert_gate_up.data(), DType::kF32, pairs, width, s.expert_act.data(), s.compute,
             width, s.stream);
  }
  moe_grouped_gemm(s.expert_act.data(), width, moe.down_weights.as<const void* const>(), s.compute,
                   hidden, width, ptr<int32_t>(s.moe_tiles), tiles, ptr<float>(s.expert_out),
                   hidden, s.stream, tile_rows);
  timeline_mark(s, "routed experts");
  const float* shared = nullptr;
  if (moe.shared.defined()) {
    dense_mlp(s, moe.shared, s.x.data(), t, ptr<float>(s.shared_out));
    shared = ptr<float>(s.shared_out);
  }
  moe_combine(ptr<float>(s.expert_out), ptr<int32_t>(s.position), ptr<float>(s.route_weight),
              shared, t, k, hidden, ptr<float>(s.branch), s.stream);
  s.branch_pending = true;
  timeline_mark(s, "MoE combine");
}

}  // namespace

void dense_mlp(State& s, const MlpLayer& mlp, const void* x, int64_t rows, float* out) {
  const int64_t width = mlp.down.in();
  const DType gate_up_dtype =
      mlp.gate_up.bias.data() == nullptr ? narrow_output(s, mlp.gate_up, rows) : DType::kF32;
  if (gate_up_dtype == DType::kF32) {
    linear_f32(s, mlp.gate_up, x, rows, ptr<float>(s.gate_up), 2 * width);
  } else {
    s.blas->linear(rows, 2 * width, mlp.gate_up.in(), x, mlp.gate_up.in(),
                   mlp.gate_up.weight.data(), mlp.gate_up.in(), mlp.gate_up.weight.dtype,
                   s.gate_up.data(), 2 * width, gate_up_dtype);
  }
  timeline_mark(s, "gate_up");
  silu_mul(s.gate_up.data(), gate_up_dtype, rows, width, s.act.data(), s.compute, width, s.stream);
  timeline_mark(s, "SiLU * mul");
  if (out != nullptr) {
    linear_f32(s, mlp.down, s.act.data(), rows, out, s.config.hidden_size);
  } else {
    linear_to_residual(s, mlp.down, s.act.data(), rows);
  }
  timeline_mark(s, "down");
}

void fused_mlp(State& s, int64_t index) {
  const FusedLinears& f = s.fused_layers[static_cast<size_t>(index)];
  gemv(f.gate_up);  // act = silu(gate) * up of the post-attention norm
  timeline_mark(s, "gate_up");
  gemv(f.down);  // residual += down(act)
  timeline_mark(s, "down");
}

void prepare_fused_step(State& s) {
  s.fused = false;
  if (s.tokens < 1 || s.tokens > kGemvMaxRows || s.config.is_mla()) return;
  s.fused_layers.resize(s.layers.size());
  for (size_t i = 0; i < s.layers.size(); ++i) {
    if (s.layers[i].moe) return;
    const FusedLinears& f = s.fused_layers[i] = fused_linears(s, i);
    for (const GemvArgs* a : {&f.qkv, &f.o, &f.gate_up, &f.down}) {
      if (!gemv_unsupported(*a).empty()) return;
    }
  }
  s.fused = true;
}

void moe_mlp(State& s, MoeLayer& moe) {
  const int64_t t = s.tokens, hidden = s.config.hidden_size;
  const int32_t experts = moe.routing.num_experts, k = moe.routing.top_k;
  s.blas->linear(t, experts, hidden, s.x_f32.data(), hidden, moe.router.data(), hidden, DType::kF32,
                 s.router_logits.data(), experts, DType::kF32);
  timeline_mark(s, "router");
  if (moe_on_device(moe, t)) {
    moe_mlp_on_device(s, moe);
    return;
  }
  // Router logits in f32, to the host (this waits for the stream), routed as on the CPU.
  moe.logits.resize(static_cast<size_t>(t * experts));
  PA_CUDA_CHECK(cudaMemcpyAsync(moe.logits.data(), s.router_logits.data(),
                                moe.logits.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                s.stream));
  PA_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  ops::moe_route(TensorView::contiguous(moe.logits.data(), DType::kF32, {t, experts}), moe.routing,
                 moe.correction_bias, moe.assignment);
  // Counting sort of the (token, slot) pairs by expert: pair p goes to row position[p] of the
  // expert-sorted buffers, whose row r holds token source_row[r].
  const int64_t pairs = t * k;
  moe.start.assign(static_cast<size_t>(experts) + 1, 0);
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t e = moe.assignment.experts[static_cast<size_t>(p)];
    PA_CHECK(e >= 0 && e < experts, "moe: expert id {} outside [0, {})", e, experts);
    ++moe.start[static_cast<size_t>(e) + 1];
  }
  std::partial_sum(moe.start.begin(), moe.start.end(), moe.start.begin());
  std::vector<int64_t> fill(moe.start.begin(), moe.start.end() - 1);
  moe.position.resize(static_cast<size_t>(pairs));
  moe.source_row.resize(static_cast<size_t>(pairs));
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t row = fill[static_cast<size_t>(moe.assignment.experts[static_cast<size_t>(p)])]++;
    moe.position[static_cast<size_t>(p)] = static_cast<int32_t>(row);
    moe.source_row[static_cast<size_t>(row)] = static_cast<int32_t>(p / k);
  }
  copy_to_device(s, s.source_row.data(), moe.source_row.data(), pairs);
  copy_to_device(s, s.position.data(), moe.position.data(), pairs);
  copy_to_device(s, s.route_weight.data(), moe.assignment.weights.data(), pairs);
  timeline_mark(s, "routing (host)");

  const int64_t c = s.compute_size();
  gather_rows(s.x.data(), ptr<int32_t>(s.source_row), s.expert_x.data(), pairs, hidden * c,
              s.stream);
  const int64_t width = moe.experts.front().down.in();
  for (int32_t e = 0; e < experts; ++e) {
    const int64_t begin = moe.start[static_cast<size_t>(e)],
                  rows = moe.start[static_cast<size_t>(e) + 1] - begin;
    if (rows == 0) continue;
    linear_f32(s, moe.experts[static_cast<size_t>(e)].gate_up,
               bytes(s.expert_x) + begin * hidden * c, rows,
               ptr<float>(s.expert_gate_up) + begin * 2 * width, 2 * width);
  }
  silu_mul(s.expert_gate_up.data(), DType::kF32, pairs, width, s.expert_act.data(), s.compute,
           width, s.stream, moe.pairs_interleaved ? kMoePairBlock : 0);
  for (int32_t e = 0; e < experts; ++e) {
    const int64_t begin = moe.start[static_cast<size_t>(e)],
                  rows = moe.start[static_cast<size_t>(e) + 1] - begin;
    if (rows == 0) continue;
    linear_f32(s, moe.experts[static_cast<size_t>(e)].down, bytes(s.expert_act) + begin * width * c,
               rows, ptr<float>(s.expert_out) + begin * hidden, hidden);
  }
  timeline_mark(s, "routed experts");
  const float* shared = nullptr;
  if (moe.shared.defined()) {
    dense_mlp(s, moe.shared, s.x.data(), t, ptr<float>(s.shared_out));
    shared = ptr<float>(s.shared_out);
  }
  moe_combine(ptr<float>(s.expert_out), ptr<int32_t>(s.position), ptr<float>(s.route_weight),
              shared, t, k, hidden, ptr<float>(s.branch), s.stream);
  s.branch_pending = true;
  timeline_mark(s, "MoE combine");
}

}  // namespace pagedattn::model::cuda
