// ScopedEnv: sets (or unsets) environment variables for one scope and restores each one's previous
// value (or absence) when the scope ends, also when a test throws or an ASSERT returns early, so a
// switch a test sets (PAGEDATTN_PREFILL_KERNEL, PAGEDATTN_MLA_CLUSTER, ...; ARCHITECTURE.md lists
// them) never leaks into the tests that run after it in the same process.
//
//   ScopedEnv env({{"PAGEDATTN_MLA_KERNEL", "mma"}, {"PAGEDATTN_MLA_CLUSTER", std::nullopt}});
//
// A value of std::nullopt unsets the variable for the scope. Not thread-safe (neither is setenv).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace pagedattn::testing {

class ScopedEnv {
 public:
  using Setting = std::pair<std::string, std::optional<std::string>>;

  ScopedEnv() = default;
  explicit ScopedEnv(const std::vector<Setting>& settings);
  ScopedEnv(const std::string& name, const std::optional<std::string>& value)
      : ScopedEnv(std::vector<Setting>{{name, value}}) {}
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

  // Sets one more variable in this scope (restored with the others, in reverse order).
  void set(const std::string& name, const std::optional<std::string>& value);

 private:
  std::vector<Setting> saved_;  // name and the value before this scope (nullopt: unset)
};

}  // namespace pagedattn::testing
