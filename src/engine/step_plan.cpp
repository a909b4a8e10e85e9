// flatten(): a StepPlan as the flat arrays a forward pass reads, and ModelRunner's default
// forward_sampled, launch and collect (see engine_model_runner.h).
#include <algorithm>

#include "core/check.h"
#include "pagedattn/engine_model_runner.h"

namespace pagedattn::engine {

void flatten(const StepPlan& plan, FlatStep* out) {
  PA_CHECK(out != nullptr, "out: null");
  const size_t count = plan.sequences.size();
  out->token_ids.clear();
  out->positions.clear();
  out->query_start.assign(1, 0);
  out->q_lens.clear();
  out->seq_lens.clear();
  out->logit_rows.clear();
  out->row_stride = 0;
  for (const ScheduledSequence& entry : plan.sequences) {
    out->row_stride =
        std::max<int64_t>(out->row_stride, static_cast<int64_t>(entry.block_table.size()));
  }
  out->block_table.assign(count * static_cast<size_t>(out->row_stride), 0);
  for (size_t i = 0; i < count; ++i) {
    const ScheduledSequence& entry = plan.sequences[i];
    PA_CHECK(entry.num_logit_rows >= 0 && entry.num_logit_rows <= entry.num_new_tokens(),
             "plan: sequence {} wants {} logit rows of {} new tokens", entry.sequence,
             entry.num_logit_rows, entry.num_new_tokens());
    const int32_t begin = out->query_start.back();
    for (int64_t k = 0; k < entry.num_new_tokens(); ++k) {
      out->token_ids.push_back(entry.token_ids[static_cast<size_t>(k)]);
      out->positions.push_back(static_cast<int32_t>(entry.first_position + k));
    }
    const int32_t end = static_cast<int32_t>(out->token_ids.size());
    for (int32_t row = end - entry.num_logit_rows; row < end; ++row) out->logit_rows.push_back(row);
    out->query_start.push_back(end);
    out->q_lens.push_back(end - begin);
    out->seq_lens.push_back(static_cast<int32_t>(entry.context_length()));
    std::copy(entry.block_table.begin(), entry.block_table.end(),
              out->block_table.begin() +
                  static_cast<ptrdiff_t>(i * static_cast<size_t>(out->row_stride)));
  }
}

void ModelRunner::forward_sampled(const StepPlan& plan, std::span<const ops::RowSampling> sampling,
                                  std::span<float> logits, std::span<ops::SampledToken> sampled) {
  PA_CHECK(static_cast<int64_t>(sampling.size()) == plan.num_logit_rows &&
               sampled.size() == sampling.size(),
           "forward: {} sampling entries and {} outputs for {} logit rows", sampling.size(),
           sampled.size(), plan.num_logit_rows);
  forward(plan, logits);
  const size_t vocab = static_cast<size_t>(vocab_size());
  ops::RowSampler sampler;
  for (size_t r = 0; r < sampling.size(); ++r) {
    sampled[r] = ops::SampledToken{};
    if (!sampling[r].sample) continue;
    const ops::RowDraw draw = sampler.sample(logits.subspan(r * vocab, vocab), sampling[r]);
    sampled[r] = {draw.token, draw.logprob};
  }
}

int64_t resolve_pending_tokens(StepPlan& plan, std::span<const ops::SampledToken> previous) {
  int64_t resolved = 0;
  for (ScheduledSequence& entry : plan.sequences) {
    for (int32_t& token : entry.token_ids) {
      if (!is_pending_token(token)) continue;
      const int32_t row = pending_row(token);
      PA_CHECK(static_cast<size_t>(row) < previous.size(),
               "launch: sequence {} waits for row {} of the previous step, which had {} rows",
               entry.sequence, row, previous.size());
      token = previous[static_cast<size_t>(row)].token;
      ++resolved;
    }
  }
  return resolved;
}

void ModelRunner::launch(const StepPlan& plan, std::span<const ops::RowSampling> sampling) {
  PA_CHECK(static_cast<int64_t>(sampling.size()) == plan.num_logit_rows,
           "launch: {} sampling entries for {} logit rows", sampling.size(), plan.num_logit_rows);
  launched_plan_ = plan;
  resolve_pending_tokens(launched_plan_, previous_launch_);
  launched_logits_.resize(sampling.size() * static_cast<size_t>(vocab_size()));
  std::vector<ops::SampledToken> sampled(sampling.size());
  forward_sampled(launched_plan_, sampling, launched_logits_, sampled);
  previous_launch_ = sampled;
  uncollected_.push_back(std::move(sampled));
}

void ModelRunner::collect(std::span<ops::SampledToken> sampled) {
  PA_CHECK(!uncollected_.empty(), "collect: no step launched");
  PA_CHECK(sampled.size() == uncollected_.front().size(),
           "collect: {} outputs for a step of {} logit rows", sampled.size(),
           uncollected_.front().size());
  std::copy(uncollected_.front().begin(), uncollected_.front().end(), sampled.begin());
  uncollected_.pop_front();
}

}  // namespace pagedattn::engine
