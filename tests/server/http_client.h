// The tests' own HTTP/1.1 client over plain loopback sockets (no HTTP library, so the server is
// checked against an implementation that shares nothing with it): one request per connection
// (Connection: close), the response read to EOF, chunked bodies decoded; and a streaming reader
// that hands each SSE "data:" payload to a callback as it arrives and can hang up at any point.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace pagedattn::server::testing {

struct HttpResponse {
  int status = 0;                              // 0: no response (connection failed or closed early)
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;                            // de-chunked
};

// Connects to 127.0.0.1:port; -1 on failure. Receive timeout `timeout_seconds`.
int connect_loopback(int port, int timeout_seconds = 30);
bool send_all(int socket, const std::string& data);

HttpResponse http_request(int port, const std::string& method, const std::string& path,
                          const std::string& body = {},
                          const std::vector<std::string>& extra_headers = {});
// Sends `raw` as is (a whole request, possibly malformed) and reads the response.
HttpResponse raw_request(int port, const std::string& raw);

struct StreamResult {
  int status = 0;
  std::vector<std::string> events;  // "data:" payloads in order ("[DONE]" included)
  std::string body;                 // the whole de-chunked body
  bool hung_up = false;             // the callback asked to stop
  std::string failure;  // why no complete stream: connect / send / recv errno text; empty if ok
};

// POSTs `body` to `path` and reads the SSE stream; `on_event(payload)` returning false closes the
// connection at once (a client going away).
StreamResult stream_request(int port, const std::string& path, const std::string& body,
                            const std::function<bool(const std::string&)>& on_event = {});

// Parses a response head + de-chunks a body; exposed for the client's own checks.
HttpResponse parse_response(const std::string& raw);

}  // namespace pagedattn::server::testing
