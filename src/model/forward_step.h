// The host side of a step: validates the requests, derives each new token's position and KV slot,
// plans the attention metadata once (planner.h) and has the selected backend plan its work for the
// step (Backend::plan), so that every layer only runs.
#pragma once

#include <array>
#include <memory>
#include <span>
#include <vector>

#include "model/layers.h"
#include "pagedattn/registry.h"

namespace pagedattn::model {

// A device model's side of planning (src/model/cuda): the host planner's metadata copied to the
// device before Backend::plan, and the stream of every workspace the planner creates.
class DeviceStep {
 public:
  virtual ~DeviceStep() = default;
  // Device copies of `host`'s arrays (batch_size, max_q_len and num_pages_hint as given).
  virtual StepMetadata upload(const StepMetadata& host) = 0;
  // Called once for each workspace the planner creates (the CUDA model sets its stream).
  virtual void adopt(Workspace& workspace) = 0;
};

class StepPlanner {
 public:
  StepPlanner() = default;
  // On a CUDA device, `device_step` receives the metadata and the workspaces (it must outlive
  // the planner); q is then in the pool's dtype (over an fp8 pool: fp8_query_dtype), else f32.
  StepPlanner(const ModelConfig& config, Selection selection, Device device = Device::cpu(),
              DeviceStep* device_step = nullptr);

  // Throws Error naming the request for anything invalid (Step::sampling included), before
  // anything is written. padded_batch > 0 (a decode step of at most that many requests, for a
  // CUDA graph of that size): requests num_reqs .. padded_batch - 1 are padding, one token each
  // (id 0, position 0, slot -1: nothing stored) with no pages (out 0), and the backend plans
  // padded_batch requests.
  StepContext& prepare(const Step& step, const KvPool& pool, const ops::RopeTable& rope,
                       int32_t padded_batch = 0);
  std::span<const int32_t> token_ids() const { return token_ids_; }
  // Rows of the step's tokens whose logits are asked for, in output order: each wanting request's
  // last num_logit_rows rows (every row under LogitsRows::kAll); none of a request whose
  // wants_logits is false. The CPU and the CUDA model both take their final norm's rows from here.
  const std::vector<int64_t>& logit_rows(const Step& step);
  // The dtype of q (and of the attention output) over `pool`: f32 on the CPU; on CUDA the pool's
  // dtype, or fp8_query_dtype (bf16 or f16: the model's compute dtype) over an fp8 pool.
  DType query_dtype(const KvPool& pool) const;
  void set_fp8_query_dtype(DType dtype) { fp8_query_dtype_ = dtype; }
  // The backend that runs this model's decode (or prefill / extend) steps over `pool`, chosen by
  // the selection at its first use.
  const Backend& backend_for(bool decode, const KvPool& pool);
  // Counts the workspaces created so far: a captured graph holds the workspace it was captured
  // with, and is stale once this changes.
  int64_t workspace_generation() const { return workspace_generation_; }
  // ModelOptions::validate_metadata: the workspaces created from now on check every step's
  // metadata on the host (WorkspaceLimits::validate_metadata).
  void set_validate_metadata(bool on) { validate_metadata_ = on; }
  // Workspace::check_device_errors of every workspace: the first metadata violation the device
  // kernels recorded, as an Error. After the step's work is synchronised.
  void check_device_errors();

 private:
  OpDesc describe(bool decode, const KvPool& pool) const;
  void select_and_plan(const OpDesc& op);

  struct BackendSlot {
    const Backend* backend = nullptr;
    std::unique_ptr<Workspace> workspace;
    WorkspaceLimits limits{};
  };
  bool mla_ = false;
  int32_t heads_ = 0, kv_heads_ = 0, head_dim_qk_ = 0, head_dim_vo_ = 0;
  float sm_scale_ = 0.0f;
  ops::RopeStyle rope_style_ = ops::RopeStyle::kNeox;
  Selection selection_;
  Device device_ = Device::cpu();
  DType fp8_query_dtype_ = DType::kBF16;
  DeviceStep* device_step_ = nullptr;
  std::array<BackendSlot, 4> slots_by_op_;  // indexed by OpKind
  std::unique_ptr<PlanStorage> storage_;
  int32_t storage_batch_ = 0;
  int64_t storage_pages_ = 0;
  int64_t workspace_generation_ = 0;
  bool validate_metadata_ = false;
  std::vector<int32_t> token_ids_, block_table_, seq_lens_, q_lens_;
  std::vector<int64_t> rows_;
  StepContext context_;
};

}  // namespace pagedattn::model
