// What the server tests share: a live server on a free loopback port over the engine's fake
// model (tests/engine/fake_model.h: logits a pseudo-random function of the prefix read back
// through the pages) and the byte-level text front; a model that can be paused (to hold
// requests in flight); and the independent references: the greedy output computed with no
// engine (argmax over reference_logits on the growing token list) and a whole-buffer UTF-8
// decoder written apart from the front's incremental one.
#pragma once

#include <gtest/gtest.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/fake_model.h"
#include "pagedattn/engine.h"
#include "pagedattn/server.h"
#include "server/byte_front.h"

namespace pagedattn::server::testing {

using Json = nlohmann::json;

// FakeModel whose forward() waits while paused, so requests stay in flight on demand, and can
// be slowed down (a step delay), so a request lasts long enough to leave it midway. With
// enable_overlap() it samples its rows and runs launched steps as a CUDA model does (overlap
// scheduling: launch, then collect; the gate and the delay apply at collect; no script).
class GatedModel : public engine::ModelRunner {
 public:
  GatedModel(int32_t vocab, int32_t num_pages, int32_t page_size)
      : model_(vocab, num_pages, page_size) {}
  int32_t vocab_size() const override { return model_.vocab_size(); }
  void enable_overlap() { model_.enable_overlap(); }
  bool supports_overlap() const override { return model_.supports_overlap(); }
  bool prefers_model_sampling() const override { return model_.prefers_model_sampling(); }
  void launch(const engine::StepPlan& plan, std::span<const ops::RowSampling> sampling) override {
    model_.launch(plan, sampling);
  }
  void collect(std::span<ops::SampledToken> sampled) override {
    wait_for_gate();
    model_.collect(sampled);
  }
  void forward(const engine::StepPlan& plan, std::span<float> logits) override {
    wait_for_gate();
    model_.forward(plan, logits);
    std::optional<std::string> script;
    {
      std::lock_guard script_lock(mutex_);
      script = script_;
    }
    if (script) follow_script(plan, *script, logits);
  }
  // From now on every request's output is `script` (its bytes, then EOS), whatever its prompt;
  // nullopt: the fake model's own logits again. Needs the byte-level front's chat prompt, which
  // ends in "assistant: " (the script must not contain that).
  void set_script(std::optional<std::string> script) {
    std::lock_guard lock(mutex_);
    script_ = std::move(script);
  }
  // Waits while paused, then sleeps the step delay.
  void wait_for_gate() {
    std::unique_lock lock(mutex_);
    resumed_.wait(lock, [&] { return !paused_; });
    const std::chrono::milliseconds delay = step_delay_;
    lock.unlock();
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
  }
  // Every forward takes at least this long (a request of N tokens lasts N steps of it).
  void set_step_delay(std::chrono::milliseconds delay) {
    std::lock_guard lock(mutex_);
    step_delay_ = delay;
  }
  void pause() {
    std::lock_guard lock(mutex_);
    paused_ = true;
  }
  void resume() {
    {
      std::lock_guard lock(mutex_);
      paused_ = false;
    }
    resumed_.notify_all();
  }

 private:
  // Each logits row becomes one-hot at the script's next byte: the prompt ends at the last
  // "assistant: ", what follows it is what the script has produced so far.
  void follow_script(const engine::StepPlan& plan, const std::string& script,
                     std::span<float> logits) {
    static const std::string kPromptEnd = "assistant: ";
    size_t row = 0;
    for (const engine::ScheduledSequence& entry : plan.sequences) {
      if (entry.num_logit_rows == 0) continue;
      const std::vector<int32_t> prefix = model_.read_prefix(entry);
      const std::string text(prefix.begin(), prefix.end());  // bytes (specials never occur)
      const size_t prompt_end = text.rfind(kPromptEnd);
      const size_t produced =
          prompt_end == std::string::npos ? 0 : text.size() - prompt_end - kPromptEnd.size();
      const int32_t token = produced < script.size()
                                ? static_cast<int32_t>(static_cast<unsigned char>(script[produced]))
                                : kEos;
      std::span<float> out = logits.subspan(row * static_cast<size_t>(kVocab), kVocab);
      std::fill(out.begin(), out.end(), -10.0f);
      out[static_cast<size_t>(token)] = 10.0f;
      ++row;
    }
  }

