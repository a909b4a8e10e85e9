// NullRunner (see null_runner.h).
#include "tools/bench/engine_host/null_runner.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "pagedattn/sampling.h"

namespace pagedattn::tools {
namespace {

uint64_t mix64(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

constexpr float kPeak = 8.0f;

}  // namespace

NullRunner::NullRunner(int32_t vocab_size, std::vector<int32_t> avoid) : vocab_(vocab_size) {
  PA_CHECK(vocab_ >= 2, "null runner: vocab_size {} (expected >= 2)", vocab_);
  avoided_.assign(static_cast<size_t>(vocab_), 0);
  int32_t count = 0;
  for (const int32_t token : avoid) {
    PA_CHECK(token >= 0 && token < vocab_, "null runner: avoided token {} outside [0, {})", token,
             vocab_);
    count += avoided_[static_cast<size_t>(token)] == 0 ? 1 : 0;
    avoided_[static_cast<size_t>(token)] = 1;
  }
  PA_CHECK(count < vocab_, "null runner: every token of the vocabulary ({}) is avoided", vocab_);
  logprob_ = -static_cast<float>(std::log(static_cast<double>(vocab_)));
}

int32_t NullRunner::not_avoided(int64_t token) const {
  auto t = static_cast<int32_t>(token % vocab_);
  while (avoided_[static_cast<size_t>(t)] != 0) t = (t + 1) % vocab_;
  return t;
}

int32_t NullRunner::sampled_token(uint64_t seed, uint64_t choice, uint64_t position) const {
  const double u = ops::sampling_uniform(seed, choice, position);
  return not_avoided(std::min<int64_t>(static_cast<int64_t>(u * vocab_), vocab_ - 1));
}

int32_t NullRunner::peak_token(int64_t sequence, int64_t position) const {
  const uint64_t bits = mix64(static_cast<uint64_t>(sequence) * 0x100000001b3ULL ^
                              mix64(static_cast<uint64_t>(position)));
  return not_avoided(static_cast<int64_t>(bits % static_cast<uint64_t>(vocab_)));
}

void NullRunner::record(const engine::StepPlan& plan) {
  ++calls_;
  last_sequences_ = static_cast<int32_t>(plan.sequences.size());
  last_decodes_ = plan.num_decodes;
}

void NullRunner::fill_logits(const engine::StepPlan& plan, std::span<float> logits,
                             std::span<const ops::RowSampling> skip) {
  const size_t vocab = static_cast<size_t>(vocab_);
  PA_CHECK(logits.size() == static_cast<size_t>(plan.num_logit_rows) * vocab,
           "null runner: logits of {} floats for {} rows of vocabulary {}", logits.size(),
           plan.num_logit_rows, vocab_);
  size_t row = 0;
  for (const engine::ScheduledSequence& entry : plan.sequences) {
    const int64_t end = entry.context_length();
    for (int64_t position = end - entry.num_logit_rows; position < end; ++position, ++row) {
      if (!skip.empty() && skip[row].sample) continue;
      const std::span<float> values = logits.subspan(row * vocab, vocab);
      std::fill(values.begin(), values.end(), 0.0f);
      values[static_cast<size_t>(peak_token(entry.sequence, position))] = kPeak;
      ++rows_logits_;
    }
  }
}

void NullRunner::forward(const engine::StepPlan& plan, std::span<float> logits) {
  record(plan);
  fill_logits(plan, logits, {});
}

void NullRunner::forward_sampled(const engine::StepPlan& plan,
                                 std::span<const ops::RowSampling> sampling,
                                 std::span<float> logits, std::span<ops::SampledToken> sampled) {
  PA_CHECK(static_cast<int64_t>(sampling.size()) == plan.num_logit_rows &&
               sampled.size() == sampling.size(),
           "null runner: {} sampling entries and {} outputs for {} logit rows", sampling.size(),
           sampled.size(), plan.num_logit_rows);
  record(plan);
  for (size_t r = 0; r < sampling.size(); ++r) {
    if (!sampling[r].sample) {
      sampled[r] = ops::SampledToken{};
      continue;
    }
    sampled[r] = {sampled_token(sampling[r].seed, sampling[r].choice, sampling[r].position),
                  logprob_};
    ++rows_sampled_;
  }
  fill_logits(plan, logits, sampling);
}

}  // namespace pagedattn::tools
