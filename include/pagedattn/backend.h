// The backend interface: what every attention backend (CPU, CUDA, ...) implements, and the
// arguments of the four operations.
//
// Plan once per step, run once per layer: create_workspace() sizes fixed buffers once;
// plan() derives the backend's work partition from the step's metadata into the workspace (no
// allocation); run_*() executes one layer. A workspace belongs to one backend and one stream.
// The step's metadata stays as plan() saw it until the step's last run_*(). On CUDA, the kernels
// start before the previous kernel of the stream ends (programmatic dependent launch), and a
// decode run after the step's first may read the metadata then: a kernel of the caller's that
// writes the metadata must not call griddepcontrol.launch_dependents (cudaTriggerProgrammatic-
// LaunchCompletion) before its writes; kernels that do not use PDL are safe as they are.
//
// Shapes (T = total query rows = qo_indptr[B]; decode has T = B):
//   decode:   q [B, Hq, D]            out [B, Hq, D]        lse [B, Hq] (optional, f32, natural log)
//   prefill:  q [T, Hq, Dqk]          out [T, Hq, Dvo]      lse [T, Hq]
//   MLA:      q_nope [T, H, rank]     q_pe [T, H, rope]     out [T, H, rank]   lse [T, H]
// Hq must be a multiple of Hkv (group size Hq / Hkv: MHA 1, GQA g, MQA Hq). A request with no KV
// writes out = 0 and lse = -inf.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "pagedattn/kv_cache.h"
#include "pagedattn/tensor.h"

