// The demo's workload (see demo_trace.h). Two shared system prompts: one ending in a partial page
// (fork copies that page), one page-aligned (fork shares every page); about 40% and 20% of the
// requests start with them. Prompt lengths are log-uniform in [min_prompt, max_prompt] (half that
// after a prefix), output lengths uniform in [steps / 2, steps], arrivals 0 to 3 steps apart.
#include "tools/demo/demo_trace.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"

namespace pagedattn::tools::demo {
namespace {

constexpr int64_t kPrefixIdBase = int64_t{1} << 40;  // allocator ids of the shared prefixes

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

void validate_options(const DemoOptions& options) {
  const int32_t a = options.alloc_page_size;
  PA_CHECK(options.num_requests >= 1, "--requests: {} (expected >= 1)", options.num_requests);
  PA_CHECK(options.decode_steps >= 1, "--steps: {} (expected >= 1)", options.decode_steps);
  PA_CHECK(a >= 1, "--alloc-page-size: {} (expected >= 1)", a);
  PA_CHECK(!options.page_sizes.empty(), "--page-size: empty list (expected e.g. 1,16)");
  for (int32_t p : options.page_sizes) {
    PA_CHECK(p >= 1 && a % p == 0,
             "--page-size: {} does not divide the allocation page size {} (expected a divisor)", p,
             a);
  }
  PA_CHECK(options.min_prompt >= 1 && options.max_prompt >= options.min_prompt,
           "--max-prompt: {} (expected >= {}, the minimum prompt)", options.max_prompt,
           options.min_prompt);
  PA_CHECK(options.max_batch >= 1, "--max-batch: {} (expected >= 1)", options.max_batch);
  PA_CHECK(options.num_pages >= 0, "--num-pages: {} (expected >= 0; 0 sizes the pool itself)",
           options.num_pages);
  PA_CHECK(options.checks_per_step >= 1, "--checks-per-step: {} (expected >= 1)",
           options.checks_per_step);
  PA_CHECK(options.num_qo_heads >= 1 && options.num_kv_heads >= 1 &&
               options.num_qo_heads % options.num_kv_heads == 0,
           "model: {} query heads is not a multiple of {} KV heads", options.num_qo_heads,
           options.num_kv_heads);
}

Trace make_trace(const DemoOptions& options, std::mt19937_64& rng, ValueSource& values) {
  const int32_t a = options.alloc_page_size;
  const int64_t token_elements = int64_t{options.num_kv_heads} * options.head_dim;
  Trace trace;
  for (int32_t length : {6 * a + (a + 2) / 3, 4 * a}) {
    Prefix p;
    p.length = std::max(1, length);
    p.id = kPrefixIdBase + static_cast<int64_t>(trace.prefixes.size());
    p.k.resize(static_cast<size_t>(p.length * token_elements));
    p.v.resize(p.k.size());
    values.fill(p.k.data(), static_cast<int64_t>(p.k.size()), 1.0f);
    values.fill(p.v.data(), static_cast<int64_t>(p.v.size()), 1.0f);
    trace.prefixes.push_back(std::move(p));
  }
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const double log_min = std::log(options.min_prompt), log_max = std::log(options.max_prompt);
  int64_t arrival = 0;
  for (int32_t i = 0; i < options.num_requests; ++i) {
    Request r;
    r.id = i;
    const double pick = unit(rng);
    r.prefix = pick < 0.4 ? 0 : pick < 0.6 ? 1 : -1;
    const int32_t own =
        std::clamp(static_cast<int32_t>(std::exp(log_min + (log_max - log_min) * unit(rng))),
                   options.min_prompt, options.max_prompt);
    r.prompt_len = r.prefix >= 0 ? trace.prefixes[r.prefix].length + std::max(1, own / 2) : own;
    r.output_len = std::uniform_int_distribution<int32_t>(std::max(1, options.decode_steps / 2),
                                                          options.decode_steps)(rng);
    r.arrival_step = arrival;
    arrival += std::uniform_int_distribution<int64_t>(0, 3)(rng);
    trace.longest = std::max<int64_t>(trace.longest, r.prompt_len + r.output_len);
    trace.requests.push_back(std::move(r));
  }
  return trace;
}

int64_t pool_pages(const DemoOptions& options, const Trace& trace) {
  const int32_t a = options.alloc_page_size;
  std::vector<int64_t> needs;
  int64_t largest = 0, prefix_pages = 0;
  for (const Request& r : trace.requests) {
    needs.push_back(ceil_div(r.prompt_len + r.output_len, a));
    largest = std::max(largest, needs.back());
  }
  for (const Prefix& p : trace.prefixes) prefix_pages += ceil_div(p.length, a);
  std::sort(needs.rbegin(), needs.rend());
  const size_t busiest_count = std::min<size_t>(needs.size(), options.max_batch);
  const int64_t busiest = std::accumulate(needs.begin(), needs.begin() + busiest_count, int64_t{0});
  const int64_t minimum = largest + prefix_pages + 2;
  const int64_t pages =
      options.num_pages > 0
          ? options.num_pages
          : std::max(minimum, static_cast<int64_t>(busiest * 0.45) + prefix_pages);
  PA_CHECK(pages >= minimum,
           "--num-pages: {} is too small for this trace (expected >= {}: the largest request, "
           "{} pages, plus the shared prefixes, {} pages, plus 2)",
           pages, minimum, largest, prefix_pages);
  return pages;
}

}  // namespace pagedattn::tools::demo
