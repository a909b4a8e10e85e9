// Tool calling through /v1/chat/completions: the scripted model (server_support.h: the fake
// model made to write a given text) writes tool calls in the hermes format, and the responses
// must carry them as OpenAI does: non-streaming message.content (null when only calls) and
// message.tool_calls with finish_reason "tool_calls"; streaming, content deltas and per call a
// first delta (index, id, type, name, empty arguments) then the arguments, assembled here as
// the OpenAI clients assemble them. Expected calls and content are written out by hand. Also the
// request side through prepare_request: tools / tool_choice / messages with tool calls validated
// field by field, and what reaches the template (the byte-level front's rendering).
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "server/http_client.h"
#include "server/server_support.h"

namespace pagedattn::server::testing {
namespace {

using OrderedJson = nlohmann::ordered_json;

const Json kTools = Json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
   "parameters": {"type": "object", "properties": {"location": {"type": "string"}},
                  "required": ["location"]}}},
  {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}])");

const std::string kTwoCalls =
    "Let me check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": "
    "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": "
    "\"Tokyo \xE5\xA4\xA9\xE6\xB0\x97\"}}\n</tool_call>";
const std::string kParisArguments = R"({"location":"Paris"})";
const std::string kSearchArguments = "{\"query\":\"Tokyo \xE5\xA4\xA9\xE6\xB0\x97\"}";

// Room for the tools in the prompt plus the script.
TestServerOptions tool_options() {
  TestServerOptions options;
  options.max_model_length = 4096;
  return options;
}

Json chat_request(bool stream, Json extra = Json::object()) {
  Json request = {{"model", "test-model"},
                  {"messages", {{{"role", "user"}, {"content", "Weather in Paris? And Tokyo?"}}}},
                  {"tools", kTools},
                  {"temperature", 0},
                  {"max_tokens", 400},
                  {"stream", stream}};
  for (const auto& [key, value] : extra.items()) request[key] = value;
  return request;
}

Json post(TestServer& server, const Json& request) {
  const HttpResponse response =
      http_request(server.port(), "POST", "/v1/chat/completions", request.dump());
  EXPECT_EQ(response.status, 200) << response.body;
  return Json::parse(response.body);
}

// A stream assembled as the OpenAI clients assemble one: content appended, each tool call's
// fields by index, arguments appended; and the shape of each tool-call delta checked.
struct Assembled {
  std::string content;
  std::vector<Json> calls;  // {id, type, function: {name, arguments}}
  std::string finish_reason;
  int content_chunks = 0;
};

Assembled stream(TestServer& server, const Json& request) {
  const StreamResult result = stream_request(server.port(), "/v1/chat/completions", request.dump());
  EXPECT_EQ(result.status, 200);
  Assembled assembled;
  std::map<int, int> deltas_per_call;
  for (const std::string& event : result.events) {
    if (event == "[DONE]") continue;
    const Json chunk = Json::parse(event);
    if (chunk["choices"].empty()) continue;
    const Json& choice = chunk["choices"][0];
    const Json& delta = choice["delta"];
    if (delta.contains("content") && delta["content"].is_string()) {
      assembled.content += delta["content"].get<std::string>();
      if (!delta["content"].get<std::string>().empty()) ++assembled.content_chunks;
    }
    if (delta.contains("tool_calls")) {
      EXPECT_EQ(delta["tool_calls"].size(), 1u) << event;
      const Json& call = delta["tool_calls"][0];
      const int index = call["index"];
      const int seen = deltas_per_call[index]++;
      if (seen == 0) {
        // First delta: index, id, type, name, empty arguments.
        EXPECT_EQ(static_cast<size_t>(index), assembled.calls.size()) << event;
        EXPECT_TRUE(call["id"].is_string()) << event;
        EXPECT_EQ(call["type"], "function") << event;
        EXPECT_EQ(call["function"]["arguments"], "") << event;
        assembled.calls.push_back(
            {{"id", call["id"]},
             {"type", "function"},
             {"function", {{"name", call["function"]["name"]}, {"arguments", ""}}}});
      } else {
        EXPECT_FALSE(call.contains("id")) << event;
        EXPECT_FALSE(call["function"].contains("name")) << event;
        std::string arguments = assembled.calls.at(index)["function"]["arguments"];
        assembled.calls.at(index)["function"]["arguments"] =
            arguments + call["function"]["arguments"].get<std::string>();
      }
    }
    if (choice["finish_reason"].is_string()) assembled.finish_reason = choice["finish_reason"];
  }
  return assembled;
}

