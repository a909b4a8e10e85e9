// The engine loop (see engine.h): inbox, step, sampling, stop checks, events.
//
// A request is a set of choices (Sequence + detokenizer + stop matcher + the event being filled
// this step). The inbox is the only state shared with other threads besides the stats snapshot
// and the live-request counter; everything else belongs to the thread that calls step().
#include "pagedattn/engine.h"

#include <algorithm>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/check.h"
#include "pagedattn/engine_kv.h"
#include "pagedattn/engine_sampler.h"
#include "pagedattn/engine_scheduler.h"
#include "pagedattn/page_allocator.h"

namespace pagedattn::engine {

struct Engine::Choice {
  Sequence sequence;
  Request* request = nullptr;
  std::unique_ptr<IncrementalDetokenizer> detokenizer;
  std::unique_ptr<StopStringMatcher> stops;
  RequestEvent pending;
  bool sent_first = false;
  bool blocks_overlap = false;  // needs its rows on the host (Engine::overlappable)
};

struct Engine::Request {
  int64_t id = 0;
  SamplingParams params;
  uint64_t seed = 0;
  std::shared_ptr<RequestStream> stream;
  int32_t first_index = 0;  // added to each choice's index in its events
  std::vector<std::unique_ptr<Choice>> choices;
  int32_t unfinished = 0;
  // prompt_logprobs: entry p scores prompt token p + 1 (from the row of position p). Whichever
  // choice computes position p first fills it (a choice that shares the first one's pages, or
  // recomputes after a preemption, finds it done); when none is left, the choices' score_prompt
  // is cleared, so a later recompute takes prefix-cache hits and one row again.
  std::vector<TokenLogprob> prompt_logprobs;
  std::vector<uint8_t> prompt_scored;
  int64_t prompt_unscored = 0;
};

struct Engine::Inbox {
  struct Pending {
    int64_t id;
    std::vector<int32_t> prompt;
    SamplingParams params;
    std::shared_ptr<RequestStream> stream;
    int32_t first_index;
  };
  std::mutex mutex;
  std::condition_variable wake;
  std::vector<Pending> added;
  std::vector<int64_t> aborted;
  bool abort_all = false;
};

Engine::Engine(EngineConfig config, ModelRunner& runner, DetokenizerFactory detokenizer)
    : config_(std::move(config)), runner_(runner), detokenizer_(std::move(detokenizer)) {
  PA_CHECK(config_.num_pages >= 1, "num_pages: {} (expected >= 1)", config_.num_pages);
  PA_CHECK(config_.page_size >= 1, "page_size: {} (expected >= 1)", config_.page_size);
  PA_CHECK(config_.max_running >= 1, "max_running: {} (expected >= 1)", config_.max_running);
  PA_CHECK(config_.max_model_length >= 2, "max_model_length: {} (expected >= 2)",
           config_.max_model_length);
  limits_ = ModelLimits{runner_.vocab_size(), config_.max_model_length};
  PA_CHECK(limits_.vocab_size >= 1, "runner: vocab_size {} (expected >= 1)", limits_.vocab_size);
  for (const int32_t eos : config_.eos_token_ids) {
    PA_CHECK(eos >= 0 && eos < limits_.vocab_size, "eos_token_ids: {} outside [0, {})", eos,
             limits_.vocab_size);
  }
  allocator_ = std::make_unique<PageAllocator>(config_.num_pages, config_.page_size);
  kv_ = std::make_unique<KvManager>(*allocator_, config_.prefix_cache);
  const int64_t scoring_rows =
      config_.max_scoring_rows > 0
          ? config_.max_scoring_rows
          : std::max<int64_t>(16, kScoringLogitsBytes / (int64_t{limits_.vocab_size} * 4));
  scheduler_ = std::make_unique<Scheduler>(
      SchedulerConfig{config_.max_tokens_per_step, config_.max_running, scoring_rows}, *kv_);
  int32_t threads = 1;
#ifdef _OPENMP
  threads = std::max(1, omp_get_max_threads());
#endif
  samplers_.resize(static_cast<size_t>(threads));
  step_ = std::make_unique<ScheduleResult>();
  model_sampling_ = config_.model_sampling.value_or(runner_.prefers_model_sampling());
  PA_CHECK(!config_.overlap.value_or(false) || model_sampling_,
           "overlap: overlap scheduling needs the runner to sample (model_sampling)");
  overlap_ = model_sampling_ && config_.overlap.value_or(runner_.supports_overlap());
  inbox_ = std::make_unique<Inbox>();
  publish_stats();
}

Engine::~Engine() {
  // A step still running on the device is waited for, so that none of it outlives the engine.
  if (launched_) {
    try {
      runner_.collect(launched_sampled_);
    } catch (const Error&) {
    }
  }
  // Streams still open get an abort, so no consumer waits forever.
  for (auto& [id, request] : requests_) {
    for (auto& choice : request->choices) {
      if (choice->sequence.status != SequenceStatus::kFinished) {
        RequestEvent event;
        event.index = request->first_index + choice->sequence.index;
        event.finish_reason = FinishReason::kAbort;
        event.error = "the engine shut down";
        request->stream->push(std::move(event));
      }
    }
  }
  std::lock_guard lock(inbox_->mutex);
  for (auto& pending : inbox_->added) {
    for (int32_t index = 0; index < pending.params.n; ++index) {
      RequestEvent event;
      event.index = pending.first_index + index;
      event.finish_reason = FinishReason::kAbort;
      event.error = "the engine shut down";
      pending.stream->push(std::move(event));
    }
  }
}

const PageAllocator& Engine::allocator() const { return *allocator_; }

Engine::Handle Engine::add_request(std::vector<int32_t> prompt, SamplingParams params) {
  auto stream = std::make_shared<RequestStream>(params.n);
  return add_request(std::move(prompt), std::move(params), std::move(stream), 0);
}

Engine::Handle Engine::add_request(std::vector<int32_t> prompt, SamplingParams params,
                                   std::shared_ptr<RequestStream> stream, int32_t first_index) {
  PA_CHECK(stream != nullptr, "add_request: no stream");
  PA_CHECK(first_index >= 0, "add_request: first_index {} (expected >= 0)", first_index);
  validate(params, static_cast<int64_t>(prompt.size()), limits_);
  for (const int32_t token : prompt) {
    PA_CHECK(token >= 0 && token < limits_.vocab_size,
             "prompt: token {} is outside the vocabulary [0, {})", token, limits_.vocab_size);
  }
  PA_CHECK(params.stop.empty() || detokenizer_,
           "stop: stop strings need a detokenizer, and this engine has none");
  Handle handle;
  handle.id = next_request_.fetch_add(1);
  handle.stream = std::move(stream);
  {
    std::lock_guard lock(inbox_->mutex);
    live_requests_.fetch_add(1);
    inbox_->added.push_back(
        {handle.id, std::move(prompt), std::move(params), handle.stream, first_index});
  }
  inbox_->wake.notify_all();
  return handle;
}

void Engine::abort(int64_t request) {
  {
    std::lock_guard lock(inbox_->mutex);
    inbox_->aborted.push_back(request);
  }
  inbox_->wake.notify_all();
}

void Engine::abort_all() {
  {
    std::lock_guard lock(inbox_->mutex);
    inbox_->abort_all = true;
  }
  inbox_->wake.notify_all();
}

bool Engine::has_work() const { return live_requests_.load() > 0; }

bool Engine::wait_for_work(std::chrono::milliseconds timeout) {
  std::unique_lock lock(inbox_->mutex);
  return inbox_->wake.wait_for(lock, timeout, [&] {
    return live_requests_.load() > 0 || !inbox_->aborted.empty() || inbox_->abort_all;
  });
}

void Engine::start_request(int64_t id, std::vector<int32_t> prompt, SamplingParams params,
                           std::shared_ptr<RequestStream> stream, int32_t first_index) {
  auto request = std::make_unique<Request>();
  request->id = id;
  request->seed = params.seed ? *params.seed : config_.seed * 0x9e3779b97f4a7c15ULL + uint64_t(id);
  request->stream = std::move(stream);
  request->first_index = first_index;
  const int64_t prompt_length = static_cast<int64_t>(prompt.size());
  const int64_t max_output = resolved_max_tokens(params, prompt_length, limits_);
  request->params = std::move(params);
  request->unfinished = request->params.n;
  if (request->params.prompt_logprobs) {
    request->prompt_unscored = prompt_length - 1;
    request->prompt_logprobs.resize(static_cast<size_t>(prompt_length - 1));
    request->prompt_scored.assign(static_cast<size_t>(prompt_length - 1), 0);
  }
  for (int32_t index = 0; index < request->params.n; ++index) {
    auto choice = std::make_unique<Choice>();
    choice->request = request.get();
    Sequence& sequence = choice->sequence;
    sequence.id = next_sequence_++;
    sequence.request = id;
    sequence.index = index;
    sequence.tokens = prompt;
    sequence.prompt_length = prompt_length;
    sequence.max_output = max_output;
    sequence.score_prompt = request->prompt_unscored > 0;
    if (index > 0) sequence.share_from = &request->choices.front()->sequence;
    if (detokenizer_) choice->detokenizer = detokenizer_(prompt);
    if (!request->params.stop.empty()) {
      choice->stops = std::make_unique<StopStringMatcher>(request->params.stop);
    }
    choice->pending.index = first_index + index;
    choice->blocks_overlap = !overlappable(request->params, max_output);
    overlap_blockers_ += choice->blocks_overlap ? 1 : 0;
    choices_.emplace(sequence.id, choice.get());
    request->choices.push_back(std::move(choice));
  }
  for (auto& choice : request->choices) scheduler_->add(&choice->sequence);
  requests_.emplace(id, std::move(request));
}

void Engine::drain_inbox() {
  std::vector<Inbox::Pending> added;
  std::vector<int64_t> aborted;
  bool all = false;
  {
    std::lock_guard lock(inbox_->mutex);
    added.swap(inbox_->added);
    aborted.swap(inbox_->aborted);
    all = std::exchange(inbox_->abort_all, false);
  }
  for (auto& pending : added) {
    start_request(pending.id, std::move(pending.prompt), std::move(pending.params),
                  std::move(pending.stream), pending.first_index);
  }
  if (all) {
    aborted.clear();
    for (const auto& [id, request] : requests_) aborted.push_back(id);
  }
  for (const int64_t id : aborted) {
    const auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    Request* request = it->second.get();
    for (size_t i = 0; requests_.contains(id) && i < request->choices.size(); ++i) {
      Choice& choice = *request->choices[i];
      if (choice.sequence.status != SequenceStatus::kFinished) finish(choice, FinishReason::kAbort);
    }
  }
}

void Engine::flush_events(Choice& choice) {
  RequestEvent& event = choice.pending;
  if (event.token_ids.empty() && event.text.empty() && !event.finished()) return;
  const Request& request = *choice.request;
  if (!choice.sent_first) {
    event.num_prompt_tokens = choice.sequence.prompt_length;
    event.num_cached_tokens = std::max<int64_t>(choice.sequence.num_cached_tokens, 0);
    // Complete by the first token (every prompt row precedes it); an abort or an error may
    // come first, and then there is nothing to send.
    if (request.params.prompt_logprobs && request.prompt_unscored == 0) {
      event.prompt_logprobs = request.prompt_logprobs;
    }
    choice.sent_first = true;
  }
  request.stream->push(std::move(event));
  // Emptied field by field (a fresh RequestEvent assigned would construct and move every field
  // of a large struct once per choice per step); the index stays.
  event.token_ids.clear();
  event.logprobs.clear();
  event.prompt_logprobs.clear();
  event.text.clear();
  event.finish_reason = FinishReason::kNone;
  event.stop_string.clear();
  event.stop_token.reset();
  event.error.clear();
  event.num_prompt_tokens = 0;
  event.num_cached_tokens = 0;
}

void Engine::finish(Choice& choice, FinishReason reason, std::string error) {
  Sequence& sequence = choice.sequence;
  scheduler_->remove(&sequence);  // releases the pages (already removed when rejected)
  if (choice.detokenizer && reason != FinishReason::kAbort && reason != FinishReason::kError &&
      choice.pending.stop_string.empty()) {
    std::string text = choice.detokenizer->flush();
    if (choice.stops) {
      StopStringMatcher::Result result = choice.stops->push(text);
      text = std::move(result.text);
      if (result.stop) {
        choice.pending.stop_string = *result.stop;
        reason = FinishReason::kStop;
      } else {
        text += choice.stops->flush();
      }
    }
    choice.pending.text += text;
  }
  choice.pending.finish_reason = reason;
  choice.pending.error = std::move(error);
  flush_events(choice);
  overlap_blockers_ -= choice.blocks_overlap ? 1 : 0;
  choices_.erase(sequence.id);
  Request* request = choice.request;
  if (--request->unfinished == 0) {
    ++num_finished_;
    requests_.erase(request->id);  // destroys `choice`
    live_requests_.fetch_sub(1);
  }
}

SampleContext Engine::context_of(const Choice& choice) const {
  const Sequence& sequence = choice.sequence;
  const std::span<const int32_t> tokens(sequence.tokens);
  SampleContext context;
  context.prompt = tokens.first(static_cast<size_t>(sequence.prompt_length));
  context.output = tokens.subspan(static_cast<size_t>(sequence.prompt_length));
  context.seed = choice.request->seed;
  context.choice = static_cast<uint64_t>(sequence.index);
  context.position = static_cast<uint64_t>(sequence.num_output());
  return context;
}

void Engine::plan_model_sampling(const ScheduleResult& result) {
  // One entry per logits row of the plan. Only the row of a sequence's last token, when that
  // token samples (the chunk reaches the end of the sequence and max_tokens > 0), with parameters
  // the model's sampler serves, is drawn by the runner; prompt-scoring rows need their logits.
  row_sampling_.clear();
  if (!model_sampling_) return;
  bool any = false;
  for (size_t i = 0; i < result.scheduled.size(); ++i) {
    const ScheduledSequence& entry = result.plan.sequences[i];
    if (entry.num_logit_rows == 0) continue;
    row_sampling_.resize(row_sampling_.size() + static_cast<size_t>(entry.num_logit_rows - 1));
    const Choice& choice = *step_choices_[i];
    const SamplingParams& params = choice.request->params;
    const bool eligible = entry.context_length() == choice.sequence.num_tokens() &&
                          choice.sequence.max_output > 0 && model_can_sample(params);
    row_sampling_.push_back(eligible ? row_sampling(params, context_of(choice))
                                     : ops::RowSampling{});
    any = any || eligible;
  }
  if (!any) row_sampling_.clear();
  model_sampled_.assign(row_sampling_.size(), ops::SampledToken{});
}

void Engine::sample_rows(const ScheduleResult& result) {
  // Each sequence's logit rows are the last num_logit_rows of its new tokens. A row at a prompt
  // position before the last scores the next prompt token (prompt_logprobs; once per request);
  // the row of a sequence's last token samples its next one. Rows are independent (a row's result
  // depends on its logits, parameters and context only), so large steps run them on several
  // threads, each with its own Sampler; tokens are appended afterwards, in plan order.
  const size_t vocab = static_cast<size_t>(limits_.vocab_size);
  row_jobs_.clear();
  sampling_choices_.clear();
  int64_t row = 0;
  for (size_t i = 0; i < result.scheduled.size(); ++i) {
    const ScheduledSequence& entry = result.plan.sequences[i];
    if (entry.num_logit_rows == 0) continue;
    Choice* choice = step_choices_[i];
    Request& request = *choice->request;
    const int64_t end = entry.context_length();
    for (int64_t position = end - entry.num_logit_rows; position < end; ++position, ++row) {
      const auto slot = static_cast<size_t>(position);
      if (position + 1 < choice->sequence.prompt_length && request.prompt_unscored > 0 &&
          request.prompt_scored[slot] == 0) {
        request.prompt_scored[slot] = 1;
        --request.prompt_unscored;
        row_jobs_.push_back({choice, row, position});
      }
    }
    if (end == choice->sequence.num_tokens()) {
      sampling_choices_.push_back(choice);
      row_jobs_.push_back({choice, row - 1, -1});
    }
  }
  sampled_.resize(sampling_choices_.size());
  // Sampling jobs write sampled_ in the order they were listed. A job whose row the runner
  // sampled takes its token here; the others (host_jobs_) need the logits.
  host_jobs_.clear();
  for (size_t j = 0, next = 0; j < row_jobs_.size(); ++j) {
    const RowJob& job = row_jobs_[j];
    const size_t slot = job.position < 0 ? next++ : 0;
    if (job.position < 0 && !row_sampling_.empty() &&
        row_sampling_[static_cast<size_t>(job.row)].sample) {
      const ops::SampledToken& drawn = model_sampled_[static_cast<size_t>(job.row)];
      TokenLogprob& out = sampled_[slot];
      out.token = drawn.token;
      out.logprob = drawn.logprob;
      out.top.clear();
      out.rank = 0;  // drawn on the device: not ranked
      continue;
    }
    host_jobs_.push_back({j, slot});
  }
  const auto run = [&](const HostJob& host_job, size_t thread) {
    const RowJob& job = row_jobs_[host_job.job];
    const Choice& choice = *job.choice;
    const SamplingParams& params = choice.request->params;
    const std::span<const float> logits =
        logits_.subspan(static_cast<size_t>(job.row) * vocab, vocab);
    if (job.position >= 0) {
      const auto position = static_cast<size_t>(job.position);
      choice.request->prompt_logprobs[position] = samplers_[thread].score(
          logits, choice.sequence.tokens[position + 1], *params.prompt_logprobs);
    } else if (choice.sequence.max_output > 0) {
      sampled_[host_job.slot] = samplers_[thread].sample(logits, params, context_of(choice));
    }
  };
  const int64_t host_jobs = static_cast<int64_t>(host_jobs_.size());
  // At most one thread per Sampler, whatever omp_set_num_threads says later. A step without
  // enough host work never enters a parallel region (libgomp allocates a team even for one).
  [[maybe_unused]] const int thread_count = static_cast<int>(samplers_.size());
  const bool parallel = host_jobs > 1 && static_cast<size_t>(host_jobs) * vocab >= (1u << 20);
  if (parallel) {
#pragma omp parallel for schedule(dynamic) num_threads(thread_count)
    for (int64_t j = 0; j < host_jobs; ++j) {
      size_t thread = 0;
#ifdef _OPENMP
      thread = static_cast<size_t>(omp_get_thread_num());
#endif
      run(host_jobs_[static_cast<size_t>(j)], thread);
    }
  } else {
    for (const HostJob& host_job : host_jobs_) run(host_job, 0);
  }
  // A request whose prompt is scored computes one row per prompt chunk from now on.
  for (const RowJob& job : row_jobs_) {
    Request& request = *job.choice->request;
    if (job.position >= 0 && request.prompt_unscored == 0) {
      for (auto& choice : request.choices) choice->sequence.score_prompt = false;
    }
  }
  // A choice that finishes flushes its events (and may be destroyed); the others are flushed at
  // the end of the step.
  to_flush_.clear();
  for (size_t k = 0; k < sampling_choices_.size(); ++k) {
    Choice& choice = *sampling_choices_[k];
    if (choice.sequence.max_output == 0) {
      finish(choice, FinishReason::kLength);  // max_tokens 0: the prompt only
    } else if (advance(choice, std::move(sampled_[k]))) {
      to_flush_.push_back(&choice);
    }
  }
}

bool Engine::advance(Choice& choice, TokenLogprob&& sampled) {
  Sequence& sequence = choice.sequence;
  const SamplingParams& params = choice.request->params;
  const int32_t token = sampled.token;
  sequence.tokens.push_back(token);
  ++num_generated_tokens_;
  choice.pending.token_ids.push_back(token);
  if (params.logprobs) choice.pending.logprobs.push_back(std::move(sampled));

  const auto contains = [](const std::vector<int32_t>& ids, int32_t id) {
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  };
  if (contains(params.stop_token_ids, token) ||
      (!params.ignore_eos && contains(config_.eos_token_ids, token))) {
    choice.pending.stop_token = token;
    finish(choice, FinishReason::kStop);
    return false;
  }
  if (choice.detokenizer) {
    std::string text = choice.detokenizer->push(token);
    if (choice.stops) {
      StopStringMatcher::Result result = choice.stops->push(text);
      choice.pending.text += result.text;
      if (result.stop) {
        choice.pending.stop_string = *result.stop;
        finish(choice, FinishReason::kStop);
        return false;
      }
    } else {
      choice.pending.text += text;
    }
  }
  if (sequence.num_output() >= sequence.max_output) {
    finish(choice, FinishReason::kLength);
    return false;
  }
  return true;
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

bool Engine::overlappable(const SamplingParams& params, int64_t max_output) const {
  return max_output > 0 && !params.prompt_logprobs && model_can_sample(params);
}

bool Engine::step() {
  // Timed phases (EngineStats): schedule, plan, forward (launch and collect), sample.
  const auto start = std::chrono::steady_clock::now();
  drain_inbox();
  if (overlap_ && overlap_blockers_ == 0) return step_overlapped(start);
  // A request that needs its rows on the host: the step in flight is taken in first, then
  // steps run one at a time until no such request is left.
  const bool collected = launched_;
  if (launched_) collect_launched();
  return step_at_once(start) || collected;
}

bool Engine::finish_rejected(const ScheduleResult& result) {
  for (Sequence* sequence : result.rejected) {
    Choice& choice = *choices_.at(sequence->id);
    const int32_t pages = kv_->pages_for(sequence->num_tokens());
    if (sequence->num_output() == 0) {
      finish(choice, FinishReason::kError,
             fmt::format("prompt: {} tokens need {} KV pages of {} tokens; the pool has {}",
                         sequence->num_tokens(), pages, config_.page_size, config_.num_pages));
    } else {
      finish(choice, FinishReason::kLength,
             fmt::format("the KV pool ({} pages of {} tokens) cannot hold {} tokens",
                         config_.num_pages, config_.page_size, sequence->num_tokens()));
    }
  }
  return !result.rejected.empty();
}

void Engine::fill_step(ScheduleResult& result) {
  scheduler_->fill_plan(&result);
  step_choices_.clear();
  for (const Sequence* sequence : result.scheduled)
    step_choices_.push_back(choices_.at(sequence->id));
  ++num_steps_;
  num_computed_tokens_ += result.plan.num_tokens;
}

bool Engine::step_at_once(std::chrono::steady_clock::time_point start) {
  ScheduleResult& result = *step_;
  scheduler_->schedule(&result);
  const bool worked = finish_rejected(result) || !result.plan.empty();
  schedule_seconds_ += seconds_since(start);
  if (result.plan.empty()) {
    publish_stats();
    return worked;
  }
  const auto plan_start = std::chrono::steady_clock::now();
  fill_step(result);
  const size_t vocab = static_cast<size_t>(limits_.vocab_size);
  const size_t logit_floats = static_cast<size_t>(result.plan.num_logit_rows) * vocab;
  if (logit_floats > logits_capacity_) {
    logits_capacity_ = std::max(logit_floats, 2 * logits_capacity_);
    logits_buffer_ = std::make_unique_for_overwrite<float[]>(logits_capacity_);
  }
  logits_ = std::span<float>(logits_buffer_.get(), logit_floats);
  plan_model_sampling(result);
  plan_seconds_ += seconds_since(plan_start);
  const auto forward_start = std::chrono::steady_clock::now();
  try {
    if (row_sampling_.empty()) {
      runner_.forward(result.plan, logits_);
    } else {
      runner_.forward_sampled(result.plan, row_sampling_, logits_, model_sampled_);
      for (size_t r = 0; r < row_sampling_.size(); ++r) {
        PA_CHECK(!row_sampling_[r].sample ||
                     (model_sampled_[r].token >= 0 && model_sampled_[r].token < limits_.vocab_size),
                 "the runner sampled token {} for row {} (vocabulary {})", model_sampled_[r].token,
                 r, limits_.vocab_size);
      }
    }
    forward_seconds_ += seconds_since(forward_start);
  } catch (const Error& error) {
    for (Sequence* sequence : result.scheduled) {
      finish(*choices_.at(sequence->id), FinishReason::kError,
             std::string("model: ") + error.what());
    }
    publish_stats();
    return true;
  }
  const auto sample_start = std::chrono::steady_clock::now();
  scheduler_->complete(result);
  sample_rows(result);
  // Only the choices advanced this step (and still running) have events pending: every other
  // path that fills one (finish) flushes it at once.
  for (Choice* choice : to_flush_) flush_events(*choice);
  sample_seconds_ += seconds_since(sample_start);
  publish_stats();
  return true;
}

bool Engine::step_overlapped(std::chrono::steady_clock::time_point start) {
  // Step N (launched_) may still run on the device. Step N + 1 is scheduled as if each of N's
  // rows had drawn its token (a pending token stands in the sequence), launched, and only then
  // are N's tokens taken in.
  ScheduleResult& result = *step_;
  scheduler_->schedule(&result);
  bool worked = finish_rejected(result);
  schedule_seconds_ += seconds_since(start);
  if (result.plan.empty()) {
    if (launched_) {
      collect_launched();
      worked = true;
    }
    publish_stats();
    return worked;
  }
  const auto plan_start = std::chrono::steady_clock::now();
  fill_step(result);
  plan_model_sampling(result);
  // No live request blocks overlap, so the runner draws every row.
  PA_CHECK(static_cast<int64_t>(row_sampling_.size()) == result.plan.num_logit_rows &&
               std::all_of(row_sampling_.begin(), row_sampling_.end(),
                           [](const ops::RowSampling& row) { return row.sample; }),
           "engine: an overlapped step with a row the runner does not sample");
  plan_seconds_ += seconds_since(plan_start);
  const auto forward_start = std::chrono::steady_clock::now();
  try {
    runner_.launch(result.plan, row_sampling_);
  } catch (const Error& error) {
    // The step did not start: its sequences finish with the error, the one before is taken in.
    const std::string message = std::string("model: ") + error.what();
    for (const ScheduledSequence& entry : result.plan.sequences) {
      fail_if_live(entry.sequence, message);
    }
    if (launched_) collect_launched();
    publish_stats();
    return true;
  }
  forward_seconds_ += seconds_since(forward_start);
  if (launched_) {
    ++num_overlapped_steps_;
    collect_launched();
  }

  // This step's sequences still live: their new tokens are (being) computed; each row's token
  // is pending until the next collect. A sequence that finished in the collect above (a stop in
  // step N) is dropped here: its row in this step is wasted.
  const auto complete_start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < result.scheduled.size(); ++i) {
    if (!choices_.contains(result.plan.sequences[i].sequence)) result.scheduled[i] = nullptr;
  }
  scheduler_->complete(result);
  launched_rows_.clear();
  for (size_t i = 0; i < result.scheduled.size(); ++i) {
    const ScheduledSequence& entry = result.plan.sequences[i];
    if (entry.num_logit_rows == 0) continue;
    const int32_t row = static_cast<int32_t>(launched_rows_.size());
    launched_rows_.push_back(entry.sequence);
    if (result.scheduled[i] != nullptr) result.scheduled[i]->tokens.push_back(pending_token(row));
  }
  launched_sampled_.resize(launched_rows_.size());
  launched_ = true;
  // Nothing live is left: nothing stays in flight while the engine idles.
  if (choices_.empty()) collect_launched();
  sample_seconds_ += seconds_since(complete_start);
  publish_stats();
  return true;
}

void Engine::fail_if_live(SequenceId id, const std::string& message) {
  if (const auto it = choices_.find(id); it != choices_.end()) {
    finish(*it->second, FinishReason::kError, message);
  }
}

void Engine::collect_launched() {
  launched_ = false;
  const auto start = std::chrono::steady_clock::now();
  try {
    runner_.collect(launched_sampled_);
  } catch (const Error& error) {
    forward_seconds_ += seconds_since(start);
    const std::string message = std::string("model: ") + error.what();
    for (const SequenceId id : launched_rows_) fail_if_live(id, message);
    return;
  }
  forward_seconds_ += seconds_since(start);
  const auto sample_start = std::chrono::steady_clock::now();
  to_flush_.clear();
  for (size_t r = 0; r < launched_rows_.size(); ++r) {
    const auto it = choices_.find(launched_rows_[r]);
    if (it == choices_.end()) continue;  // finished since the step was launched
    Choice& choice = *it->second;
    std::vector<int32_t>& tokens = choice.sequence.tokens;
    PA_CHECK(!tokens.empty() && tokens.back() == pending_token(static_cast<int32_t>(r)),
             "engine: sequence {} does not wait for row {} of the launched step",
             choice.sequence.id, r);
    tokens.pop_back();
    const ops::SampledToken& drawn = launched_sampled_[r];
    if (drawn.token < 0 || drawn.token >= limits_.vocab_size) {
      finish(choice, FinishReason::kError,
             fmt::format("model: the runner sampled token {} for row {} (vocabulary {})",
                         drawn.token, r, limits_.vocab_size));
      continue;
    }
    TokenLogprob sampled;
    sampled.token = drawn.token;
    sampled.logprob = drawn.logprob;
    sampled.rank = 0;  // drawn on the device: not ranked
    if (advance(choice, std::move(sampled))) to_flush_.push_back(&choice);
  }
  for (Choice* choice : to_flush_) flush_events(*choice);
  sample_seconds_ += seconds_since(sample_start);
}

int32_t Engine::clear_prefix_cache() {
  RadixCache* cache = kv_->prefix_cache();
  const int32_t freed = cache ? cache->clear() : 0;
  publish_stats();
  return freed;
}

void Engine::check_consistency() const {
  allocator_->check_consistency();
  if (const RadixCache* cache = kv_->prefix_cache()) cache->check_consistency();
  for (const auto& [id, choice] : choices_) {
    const Sequence& sequence = choice->sequence;
    const bool held = allocator_->has_request(sequence.id);
    PA_CHECK(held == (sequence.status == SequenceStatus::kRunning),
             "engine: sequence {} is {} but {} pages", sequence.id,
             static_cast<int>(sequence.status), held ? "holds" : "holds no");
    if (held) {
      PA_CHECK(allocator_->num_tokens(sequence.id) >= sequence.num_computed,
               "engine: sequence {} computed {} tokens but holds pages for {}", sequence.id,
               sequence.num_computed, allocator_->num_tokens(sequence.id));
    }
  }
}

void Engine::publish_stats() {
  EngineStats stats;
  stats.num_waiting = static_cast<int64_t>(scheduler_->num_waiting());
  stats.num_running = static_cast<int64_t>(scheduler_->num_running());
  stats.num_pages = allocator_->num_pages();
  stats.num_free_pages = allocator_->num_free_pages();
  stats.num_cached_pages = kv_->prefix_cache() ? kv_->prefix_cache()->num_cached_pages() : 0;
  stats.prefix_hit_tokens = kv_->prefix_hit_tokens();
  stats.prefix_query_tokens = kv_->prefix_query_tokens();
  stats.num_preemptions = scheduler_->num_preemptions();
  stats.num_steps = num_steps_;
  stats.num_overlapped_steps = num_overlapped_steps_;
  stats.num_computed_tokens = num_computed_tokens_;
  stats.num_generated_tokens = num_generated_tokens_;
  stats.num_finished = num_finished_;
  stats.schedule_seconds = schedule_seconds_;
  stats.plan_seconds = plan_seconds_;
  stats.forward_seconds = forward_seconds_;
  stats.sample_seconds = sample_seconds_;
  std::lock_guard lock(stats_mutex_);
  stats_ = stats;
}

EngineStats Engine::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

}  // namespace pagedattn::engine
