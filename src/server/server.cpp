// The server (server.h): routes, the cpp-httplib configuration (a pool of max_connections
// threads, the body limit, timeouts, OpenAI-shaped bodies for the errors httplib answers by
// itself), the engine thread, and the graceful shutdown.
#include "pagedattn/server.h"

#include <fmt/format.h>
#include <sys/socket.h>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>
#include <cstdio>
#include <ctime>

#include "core/check.h"
#include "pagedattn/page_allocator.h"
#include "server_impl.h"

namespace pagedattn::server {

Server::Impl::Impl(ServerConfig config_in, engine::Engine& engine_in, const TextFront& front_in)
    : config(std::move(config_in)), engine(engine_in), front(front_in) {
  context.model_name = config.model_name;
  context.limits = engine.limits();
  context.front = &front;
  context.tool_call_format = config.tool_call_format;
}

void Server::Impl::log(const std::string& line) const {
  if (config.log) {
    config.log(line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

void Server::Impl::send_error(httplib::Response& response, const ApiError& error) const {
  response.status = error.status;
  response.set_content(error_body(error), "application/json");
}

void Server::Impl::install_routes() {
  http.Post("/v1/chat/completions",
            [this](const httplib::Request& request, httplib::Response& response) {
              handle_generate(request, response, Endpoint::kChat);
            });
  http.Post("/v1/completions",
            [this](const httplib::Request& request, httplib::Response& response) {
              handle_generate(request, response, Endpoint::kCompletions);
            });
  const auto model_json = [this] {
    return detail::Json{{"id", config.model_name},
                        {"object", "model"},
                        {"created", static_cast<int64_t>(std::time(nullptr))},
                        {"owned_by", "pagedattn"},
                        {"max_model_len", context.limits.max_model_length}};
  };
  http.Get("/v1/models", [model_json](const httplib::Request&, httplib::Response& response) {
    const detail::Json body = {{"object", "list"}, {"data", detail::Json::array({model_json()})}};
    response.set_content(detail::dump(body), "application/json");
  });
  http.Get("/v1/models/(.+)", [this, model_json](const httplib::Request& request,
                                                 httplib::Response& response) {
    if (request.matches[1] != config.model_name) {
      send_error(
          response,
          {404, fmt::format("The model `{}` does not exist", std::string(request.matches[1])),
           "invalid_request_error", "model", "model_not_found"});
      return;
    }
    response.set_content(detail::dump(model_json()), "application/json");
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& response) {
    if (draining.load()) {
      send_error(response,
                 {503, "the server is shutting down", "server_error", "", "shutting_down"});
      return;
    }
    response.set_content("{\"status\":\"ok\"}", "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(metrics.render(engine.stats(), pending.load()),
                         "text/plain; version=0.0.4; charset=utf-8");
  });
  // httplib answers some errors itself (no route, body over the limit, an unparsable request)
  // with an empty body; those get OpenAI's error shape. Bodies the handlers wrote are kept.
  http.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& request,
             httplib::Response& response) -> httplib::Server::HandlerResponse {
        if (!response.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        ApiError error;
        error.status = response.status;
        if (response.status == 404) {
          error.message = fmt::format("not found: {} {}", request.method, request.path);
          error.code = "not_found";
        } else if (response.status == 413) {
          error.message =
              fmt::format("the request body exceeds the limit of {} bytes", config.max_body_bytes);
          error.code = "request_too_large";
        } else {
          error.message =
              fmt::format("the HTTP request could not be served (status {})", response.status);
          if (response.status >= 500) error.type = "server_error";
        }
        send_error(response, error);
        return httplib::Server::HandlerResponse::Handled;
      }));
  http.set_exception_handler(
      [this](const httplib::Request&, httplib::Response& response, std::exception_ptr pointer) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(pointer);
        } catch (const std::exception& error) {
          what = error.what();
        } catch (...) {
        }
        log(fmt::format("error: a handler threw: {}", what));
        send_error(response, {500, "internal error: " + what, "server_error", "", ""});
      });
  // Counted before the response is written (httplib calls the post-routing handler just before
  // the status line; its logger only after the body): a client that has read an answer finds it
  // in /metrics already.
  http.set_post_routing_handler([this](const httplib::Request&, httplib::Response& response) {
    metrics.record_status(response.status);
  });
}

void Server::Impl::engine_loop() {
  while (!engine_stop.load()) {
    bool worked = false;
    try {
      worked = engine.step();
    } catch (const std::exception& error) {
      log(fmt::format("error: engine step failed: {}; aborting every request", error.what()));
      engine.abort_all();
    }
    if (!worked) {
      if (engine.has_work()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      } else {
        engine.wait_for_work(std::chrono::milliseconds(50));
      }
    }
  }
  // Whatever is left (only after the grace period and the abort) is aborted and drained, so the
  // pages come back before the caller checks them.
  engine.abort_all();
  for (int step = 0; step < 100000; ++step) {
    try {
      engine.step();
    } catch (const std::exception&) {
    }
    if (!engine.has_work()) break;
  }
}

Server::Server(ServerConfig config, engine::Engine& engine, const TextFront& front)
    : impl_(std::make_unique<Impl>(std::move(config), engine, front)) {}

Server::~Server() {
  if (impl_->started.load() && !impl_->stopped.load()) shutdown(std::chrono::milliseconds(0));
}

