// A fuzz test of the request parser: random byte strings, and mutations of valid bodies (byte
// flips, insertions, deletions, truncations, spliced JSON values of every type in place of a
// field's value, deep nesting). prepare_request must return for every one (no crash, no
// exception) with either a request the engine's validate() accepts or a 4xx carrying a message;
// a share of the bodies also goes to a live server, which must answer each with 200 or 4xx and
// keep answering /health. Seeded; the seed is printed (rerun with PAGEDATTN_FUZZ_SEED=...).
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>

#include "server/http_client.h"
#include "server/server_support.h"

namespace pagedattn::server::testing {
namespace {

const std::vector<std::string> kValidBodies = {
    R"({"model":"test-model","messages":[{"role":"user","content":"hello"}],"max_tokens":4})",
    R"({"model":"test-model","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"t"}]}],"temperature":0.5,"top_p":0.9,"n":2,"stop":["a","b"],"max_completion_tokens":5,"logprobs":true,"top_logprobs":2,"seed":7})",
    R"({"model":"test-model","prompt":"once upon","max_tokens":6,"logprobs":1,"stream":true,"stream_options":{"include_usage":true}})",
    R"({"model":"test-model","prompt":[1,2,3],"max_tokens":3,"logit_bias":{"5":1.5},"presence_penalty":0.1,"frequency_penalty":0.2,"repetition_penalty":1.05,"top_k":5,"min_p":0.1,"ignore_eos":true})",
};

std::string random_json_value(std::mt19937_64& random, int depth = 0) {
  switch (random() % (depth > 3 ? 7 : 9)) {
    case 0:
      return "null";
    case 1:
      return random() % 2 ? "true" : "false";
    case 2:
      return std::to_string(static_cast<int64_t>(random()) >> (random() % 64));
    case 3:
      return std::to_string(static_cast<double>(random() % 100000) / 997.0 - 50.0);
    case 4:
      return "\"" + std::string(random() % 8, static_cast<char>('a' + random() % 26)) + "\"";
    case 5:
      return "\"\\u" + std::string("d800") + "\"";
    case 6:
      return "1e999";
    case 7: {
      std::string out = "[";
      for (size_t i = 0, n = random() % 4; i < n; ++i) {
        out += (i ? "," : "") + random_json_value(random, depth + 1);
      }
      return out + "]";
    }
    default: {
      std::string out = "{";
      for (size_t i = 0, n = random() % 3; i < n; ++i) {
        out +=
            (i ? ",\"k" : "\"k") + std::to_string(i) + "\":" + random_json_value(random, depth + 1);
      }
      return out + "}";
    }
  }
}

std::string mutate(std::string body, std::mt19937_64& random) {
  const int rounds = 1 + static_cast<int>(random() % 4);
  for (int round = 0; round < rounds && !body.empty(); ++round) {
    const size_t at = random() % body.size();
    switch (random() % 6) {
      case 0:
        body[at] = static_cast<char>(random() % 256);
        break;
      case 1:
        body.insert(at, 1, static_cast<char>(random() % 256));
        break;
      case 2:
        body.erase(at, 1 + random() % 8);
        break;
      case 3:
        body.resize(at);
        break;
      case 4: {  // Replace the value after a ':' with a random JSON value.
        const size_t colon = body.find(':', at);
        if (colon == std::string::npos) break;
        size_t end = colon + 1, nesting = 0;
        for (; end < body.size(); ++end) {
          const char c = body[end];
          if (c == '[' || c == '{') ++nesting;
          if ((c == ']' || c == '}') && nesting-- == 0) break;
          if (c == ',' && nesting == 0) break;
        }
        body.replace(colon + 1, end - colon - 1, random_json_value(random));
        break;
      }
      default: {  // Duplicate a slice.
        const size_t length = random() % (body.size() - at + 1);
        body.insert(random() % body.size(), body.substr(at, length));
      }
    }
  }
  return body;
}

