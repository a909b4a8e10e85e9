// Stop strings over streamed text, and the incremental detokenizer interface the engine uses to
// produce that text (the tokenizer layer implements it).
//
// StopStringMatcher holds back the longest tail of the text produced so far that is a proper
// prefix of some stop string, and releases everything before it. So when a stop string
// completes, it lies entirely in the held-back text (a match starting in released text would
// have made that text a held prefix), and the text before it is released while the stop string
// itself never is. Stop strings are valid UTF-8, so a held tail starts on a character boundary.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace pagedattn::engine {

class IncrementalDetokenizer {
 public:
  virtual ~IncrementalDetokenizer() = default;
  // The text that `token` completes after the tokens pushed so far (empty while it ends inside a
  // character or a merge still to be decided).
  virtual std::string push(int32_t token) = 0;
  // Whatever text is still pending at the end.
  virtual std::string flush() = 0;
};

// Makes a detokenizer for one choice; it sees the prompt first (for tokenizers whose decoding
// depends on what precedes, such as a leading space).
using DetokenizerFactory =
    std::function<std::unique_ptr<IncrementalDetokenizer>(std::span<const int32_t> prompt)>;

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops);

  struct Result {
    std::string text;                 // text to emit now
    std::optional<std::string> stop;  // the stop string that matched (text before it emitted)
  };
  // Appends `text`; returns what can be emitted, and the stop string if one completed.
  Result push(const std::string& text);
  // End of the stream: everything held back is emitted.
  std::string flush();

 private:
  std::vector<std::string> stops_;
  std::string held_;
};

}  // namespace pagedattn::engine
