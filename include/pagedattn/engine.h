// The engine: requests in, token streams out. It owns the page allocator, the prefix cache, the
// scheduler and the sampler, and drives a ModelRunner (engine_model_runner.h) one step at a time.
//
// Threads: add_request, abort, has_work, wait_for_work and stats may be called from any thread
// (HTTP handlers); they only touch a locked inbox and a stats snapshot. step() and the other
// members run on the one engine thread. An abort takes effect at the next step boundary, where
// the request's pages are freed and its streams get a finishing event (reason abort).
//
// One step: drain the inbox (new requests join the waiting queue; aborts finish) -> schedule ->
// forward -> score prompt rows (prompt_logprobs) and sample the rows of each sequence's last token
// (on the host, or by the runner where it samples: EngineConfig::model_sampling) -> stop checks
// (stop token ids, EOS unless
// ignore_eos, stop strings on the detokenized text, max_tokens) -> events to the streams ->
// release what finished. n > 1 choices share the prompt's full pages: the later choices wait
// for the first one's prefill and then take references to its pages (no copy).
//
// Overlap scheduling (EngineConfig::overlap, with a runner that samples: ModelRunner::launch):
// while the device runs step N, the host schedules step N + 1 and launches it, and only then
// takes in step N's tokens (stop checks, events). A sequence that decodes in N + 1 gets as its
// input token a reference to its row of step N (pending_token), which the runner resolves on the
// device. So its pages and position are granted one token ahead: a sequence that stops at step N
// (a stop token, EOS or stop string: max_tokens is known in advance and never overshoots) has
// also been scheduled in N + 1, whose row is dropped (one wasted row per such stop). Only steps
// whose every row the runner can sample overlap: while a live request needs logits on the host
// (bias, penalties, top-n logprobs, prompt logprobs, max_tokens 0), steps run one at a time. The
// tokens are the same either way.
//
// Invalid parameters make add_request throw Error (the message names the parameter), so a
// server can answer 400 before anything is queued. A request the KV pool could never hold
// finishes with kError (prompt) or kLength (its output outgrew the pool) instead of waiting.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "pagedattn/engine_model_runner.h"
#include "pagedattn/engine_request.h"
#include "pagedattn/engine_sampler.h"
#include "pagedattn/engine_stop.h"

namespace pagedattn {
class PageAllocator;
}

