// Sampling-parameter validation (each rule names the parameter, its value and the accepted range,
// as an HTTP 400 would want to say it) and the request event stream.
#include <cmath>

#include "core/check.h"
#include "pagedattn/engine_request.h"

namespace pagedattn::engine {

void validate(const SamplingParams& params, int64_t prompt_length, const ModelLimits& limits) {
  PA_CHECK(limits.vocab_size > 0, "vocab_size: {} (expected >= 1)", limits.vocab_size);
  PA_CHECK(limits.max_model_length > 0, "max_model_length: {} (expected >= 1)",
           limits.max_model_length);
  PA_CHECK(prompt_length >= 1, "prompt: {} tokens (expected at least 1)", prompt_length);
  PA_CHECK(prompt_length < limits.max_model_length,
           "prompt: {} tokens, but the model length is {} (the prompt and at least one output "
           "token must fit)",
           prompt_length, limits.max_model_length);
  PA_CHECK(params.n >= 1 && params.n <= kMaxChoices, "n: {} (expected 1 to {})", params.n,
           kMaxChoices);
  PA_CHECK(std::isfinite(params.temperature) && params.temperature >= 0.0,
           "temperature: {} (expected a finite value >= 0)", params.temperature);
  PA_CHECK(params.top_p > 0.0 && params.top_p <= 1.0, "top_p: {} (expected in (0, 1])",
           params.top_p);
  PA_CHECK(params.top_k >= -1, "top_k: {} (expected -1 or 0 for all tokens, or >= 1)",
           params.top_k);
  PA_CHECK(params.min_p >= 0.0 && params.min_p <= 1.0, "min_p: {} (expected in [0, 1])",
           params.min_p);
  PA_CHECK(std::isfinite(params.repetition_penalty) && params.repetition_penalty > 0.0,
           "repetition_penalty: {} (expected a finite value > 0)", params.repetition_penalty);
  PA_CHECK(params.presence_penalty >= -2.0 && params.presence_penalty <= 2.0,
           "presence_penalty: {} (expected in [-2, 2])", params.presence_penalty);
  PA_CHECK(params.frequency_penalty >= -2.0 && params.frequency_penalty <= 2.0,
           "frequency_penalty: {} (expected in [-2, 2])", params.frequency_penalty);
  for (const auto& [token, bias] : params.logit_bias) {
    PA_CHECK(token >= 0 && token < limits.vocab_size,
             "logit_bias: token {} is outside the vocabulary [0, {})", token, limits.vocab_size);
    PA_CHECK(std::isfinite(bias) && bias >= -100.0f && bias <= 100.0f,
             "logit_bias: token {} has bias {} (expected in [-100, 100])", token, bias);
  }
  if (params.max_tokens) {
    const int64_t room = limits.max_model_length - prompt_length;
    PA_CHECK(*params.max_tokens >= 0, "max_tokens: {} (expected >= 0)", *params.max_tokens);
    PA_CHECK(*params.max_tokens <= room,
             "max_tokens: {} with a prompt of {} tokens exceeds the model length {} (at most {})",
             *params.max_tokens, prompt_length, limits.max_model_length, room);
  }
  for (const int32_t token : params.stop_token_ids) {
    PA_CHECK(token >= 0 && token < limits.vocab_size,
             "stop_token_ids: {} is outside the vocabulary [0, {})", token, limits.vocab_size);
  }
  PA_CHECK(params.stop.size() <= kMaxStopStrings, "stop: {} strings (expected at most {})",
           params.stop.size(), kMaxStopStrings);
  for (const std::string& stop : params.stop) {
    PA_CHECK(!stop.empty(), "stop: an empty stop string (expected at least one character)");
  }
  if (params.logprobs) {
    PA_CHECK(*params.logprobs >= 0 && *params.logprobs <= kMaxLogprobs,
             "logprobs: {} (expected 0 to {})", *params.logprobs, kMaxLogprobs);
  }
  if (params.prompt_logprobs) {
    PA_CHECK(*params.prompt_logprobs >= 0 && *params.prompt_logprobs <= kMaxLogprobs,
             "prompt_logprobs: {} (expected 0 to {})", *params.prompt_logprobs, kMaxLogprobs);
  }
}

int64_t resolved_max_tokens(const SamplingParams& params, int64_t prompt_length,
                            const ModelLimits& limits) {
  return params.max_tokens ? *params.max_tokens : limits.max_model_length - prompt_length;
}

const char* to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

void RequestStream::push(RequestEvent&& event) {
  {
    std::lock_guard lock(mutex_);
    if (event.finished()) --choices_left_;
    events_.push_back(std::move(event));
  }
  ready_.notify_all();
}

std::optional<RequestEvent> RequestStream::take_front() {
  if (head_ == events_.size()) return std::nullopt;
  std::optional<RequestEvent> event(std::move(events_[head_++]));
  if (head_ == events_.size()) {
    events_.clear();  // keeps the capacity
    head_ = 0;
  } else if (head_ >= 64 && 2 * head_ >= events_.size()) {
    // A consumer that lags: drop the taken half, so the vector stays within twice the queue.
    events_.erase(events_.begin(), events_.begin() + static_cast<ptrdiff_t>(head_));
    head_ = 0;
  }
  return event;
}

std::optional<RequestEvent> RequestStream::try_pop() {
  std::lock_guard lock(mutex_);
  return take_front();
}

std::optional<RequestEvent> RequestStream::pop(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  ready_.wait_for(lock, timeout, [&] { return head_ < events_.size() || choices_left_ <= 0; });
  return take_front();
}

bool RequestStream::done() const {
  std::lock_guard lock(mutex_);
  return choices_left_ <= 0 && head_ == events_.size();
}

bool RequestStream::all_finished() const {
  std::lock_guard lock(mutex_);
  return choices_left_ <= 0;
}

}  // namespace pagedattn::engine