  engine::testing::FakeModel model_;
  std::optional<std::string> script_;
  std::mutex mutex_;
  std::condition_variable resumed_;
  bool paused_ = false;
  std::chrono::milliseconds step_delay_{0};
};

struct TestServerOptions {
  int32_t num_pages = 4096;
  int32_t page_size = 16;
  int64_t max_model_length = 512;
  int32_t max_running = 256;
  int32_t max_connections = 64;
  int64_t max_pending_requests = 4096;
  size_t max_body_bytes = 1 << 20;
  std::string model_name = "test-model";
  ToolCallFormat tool_call_format = ToolCallFormat::kHermes;
  bool overlap = false;  // the model samples and runs launched steps (GatedModel::enable_overlap)
};

class TestServer {
 public:
  explicit TestServer(TestServerOptions options = {}) : options_(options) {
    engine::EngineConfig config;
    config.num_pages = options.num_pages;
    config.page_size = options.page_size;
    config.max_model_length = options.max_model_length;
    config.max_running = options.max_running;
    config.eos_token_ids = {kEos};
    model_ = std::make_unique<GatedModel>(kVocab, options.num_pages, options.page_size);
    if (options.overlap) model_->enable_overlap();
    engine_ = std::make_unique<engine::Engine>(config, *model_, ByteFront::detokenizer());
    ServerConfig server_config;
    server_config.host = "127.0.0.1";
    server_config.port = 0;
    server_config.model_name = options.model_name;
    server_config.max_connections = options.max_connections;
    server_config.max_pending_requests = options.max_pending_requests;
    server_config.max_body_bytes = options.max_body_bytes;
    server_config.tool_call_format = options.tool_call_format;
    server_config.keep_alive_interval = std::chrono::milliseconds(200);
    server_config.read_timeout_seconds = 5;
    server_config.log = [this](const std::string& line) {
      std::lock_guard lock(log_mutex_);
      log_.push_back(line);
    };
    server_ = std::make_unique<Server>(server_config, *engine_, front_);
    server_->start();
  }
  ~TestServer() {
    model_->resume();
    server_->shutdown(std::chrono::milliseconds(0));
  }

  int port() const { return server_->port(); }
  Server& server() { return *server_; }
  engine::Engine& engine() { return *engine_; }
  GatedModel& model() { return *model_; }
  const ByteFront& front() const { return front_; }
  const TestServerOptions& options() const { return options_; }
  std::vector<std::string> log_lines() {
    std::lock_guard lock(log_mutex_);
    return log_;
  }

 private:
  TestServerOptions options_;
  ByteFront front_;
  std::unique_ptr<GatedModel> model_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<Server> server_;
  std::mutex log_mutex_;
  std::vector<std::string> log_;
};

// Whole-buffer UTF-8 decoding: each maximal well-formed character (code point in range, not a
// surrogate, shortest form) is kept; any other byte becomes U+FFFD alone.
inline std::string naive_decode(const std::vector<int32_t>& tokens) {
  std::string bytes;
  for (const int32_t token : tokens) {
    if (token < 256) bytes += static_cast<char>(token);
  }
  std::string out;
  size_t i = 0;
  while (i < bytes.size()) {
    const unsigned lead = static_cast<unsigned char>(bytes[i]);
    size_t length = lead < 0x80         ? 1
                    : (lead >> 5) == 6  ? 2
                    : (lead >> 4) == 14 ? 3
                    : (lead >> 3) == 30 ? 4
                                        : 0;
    uint32_t code = length == 1   ? lead
                    : length == 2 ? (lead & 0x1F)
                    : length == 3 ? (lead & 0x0F)
                                  : (lead & 0x07);
    bool valid = length > 0 && i + length <= bytes.size();
    for (size_t k = 1; valid && k < length; ++k) {
      const unsigned next = static_cast<unsigned char>(bytes[i + k]);
      if ((next >> 6) != 2) valid = false;
      code = (code << 6) | (next & 0x3F);
    }
    const uint32_t minimum[] = {0, 0, 0x80, 0x800, 0x10000};
    if (valid &&
        (code < minimum[length] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF))) {
      valid = false;
    }
    if (valid) {
      out += bytes.substr(i, length);
      i += length;
    } else {
      out += "\xEF\xBF\xBD";
      i += 1;
    }
  }
  return out;
}

// Greedy tokens of `prompt` with no engine: argmax of the fake model's logits over the growing
// list, up to max_tokens or EOS (unless ignored).
inline std::vector<int32_t> greedy_tokens(std::vector<int32_t> prompt, int64_t max_tokens,
                                          bool ignore_eos) {
  std::vector<int32_t> output;
  std::vector<float> logits(kVocab);
  while (static_cast<int64_t>(output.size()) < max_tokens) {
    engine::testing::reference_logits(prompt, logits);
    const int32_t token =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    prompt.push_back(token);
    output.push_back(token);
    if (!ignore_eos && token == kEos) break;
  }
  return output;
}

inline std::vector<int32_t> bytes_of(const std::string& text) {
  std::vector<int32_t> tokens;
  for (const char c : text) tokens.push_back(static_cast<unsigned char>(c));
  return tokens;
}

// Waits (bounded) until the engine has no sequence left; then pages free + cached == total.
inline bool wait_idle(engine::Engine& engine, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    const engine::EngineStats stats = engine.stats();
    if (!engine.has_work() && stats.num_running == 0 && stats.num_waiting == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

}  // namespace pagedattn::server::testing
