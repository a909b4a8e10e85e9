// One generation request over HTTP: prepare -> enqueue (one engine request per prompt of a
// completions batch, all on one event stream) -> either wait for every choice and answer one
// JSON, or stream SSE chunks (each carrying its choice's index) from a chunked content provider.
// While waiting for the one JSON, the handler polls its client's socket (ClientWatch,
// client_watch.h) every kClientCheckInterval; a client gone aborts the request (every prompt's)
// at once (pages freed at the engine's next step boundary) and records it as cancelled. The
// provider runs on the connection's pool thread after the handler returns: it pops the request's
// events (waiting a little when there are none), writes them, and sends an SSE comment after
// keep_alive_interval of silence so that a client gone while its request waits is noticed by the
// failed write. A failed write ends the response; the releaser then aborts the engine requests
// (their pages are freed at the next step boundary) and records it as cancelled.
#include <fmt/format.h>

#include <ctime>
#include <optional>

#include "client_watch.h"
#include "pagedattn/error.h"
#include "server_impl.h"

namespace pagedattn::server {

namespace {
double seconds(Clock::duration duration) { return std::chrono::duration<double>(duration).count(); }
// How often a non-streaming handler looks whether its client is still there.
constexpr std::chrono::milliseconds kClientCheckInterval{20};
}  // namespace

void Exchange::enqueue(engine::Engine& engine) {
  const int32_t n = request.params.n;
  stream = std::make_shared<engine::RequestStream>(static_cast<int32_t>(choices.size()));
  try {
    for (size_t i = 0; i < request.prompts.size(); ++i) {
      const int32_t first_index = static_cast<int32_t>(i) * n;
      engine_requests.push_back(
          engine.add_request(request.prompts[i], request.params, stream, first_index).id);
    }
  } catch (const Error&) {
    abort(engine);
    throw;
  }
}

void Exchange::abort(engine::Engine& engine) const {
  for (const int64_t id : engine_requests) engine.abort(id);
}

void Exchange::echo_prompt(const engine::RequestEvent& event, detail::ChoiceOutput& output) const {
  const size_t prompt = static_cast<size_t>(event.index / request.params.n);
  output.text = request.prompt_texts[prompt] + output.text;
  if (!request.logprobs) return;
  std::vector<engine::TokenLogprob> entries;
  entries.push_back({request.prompts[prompt].front(), 0.0f, {}, 0});
  entries.insert(entries.end(), event.prompt_logprobs.begin(), event.prompt_logprobs.end());
  // The engine may have scored more alternatives (prompt_logprobs asked more): logprobs' own n.
  const size_t top = static_cast<size_t>(request.params.logprobs.value_or(0));
  for (engine::TokenLogprob& entry : entries) {
    if (entry.top.size() > top) entry.top.resize(top);
  }
  entries.insert(entries.end(), output.logprobs.begin(), output.logprobs.end());
  output.logprobs = std::move(entries);
  output.first_logprob_null = true;
}

void Exchange::take_prompt_logprobs(const engine::RequestEvent& event,
                                    detail::ChoiceOutput& output) const {
  if (!request.prompt_logprobs) return;
  // Chat has one prompt: its entries go once, with the first choice.
  if (head.endpoint == Endpoint::kChat && event.index != 0) return;
  output.has_prompt_logprobs = true;
  output.prompt_top = *request.prompt_logprobs;
  output.prompt_logprobs = event.prompt_logprobs;
}

void Exchange::apply(const engine::RequestEvent& event) {
  if (event.index < 0 || event.index >= static_cast<int32_t>(choices.size())) return;
  ChoiceState& choice = choices[static_cast<size_t>(event.index)];
  if (!event.token_ids.empty() && !first_token) first_token = Clock::now();
  // Each prompt's cached tokens once (its first choice), summed over the batch.
  if (event.num_prompt_tokens > 0 && event.index % request.params.n == 0)
    usage.cached_tokens += event.num_cached_tokens;
  usage.completion_tokens += static_cast<int64_t>(event.token_ids.size());
  if (request.echo && !choice.received_first) echo_prompt(event, choice.output);
  if (!choice.received_first) take_prompt_logprobs(event, choice.output);
  choice.received_first = true;
  choice.output.text += event.text;
  choice.output.logprobs.insert(choice.output.logprobs.end(), event.logprobs.begin(),
                                event.logprobs.end());
  if (event.finished() && !choice.finished) {
    choice.finished = true;
    choice.output.finish_reason = event.finish_reason;
    ++num_finished;
    if (event.finish_reason == engine::FinishReason::kError && error.empty()) {
      error = event.error.empty() ? "the engine could not serve the request" : event.error;
    }
  }
}

void Exchange::complete(bool cancelled) {
  if (completed) return;
  completed = true;
  const Clock::time_point end = Clock::now();
  detail::RequestRecord record;
  std::string reasons;
  for (const ChoiceState& choice : choices) {
    const char* name = detail::finish_reason_name(choice.output.finish_reason);
    if (!reasons.empty()) reasons += ',';
    reasons += cancelled && !choice.finished ? "cancelled" : (name ? name : "none");
  }
  record.finish_reason = cancelled ? "cancelled" : reasons.substr(0, reasons.find(','));
  record.prompt_tokens = usage.prompt_tokens;
  record.completion_tokens = usage.completion_tokens;
  record.ttft_seconds = first_token ? seconds(*first_token - start) : -1.0;
  record.e2e_seconds = seconds(end - start);
  server->metrics.record(record);
  if (server->config.log_requests) {
    server->log(fmt::format(
        "request {} prompt_tokens={} completion_tokens={} ttft_ms={} total_ms={:.1f} finish={}",
        head.id, usage.prompt_tokens, usage.completion_tokens,
        first_token ? fmt::format("{:.1f}", record.ttft_seconds * 1e3) : std::string("-"),
        record.e2e_seconds * 1e3, reasons));
  }
  server->pending.fetch_sub(static_cast<int64_t>(request.prompts.size()));
}

std::string Exchange::stream_text(const engine::RequestEvent& event) {
  ChoiceState& choice = choices[static_cast<size_t>(event.index)];
  std::string text;
  if (event.finish_reason == engine::FinishReason::kError) {
    ApiError api;
    api.status = 500;
    api.type = "server_error";
    api.message = event.error.empty() ? "the engine could not serve the request" : event.error;
    text += detail::error_event(api);
  }
  detail::ChoiceOutput piece;
  piece.index = event.index;
  piece.text = event.text;
  piece.logprobs = event.logprobs;
  // Echo: the choice's first chunk starts with the prompt.
  if (request.echo && !choice.sent_first) echo_prompt(event, piece);
  if (!choice.sent_first) take_prompt_logprobs(event, piece);
  const bool has_content =
      !piece.text.empty() || !piece.logprobs.empty() || piece.has_prompt_logprobs;
  if (!choice.sent_first && head.endpoint == Endpoint::kChat) {
    // The role comes first, alone, as OpenAI sends it.
    detail::ChoiceOutput role;
    role.index = event.index;
    text += detail::chunk_event(head, role, true, false, request.include_usage, server->front,
                                choice.offset);
    choice.sent_first = true;
  }
  choice.sent_first = true;
  if (choice.tools) {
    text += stream_tool_pieces(choice, piece, event.finished());
  } else if (has_content) {
    text += detail::chunk_event(head, piece, false, request.logprobs, request.include_usage,
                                server->front, choice.offset);
  }
  if (event.finished()) {
    detail::ChoiceOutput last;
    last.index = event.index;
    last.finish_reason = event.finish_reason;
    last.called_tools = choice.num_tool_calls > 0;
    text += detail::chunk_event(head, last, false, false, request.include_usage, server->front,
                                choice.offset);
  }
  return text;
}

std::string Exchange::stream_tail() const {
  std::string text;
  if (request.include_usage) text += detail::usage_event(head, usage);
  return text + detail::kDoneEvent;
}

void Server::Impl::handle_generate(const httplib::Request& http_request,
                                   httplib::Response& response, Endpoint endpoint) {
  const Clock::time_point start = Clock::now();
  if (draining.load()) {
    send_error(response, {503, "the server is shutting down", "server_error", "", "shutting_down"});
    return;
  }
  std::variant<PreparedRequest, ApiError> prepared =
      prepare_request(http_request.body, endpoint, context);
  if (auto* error = std::get_if<ApiError>(&prepared)) {
    send_error(response, *error);
    return;
  }
  // Each prompt of a batch is an engine request and takes its own place in the queue.
  const auto slots = static_cast<int64_t>(std::get<PreparedRequest>(prepared).prompts.size());
  if (pending.fetch_add(slots) + slots > config.max_pending_requests) {
    pending.fetch_sub(slots);
    send_error(response, {503,
                          fmt::format("the server's queue is full ({} requests pending); retry "
                                      "later",
                                      config.max_pending_requests),
                          "server_error", "", "queue_full"});
    return;
  }
  auto exchange = std::make_shared<Exchange>();
  exchange->server = this;
  exchange->request = std::move(std::get<PreparedRequest>(prepared));
  exchange->start = start;
  exchange->last_write = start;
  const int64_t number = next_id.fetch_add(1);
  exchange->head = {endpoint,
                    fmt::format("{}-{}", endpoint == Endpoint::kChat ? "chatcmpl" : "cmpl", number),
                    static_cast<int64_t>(std::time(nullptr)), exchange->request.model};
  for (const std::vector<int32_t>& prompt : exchange->request.prompts) {
    exchange->usage.prompt_tokens += static_cast<int64_t>(prompt.size());
  }
  exchange->choices.resize(exchange->request.prompts.size() *
                           static_cast<size_t>(exchange->request.params.n));
  for (size_t i = 0; i < exchange->choices.size(); ++i) {
    exchange->choices[i].output.index = static_cast<int32_t>(i);
  }
  exchange->start_tool_parsers();
  try {
    exchange->enqueue(engine);
  } catch (const Error& error) {
    pending.fetch_sub(slots);
    send_error(response, {400, error.what(), "invalid_request_error", "", "invalid_value"});
    return;
  }
  engine::RequestStream& stream = *exchange->stream;

  if (!exchange->request.stream) {
    // The client is looked for after the first check interval, so a short request never pays
    // for the lookup; then polled once per interval.
    std::optional<detail::ClientWatch> client;
    Clock::time_point next_check = Clock::now() + kClientCheckInterval;
    while (!stream.done()) {
      if (auto event = stream.pop(kClientCheckInterval)) exchange->apply(*event);
      if (stream.done() || Clock::now() < next_check) continue;
      next_check = Clock::now() + kClientCheckInterval;
      if (!client) client.emplace(http_request);
      if (client->gone()) {
        exchange->abort(engine);
        exchange->complete(true);
        // Nobody reads this answer; 499 (nginx's "client closed request") is what the metrics
        // count for it.
        send_error(response, {499, "the client closed the connection before the answer",
                              "invalid_request_error", "", "client_closed_request"});
        return;
      }
    }
    exchange->complete(false);
    if (!exchange->error.empty() && exchange->usage.completion_tokens == 0) {
      send_error(response, {500, exchange->error, "server_error", "", "engine_error"});
      return;
    }
    exchange->parse_tool_calls();
    std::vector<detail::ChoiceOutput> outputs;
    for (const Exchange::ChoiceState& choice : exchange->choices) outputs.push_back(choice.output);
    response.set_header("X-Request-Id", exchange->head.id);
    response.set_content(
        detail::completion_body(exchange->head, outputs, exchange->request.logprobs,
                                exchange->usage, front),
        "application/json");
    return;
  }

  metrics.set_open_streams(open_streams.fetch_add(1) + 1);
  response.set_header("Cache-Control", "no-cache");
  response.set_header("X-Request-Id", exchange->head.id);
  const auto keep_alive = config.keep_alive_interval;
  response.set_chunked_content_provider(
      "text/event-stream",
      [exchange, keep_alive](size_t, httplib::DataSink& sink) {
        engine::RequestStream& events = *exchange->stream;
        std::string text;
        if (auto event = events.pop(std::chrono::milliseconds(20))) {
          do {
            exchange->apply(*event);
            text += exchange->stream_text(*event);
          } while ((event = events.try_pop()));
        }
        const Clock::time_point now = Clock::now();
        if (exchange->all_finished()) {
          // Recorded before the last bytes go out, so that a client that read [DONE] finds the
          // request in /metrics; the request is served whether or not they arrive.
          exchange->complete(false);
          text += exchange->stream_tail();
          if (!sink.write(text.data(), text.size())) return false;
          sink.done();
          return true;
        }
        if (text.empty() && now - exchange->last_write >= keep_alive) text = ": keep-alive\n\n";
        if (!text.empty()) {
          if (!sink.write(text.data(), text.size())) return false;
          exchange->last_write = now;
        }
        return true;
      },
      [exchange, this](bool) {
        if (!exchange->completed) {
          exchange->abort(engine);
          exchange->complete(true);
        }
        metrics.set_open_streams(open_streams.fetch_sub(1) - 1);
      });
}

}  // namespace pagedattn::server
