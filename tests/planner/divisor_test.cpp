// The planner's fast divisor (shift for powers of two, multiply-high otherwise) against plain
// integer division, on random and edge numerators up to 2^31 - 1 for divisors of all sizes.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <limits>
#include <random>

#include "common/test_util.h"
#include "planner/plan_loops.h"

namespace pagedattn {
namespace {

TEST(Divisor, MatchesIntegerDivision) {
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 300; ++d) divisors.push_back(d);
  for (uint32_t d : {1000u, 4096u, 65535u, 65536u, 1000003u, 1u << 30, 2147483647u}) {
    divisors.push_back(d);
  }
  std::uniform_int_distribution<uint32_t> numerator(0, std::numeric_limits<int32_t>::max());
  for (uint32_t d : divisors) {
    const planner::Divisor divisor(d);
    EXPECT_EQ(divisor.shift >= 0, (d & (d - 1)) == 0) << d;
    for (uint32_t n : {0u, 1u, d - 1, d, d + 1, 2147483647u, 2147483647u - d}) {
      ASSERT_EQ(divisor.div(n), n / d) << n << " / " << d;
    }
    for (int i = 0; i < 200; ++i) {
      const uint32_t n = numerator(rng);
      ASSERT_EQ(divisor.div(n), n / d) << n << " / " << d;
      if (n <= 2147483647u - d) {
        ASSERT_EQ(divisor.ceil_div(n), (n + d - 1) / d) << n << " / " << d;
      }
    }
  }
}

}  // namespace
}  // namespace pagedattn
