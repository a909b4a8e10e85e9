// StopStringMatcher (see engine_stop.h). The held tail is at most the longest stop string minus
// one byte, so each push costs O((held + text) * stops * longest stop).
#include <algorithm>

#include "pagedattn/engine_stop.h"

namespace pagedattn::engine {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

StopStringMatcher::Result StopStringMatcher::push(const std::string& text) {
  Result result;
  held_ += text;
  if (stops_.empty()) {
    result.text = std::move(held_);
    held_.clear();
    return result;
  }
  // The earliest completed stop string (the longest one on a tie at the same position).
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const std::string& stop : stops_) {
    const size_t at = held_.find(stop);
    if (at == std::string::npos) continue;
    if (at < best || (at == best && stop.size() > best_stop->size())) {
      best = at;
      best_stop = &stop;
    }
  }
  if (best_stop != nullptr) {
    result.text = held_.substr(0, best);
    result.stop = *best_stop;
    held_.clear();
    return result;
  }
  // Hold the longest tail that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    const size_t longest = std::min(stop.size() - 1, held_.size());
    for (size_t length = longest; length > hold; --length) {
      if (held_.compare(held_.size() - length, length, stop, 0, length) == 0) {
        hold = length;
        break;
      }
    }
  }
  result.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return result;
}

std::string StopStringMatcher::flush() {
  std::string text = std::move(held_);
  held_.clear();
  return text;
}

}  // namespace pagedattn::engine