void expect_two_calls(const Json& calls) {
  ASSERT_EQ(calls.size(), 2u) << calls.dump();
  EXPECT_EQ(calls[0]["type"], "function");
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(calls[0]["function"]["arguments"], kParisArguments);
  EXPECT_EQ(calls[1]["function"]["name"], "search");
  EXPECT_EQ(calls[1]["function"]["arguments"], kSearchArguments);
  std::set<std::string> ids;
  for (const Json& call : calls) {
    const std::string id = call["id"];
    EXPECT_TRUE(id.starts_with("call_") && id.size() == 29) << id;
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 2u) << "ids must differ";
}

TEST(ToolCallsServer, NonStreamingCarriesCallsAndContent) {
  TestServer server(tool_options());
  server.model().set_script(kTwoCalls);
  const Json body = post(server, chat_request(false));
  const Json& choice = body["choices"][0];
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["message"]["content"], "Let me check both.");
  expect_two_calls(choice["message"]["tool_calls"]);
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  // The prompt: the tools as the client sent them, then the conversation (byte-level front).
  const std::string prompt =
      "tools: " + kTools.dump() + "\nuser: Weather in Paris? And Tokyo?\nassistant: ";
  EXPECT_EQ(body["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(body["usage"]["completion_tokens"], kTwoCalls.size() + 1);  // + EOS
}

TEST(ToolCallsServer, OnlyCallsGiveNullContent) {
  TestServer server(tool_options());
  server.model().set_script(
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n"
      "</tool_call>");
  const Json body = post(server, chat_request(false));
  const Json& message = body["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null()) << message.dump();
  ASSERT_EQ(message["tool_calls"].size(), 1u);
  EXPECT_EQ(message["tool_calls"][0]["function"]["arguments"], kParisArguments);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
}

TEST(ToolCallsServer, StreamingAssemblesToTheSameCalls) {
  TestServer server(tool_options());
  server.model().set_script(kTwoCalls);
  const Assembled streamed = stream(server, chat_request(true));
  EXPECT_EQ(streamed.content, "Let me check both.");
  expect_two_calls(streamed.calls);
  EXPECT_EQ(streamed.finish_reason, "tool_calls");
  EXPECT_GT(streamed.content_chunks, 1) << "content must stream, not come at the end";
}

TEST(ToolCallsServer, StreamingWithUsageAndLogprobs) {
  TestServer server(tool_options());
  server.model().set_script(kTwoCalls);
  const StreamResult result = stream_request(
      server.port(), "/v1/chat/completions",
      chat_request(true, {{"logprobs", true}, {"stream_options", {{"include_usage", true}}}})
          .dump());
  ASSERT_EQ(result.status, 200);
  size_t logprobs = 0;
  for (const std::string& event : result.events) {
    if (event == "[DONE]") continue;
    const Json chunk = Json::parse(event);
    if (chunk["choices"].empty()) {
      EXPECT_EQ(chunk["usage"]["completion_tokens"], kTwoCalls.size() + 1);
      continue;
    }
    const Json& entry = chunk["choices"][0]["logprobs"];
    if (entry.is_object()) logprobs += entry["content"].size();
  }
  // Every token's logprob arrives once, wherever the parser let its text out.
  EXPECT_EQ(logprobs, kTwoCalls.size() + 1);
}

TEST(ToolCallsServer, WithoutToolsOrWithToolChoiceNoneTheTextIsContent) {
  TestServer server(tool_options());
  server.model().set_script(kTwoCalls);
  Json request = chat_request(false);
  request.erase("tools");
  Json body = post(server, request);
  EXPECT_EQ(body["choices"][0]["message"]["content"], kTwoCalls);
  EXPECT_FALSE(body["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");

  body = post(server, chat_request(false, {{"tool_choice", "none"}}));
  EXPECT_EQ(body["choices"][0]["message"]["content"], kTwoCalls);
  EXPECT_FALSE(body["choices"][0]["message"].contains("tool_calls"));
  // The tools still reach the template (vLLM's default for "none").
  EXPECT_EQ(
      body["usage"]["prompt_tokens"],
      ("tools: " + kTools.dump() + "\nuser: Weather in Paris? And Tokyo?\nassistant: ").size());

  const Assembled streamed = stream(server, chat_request(true, {{"tool_choice", "none"}}));
  EXPECT_EQ(streamed.content, kTwoCalls);
  EXPECT_TRUE(streamed.calls.empty());
  EXPECT_EQ(streamed.finish_reason, "stop");
}

TEST(ToolCallsServer, MalformedCallStaysContent) {
  TestServer server(tool_options());
  const std::string text =
      "Trying: <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {location: Paris}}\n"
      "</tool_call>";
  server.model().set_script(text);
  const Json body = post(server, chat_request(false));
  EXPECT_EQ(body["choices"][0]["message"]["content"], text);
  EXPECT_FALSE(body["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  const Assembled streamed = stream(server, chat_request(true));
  EXPECT_EQ(streamed.content, text);
  EXPECT_TRUE(streamed.calls.empty());
  EXPECT_EQ(streamed.finish_reason, "stop");
}

TEST(ToolCallsServer, ParallelToolCallsFalseKeepsTheFirst) {
  TestServer server(tool_options());
  server.model().set_script(kTwoCalls);
  const Json body = post(server, chat_request(false, {{"parallel_tool_calls", false}}));
  const Json& calls = body["choices"][0]["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  const Assembled streamed = stream(server, chat_request(true, {{"parallel_tool_calls", false}}));
  ASSERT_EQ(streamed.calls.size(), 1u);
  EXPECT_EQ(streamed.calls[0]["function"]["name"], "get_weather");
}

TEST(ToolCallsServer, EveryChoiceParsesItsOwnCalls) {
  TestServer server(tool_options());
  server.model().set_script(kTwoCalls);
  const Json body = post(server, chat_request(false, {{"n", 2}}));
  ASSERT_EQ(body["choices"].size(), 2u);
  for (const Json& choice : body["choices"]) {
    EXPECT_EQ(choice["message"]["content"], "Let me check both.");
    expect_two_calls(choice["message"]["tool_calls"]);
  }
}

TEST(ToolCallsServer, LengthCutMidCallIsContentWithReasonLength) {
  TestServer server(tool_options());
  server.model().set_script(kTwoCalls);
  const size_t cut = kTwoCalls.find("search") + 3;
  const Json body = post(server, chat_request(false, {{"max_tokens", cut}}));
  const Json& message = body["choices"][0]["message"];
  // The first call is whole; the second, cut off, is the text it was.
  ASSERT_EQ(message["tool_calls"].size(), 1u);
  // (The newline after the first call only separated it: not content.)
  EXPECT_EQ(message["content"], "Let me check both.<tool_call>\n{\"name\": \"sea");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
}

TEST(ToolCallsServer, ConversationWithToolResultsRenders) {
  TestServer server(tool_options());
  server.model().set_script("It is 22 degrees in Paris.");
  Json request = chat_request(false);
  request["messages"] = Json::parse(R"([
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": null, "refusal": null,
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"location\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 22}"}])");
  const Json body = post(server, request);
  EXPECT_EQ(body["choices"][0]["message"]["content"], "It is 22 degrees in Paris.");
  EXPECT_FALSE(body["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  const std::string prompt =
      "tools: " + kTools.dump() +
      "\nuser: Weather in Paris?\nassistant: <call get_weather {\"location\": \"Paris\"}>\n"
      "tool: {\"temperature\": 22} (for call_1)\nassistant: ";
  EXPECT_EQ(body["usage"]["prompt_tokens"], prompt.size());
}

// --- the request side, through prepare_request -----------------------------------------------

ParseContext tools_context(const ByteFront& front, ToolCallFormat format) {
  ParseContext context;
  context.model_name = "m";
  context.limits = {kVocab, 4096};
  context.front = &front;
  context.tool_call_format = format;
  return context;
}

std::variant<PreparedRequest, ApiError> prepare(const std::string& fields,
                                                ToolCallFormat format = ToolCallFormat::kHermes) {
  static const ByteFront front;
  const std::string body =
      R"({"model": "m", "messages": [{"role": "user", "content": "hi"}])" + fields + "}";
  return prepare_request(body, Endpoint::kChat, tools_context(front, format));
}

void expect_refused(const std::string& fields, const std::string& param,
                    ToolCallFormat format = ToolCallFormat::kHermes) {
  const auto result = prepare(fields, format);
  ASSERT_TRUE(std::holds_alternative<ApiError>(result)) << "accepted: " << fields;
  const ApiError& error = std::get<ApiError>(result);
  EXPECT_EQ(error.status, 400) << fields;
  EXPECT_EQ(error.param, param) << fields << ": " << error.message;
  EXPECT_NE(error.message.find(param), std::string::npos) << error.message;
}

const std::string kToolList =
    R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
                   {"type": "function", "function": {"name": "g"}}])";

TEST(ToolCallsProtocol, ToolsAreValidatedFieldByField) {
  expect_refused(R"(, "tools": {"type": "function"})", "tools");
  expect_refused(R"(, "tools": [{"type": "function", "function": {"name": "f"}}, 3])", "tools[1]");
  expect_refused(R"(, "tools": [{"type": "retrieval", "function": {"name": "f"}}])",
                 "tools[0].type");
  expect_refused(R"(, "tools": [{"type": "function"}])", "tools[0].function");
  expect_refused(R"(, "tools": [{"type": "function", "function": {"name": "f"}},
                               {"type": "function", "function": {"name": "g"}},
                               {"type": "function", "function": {"description": "no name"}}])",
                 "tools[2].function.name");
  expect_refused(R"(, "tools": [{"type": "function", "function": {"name": ""}}])",
                 "tools[0].function.name");
  expect_refused(
      R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}])",
      "tools[0].function.parameters");
  expect_refused(
      R"(, "tools": [{"type": "function", "function": {"name": "f", "description": 1}}])",
      "tools[0].function.description");
}