namespace pagedattn {

enum class OpKind : uint8_t { kDecode, kPrefill, kMlaDecode, kMlaExtend };
std::string_view op_name(OpKind op);  // "decode", "prefill", "mla_decode", "mla_extend"
inline bool is_mla(OpKind op) { return op == OpKind::kMlaDecode || op == OpKind::kMlaExtend; }
inline bool is_decode_like(OpKind op) { return op == OpKind::kDecode || op == OpKind::kMlaDecode; }

// What a backend needs to know to say whether it can run an operation.
struct OpDesc {
  OpKind op = OpKind::kDecode;
  Device device = Device::cpu();
  DType q_dtype = DType::kBF16;   // also the output dtype
  DType kv_dtype = DType::kBF16;
  int32_t num_qo_heads = 32;
  int32_t num_kv_heads = 8;       // 1 for MLA
  int32_t head_dim_qk = 128;      // MLA: kv_lora_rank + rope_dim
  int32_t head_dim_vo = 128;      // MLA: kv_lora_rank
  int32_t page_size = 16;
  KvLayout layout = KvLayout::kNHD;
  bool causal = true;
  bool soft_cap = false;
  bool sliding_window = false;
  std::string str() const;        // one line, for errors and `pagedattn info`
};

// The answer of Backend::supports(): yes, or no with a reason a person can act on.
struct Support {
  bool ok = true;
  std::string reason;
  static Support yes() { return {}; }
  static Support no(std::string why) { return {false, std::move(why)}; }
  explicit operator bool() const { return ok; }
};

struct AttentionOptions {
  float sm_scale = 0.0f;         // explicit; required > 0
  float logits_soft_cap = 0.0f;  // > 0: logits = cap * tanh(logits / cap), before masking
  int32_t window_left = -1;      // >= 0: a query at position i sees keys in [i - window_left, i]
  bool causal = true;            // prefill/extend: queries aligned to the end of the KV
};

// The step's metadata from the planner, on the backend's device (all int32).
struct StepMetadata {
  int32_t batch_size = 0;       // padded
  TensorView qo_indptr;         // [B + 1]
  TensorView kv_indptr;         // [B + 1]
  TensorView kv_indices;        // [>= kv_indptr[B]] attention-page ids
  TensorView kv_last_page_len;  // [B]
  // Host-known bounds for sizing the work partition without a device sync (0 = unknown).
  int32_t max_q_len = 0;
  int64_t num_pages_hint = 0;
};

struct DecodeArgs {
  TensorView q;  // [B, Hq, D]
  PagedKv kv;
  StepMetadata meta;
  TensorView out;  // [B, Hq, D]
  TensorView lse;  // [B, Hq] f32, optional
  AttentionOptions options;
  void* stream = nullptr;  // cudaStream_t for CUDA backends
};

struct PrefillArgs {
  TensorView q;  // [T, Hq, Dqk]
  PagedKv kv;    // k: Dqk, v: Dvo
  StepMetadata meta;
  TensorView out;  // [T, Hq, Dvo]
  TensorView lse;  // [T, Hq] f32, optional
  AttentionOptions options;
  void* stream = nullptr;
};

struct MlaArgs {
  TensorView q_nope;  // [T, H, kv_lora_rank]
  TensorView q_pe;    // [T, H, rope_dim]
  PagedLatent kv;
  StepMetadata meta;  // decode: qo_indptr[i] = i (or q_len 2..4 for speculative decoding)
  TensorView out;     // [T, H, kv_lora_rank]
  TensorView lse;     // [T, H] f32, optional
  float sm_scale = 0.0f;
  bool causal = true;
  void* stream = nullptr;
};

// Capacity of a workspace: the largest step it will be planned for.
struct WorkspaceLimits {
  int32_t max_batch = 256;
  int64_t max_pages = 1 << 20;
  int64_t max_qo_rows = 1 << 16;
  int32_t max_qo_heads = 128;
  int32_t max_head_dim = 576;
  // Validating mode (tests, ModelOptions::validate_metadata): a device backend's plan() and run_*
  // copy the step's metadata to the host, synchronise, and check it as the CPU backend does (the
  // same messages), throwing before anything is launched; plan() also reports what the kernels
  // recorded (check_device_errors). A host sync per call: for debugging, not for serving. The CPU
  // backend checks everything on every call anyway.
  bool validate_metadata = false;
};

// Metadata on trust. run_* of a device backend does not synchronise to read the metadata (the
// calls are captured in CUDA graphs), so a bad entry in it (a page id outside the pool, a
// decreasing kv_indptr, q_len > kv_len, ...) cannot throw there. Instead the kernels never read
// or write outside the cache, the metadata, q or out whatever it says; they write the affected
// request's rows as out = 0, lse = -inf; and they record the first violation on the device.
// check_device_errors() reports it.
class Workspace {
 public:
  virtual ~Workspace() = default;
  // Throws Error naming the first metadata violation the device recorded since the last call
  // (the operation, request, array entry and value, and what was written for the request), and
  // clears it so that the next one is recorded. The CUDA backends read it from host-mapped memory:
  // call after the work of the run_* calls is synchronised (a stream or event sync, e.g. where the
  // step's results are collected), not while a captured graph may be running. The CPU backend
  // throws from run_* itself and records nothing: a no-op.
  virtual void check_device_errors() {}
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual DeviceType device_type() const = 0;
  // Whether this backend can run `op`, and if not, why (naming the unsupported value and the
  // supported ones).
  virtual Support supports(const OpDesc& op) const = 0;
  // One line on what this backend supports, for `pagedattn info`.
  virtual std::string describe() const = 0;

  virtual std::unique_ptr<Workspace> create_workspace(const WorkspaceLimits& limits) const = 0;
  virtual void plan(Workspace& workspace, const OpDesc& op, const StepMetadata& meta) const = 0;
  virtual void run_decode(Workspace& workspace, const DecodeArgs& args) const = 0;
  virtual void run_prefill(Workspace& workspace, const PrefillArgs& args) const = 0;
  virtual void run_mla(Workspace& workspace, const MlaArgs& args) const = 0;
};

// Derive the OpDesc of a call from its arguments (shapes, dtypes, device).
OpDesc describe_op(const DecodeArgs& args);
OpDesc describe_op(const PrefillArgs& args);
OpDesc describe_op(const MlaArgs& args, OpKind op);

}  // namespace pagedattn
