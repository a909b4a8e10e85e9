// The server's private state (server.h's Impl) and the per-request Exchange shared by the HTTP
// handler and, for a stream, the content provider that outlives the handler. Internal.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "metrics.h"
#include "pagedattn/server.h"
#include "pagedattn/server_tool_calls.h"
#include "responses.h"

namespace pagedattn::server {

using Clock = std::chrono::steady_clock;

// httplib::Server with its listening socket reachable: httplib 0.11 listens with a backlog of 5,
// which drops the SYNs of a burst of clients (each then retries a second later); start() listens
// again on the bound socket with a backlog of SOMAXCONN.
class HttpServer : public httplib::Server {
 public:
  socket_t listening_socket() const { return svr_sock_; }
};

struct Server::Impl {
  Impl(ServerConfig config, engine::Engine& engine, const TextFront& front);

  void log(const std::string& line) const;
  void install_routes();
  void engine_loop();
  void handle_generate(const httplib::Request& request, httplib::Response& response,
                       Endpoint endpoint);
  void send_error(httplib::Response& response, const ApiError& error) const;

  ServerConfig config;
  engine::Engine& engine;
  const TextFront& front;
  ParseContext context;
  HttpServer http;
  std::thread http_thread;
  std::thread engine_thread;
  int bound_port = 0;
  std::atomic<bool> started{false};
  std::atomic<bool> stopped{false};
  std::atomic<bool> draining{false};
  std::atomic<bool> engine_stop{false};
  std::atomic<int64_t> pending{0};  // requests handed to the engine and not yet answered
  std::atomic<int64_t> open_streams{0};
  std::atomic<int64_t> next_id{0};
  detail::Metrics metrics;
  std::mutex shutdown_mutex;
};

// One generation request from enqueue to its last byte. A completions batch is one engine request
// per prompt, all sending their events to one stream: choice j of prompt i is index i * n + j
// there and in the answer (OpenAI's order).
struct Exchange {
  struct ChoiceState {
    detail::ChoiceOutput output;  // accumulated (non-streaming) or the event being sent
    detail::TextOffset offset;    // streamed completions logprobs: text_offset so far
    bool received_first = false;
    bool sent_first = false;
    bool finished = false;
    std::optional<ToolCallParser> tools;  // chat with tool calls parsed (exchange_tools.cpp)
    int32_t num_tool_calls = 0;           // streamed so far
  };

  Server::Impl* server = nullptr;
  PreparedRequest request;
  detail::ResponseHead head;
  std::shared_ptr<engine::RequestStream> stream;  // every prompt's choices
  std::vector<int64_t> engine_requests;           // one per prompt
  Clock::time_point start;
  std::optional<Clock::time_point> first_token;
  Clock::time_point last_write;
  std::vector<ChoiceState> choices;
  detail::Usage usage;
  int32_t num_finished = 0;
  std::string error;       // the first kError message
  bool completed = false;  // recorded (metrics, log, pending released)

  // Queues one engine request per prompt; throws Error (nothing left queued) if the engine
  // refuses one.
  void enqueue(engine::Engine& engine);
  // Aborts every prompt's engine request (a client gone).
  void abort(engine::Engine& engine) const;
  // Folds an event into the choice's state and the usage.
  void apply(const engine::RequestEvent& event);
  // Echo: what a choice's answer starts with (the prompt's text; with logprobs its tokens' entries,
  // the first without a logprob), from the choice's first event (which carries prompt_logprobs).
  void echo_prompt(const engine::RequestEvent& event, detail::ChoiceOutput& output) const;
  // PreparedRequest::prompt_logprobs: the choice's first event's prompt entries into `output`.
  void take_prompt_logprobs(const engine::RequestEvent& event, detail::ChoiceOutput& output) const;
  bool all_finished() const { return num_finished == static_cast<int32_t>(choices.size()); }
  // Metrics, the log line, the pending count. `cancelled`: the client went away.
  void complete(bool cancelled);
  // The SSE text for `event` (after apply()).
  std::string stream_text(const engine::RequestEvent& event);
  // The SSE text after the last choice finished: usage (if asked) and [DONE].
  std::string stream_tail() const;

  // Tool calls (exchange_tools.cpp). A parser per choice when the request's output is parsed.
  void start_tool_parsers();
  // Non-streaming: each choice's whole text split into content and tool_calls.
  void parse_tool_calls();
  // Streaming: the chunks of `piece` (the event's text and logprobs) through the choice's parser;
  // `finished`: the choice's last event (what the parser held back comes out).
  std::string stream_tool_pieces(ChoiceState& choice, const detail::ChoiceOutput& piece,
                                 bool finished);
};

}  // namespace pagedattn::server