namespace pagedattn::engine {

class KvManager;
class Scheduler;
struct ScheduleResult;

struct EngineConfig {
  int32_t num_pages = 0;               // allocation pages of the runner's KV pool
  int32_t page_size = 16;              // tokens per allocation page
  int64_t max_tokens_per_step = 2048;  // token budget per step; <= 0: unbounded
  int32_t max_running = 256;
  int64_t max_model_length = 4096;
  bool prefix_cache = true;
  std::vector<int32_t> eos_token_ids;
  uint64_t seed = 0;  // requests without a seed get one derived from this and their id
  // Prompt tokens scored per step (SamplingParams::prompt_logprobs: one logits row of vocab floats
  // each); 0: as many as kScoringLogitsBytes of f32 logits hold (at least 16). A longer prompt
  // is scored over several steps.
  int64_t max_scoring_rows = 0;
  // Rows of requests without logit bias, penalties or top-n logprobs are sampled by the runner
  // (ModelRunner::forward_sampled: same algorithm, only tokens come back). Unset: when the runner
  // prefers it (ModelRuntime: a model on a GPU).
  std::optional<bool> model_sampling;
  // Overlap scheduling (see above). Unset: when the runner supports it (ModelRuntime: a model on
  // a GPU) and samples. On with a runner that does not: the same steps and tokens, run at launch.
  std::optional<bool> overlap;
};

inline constexpr int64_t kScoringLogitsBytes = int64_t{256} << 20;

struct EngineStats {
  int64_t num_waiting = 0;  // sequences (choices) waiting or preempted
  int64_t num_running = 0;
  int32_t num_pages = 0;
  int32_t num_free_pages = 0;
  int32_t num_cached_pages = 0;     // held by the prefix cache (some may be in use too)
  int64_t prefix_hit_tokens = 0;    // prompt tokens served from the prefix cache
  int64_t prefix_query_tokens = 0;  // prompt tokens looked up in it
  int64_t num_preemptions = 0;
  int64_t num_steps = 0;
  int64_t num_overlapped_steps = 0;  // launched while the step before was still uncollected
  int64_t num_computed_tokens = 0;   // tokens through the model
  int64_t num_generated_tokens = 0;  // tokens sampled
  int64_t num_finished = 0;          // requests (all choices done)
  // Host time spent, over all steps: inbox + scheduling decisions (pages, preemption); the plan
  // (the step's token ids and block tables, the rows the runner samples); the runner's forward;
  // sampling, stop checks and events. Their ratio is the host overhead per step.
  double schedule_seconds = 0.0;
  double plan_seconds = 0.0;
  double forward_seconds = 0.0;
  double sample_seconds = 0.0;
};

class Engine {
 public:
  Engine(EngineConfig config, ModelRunner& runner, DetokenizerFactory detokenizer = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  struct Handle {
    int64_t id = 0;
    std::shared_ptr<RequestStream> stream;
  };
  // Any thread. Validates (throws Error naming the bad parameter) and queues the request.
  Handle add_request(std::vector<int32_t> prompt, SamplingParams params);
  // The same, with the events going to `stream`, which several requests may share (a batch of
  // prompts answered together): this request's choice i sends events with index first_index + i.
  // `stream` must count every choice of every request that shares it (RequestStream's
  // num_choices), or done() never becomes true.
  Handle add_request(std::vector<int32_t> prompt, SamplingParams params,
                     std::shared_ptr<RequestStream> stream, int32_t first_index);
  // Any thread. Unknown or finished ids are ignored.
  void abort(int64_t request);
  void abort_all();
  // Any thread: whether a request is queued, waiting or running.
  bool has_work() const;
  // Any thread (the engine thread idles here): waits until has_work() or the timeout.
  bool wait_for_work(std::chrono::milliseconds timeout);
  EngineStats stats() const;
  ModelLimits limits() const { return limits_; }
  const EngineConfig& config() const { return config_; }

  // Engine thread. Runs one step; false when there was nothing to do.
  bool step();
  // Engine thread. Frees every cached page no request uses; returns how many.
  int32_t clear_prefix_cache();
  // Engine thread. Throws Error if the allocator, the cache or the sequences disagree.
  void check_consistency() const;
  const PageAllocator& allocator() const;

 private:
  struct Choice;
  struct Request;
  struct Inbox;

  void drain_inbox();
  void start_request(int64_t id, std::vector<int32_t> prompt, SamplingParams params,
                     std::shared_ptr<RequestStream> stream, int32_t first_index);
  // What the sampler needs of `choice`: its prompt, output, seed, choice index and position.
  SampleContext context_of(const Choice& choice) const;
  // The rows of the step the runner samples (model_sampling): fills row_sampling_ (empty: none).
  void plan_model_sampling(const ScheduleResult& result);
  // Scores the prompt rows and samples the last rows of the step (in parallel when large; the rows
  // the runner sampled take its token), then advances each choice.
  void sample_rows(const ScheduleResult& result);
  // Appends the sampled token to `choice`, applies the stop checks, fills its pending event.
  // false: the choice finished (its events are sent; it may be destroyed).
  bool advance(Choice& choice, TokenLogprob&& sampled);
  void finish(Choice& choice, FinishReason reason, std::string error = {});
  void flush_events(Choice& choice);
  void publish_stats();
  // A step scheduled, planned and run to the end (its tokens taken in) before step() returns.
  bool step_at_once(std::chrono::steady_clock::time_point start);
  // A step launched before the previous one is collected (overlap scheduling).
  bool step_overlapped(std::chrono::steady_clock::time_point start);
  // The scheduled step's token ids and block tables, its choices (step_choices_), the counters.
  void fill_step(ScheduleResult& result);
  // Handles the scheduler's rejections of this step; false when there were none.
  bool finish_rejected(const ScheduleResult& result);
  // Waits for the launched step and takes in its tokens (stop checks, events). A row whose
  // choice finished since (abort, a stop in the step before) is dropped.
  void collect_launched();
  // Finishes sequence `id` with kError and `message` unless it has finished already.
  void fail_if_live(SequenceId id, const std::string& message);
  // Whether a choice with these parameters can be in an overlapped step (every row sampled by
  // the runner, nothing needed on the host).
  bool overlappable(const SamplingParams& params, int64_t max_output) const;

  EngineConfig config_;
  ModelRunner& runner_;
  DetokenizerFactory detokenizer_;
  ModelLimits limits_;

  std::unique_ptr<PageAllocator> allocator_;
  std::unique_ptr<KvManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ScheduleResult> step_;  // the step being run; its buffers reused every step
  std::vector<Sampler> samplers_;         // one per sampling thread
  // One logits row's work: score prompt token position + 1 (position >= 0) or sample (-1).
  struct RowJob {
    Choice* choice;
    int64_t row;
    int64_t position;
  };
  std::vector<RowJob> row_jobs_;
  // A job that needs the logits on the host: its index in row_jobs_ and, for a sampling job, in
  // sampled_.
  struct HostJob {
    size_t job;
    size_t slot;
  };
  std::vector<HostJob> host_jobs_;
  std::vector<Choice*> sampling_choices_;
  std::vector<Choice*> step_choices_;  // of the step's scheduled sequences, in plan order
  std::vector<Choice*> to_flush_;      // advanced this step and still running
  std::vector<TokenLogprob> sampled_;
  bool model_sampling_ = false;
  std::vector<ops::RowSampling> row_sampling_;  // [logit rows] when the runner samples some
  std::vector<ops::SampledToken> model_sampled_;
  bool overlap_ = false;
  int64_t overlap_blockers_ = 0;  // live choices that keep steps from overlapping
  // The step launched and not collected yet (overlap): each logit row's sequence, in row order.
  bool launched_ = false;
  std::vector<SequenceId> launched_rows_;
  std::vector<ops::SampledToken> launched_sampled_;
  std::unordered_map<int64_t, std::unique_ptr<Request>> requests_;  // live, engine thread
  std::unordered_map<SequenceId, Choice*> choices_;
  SequenceId next_sequence_ = 0;
  // The step's logits, [logit rows, vocab] f32. Grown, never value-initialized: only rows the
  // runner writes are read, so the rows it samples itself cost nothing, not even their pages.
  std::unique_ptr<float[]> logits_buffer_;
  size_t logits_capacity_ = 0;
  std::span<float> logits_;

  std::unique_ptr<Inbox> inbox_;
  std::atomic<int64_t> next_request_{0};
  std::atomic<int64_t> live_requests_{0};
  mutable std::mutex stats_mutex_;
  EngineStats stats_;
  int64_t num_steps_ = 0;
  int64_t num_overlapped_steps_ = 0;
  int64_t num_computed_tokens_ = 0;
  int64_t num_generated_tokens_ = 0;
  int64_t num_finished_ = 0;
  double schedule_seconds_ = 0.0;
  double plan_seconds_ = 0.0;
  double forward_seconds_ = 0.0;
  double sample_seconds_ = 0.0;
};

}  // namespace pagedattn::engine
