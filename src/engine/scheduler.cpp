// The scheduler (see engine_scheduler.h for the policy).
//
// A step's passes: decodes, running prefill chunks, admissions. `scheduled_step` marks what this
// step already holds, so a preemption never takes back pages a scheduled sequence will write.
#include <algorithm>
#include <limits>

#include "core/check.h"
#include "pagedattn/engine_scheduler.h"

namespace pagedattn::engine {

Scheduler::Scheduler(SchedulerConfig config, KvManager& kv) : config_(config), kv_(kv) {
  PA_CHECK(config_.max_running >= 1, "max_running: {} (expected >= 1)", config_.max_running);
}

void Scheduler::add(Sequence* sequence) {
  PA_CHECK(sequence != nullptr && sequence->num_tokens() >= 1, "sequence: null or without tokens");
  sequence->status = SequenceStatus::kWaiting;
  sequence->num_computed = 0;
  waiting_.push_back(sequence);
}

void Scheduler::remove(Sequence* sequence) {
  if (sequence->status == SequenceStatus::kRunning) {
    running_.erase(std::find(running_.begin(), running_.end(), sequence));
    kv_.release(sequence->id);
  } else if (sequence->status == SequenceStatus::kWaiting ||
             sequence->status == SequenceStatus::kPreempted) {
    const auto it = std::find(waiting_.begin(), waiting_.end(), sequence);
    if (it != waiting_.end()) waiting_.erase(it);
  }
  sequence->status = SequenceStatus::kFinished;
  for (Sequence* other : waiting_) {
    if (other->share_from == sequence) other->share_from = nullptr;
  }
  for (Sequence* other : running_) {
    if (other->share_from == sequence) other->share_from = nullptr;
  }
}

int32_t Scheduler::sibling_pages(const Sequence& sequence) const {
  return static_cast<int32_t>((sequence.prompt_length - 1) / kv_.page_size());
}

bool Scheduler::blocked_on_sibling(Sequence* sequence) {
  Sequence* source = sequence->share_from;
  if (source == nullptr) return false;
  if (source->status != SequenceStatus::kRunning || sibling_pages(*sequence) == 0) {
    sequence->share_from = nullptr;  // share nothing; the prefix cache may still help
    return false;
  }
  return source->num_computed < static_cast<int64_t>(sibling_pages(*sequence)) * kv_.page_size();
}

void Scheduler::preempt(Sequence* victim) {
  running_.erase(std::find(running_.begin(), running_.end(), victim));
  kv_.release(victim->id);
  victim->num_computed = 0;
  victim->num_offered_pages = 0;
  victim->status = SequenceStatus::kPreempted;
  ++victim->num_preemptions;
  ++num_preemptions_;
  waiting_.push_front(victim);
}

Sequence* Scheduler::newest_unscheduled(const Sequence* except) const {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    if (*it != except && (*it)->scheduled_step != step_) return *it;
  }
  return nullptr;
}

void Scheduler::schedule_tokens(Sequence* sequence, int64_t count, ScheduleResult* result) {
  // The plan's entries beyond the scheduled ones are the previous step's, reused in place.
  const size_t index = result->scheduled.size();
  if (index == result->plan.sequences.size()) result->plan.sequences.emplace_back();
  ScheduledSequence& entry = result->plan.sequences[index];
  entry.sequence = sequence->id;
  entry.first_position = sequence->num_computed;
  const bool reaches_end = sequence->num_computed + count == sequence->num_tokens();
  entry.num_logit_rows = reaches_end ? 1 : 0;
  // Prompt scoring: every new token from the chunk's first on is a row (the rows before the
  // prompt's last token score the next prompt token; the last one, if here, samples).
  if (sequence->score_prompt && sequence->num_computed < sequence->prompt_length - 1) {
    entry.num_logit_rows = static_cast<int32_t>(count);
  }
  result->plan.num_tokens += count;
  result->plan.num_logit_rows += entry.num_logit_rows;
  if (count == 1 && reaches_end && result->plan.num_decodes == static_cast<int32_t>(index)) {
    ++result->plan.num_decodes;
  }
  result->scheduled.push_back(sequence);
  result->counts.push_back(count);
  sequence->scheduled_step = step_;
}

void Scheduler::fill_plan(ScheduleResult* result) const {
  PA_CHECK(result != nullptr, "fill_plan: no result");
  for (size_t i = 0; i < result->scheduled.size(); ++i) {
    const Sequence& sequence = *result->scheduled[i];
    ScheduledSequence& entry = result->plan.sequences[i];
    const auto begin = sequence.tokens.begin() + static_cast<ptrdiff_t>(entry.first_position);
    entry.token_ids.assign(begin, begin + static_cast<ptrdiff_t>(result->counts[i]));
    const auto table = kv_.block_table(sequence.id);
    entry.block_table.assign(table.begin(), table.end());
  }
}

ScheduleResult Scheduler::schedule() {
  ScheduleResult result;
  schedule(&result);
  fill_plan(&result);
  return result;
}

