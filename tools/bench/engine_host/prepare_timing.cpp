// StepPlanner::prepare timed on the CPU (see prepare_timing.h).
#include "tools/bench/engine_host/prepare_timing.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/check.h"
#include "model/forward_step.h"
#include "pagedattn/model.h"
#include "tools/cli/report.h"

namespace pagedattn::tools {
namespace {

using Clock = std::chrono::steady_clock;

double microseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

constexpr int64_t kMaxPoolPages = 4096;

}  // namespace

PrepareTiming time_prepare(const model::ModelConfig& config, int32_t batch, int64_t context,
                           int32_t page_size, double min_seconds) {
  PA_CHECK(batch >= 1 && context >= 1 && page_size >= 1,
           "prepare timing: batch {}, context {}, page size {} (expected >= 1)", batch, context,
           page_size);
  PA_CHECK(!config.is_mla(),
           "prepare timing: GQA shapes only (the op described here is GQA decode)");
  const int64_t blocks = (context + page_size - 1) / page_size;
  model::ModelConfig one_layer = config;
  one_layer.num_hidden_layers = 1;
  model::KvPoolConfig pool_config;
  pool_config.alloc_page_size = page_size;
  pool_config.num_pages = std::min<int64_t>(kMaxPoolPages, blocks * batch);
  const model::KvPool pool(one_layer, pool_config);
  const ops::RopeTable rope(config.rope.inverse_frequencies(), config.rope.attention_scaling(),
                            context + 1);
  model::StepPlanner planner(config, Selection::parse("cpu"));

  std::vector<int32_t> tokens(static_cast<size_t>(batch));
  std::vector<int32_t> tables(static_cast<size_t>(batch * blocks));
  for (size_t i = 0; i < tables.size(); ++i) {
    tables[i] = static_cast<int32_t>(static_cast<int64_t>(i) % pool_config.num_pages);
  }
  model::Step step;
  for (int32_t r = 0; r < batch; ++r) {
    tokens[static_cast<size_t>(r)] = (r * 7919) % static_cast<int32_t>(config.vocab_size);
    model::RequestStep request;
    request.tokens = std::span<const int32_t>(tokens).subspan(static_cast<size_t>(r), 1);
    request.cached_len = static_cast<int32_t>(context - 1);
    request.block_table = std::span<const int32_t>(tables).subspan(static_cast<size_t>(r * blocks),
                                                                   static_cast<size_t>(blocks));
    step.requests.push_back(request);
    ops::RowSampling sampling;
    sampling.sample = true;
    sampling.temperature = 0.6;
    sampling.seed = static_cast<uint64_t>(r);
    sampling.position = static_cast<uint64_t>(context);
    step.sampling.push_back(sampling);
  }

  // The first call selects the backend and sizes the workspace; the op as prepare describes it.
  model::StepContext& context_out = planner.prepare(step, pool, rope);
  PA_CHECK(context_out.decode, "prepare timing: the step is not a decode step");
  OpDesc op;
  op.op = OpKind::kDecode;
  op.device = Device::cpu();
  op.q_dtype = DType::kF32;
  op.kv_dtype = pool.config().dtype;
  op.num_qo_heads = static_cast<int32_t>(config.num_attention_heads);
  op.num_kv_heads = static_cast<int32_t>(config.num_key_value_heads);
  op.head_dim_qk = op.head_dim_vo = static_cast<int32_t>(config.head_dim);
  op.page_size = pool.page_size();
  op.layout = pool.config().layout;
  op.causal = true;

  std::vector<double> prepare_us, plan_us;
  const auto start = Clock::now();
  while (prepare_us.size() < 100 ||
         std::chrono::duration<double>(Clock::now() - start).count() < min_seconds) {
    const auto call = Clock::now();
    model::StepContext& ctx = planner.prepare(step, pool, rope);
    prepare_us.push_back(microseconds_since(call));
    const auto plan_call = Clock::now();
    ctx.backend->plan(*ctx.workspace, op, ctx.meta);
    plan_us.push_back(microseconds_since(plan_call));
    keep(&ctx);
  }
  PrepareTiming timing;
  timing.batch = batch;
  timing.context = context;
  timing.calls = static_cast<int64_t>(prepare_us.size());
  timing.prepare_us = spread(std::move(prepare_us));
  timing.backend_plan_us = spread(std::move(plan_us));
  return timing;
}

}  // namespace pagedattn::tools