TEST(ToolCallsProtocol, ToolChoice) {
  auto ok = prepare(kToolList);
  ASSERT_TRUE(std::holds_alternative<PreparedRequest>(ok));
  EXPECT_EQ(std::get<PreparedRequest>(ok).tool_call_format, ToolCallFormat::kHermes);
  EXPECT_TRUE(std::get<PreparedRequest>(ok).parallel_tool_calls);
  ok = prepare(kToolList + R"(, "tool_choice": "auto", "parallel_tool_calls": false)");
  ASSERT_TRUE(std::holds_alternative<PreparedRequest>(ok));
  EXPECT_FALSE(std::get<PreparedRequest>(ok).parallel_tool_calls);
  ok = prepare(kToolList + R"(, "tool_choice": "none")");
  ASSERT_TRUE(std::holds_alternative<PreparedRequest>(ok));
  EXPECT_EQ(std::get<PreparedRequest>(ok).tool_call_format, ToolCallFormat::kNone);
  // The tools reach the template whatever tool_choice says.
  EXPECT_EQ(
      std::get<PreparedRequest>(ok).prompts.at(0).size(),
      ("tools: " + OrderedJson::parse(kToolList.substr(11)).dump() + "\nuser: hi\nassistant: ")
          .size());
  ok = prepare(R"(, "tool_choice": "none")");  // no tools: nothing to refuse
  ASSERT_TRUE(std::holds_alternative<PreparedRequest>(ok));

  expect_refused(kToolList + R"(, "tool_choice": "required")", "tool_choice");
  expect_refused(kToolList + R"(, "tool_choice": "sometimes")", "tool_choice");
  expect_refused(kToolList + R"(, "tool_choice": 3)", "tool_choice");
  expect_refused(kToolList + R"(, "tool_choice": {"type": "function", "function": {"name": "f"}})",
                 "tool_choice");
  expect_refused(kToolList + R"(, "tool_choice": {"type": "function", "function": {"name": "h"}})",
                 "tool_choice.function.name");
  expect_refused(R"(, "tool_choice": "auto")", "tool_choice");  // no tools
  expect_refused(kToolList + R"(, "parallel_tool_calls": "yes")", "parallel_tool_calls");
  // No parser for the model: tools with "auto" (the default) are refused, "none" served.
  expect_refused(kToolList, "tools", ToolCallFormat::kNone);
  expect_refused(kToolList + R"(, "tool_choice": "auto")", "tool_choice", ToolCallFormat::kNone);
  ok = prepare(kToolList + R"(, "tool_choice": "none")", ToolCallFormat::kNone);
  EXPECT_TRUE(std::holds_alternative<PreparedRequest>(ok));
}

