// A generation request as the engine's caller sees it: sampling parameters with their validation,
// why a request finished, and the per-request stream of events (new tokens, text, logprobs, the
// finish) that the engine thread pushes and a caller thread (an HTTP handler, the CLI) pops.
//
// Parameters follow vLLM's / OpenAI's meanings: temperature 0 is greedy; top_k -1 or 0 is off;
// repetition_penalty divides positive logits and multiplies negative ones of tokens seen in the
// prompt or the output; presence / frequency penalties subtract from tokens of the output.
// max_tokens defaults to what the model length leaves after the prompt; 0 computes the prompt and
// samples nothing (scoring a prompt: its prompt_logprobs). prompt_logprobs asks, as vLLM's does,
// for the logprob of every prompt token after the first under the model given the tokens before
// it (the raw logits of the row before it), with the top-n alternatives.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace pagedattn::engine {

struct SamplingParams {
  int32_t n = 1;                    // choices per request; they share the prompt's full pages
  double temperature = 1.0;         // >= 0; 0 (or below 1e-5) is greedy
  double top_p = 1.0;               // (0, 1]
  int32_t top_k = -1;               // -1 or 0: off; else >= 1
  double min_p = 0.0;               // [0, 1]: drop tokens below min_p * the top probability
  std::optional<uint64_t> seed;     // same seed, same output, whatever else is in the batch
  double repetition_penalty = 1.0;  // > 0; over prompt + output
  double presence_penalty = 0.0;    // [-2, 2]; over output
  double frequency_penalty = 0.0;   // [-2, 2]; over output
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token, added to its logit)
  std::optional<int32_t> max_tokens;    // >= 0 (0: prompt only); default: model length - prompt
  std::vector<int32_t> stop_token_ids;  // finish (reason stop) after sampling one of these
  std::vector<std::string> stop;        // stop strings, matched on the detokenized text
  bool ignore_eos = false;
  std::optional<int32_t> logprobs;  // top-n alternatives per token, [0, 20]; unset: none
  std::optional<int32_t> prompt_logprobs;  // top-n per prompt token, [0, 20]; unset: none
};

inline constexpr int32_t kMaxLogprobs = 20;
inline constexpr int32_t kMaxChoices = 64;
inline constexpr size_t kMaxStopStrings = 16;

// What validation needs to know about the model.
struct ModelLimits {
  int32_t vocab_size = 0;
  int64_t max_model_length = 0;
};

// Throws pagedattn::Error naming the first bad parameter, its value and what was expected.
// A prompt of `prompt_length` tokens must leave room for at least one output token.
void validate(const SamplingParams& params, int64_t prompt_length, const ModelLimits& limits);

// The output budget of a valid request: max_tokens, or what the model length leaves.
int64_t resolved_max_tokens(const SamplingParams& params, int64_t prompt_length,
                            const ModelLimits& limits);

enum class FinishReason : uint8_t {
  kNone,    // still running
  kStop,    // EOS, a stop token id or a stop string
  kLength,  // max_tokens, or the KV pool cannot hold the request even alone
  kAbort,   // cancelled by the caller
  kError,   // the engine could not serve it (reason in RequestEvent::error)
};
const char* to_string(FinishReason reason);

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;  // of the model's distribution (raw logits, before any processing)
  std::vector<std::pair<int32_t, float>> top;  // the top-n (token, logprob), best first
  // 1 + the tokens ranked before `token` (a higher logit, or an equal one and a lower id: the
  // order of `top`); 0 where not computed (a token drawn by the model on the device).
  int32_t rank = 0;
};

// One event of one choice: the tokens (and text) produced since the previous event, and on the
// choice's last event its finish reason. (The engine empties its pending event field by field
// after sending it, Engine::flush_events: a new field is emptied there too.)
struct RequestEvent {
  int32_t index = 0;                   // which of the n choices (+ the request's first_index)
  std::vector<int32_t> token_ids;      // new tokens (the stop token included, as vLLM does)
  std::vector<TokenLogprob> logprobs;  // one per new token when logprobs were asked
  // On a choice's first event, when prompt_logprobs were asked: one per prompt token from the
  // second on (prompt_length - 1 entries; the first token has nothing before it to be scored by).
  std::vector<TokenLogprob> prompt_logprobs;
  std::string text;                    // new text (with a detokenizer; stop strings withheld)
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_string;            // the stop string that matched, if one did
  std::optional<int32_t> stop_token;  // the EOS / stop token that finished it, if one did
  std::string error;                  // why, for kError (and kLength by the pool)
  int64_t num_prompt_tokens = 0;
  int64_t num_cached_tokens = 0;  // prompt tokens served from the prefix cache (first admission)
  bool finished() const { return finish_reason != FinishReason::kNone; }
};

// A thread-safe queue of one request's events. The engine pushes; one consumer pops. done() is
// true once every choice has sent its finishing event and the queue is drained. The queue is a
// vector that keeps its capacity, so a consumer that keeps up costs the engine no allocation per
// event (a std::deque of events this size allocates a block every two).
class RequestStream {
 public:
  // num_choices: every choice whose events come here (one request's n, or the choices of several
  // requests that share the stream: Engine::add_request with a first_index).
  explicit RequestStream(int32_t num_choices) : choices_left_(num_choices) {}

  void push(RequestEvent&& event);
  std::optional<RequestEvent> try_pop();
  // Waits up to `timeout` for an event; nullopt on timeout (or when done).
  std::optional<RequestEvent> pop(std::chrono::milliseconds timeout);
  bool done() const;
  // Every choice has finished (events may still be queued).
  bool all_finished() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::optional<RequestEvent> take_front();  // with the lock held
  std::vector<RequestEvent> events_;         // queued: [head_, size); before head_: taken
  size_t head_ = 0;
  int32_t choices_left_;
};

}  // namespace pagedattn::engine
