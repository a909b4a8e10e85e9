// RequestStream: events come out in the order they went in, whatever the interleaving of pushes
// and pops (a consumer that keeps up, one that lags by hundreds of events, one that drains at the
// end), with every field intact; done() only once every choice finished and the queue is empty;
// pop() returns what is queued at once and times out on an empty stream.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>

#include "pagedattn/engine_request.h"

namespace pagedattn::engine {
namespace {

RequestEvent numbered(int32_t n, bool finish) {
  RequestEvent event;
  event.index = n % 3;
  event.token_ids = {n, n + 1};
  event.text = "event " + std::to_string(n) + std::string(static_cast<size_t>(n % 40), 'x');
  event.num_prompt_tokens = n;
  if (finish) event.finish_reason = FinishReason::kLength;
  return event;
}

void expect_event(const RequestEvent& event, int32_t n) {
  EXPECT_EQ(event.index, n % 3);
  EXPECT_EQ(event.token_ids, (std::vector<int32_t>{n, n + 1}));
  EXPECT_EQ(event.text,
            "event " + std::to_string(n) + std::string(static_cast<size_t>(n % 40), 'x'));
  EXPECT_EQ(event.num_prompt_tokens, n);
}

TEST(RequestStream, KeepsOrderUnderAnyInterleaving) {
  std::mt19937_64 rng(5);
  for (int32_t lag : {0, 3, 100, 700}) {
    SCOPED_TRACE("lag " + std::to_string(lag));
    const int32_t total = 2000;
    RequestStream stream(1);
    int32_t pushed = 0, popped = 0;
    while (popped < total) {
      // Push up to `lag` ahead of the consumer (a random burst), then pop a random number.
      const int32_t burst = static_cast<int32_t>(rng() % 8) + 1;
      for (int32_t i = 0; i < burst && pushed < total && pushed - popped <= lag; ++i) {
        RequestEvent event = numbered(pushed, pushed == total - 1);
        stream.push(std::move(event));
        ++pushed;
      }
      const int32_t take = static_cast<int32_t>(rng() % 8) + 1;
      for (int32_t i = 0; i < take; ++i) {
        std::optional<RequestEvent> event = stream.try_pop();
        if (!event) {
          EXPECT_EQ(popped, pushed);
          break;
        }
        expect_event(*event, popped);
        EXPECT_EQ(event->finished(), popped == total - 1);
        ++popped;
      }
      EXPECT_EQ(stream.done(), popped == total);
    }
    EXPECT_FALSE(stream.try_pop().has_value());
    EXPECT_TRUE(stream.done());
  }
}

TEST(RequestStream, DoneNeedsEveryChoiceAndAnEmptyQueue) {
  RequestStream stream(2);
  stream.push(numbered(0, true));
  EXPECT_FALSE(stream.all_finished());
  stream.push(numbered(1, true));
  EXPECT_TRUE(stream.all_finished());
  EXPECT_FALSE(stream.done());  // two events queued
  const auto first = stream.pop(std::chrono::milliseconds(0));
  ASSERT_TRUE(first.has_value());
  expect_event(*first, 0);
  EXPECT_FALSE(stream.done());
  ASSERT_TRUE(stream.pop(std::chrono::milliseconds(1000)).has_value());
  EXPECT_TRUE(stream.done());
  // Done and empty: pop returns at once with nothing.
  EXPECT_FALSE(stream.pop(std::chrono::milliseconds(1000)).has_value());

  RequestStream open(1);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(open.pop(std::chrono::milliseconds(20)).has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(20));
  EXPECT_FALSE(open.done());
}

}  // namespace
}  // namespace pagedattn::engine