std::variant<PreparedRequest, ApiError> prepare_messages(const std::string& messages) {
  static const ByteFront front;
  const std::string body = R"({"model": "m", "messages": )" + messages + "}";
  return prepare_request(body, Endpoint::kChat, tools_context(front, ToolCallFormat::kHermes));
}

void expect_messages_refused(const std::string& messages, const std::string& param) {
  const auto result = prepare_messages(messages);
  ASSERT_TRUE(std::holds_alternative<ApiError>(result)) << "accepted: " << messages;
  EXPECT_EQ(std::get<ApiError>(result).param, param) << std::get<ApiError>(result).message;
}

TEST(ToolCallsProtocol, MessagesWithToolCalls) {
  // Arguments as a string or an object (its key order kept), content null or absent, the null
  // fields clients echo back.
  const auto ok = prepare_messages(R"([
    {"role": "user", "content": "q"},
    {"role": "assistant", "tool_calls": [
       {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": 2}"}},
       {"function": {"name": "g", "arguments": {"z": 1, "a": [true]}}}],
     "function_call": null, "audio": null},
    {"role": "tool", "tool_call_id": "a", "content": [{"type": "text", "text": "r1"}]},
    {"role": "tool", "tool_call_id": "", "content": "r2", "name": "g"}])");
  ASSERT_TRUE(std::holds_alternative<PreparedRequest>(ok)) << std::get<ApiError>(ok).message;
  const std::string expected =
      "user: q\nassistant: <call f {\"z\": 1, \"a\": 2}><call g {\"z\":1,\"a\":[true]}>\n"
      "tool: r1 (for a)\ntool: r2 (for )\nassistant: ";
  EXPECT_EQ(std::get<PreparedRequest>(ok).prompts.at(0), bytes_of(expected));

  expect_messages_refused(R"([{"role": "tool", "content": "r"}])", "messages[0].tool_call_id");
  expect_messages_refused(R"([{"role": "tool", "tool_call_id": 5, "content": "r"}])",
                          "messages[0].tool_call_id");
  expect_messages_refused(R"([{"role": "user", "content": "q", "tool_calls": []}])",
                          "messages[0].tool_calls");
  expect_messages_refused(R"([{"role": "assistant", "content": null}])", "messages[0].content");
  expect_messages_refused(R"([{"role": "assistant", "refusal": "no", "content": "x"}])",
                          "messages[0].refusal");
  expect_messages_refused(R"([{"role": "assistant", "tool_calls": {"function": {}}}])",
                          "messages[0].tool_calls");
  expect_messages_refused(
      R"([{"role": "assistant", "tool_calls": [{"type": "code", "function": {"name": "f"}}]}])",
      "messages[0].tool_calls[0].type");
  expect_messages_refused(R"([{"role": "assistant", "tool_calls": [{"function": {}}]}])",
                          "messages[0].tool_calls[0].function.name");
  expect_messages_refused(
      R"([{"role": "user", "content": "q"},
          {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}])",
      "messages[1].tool_calls[0].function.arguments");
  expect_messages_refused(
      R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}])",
      "messages[0].tool_calls[0].function.arguments");
  expect_messages_refused(
      R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 7}}]}])",
      "messages[0].tool_calls[0].function.arguments");
  expect_messages_refused(R"([{"role": "robot", "content": "x"}])", "messages[0].role");
}

}  // namespace
}  // namespace pagedattn::server::testing
