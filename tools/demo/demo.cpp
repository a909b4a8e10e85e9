// The demo's engine loop (see demo.h): a seeded trace of requests, scheduled step by step over a
// PageAllocator-managed pool, with the attention batches run and checked by AttentionRunner.
//
// One engine step:
//   1. arrivals join the waiting queue;
//   2. admission, in queue order while the batch has room and the pool has the pages (else the
//      head of the queue waits: a "queued admission"). A request with a shared prefix forks the
//      prefix's cache entry (filled on first use): full pages shared, the partial last page
//      copied with copy_tokens. Its remaining tokens get pages, their K/V are stored with
//      store_kv, and it joins this step's prefill batch (q_len = its uncached tokens);
//   3. decode: every request admitted in an earlier step grows by one token (one new page when
//      it crosses a page boundary), its K/V stored, one query row each. When the pool cannot
//      supply the pages, the youngest requests are preempted (pages freed, requeued at the
//      front; they are prefilled again on re-admission: recompute);
//   4. finished requests free their pages; allocator consistency is checked.
// The logical K/V of every request (what it has seen, in order) is kept beside the cache so the
// reference can check outputs without trusting the cache's bookkeeping.
#include "tools/demo/demo.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <numeric>
#include <random>

#include "core/check.h"
#include "pagedattn/page_allocator.h"
#include "pagedattn/registry.h"
#include "tools/demo/demo_attention.h"
#include "tools/demo/demo_trace.h"

namespace pagedattn::tools {
namespace {

using demo::BatchEntry;
using demo::Prefix;
using demo::Request;
using demo::State;

constexpr float kQueryRange = 6.0f;  // |q| up to 6: logits spread enough for a peaked softmax

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

class Engine {
 public:
  explicit Engine(const DemoOptions& options);
  DemoResult run();

 private:
  int32_t pages_to_admit(const Request& r) const;
  void admit(Request& r, std::vector<BatchEntry>& prefill);
  void store_tokens(int64_t id, const std::vector<uint16_t>& k, const std::vector<uint16_t>& v,
                    int32_t from, int32_t to);
  void preempt(Request& r);
  void run_batch(bool prefill, const std::vector<BatchEntry>& batch);
  void check(bool ok, std::string message);

