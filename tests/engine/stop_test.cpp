// StopStringMatcher against a naive reference over random chunked text: the emitted text is the
// full text cut before the first stop string (earliest start; longest on a tie), the stop is
// reported on the first chunk whose arrival completes one, and before that each push releases
// everything except the longest tail that is a proper prefix of a stop string.
#include <gtest/gtest.h>

#include <random>

#include "pagedattn/engine_stop.h"

namespace pagedattn::engine {
namespace {

size_t first_stop(const std::string& text, const std::vector<std::string>& stops,
                  std::string* which) {
  size_t best = std::string::npos;
  for (const std::string& stop : stops) {
    const size_t at = text.find(stop);
    if (at != std::string::npos &&
        (best == std::string::npos || at < best || (at == best && stop.size() > which->size()))) {
      best = at;
      *which = stop;
    }
  }
  return best;
}

size_t held_tail(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const std::string& stop : stops) {
    for (size_t length = 1; length < stop.size() && length <= text.size(); ++length) {
      if (text.substr(text.size() - length) == stop.substr(0, length))
        hold = std::max(hold, length);
    }
  }
  return hold;
}

TEST(StopStringMatcher, MatchesNaiveReferenceOnRandomChunks) {
  std::mt19937_64 rng(99);
  auto random_string = [&](size_t lo, size_t hi) {
    std::string s(std::uniform_int_distribution<size_t>(lo, hi)(rng), 'a');
    for (char& c : s) c = static_cast<char>('a' + rng() % 3);
    return s;
  };
  int stopped = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::string> stops;
    const size_t count = rng() % 3;
    for (size_t i = 0; i < count; ++i) stops.push_back(random_string(1, 5));
    StopStringMatcher matcher(stops);
    std::string full, emitted;
    bool done = false;
    for (int chunk = 0; chunk < 12 && !done; ++chunk) {
      const std::string piece = random_string(0, 3);
      full += piece;
      const StopStringMatcher::Result result = matcher.push(piece);
      emitted += result.text;
      std::string which;
      const size_t at = first_stop(full, stops, &which);
      ASSERT_EQ(result.stop.has_value(), at != std::string::npos) << "trial " << trial;
      if (result.stop) {
        EXPECT_EQ(*result.stop, which);
        EXPECT_EQ(emitted, full.substr(0, at));
        done = true;
        ++stopped;
      } else {
        EXPECT_EQ(emitted, full.substr(0, full.size() - held_tail(full, stops)));
      }
    }
    if (!done) {
      emitted += matcher.flush();
      EXPECT_EQ(emitted, full);
    }
  }
  EXPECT_GT(stopped, 500);
}

TEST(StopStringMatcher, StopSpanningManyPushesIsNeverEmitted) {
  StopStringMatcher matcher({"</end>"});
  std::string emitted;
  for (const char* piece : {"hello <", "/e", "n", "d", ">tail"}) {
    const auto result = matcher.push(piece);
    emitted += result.text;
    if (result.stop) break;
  }
  EXPECT_EQ(emitted, "hello ");
  StopStringMatcher no_stops({});
  EXPECT_EQ(no_stops.push("abc").text, "abc");
  StopStringMatcher false_start({"abc"});
  EXPECT_EQ(false_start.push("xab").text, "x");
  EXPECT_EQ(false_start.push("d").text, "abd");
}

}  // namespace
}  // namespace pagedattn::engine