void Scheduler::schedule(ScheduleResult* out) {
  PA_CHECK(out != nullptr, "schedule: no result");
  ++step_;
  // Cleared, keeping every buffer: the plan's entries (and their token and block-table vectors)
  // are reused in place, so a steady batch allocates nothing here or in fill_plan.
  ScheduleResult& result = *out;
  result.plan.page_size = kv_.page_size();
  result.plan.num_decodes = 0;
  result.plan.num_tokens = 0;
  result.plan.num_logit_rows = 0;
  result.scheduled.clear();
  result.counts.clear();
  result.preempted.clear();
  result.rejected.clear();
  int64_t budget = config_.max_tokens_per_step > 0 ? config_.max_tokens_per_step
                                                   : std::numeric_limits<int64_t>::max();
  int64_t scoring_left =
      config_.max_scoring_rows > 0 ? config_.max_scoring_rows : std::numeric_limits<int64_t>::max();
  bool stop_running = false;

  // Passes 1 and 2 over the running sequences: decodes, then prefill chunks.
  for (const bool decodes : {true, false}) {
    for (size_t i = 0; i < running_.size() && budget > 0 && !stop_running; ++i) {
      Sequence* sequence = running_[i];
      const int64_t remaining = sequence->num_tokens() - sequence->num_computed;
      if ((remaining == 1) != decodes || sequence->scheduled_step == step_) continue;
      // Its last token (max_tokens) is still being drawn (overlap scheduling: the pending token
      // that ends it): nothing is left to compute.
      if (decodes && sequence->max_output > 0 && sequence->num_output() >= sequence->max_output) {
        continue;
      }
      int64_t count = std::min(remaining, budget);
      if (sequence->score_prompt && !decodes) {
        if (scoring_left == 0) continue;  // scored in a later step
        count = std::min(count, scoring_left);
      }
      bool granted = true;
      while (!kv_.grow(sequence->id, sequence->num_computed + count)) {
        Sequence* victim = newest_unscheduled(decodes ? nullptr : sequence);
        if (victim == nullptr && !decodes && result.scheduled.empty()) victim = sequence;
        if (victim == nullptr) {
          granted = false;  // a prefill chunk waits while scheduled work holds the pages
          break;
        }
        const size_t victim_index = static_cast<size_t>(
            std::find(running_.begin(), running_.end(), victim) - running_.begin());
        preempt(victim);
        result.preempted.push_back(victim);
        if (victim_index <= i) --i;  // keep i on the sequence after the current one
        if (victim == sequence) {
          granted = false;
          stop_running = decodes;  // the newest decode gave way: nothing newer can grow
          break;
        }
      }
      if (!granted) continue;
      schedule_tokens(sequence, count, &result);
      budget -= count;
      if (sequence->score_prompt && !decodes) scoring_left -= count;
    }
  }

  // Pass 3: admissions, front first; a sequence that cannot get its pages blocks the rest (FCFS).
  if (result.preempted.empty()) {
    for (auto it = waiting_.begin(); it != waiting_.end() && budget > 0 &&
                                     running_.size() < static_cast<size_t>(config_.max_running);) {
      Sequence* sequence = *it;
      if (!kv_.fits_alone(sequence->num_tokens())) {
        result.rejected.push_back(sequence);
        sequence->status = SequenceStatus::kFinished;
        it = waiting_.erase(it);
        continue;
      }
      if (blocked_on_sibling(sequence)) {
        ++it;
        continue;
      }
      if (sequence->score_prompt && scoring_left == 0) break;  // FCFS: the rest wait too
      int64_t reused = 0;
      if (sequence->share_from != nullptr) {
        const int32_t pages = sibling_pages(*sequence);
        kv_.admit_shared(sequence->id, sequence->share_from->id, pages);
        reused = static_cast<int64_t>(pages) * kv_.page_size();
      } else {
        // A prompt being scored takes no cache hit (engine_scheduler.h says why).
        reused = kv_.admit(sequence->id, sequence->tokens, !sequence->score_prompt);
      }
      int64_t count = std::min(sequence->num_tokens() - reused, budget);
      if (sequence->score_prompt) count = std::min(count, scoring_left);
      if (!kv_.grow(sequence->id, reused + count)) {
        kv_.release(sequence->id);
        break;
      }
      sequence->share_from = nullptr;
      if (sequence->num_cached_tokens < 0) sequence->num_cached_tokens = reused;
      sequence->num_computed = reused;
      sequence->status = SequenceStatus::kRunning;
      it = waiting_.erase(it);
      running_.push_back(sequence);
      schedule_tokens(sequence, count, &result);
      budget -= count;
      if (sequence->score_prompt) scoring_left -= count;
    }
  }
  result.plan.sequences.resize(result.scheduled.size());
}

void Scheduler::complete(const ScheduleResult& result) {
  for (size_t i = 0; i < result.scheduled.size(); ++i) {
    Sequence* sequence = result.scheduled[i];
    if (sequence == nullptr) continue;  // finished since it was scheduled (overlap scheduling)
    sequence->num_computed += result.plan.sequences[i].num_new_tokens();
    sequence->num_offered_pages = kv_.cache(sequence->id, sequence->tokens, sequence->num_computed,
                                            sequence->num_offered_pages);
  }
}

}  // namespace pagedattn::engine
