// The tool-call side of one chat exchange (server_impl.h): a ToolCallParser per choice when the
// request's output is parsed (tools given, tool_choice "auto", a format known for the model).
// Non-streaming, the whole text is parsed once at the end. Streaming, each event's text goes
// through the parser and what it lets out becomes chunks in order: content deltas, and per call
// the two deltas OpenAI sends (id, type and name, then the arguments). The event's logprobs ride
// on its first chunk (on an empty delta when the parser held all of its text back). With
// parallel_tool_calls false, calls after a choice's first are dropped.
#include <random>

#include "server_impl.h"

namespace pagedattn::server {
namespace {

// "call_" and 24 letters or digits, as OpenAI's ids look.
std::string new_tool_call_id() {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 generator{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, sizeof(kAlphabet) - 2);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(generator)];
  return id;
}

void append(std::vector<ToolCallPiece>& pieces, std::vector<ToolCallPiece> more) {
  for (ToolCallPiece& piece : more) pieces.push_back(std::move(piece));
}

}  // namespace

void Exchange::start_tool_parsers() {
  if (request.tool_call_format == ToolCallFormat::kNone) return;
  for (ChoiceState& choice : choices) {
    choice.tools.emplace(request.tool_call_format);
    choice.output.parsed_tools = true;
  }
}

void Exchange::parse_tool_calls() {
  for (ChoiceState& choice : choices) {
    if (!choice.tools) continue;
    std::vector<ToolCallPiece> pieces = choice.tools->push(choice.output.text);
    append(pieces, choice.tools->finish());
    choice.output.text.clear();
    for (ToolCallPiece& piece : pieces) {
      if (!piece.call) {
        choice.output.text += piece.content;
      } else if (request.parallel_tool_calls || choice.output.tool_calls.empty()) {
        choice.output.tool_calls.push_back(
            {new_tool_call_id(), std::move(piece.call->name), std::move(piece.call->arguments)});
      }
    }
    choice.output.called_tools = !choice.output.tool_calls.empty();
  }
}

std::string Exchange::stream_tool_pieces(ChoiceState& choice, const detail::ChoiceOutput& piece,
                                         bool finished) {
  std::vector<ToolCallPiece> pieces = choice.tools->push(piece.text);
  if (finished) append(pieces, choice.tools->finish());
  std::string text;
  bool logprobs_sent = piece.logprobs.empty();
  const auto content_event = [&](std::string content) {
    detail::ChoiceOutput chunk;
    chunk.index = piece.index;
    chunk.text = std::move(content);
    if (!logprobs_sent) chunk.logprobs = piece.logprobs;
    logprobs_sent = true;
    text += detail::chunk_event(head, chunk, false, request.logprobs, request.include_usage,
                                server->front, choice.offset);
  };
  for (ToolCallPiece& part : pieces) {
    if (!part.call) {
      content_event(std::move(part.content));
      continue;
    }
    if (!request.parallel_tool_calls && choice.num_tool_calls > 0) continue;
    const detail::ToolCallOutput call{new_tool_call_id(), std::move(part.call->name),
                                      std::move(part.call->arguments)};
    text += detail::tool_call_events(head, piece.index, choice.num_tool_calls++, call,
                                     request.include_usage);
  }
  if (!logprobs_sent) content_event("");
  return text;
}

}  // namespace pagedattn::server