uint64_t fuzz_seed() {
  if (const char* text = std::getenv("PAGEDATTN_FUZZ_SEED"))
    return std::strtoull(text, nullptr, 10);
  return std::random_device{}();
}

void check_result(const std::string& body, Endpoint endpoint, const ParseContext& context) {
  std::variant<PreparedRequest, ApiError> result;
  try {
    result = prepare_request(body, endpoint, context);
  } catch (...) {
    FAIL() << "prepare_request threw on: " << body;
  }
  if (const auto* error = std::get_if<ApiError>(&result)) {
    EXPECT_TRUE(error->status == 400 || error->status == 404) << error->status << " " << body;
    EXPECT_FALSE(error->message.empty()) << body;
    EXPECT_FALSE(Json::parse(error_body(*error), nullptr, false).is_discarded()) << body;
    return;
  }
  const PreparedRequest& request = std::get<PreparedRequest>(result);
  EXPECT_FALSE(request.prompts.empty());
  EXPECT_LE(request.prompts.size(), kMaxPrompts);
  for (const std::vector<int32_t>& prompt : request.prompts) {
    EXPECT_FALSE(prompt.empty());
    for (const int32_t token : prompt) {
      EXPECT_TRUE(token >= 0 && token < context.limits.vocab_size) << body;
    }
    EXPECT_NO_THROW(
        engine::validate(request.params, static_cast<int64_t>(prompt.size()), context.limits))
        << body;
  }
}

TEST(ServerFuzz, ParserNeverCrashes) {
  const uint64_t seed = fuzz_seed();
  std::printf("ServerFuzz seed: %llu (PAGEDATTN_FUZZ_SEED to replay)\n",
              static_cast<unsigned long long>(seed));
  std::mt19937_64 random(seed);
  const ByteFront front;
  ParseContext context;
  context.model_name = "test-model";
  context.limits = {kVocab, 512};
  context.front = &front;
  int accepted = 0;
  for (int i = 0; i < 4000; ++i) {
    std::string body;
    if (i % 4 == 0) {
      body.resize(random() % 300);
      for (char& c : body) c = static_cast<char>(random() % 256);
    } else if (i % 97 == 0) {
      const size_t depth = 10 + random() % 200000;
      body = std::string(depth, random() % 2 ? '[' : '{');
    } else {
      body = mutate(kValidBodies[random() % kValidBodies.size()], random);
    }
    const Endpoint endpoint = random() % 2 ? Endpoint::kChat : Endpoint::kCompletions;
    check_result(body, endpoint, context);
    if (std::holds_alternative<PreparedRequest>(prepare_request(body, endpoint, context))) {
      ++accepted;
    }
  }
  std::printf("ServerFuzz: %d of 4000 bodies accepted\n", accepted);
  for (const std::string& body : kValidBodies) {
    const Endpoint endpoint =
        body.find("\"prompt\"") != std::string::npos ? Endpoint::kCompletions : Endpoint::kChat;
    EXPECT_TRUE(std::holds_alternative<PreparedRequest>(prepare_request(body, endpoint, context)))
        << body;
  }
}

TEST(ServerFuzz, LiveServerAnswersMutatedBodies) {
  const uint64_t seed = fuzz_seed();
  std::printf("ServerFuzz live seed: %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 random(seed);
  TestServer server;
  for (int i = 0; i < 150; ++i) {
    const std::string body = mutate(kValidBodies[random() % kValidBodies.size()], random);
    const std::string path = random() % 2 ? "/v1/chat/completions" : "/v1/completions";
    const HttpResponse response = http_request(server.port(), "POST", path, body);
    EXPECT_TRUE(response.status == 200 || (response.status >= 400 && response.status < 500))
        << response.status << " for " << body;
  }
  EXPECT_EQ(http_request(server.port(), "GET", "/health").status, 200);
  ASSERT_TRUE(wait_idle(server.engine(), std::chrono::seconds(20)));
}

}  // namespace
}  // namespace pagedattn::server::testing
