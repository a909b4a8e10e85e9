// ClientWatch (client_watch.h): the request's socket found by its two addresses, polled for
// the client's leaving.
#include "client_watch.h"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <string>

namespace pagedattn::server::detail {
namespace {

struct Address {
  sockaddr_storage storage{};
  socklen_t length = sizeof(sockaddr_storage);
};

int port_of(const Address& address) {
  if (address.storage.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in&>(address.storage).sin_port);
  }
  if (address.storage.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6&>(address.storage).sin6_port);
  }
  return -1;
}

// The numeric host as cpp-httplib writes it into Request::remote_addr / local_addr.
std::string host_of(const Address& address) {
  char host[NI_MAXHOST];
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&address.storage), address.length, host,
                    sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0) {
    return {};
  }
  return host;
}

bool matches(int descriptor, const httplib::Request& request) {
  Address local;
  if (::getsockname(descriptor, reinterpret_cast<sockaddr*>(&local.storage), &local.length) != 0 ||
      port_of(local) != request.local_port) {
    return false;  // not a socket, or not one of the server's connections
  }
  Address peer;
  if (::getpeername(descriptor, reinterpret_cast<sockaddr*>(&peer.storage), &peer.length) != 0 ||
      port_of(peer) != request.remote_port) {
    return false;  // the listening socket, or another client's connection
  }
  return host_of(peer) == request.remote_addr && host_of(local) == request.local_addr;
}

}  // namespace

ClientWatch::ClientWatch(const httplib::Request& request) {
  if (request.remote_port <= 0 || request.local_port <= 0) return;
  DIR* directory = ::opendir("/proc/self/fd");
  if (directory == nullptr) return;
  const int own = ::dirfd(directory);
  while (const dirent* entry = ::readdir(directory)) {
    char* end = nullptr;
    const long descriptor = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || descriptor == own) continue;
    if (matches(static_cast<int>(descriptor), request)) {
      socket_ = static_cast<int>(descriptor);
      break;
    }
  }
  ::closedir(directory);
}

bool ClientWatch::gone() const {
  if (socket_ < 0) return false;
  pollfd entry{socket_, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (::poll(&entry, 1, 0) <= 0) return false;
  if ((entry.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0) return true;
  if ((entry.revents & POLLIN) != 0) {
    // Readable: EOF (0) or an error means gone; bytes (a pipelined request) do not.
    char byte = 0;
    const ssize_t got = ::recv(socket_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (got == 0) return true;
    if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
  }
  return false;
}

}  // namespace pagedattn::server::detail