void Server::start() {
  Impl& impl = *impl_;
  PA_CHECK(!impl.started.load(), "server: start() called twice");
  PA_CHECK(impl.config.max_connections >= 1, "max_connections: {} (expected >= 1)",
           impl.config.max_connections);
  std::signal(SIGPIPE, SIG_IGN);
  const size_t threads = static_cast<size_t>(impl.config.max_connections);
  impl.http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  impl.http.set_payload_max_length(impl.config.max_body_bytes);
  impl.http.set_read_timeout(impl.config.read_timeout_seconds, 0);
  impl.http.set_write_timeout(10, 0);
  impl.http.set_keep_alive_max_count(1000);
  impl.http.set_tcp_nodelay(true);
  impl.install_routes();
  if (impl.config.port == 0) {
    impl.bound_port = impl.http.bind_to_any_port(impl.config.host);
  } else {
    impl.bound_port =
        impl.http.bind_to_port(impl.config.host, impl.config.port) ? impl.config.port : -1;
  }
  PA_CHECK(impl.bound_port > 0, "server: cannot listen on {}:{} (address in use or invalid?)",
           impl.config.host, impl.config.port);
  ::listen(impl.http.listening_socket(), SOMAXCONN);
  impl.started = true;
  impl.engine_thread = std::thread([&impl] { impl.engine_loop(); });
  impl.http_thread = std::thread([&impl] { impl.http.listen_after_bind(); });
  // stop() is a no-op until the accept loop runs, so shutdown must not be able to come first.
  while (!impl.http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  impl.log(fmt::format("pagedattn server: model {} on http://{}:{} ({} connection threads)",
                       impl.config.model_name, impl.config.host, impl.bound_port, threads));
}

int Server::port() const { return impl_->bound_port; }

bool Server::running() const { return impl_->started.load() && !impl_->stopped.load(); }

std::string Server::metrics_text() const {
  return impl_->metrics.render(impl_->engine.stats(), impl_->pending.load());
}

ShutdownReport Server::shutdown(std::chrono::milliseconds grace) {
  Impl& impl = *impl_;
  std::lock_guard lock(impl.shutdown_mutex);
  ShutdownReport report;
  if (!impl.started.load() || impl.stopped.load()) return report;
  impl.draining = true;
  const Clock::time_point deadline = Clock::now() + grace;
  while (impl.pending.load() > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  report.num_aborted = impl.pending.load();
  if (report.num_aborted > 0) {
    impl.log(fmt::format("shutdown: aborting {} requests still running", report.num_aborted));
    impl.engine.abort_all();
    // The aborted streams send their last chunk and [DONE]; a client that stopped reading is
    // cut off by the write timeout.
    const Clock::time_point limit = Clock::now() + std::chrono::seconds(15);
    while (impl.pending.load() > 0 && Clock::now() < limit) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  impl.http.stop();
  if (impl.http_thread.joinable()) impl.http_thread.join();
  impl.engine_stop = true;
  if (impl.engine_thread.joinable()) impl.engine_thread.join();
  impl.engine.clear_prefix_cache();
  report.num_pages = impl.engine.allocator().num_pages();
  report.num_free_pages = impl.engine.allocator().num_free_pages();
  impl.stopped = true;
  impl.log(fmt::format("shutdown: done; {} of {} KV pages free{}", report.num_free_pages,
                       report.num_pages,
                       report.num_free_pages == report.num_pages ? "" : " (LEAK)"));
  return report;
}

namespace {

// The write end of the pipe the handler reports a signal through; -1 when not installed.
std::atomic<int> g_signal_pipe_write{-1};

extern "C" void on_shutdown_signal(int signal_number) {
  const int saved_errno = errno;
  const int fd = g_signal_pipe_write.load(std::memory_order_relaxed);
  if (fd >= 0) {
    const unsigned char byte = static_cast<unsigned char>(signal_number);
    // A full pipe means a signal is already pending for the waiter: dropping this one is fine.
    [[maybe_unused]] const ssize_t written = ::write(fd, &byte, 1);
  }
  errno = saved_errno;
}

}  // namespace

std::function<int()> install_shutdown_signals() {
  // A handler rather than a blocked mask and sigwait: the kernel hands a process-directed
  // signal to any thread that does not block it, and threads started before the caller could
  // block anything (OpenBLAS's and OpenMP's pools start when their libraries load) would take
  // the default action and kill the process. A handler runs on whichever thread receives it.
  static std::once_flag once;
  static int read_fd = -1;
  std::call_once(once, [] {
    int fds[2];
    PA_CHECK(::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0, "serve: pipe2 failed: {}",
             std::strerror(errno));
    // The read end blocks (the waiter sleeps in read); the write end must never block a
    // handler.
    const int flags = ::fcntl(fds[0], F_GETFL);
    ::fcntl(fds[0], F_SETFL, flags & ~O_NONBLOCK);
    read_fd = fds[0];
    g_signal_pipe_write.store(fds[1]);
    struct sigaction action {};
    action.sa_handler = on_shutdown_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    for (const int signal_number : {SIGINT, SIGTERM}) {
      PA_CHECK(::sigaction(signal_number, &action, nullptr) == 0,
               "serve: sigaction({}) failed: {}", signal_number, std::strerror(errno));
    }
  });
  return [] {
    unsigned char byte = 0;
    for (;;) {
      const ssize_t got = ::read(read_fd, &byte, 1);
      if (got == 1) return static_cast<int>(byte);
      PA_CHECK(got < 0 && errno == EINTR, "serve: reading the signal pipe failed: {}",
               std::strerror(errno));
    }
  };
}

}  // namespace pagedattn::server