  DemoOptions options_;
  demo::ModelShape shape_;
  int64_t token_elements_ = 0;  // Hkv * D
  std::mt19937_64 rng_;
  demo::ValueSource values_;
  std::vector<Request> requests_;
  std::vector<Prefix> prefixes_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;  // in admission order
  std::unique_ptr<HostKvCache> cache_;
  std::unique_ptr<PageAllocator> allocator_;
  std::unique_ptr<demo::AttentionRunner> runner_;
  DemoResult result_;
  int64_t step_ = 0;
};

Engine::Engine(const DemoOptions& options)
    : options_(options),
      shape_{options.num_qo_heads, options.num_kv_heads, options.head_dim},
      token_elements_(int64_t{options.num_kv_heads} * options.head_dim),
      rng_(options.seed),
      values_(options.seed ^ 0x5bd1e995u) {
  demo::validate_options(options);
  demo::Trace trace = demo::make_trace(options, rng_, values_);
  const int64_t pages = demo::pool_pages(options, trace);
  const int64_t longest = trace.longest;
  requests_ = std::move(trace.requests);
  prefixes_ = std::move(trace.prefixes);
  const int32_t a = options.alloc_page_size;
  cache_ = std::make_unique<HostKvCache>(KvCacheConfig{
      pages, a, options.num_kv_heads, options.head_dim, options.layout, DType::kBF16});
  allocator_ = std::make_unique<PageAllocator>(static_cast<int32_t>(pages), a);
  const Selection selection =
      options.backend.empty() ? Selection::from_env() : Selection::parse(options.backend);
  const int32_t max_batch = options.max_batch + static_cast<int32_t>(prefixes_.size());
  runner_ = std::make_unique<demo::AttentionRunner>(
      shape_, *cache_, options.page_sizes, selection, max_batch, longest,
      int64_t{max_batch} * longest, options.slot_table);
  result_.num_pages = static_cast<int32_t>(pages);
  result_.description = fmt::format(
      "one attention layer (Hq {}, Hkv {}, head_dim {}, bf16 q and KV, {}), alloc pages of {} "
      "tokens, {} tables, seed {}",
      options.num_qo_heads, options.num_kv_heads, options.head_dim, layout_name(options.layout), a,
      options.slot_table ? "token->slot" : "block", options.seed);
  result_.requests = options.num_requests;
  result_.prefill_backend = runner_->backend_names(OpKind::kPrefill);
  result_.decode_backend = runner_->backend_names(OpKind::kDecode);
  for (int32_t p : options.page_sizes) {
    PageSizeStats stats;
    stats.page_size = p;
    result_.per_page_size.push_back(std::move(stats));
  }
}

void Engine::check(bool ok, std::string message) {
  ++result_.checks;
  if (ok) return;
  ++result_.failures;
  if (result_.failure_messages.size() < 10) result_.failure_messages.push_back(std::move(message));
}

// New pages an admission takes: the request's pages beyond the prefix's shared full pages, plus
// the prefix's own pages when it is not in the cache yet.
int32_t Engine::pages_to_admit(const Request& r) const {
  const int32_t a = options_.alloc_page_size;
  int64_t pages = ceil_div(r.total_tokens(), a);
  if (r.prefix >= 0) {
    const Prefix& p = prefixes_[r.prefix];
    pages -= p.length / a;
    if (!p.resident) pages += ceil_div(p.length, a);
  }
  return static_cast<int32_t>(pages);
}

void Engine::store_tokens(int64_t id, const std::vector<uint16_t>& k,
                          const std::vector<uint16_t>& v, int32_t from, int32_t to) {
  if (to <= from) return;
  const int32_t a = options_.alloc_page_size;
  const auto pages = allocator_->block_table(id);
  HostTensor slots(DType::kI64, {to - from});
  for (int32_t t = from; t < to; ++t) {
    slots.data<int64_t>()[t - from] = int64_t{pages[t / a]} * a + t % a;
    if (t == from || t % a == 0) runner_->touch(pages[t / a]);
  }
  const auto view = [&](const std::vector<uint16_t>& data) {
    return TensorView::contiguous(const_cast<uint16_t*>(data.data()) + from * token_elements_,
                                  DType::kBF16,
                                  {to - from, options_.num_kv_heads, options_.head_dim});
  };
  store_kv(cache_->paged(a), view(k), view(v), slots.view());
}

void Engine::admit(Request& r, std::vector<BatchEntry>& prefill) {
  const int32_t tokens = r.total_tokens();
  int32_t cached_prefix = 0;
  if (r.prefix >= 0) {
    Prefix& p = prefixes_[r.prefix];
    if (!p.resident) {  // first use: the prefix is prefilled as its own cache entry
      allocator_->add_request(p.id);
      check(allocator_->grow(p.id, p.length) == AllocStatus::kOk, "prefix: grow failed");
      store_tokens(p.id, p.k, p.v, 0, p.length);
      p.resident = true;
      prefill.push_back(
          {allocator_->block_table(p.id), p.length, p.length, p.k.data(), p.v.data(), p.id});
    }
    PageCopy copy;
    check(allocator_->fork(p.id, r.id, &copy) == AllocStatus::kOk, "fork failed");
    if (copy.num_tokens > 0) {
      copy_tokens(cache_->paged(options_.alloc_page_size), copy.src, copy.dst, copy.num_tokens);
      runner_->touch(copy.dst);
      ++result_.partial_page_copies;
    }
    ++result_.forks;
    cached_prefix = p.length;
    if (r.k.empty()) {
      r.k = p.k;
      r.v = p.v;
    }
  } else {
    allocator_->add_request(r.id);
  }
  // The prompt's own K/V (first admission only: a preempted request keeps what it had).
  const size_t want = static_cast<size_t>(tokens * token_elements_);
  if (r.k.size() < want) {
    const size_t have = r.k.size();
    r.k.resize(want);
    r.v.resize(want);
    values_.fill(r.k.data() + have, static_cast<int64_t>(want - have), 1.0f);
    values_.fill(r.v.data() + have, static_cast<int64_t>(want - have), 1.0f);
  }
  check(
      allocator_->grow(r.id, tokens) == AllocStatus::kOk,
      fmt::format("step {}: admitted request {} could not grow to {} tokens", step_, r.id, tokens));
  store_tokens(r.id, r.k, r.v, cached_prefix, tokens);
  r.cached = tokens;
  r.state = State::kRunning;
  prefill.push_back({allocator_->block_table(r.id), tokens, tokens - cached_prefix, r.k.data(),
                     r.v.data(), r.id});
}

void Engine::preempt(Request& r) {
  allocator_->free(r.id);
  r.cached = 0;
  r.state = State::kWaiting;
  running_.erase(std::find(running_.begin(), running_.end(), &r));
  waiting_.push_front(&r);
  ++result_.preemptions;
}

void Engine::run_batch(bool prefill, const std::vector<BatchEntry>& batch) {
  if (batch.empty()) return;
  int64_t rows = 0;
  for (const BatchEntry& e : batch) rows += e.q_len;
  HostTensor q(DType::kBF16, {rows, options_.num_qo_heads, options_.head_dim});
  values_.fill(q.data<uint16_t>(), q.numel(), kQueryRange);
  std::vector<int32_t> order(batch.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng_);
  order.resize(std::min<size_t>(order.size(), options_.checks_per_step));
  runner_->run(step_, prefill, batch, q.view(), order, result_);
  if (prefill) {
    ++result_.prefill_batches;
    result_.prefill_tokens += rows;
  } else {
    ++result_.decode_batches;
    result_.decode_tokens += rows;
  }
}

DemoResult Engine::run() {
  const auto start = std::chrono::steady_clock::now();
  const int32_t a = options_.alloc_page_size;
  int32_t finished = 0;
  size_t next_arrival = 0;
  const int64_t step_limit = 100 * (int64_t{options_.num_requests} + 1) *
                             (options_.decode_steps + 1);  // a stall is a failure, not a hang
  for (step_ = 0; finished < options_.num_requests && step_ < step_limit; ++step_) {
    while (next_arrival < requests_.size() && requests_[next_arrival].arrival_step <= step_) {
      requests_[next_arrival].state = State::kWaiting;
      waiting_.push_back(&requests_[next_arrival++]);
    }
    // Admission (one page of headroom so the first decode step rarely preempts at once).
    std::vector<BatchEntry> prefill;
    const size_t decoding = running_.size();
    while (!waiting_.empty() && static_cast<int32_t>(running_.size()) < options_.max_batch) {
      Request& r = *waiting_.front();
      if (pages_to_admit(r) + 1 > allocator_->num_free_pages()) {
        ++result_.queued_admissions;
        break;
      }
      waiting_.pop_front();
      admit(r, prefill);
      running_.push_back(&r);
    }
    run_batch(/*prefill=*/true, prefill);

    // Decode the requests admitted before this step; preempt the youngest when pages run out.
    auto pages_for_decode = [&] {
      int32_t needed = 0;
      for (size_t i = 0; i < std::min(decoding, running_.size()); ++i) {
        needed += running_[i]->cached % a == 0;
      }
      return needed;
    };
    size_t decode_count = decoding;
    while (decode_count > 0 && pages_for_decode() > allocator_->num_free_pages()) {
      preempt(*running_.back());  // youngest first (maybe one just admitted)
      decode_count = std::min(decode_count, running_.size());
    }
    std::vector<BatchEntry> decode;
    for (size_t i = 0; i < std::min(decode_count, running_.size()); ++i) {
      Request& r = *running_[i];
      check(allocator_->grow(r.id, r.cached + 1) == AllocStatus::kOk,
            fmt::format("step {}: request {} could not grow", step_, r.id));
      r.k.resize(r.k.size() + token_elements_);
      r.v.resize(r.v.size() + token_elements_);
      values_.fill(r.k.data() + r.k.size() - token_elements_, token_elements_, 1.0f);
      values_.fill(r.v.data() + r.v.size() - token_elements_, token_elements_, 1.0f);
      store_tokens(r.id, r.k, r.v, r.cached, r.cached + 1);
      ++r.cached;
      ++r.generated;
      decode.push_back({allocator_->block_table(r.id), r.cached, 1, r.k.data(), r.v.data(), r.id});
    }
    run_batch(/*prefill=*/false, decode);

    for (auto it = running_.begin(); it != running_.end();) {
      Request& r = **it;
      if (r.generated < r.output_len) {
        ++it;
        continue;
      }
      allocator_->free(r.id);
      r.state = State::kDone;
      ++finished;
      it = running_.erase(it);
    }
    result_.peak_pages_used = std::max(result_.peak_pages_used, allocator_->num_used_pages());
    try {
      allocator_->check_consistency();
      check(true, "");
    } catch (const Error& error) {
      check(false, fmt::format("step {}: {}", step_, error.what()));
    }
    if (options_.progress) {
      options_.progress({step_ + 1, static_cast<int32_t>(running_.size()),
                         static_cast<int32_t>(waiting_.size()), finished, options_.num_requests});
    }
  }
  result_.steps = step_;
  check(finished == options_.num_requests,
        fmt::format("the trace stalled: {} of {} requests finished after {} steps", finished,
                    options_.num_requests, step_));
  for (Prefix& p : prefixes_) {
    if (p.resident) allocator_->free(p.id);
  }
  check(allocator_->num_free_pages() == allocator_->num_pages(),
        fmt::format("{} pages leaked after every request finished",
                    allocator_->num_pages() - allocator_->num_free_pages()));
  result_.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return std::move(result_);
}

}  // namespace

double PageSizeStats::median_decode_ms() const {
  if (decode_step_seconds.empty()) return 0;
  std::vector<double> sorted = decode_step_seconds;
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  return sorted[sorted.size() / 2] * 1e3;
}

DemoResult run_demo(const DemoOptions& options) { return Engine(options).run(); }

}  // namespace pagedattn::tools
