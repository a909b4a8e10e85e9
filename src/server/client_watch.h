// Whether the client of a request is still connected, for a handler that waits without writing
// (a non-streaming completion: nothing is sent until the whole answer is there, so no failed
// write can tell that the client left, as it does for a stream).
//
// cpp-httplib 0.11 gives a handler neither its socket nor its stream, and its per-connection
// hook (process_and_close_socket) is private. The request does carry both ends' addresses, and
// a live TCP connection is the only socket with that pair, so the watch finds the socket by
// them among the process's descriptors (/proc/self/fd; once per request, a few microseconds per
// open descriptor). The socket stays httplib's: the watch only polls it (never reads, writes or
// closes it), and it cannot be closed under the watch because httplib closes it only after the
// handler returns.
//
// Gone means: the client closed its end (EOF: a close or a shutdown of its sending side), or the
// connection was reset. Bytes waiting on the socket (a pipelined next request) are not a sign of
// leaving. Internal to the server layer.
#pragma once

#include <httplib.h>

namespace pagedattn::server::detail {

class ClientWatch {
 public:
  // Looks the socket up; found() is false if no socket has the request's addresses (then gone()
  // is always false: the request runs to its end as before).
  explicit ClientWatch(const httplib::Request& request);
  bool found() const { return socket_ >= 0; }
  // Polls without blocking.
  bool gone() const;

 private:
  int socket_ = -1;
};

}  // namespace pagedattn::server::detail
