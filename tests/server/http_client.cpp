// The tests' HTTP client (http_client.h): blocking loopback sockets, an incremental chunked
// decoder, and SSE events split on blank lines.
#include "server/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

namespace pagedattn::server::testing {

int connect_loopback(int port, int timeout_seconds) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval timeout{timeout_seconds, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int attempt = 0; attempt < 50; ++attempt) {
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) return fd;
    if (errno != ECONNREFUSED && errno != EAGAIN && errno != EINTR) break;
    ::usleep(20000);
  }
  ::close(fd);
  return -1;
}

bool send_all(int socket, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(socket, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return false;
    }
    sent += static_cast<size_t>(n);
  }
  return true;
}

namespace {

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

// Parses the head (status line + headers) of `raw` up to "\r\n\r\n"; returns the body offset or
// npos when the head is incomplete.
size_t parse_head(const std::string& raw, HttpResponse& response) {
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) return std::string::npos;
  size_t line_end = raw.find("\r\n");
  const std::string status_line = raw.substr(0, line_end);
  const size_t space = status_line.find(' ');
  response.status = space == std::string::npos ? 0 : std::atoi(status_line.c_str() + space + 1);
  size_t position = line_end + 2;
  while (position < end) {
    line_end = raw.find("\r\n", position);
    const std::string line = raw.substr(position, line_end - position);
    const size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      response.headers[lower(line.substr(0, colon))] = value;
    }
    position = line_end + 2;
  }
  return end + 4;
}

// Incremental chunked decoding: consumes whole chunks from `input` into `output`; true once the
// last (zero) chunk was seen.
bool dechunk(std::string& input, std::string& output) {
  for (;;) {
    const size_t line_end = input.find("\r\n");
    if (line_end == std::string::npos) return false;
    const size_t size = std::stoul(input.substr(0, line_end), nullptr, 16);
    if (size == 0) return true;
    if (input.size() < line_end + 2 + size + 2) return false;
    output += input.substr(line_end + 2, size);
    input.erase(0, line_end + 2 + size + 2);
  }
}

}  // namespace

HttpResponse parse_response(const std::string& raw) {
  HttpResponse response;
  const size_t body = parse_head(raw, response);
  if (body == std::string::npos) return HttpResponse{};
  std::string rest = raw.substr(body);
  if (lower(response.headers["transfer-encoding"]) == "chunked") {
    dechunk(rest, response.body);
  } else {
    response.body = rest;
  }
  return response;
}

HttpResponse raw_request(int port, const std::string& raw) {
  const int fd = connect_loopback(port);
  if (fd < 0) return {};
  std::string received;
  if (send_all(fd, raw)) {
    char buffer[16384];
    for (;;) {
      const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) break;
      received.append(buffer, static_cast<size_t>(n));
      // A server may keep the connection open (keep-alive); a response whose length is known
      // is complete once that many body bytes are in.
      HttpResponse head;
      const size_t body = parse_head(received, head);
      if (body != std::string::npos && head.headers.contains("content-length") &&
          received.size() - body >= std::stoul(head.headers["content-length"])) {
        break;
      }
    }
  }
  ::close(fd);
  return parse_response(received);
}

HttpResponse http_request(int port, const std::string& method, const std::string& path,
                          const std::string& body, const std::vector<std::string>& extra_headers) {
  std::string raw = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  for (const std::string& header : extra_headers) raw += header + "\r\n";
  if (!body.empty() || method == "POST") {
    raw +=
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  raw += "\r\n" + body;
  return raw_request(port, raw);
}

StreamResult stream_request(int port, const std::string& path, const std::string& body,
                            const std::function<bool(const std::string&)>& on_event) {
  StreamResult result;
  const int fd = connect_loopback(port);
  if (fd < 0) {
    result.failure = std::string("connect: ") + std::strerror(errno);
    return result;
  }
  const std::string raw = "POST " + path +
                          " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                          "Content-Type: application/json\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
  if (!send_all(fd, raw)) {
    result.failure = std::string("send: ") + std::strerror(errno);
    ::close(fd);
    return result;
  }
  std::string received, pending, text;
  HttpResponse head;
  size_t body_start = std::string::npos;
  bool chunked = false;
  char buffer[16384];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) {
      result.failure =
          n == 0 ? "closed by the server" : std::string("recv: ") + std::strerror(errno);
      break;
    }
    if (body_start == std::string::npos) {
      received.append(buffer, static_cast<size_t>(n));
      body_start = parse_head(received, head);
      if (body_start == std::string::npos) continue;
      result.status = head.status;
      chunked = lower(head.headers["transfer-encoding"]) == "chunked";
      pending = received.substr(body_start);
    } else {
      pending.append(buffer, static_cast<size_t>(n));
    }
    bool last = false;
    if (chunked) {
      last = dechunk(pending, text);
    } else {
      text += pending;
      pending.clear();
    }
    size_t event_end;
    while ((event_end = text.find("\n\n")) != std::string::npos) {
      const std::string event = text.substr(0, event_end);
      result.body += text.substr(0, event_end + 2);
      text.erase(0, event_end + 2);
      if (event.rfind("data: ", 0) != 0) continue;  // SSE comments and other fields
      result.events.push_back(event.substr(6));
      if (on_event && !on_event(result.events.back())) {
        result.hung_up = true;
        ::close(fd);
        return result;
      }
    }
    if (last) {
      result.failure.clear();
      break;
    }
  }
  result.body += text;
  ::close(fd);
  return result;
}

}  // namespace pagedattn::server::testing
