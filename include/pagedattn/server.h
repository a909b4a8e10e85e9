// The OpenAI-compatible HTTP server over an engine (engine.h) and a text front
// (server_protocol.h): POST /v1/chat/completions, POST /v1/completions, GET /v1/models,
// GET /health, GET /metrics (Prometheus text).
//
// Threads: cpp-httplib accepts on one thread and serves each connection on a pool thread, which
// parses, validates, enqueues into the engine and then streams that request's events (a pool
// thread is held for as long as its connection is open, so the pool has max_connections
// threads: that many streams at once, the rest wait for a thread). One engine thread calls
// Engine::step() in a loop. A streaming client that goes away fails a write; its request is
// aborted and its pages are freed at the engine's next step boundary. Streams that produce no
// event for a while send an SSE comment line, so a client gone while its request waits is found
// too. A non-streaming request's handler polls its client's socket while it waits (every 20 ms):
// a client that closed the connection gets its request aborted the same way.
//
// shutdown(): new requests get 503, running ones finish within the grace period, whatever
// remains is aborted (its streams end with finish_reason "abort"), then the HTTP and engine
// threads are joined and the prefix cache cleared: every page is free again (reported).
//
// The server takes the engine and the text front already built; it never owns a model.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "pagedattn/engine.h"
#include "pagedattn/server_protocol.h"

namespace pagedattn::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: a free port, see Server::port()
  std::string model_name = "pagedattn";
  size_t max_body_bytes = size_t{4} << 20;  // larger bodies: 413
  int32_t max_connections = 1024;           // HTTP pool threads (open streams served at once)
  int64_t max_pending_requests = 4096;      // engine requests (prompts) at once; beyond: 503
  std::chrono::milliseconds keep_alive_interval{500};  // SSE comment after this much silence
  int read_timeout_seconds = 10;  // a client silent this long while sending is dropped
  bool log_requests = true;
  // How the model writes tool calls (server_tool_calls.h; `serve --tool-call-parser`). kNone: a
  // chat request with tools is served only with tool_choice "none".
  ToolCallFormat tool_call_format = ToolCallFormat::kNone;
  // Where log lines go (one line each, no newline); default: stderr.
  std::function<void(const std::string& line)> log;
};

struct ShutdownReport {
  int64_t num_aborted = 0;     // requests still running when the grace period ended
  int32_t num_pages = 0;       // the engine's pool
  int32_t num_free_pages = 0;  // after clearing the prefix cache: num_pages unless a leak
};

class Server {
 public:
  // `engine` and `front` must outlive the server; nothing else may step the engine meanwhile.
  Server(ServerConfig config, engine::Engine& engine, const TextFront& front);
  ~Server();  // shutdown(0) if still running
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds (throws Error naming host and port if it cannot) and starts the threads. Ignores
  // SIGPIPE for the process (a write to a closed socket must fail, not kill it).
  void start();
  int port() const;
  bool running() const;
  ShutdownReport shutdown(std::chrono::milliseconds grace);

  // The /metrics text (also callable directly).
  std::string metrics_text() const;

  struct Impl;  // src/server/server_impl.h

 private:
  std::unique_ptr<Impl> impl_;
};

// Installs handlers for SIGINT and SIGTERM (once per process; they stay installed) and returns
// a function that waits until one of them arrives and returns its number. Safe whichever thread
// the kernel delivers the signal to, and whenever other threads were started. For
// `pagedattn serve`: main waits, then calls shutdown().
std::function<int()> install_shutdown_signals();

}  // namespace pagedattn::server
