// ScopedEnv (see scoped_env.h): setenv / unsetenv with the previous values restored in reverse.
#include "common/scoped_env.h"

#include <cstdlib>

#include "pagedattn/error.h"

namespace pagedattn::testing {

ScopedEnv::ScopedEnv(const std::vector<Setting>& settings) {
  for (const auto& [name, value] : settings) set(name, value);
}

void ScopedEnv::set(const std::string& name, const std::optional<std::string>& value) {
  const char* previous = std::getenv(name.c_str());
  saved_.emplace_back(name, previous ? std::optional<std::string>(previous) : std::nullopt);
  const int rc = value ? ::setenv(name.c_str(), value->c_str(), 1) : ::unsetenv(name.c_str());
  if (rc != 0) throw_error("ScopedEnv: cannot set " + name);
}

ScopedEnv::~ScopedEnv() {
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
    if (it->second) {
      ::setenv(it->first.c_str(), it->second->c_str(), 1);
    } else {
      ::unsetenv(it->first.c_str());
    }
  }
}

}  // namespace pagedattn::testing
