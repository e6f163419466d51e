// A minimal HTTP/1.1 endpoint for Prometheus: GET /metrics, answered on the caller's
// io_context (the store server's own thread, so the stats are read without locking).
// Bounded like the store it watches: a few connections at once, a small request, a
// deadline for the whole exchange, one answer per connection (Connection: close); a
// slow or hostile client holds one of those few slots for the deadline at most.
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace rdzv::metrics {

struct HttpOptions {
  std::string host = "0.0.0.0";
  uint16_t port = 0;                           // 0: an ephemeral port, see HttpServer::port()
  size_t max_connections = 8;                  // more at once are answered 503 and closed
  size_t max_request = 8192;                   // bytes of request line and headers (431 past it)
  std::chrono::milliseconds deadline{5000};    // from accept to the last byte of the answer
};

class HttpListener;

class HttpServer {
 public:
  // Binds and listens at once; throws StoreError when it cannot (port in use, bad host).
  // `render` makes the body of each GET /metrics, on the io_context's thread.
  HttpServer(boost::asio::io_context& io, HttpOptions options, std::function<std::string()> render);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  uint16_t port() const;
  // Stops accepting; exchanges under way end by their deadline at the latest.
  void stop();

 private:
  std::shared_ptr<HttpListener> impl_;
};

}  // namespace rdzv::metrics
