// The metrics endpoint: a listener that admits a few connections, and per connection
// one exchange — read the request head (bounded in bytes and time), answer, close.
#include "metrics_http.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <array>
#include <string_view>

#include "metrics_text.hpp"
#include "rdzv/store.hpp"

namespace rdzv::metrics {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

class HttpListener : public std::enable_shared_from_this<HttpListener> {
 public:
  HttpListener(asio::io_context& io, HttpOptions options, std::function<std::string()> render);
  void accept();
  void stop();

  asio::io_context& io_;
  HttpOptions options_;
  std::function<std::string()> render_;
  tcp::acceptor acceptor_;
  asio::steady_timer retry_timer_;
  size_t open_ = 0;  // exchanges under way
  bool stopped_ = false;
};

namespace {

std::string response(std::string_view status, std::string_view content_type, std::string_view body,
                     std::string_view extra_headers = "") {
  std::string r = "HTTP/1.1 ";
  r.append(status).append("\r\nContent-Type: ").append(content_type);
  r.append("\r\nContent-Length: ").append(std::to_string(body.size()));
  r.append("\r\nConnection: close\r\n").append(extra_headers).append("\r\n").append(body);
  return r;
}

std::string plain(std::string_view status, std::string_view text, std::string_view extra_headers = "") {
  return response(status, "text/plain; charset=utf-8", std::string(text) + "\n", extra_headers);
}

// One connection: its request head, then one answer, then it closes. Everything it
// does ends by the deadline, counted from accept.
class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(tcp::socket socket, std::shared_ptr<HttpListener> listener)
      : socket_(std::move(socket)), listener_(std::move(listener)), deadline_(listener_->io_) {
    ++listener_->open_;
  }
  ~Exchange() { --listener_->open_; }

  void start() {
    deadline_.expires_after(listener_->options_.deadline);
    deadline_.async_wait([weak = weak_from_this()](const error_code& ec) {
      if (auto self = weak.lock(); self && !ec) self->close();  // the pending read or write ends aborted
    });
    read();
  }

 private:
  void read() {
    size_t room = std::min(chunk_.size(), listener_->options_.max_request - head_.size());
    socket_.async_read_some(asio::buffer(chunk_.data(), room), [self = shared_from_this()](const error_code& ec, size_t n) {
      if (ec || self->closed_) return self->close();
      self->head_.append(self->chunk_.data(), n);
      if (self->head_.find("\r\n\r\n") != std::string::npos) return self->answer();
      if (self->head_.size() >= self->listener_->options_.max_request) {
        return self->reply(plain("431 Request Header Fields Too Large", "request head over " +
                                 std::to_string(self->listener_->options_.max_request) + " bytes"));
      }
      self->read();
    });
  }

  // "GET /metrics HTTP/1.1": the method, the path (its query ignored), the version.
  void answer() {
    std::string_view line(head_.data(), head_.find("\r\n"));
    size_t sp1 = line.find(' ');
    size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp2 == std::string_view::npos || line.substr(sp2 + 1).substr(0, 7) != "HTTP/1.") {
      return reply(plain("400 Bad Request", "expected a request line like 'GET /metrics HTTP/1.1'"));
    }
    std::string_view method = line.substr(0, sp1);
    std::string_view path = line.substr(sp1 + 1, sp2 - sp1 - 1);
    path = path.substr(0, path.find('?'));
    if (path != "/metrics") return reply(plain("404 Not Found", "not found: this endpoint serves GET /metrics"));
    if (method != "GET") return reply(plain("405 Method Not Allowed", "only GET is served", "Allow: GET\r\n"));
    std::string body;
    try {
      body = listener_->render_();
    } catch (const std::exception& e) {
      return reply(plain("500 Internal Server Error", e.what()));
    }
    reply(response("200 OK", kContentType, body));
  }

  void reply(std::string text) {
    out_ = std::move(text);
    asio::async_write(socket_, asio::buffer(out_), [self = shared_from_this()](const error_code&, size_t) {
      self->close();
    });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    deadline_.cancel();
  }

  tcp::socket socket_;
  std::shared_ptr<HttpListener> listener_;
  asio::steady_timer deadline_;
  std::array<char, 1024> chunk_{};
  std::string head_;  // request line and headers, up to options.max_request bytes
  std::string out_;
  bool closed_ = false;
};

}  // namespace

HttpListener::HttpListener(asio::io_context& io, HttpOptions options, std::function<std::string()> render)
    : io_(io), options_(std::move(options)), render_(std::move(render)), acceptor_(io), retry_timer_(io) {
  error_code ec;
  auto address = asio::ip::make_address(options_.host, ec);
  if (ec) throw StoreError("metrics: bad listen address '" + options_.host + "': " + ec.message());
  tcp::endpoint endpoint(address, options_.port);
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw StoreError("metrics: cannot listen on " + options_.host + ":" + std::to_string(options_.port) + ": " +
                     ec.message());
  }
}

void HttpListener::accept() {
  acceptor_.async_accept([self = shared_from_this()](const error_code& ec, tcp::socket socket) {
    if (self->stopped_ || ec == asio::error::operation_aborted) return;
    if (ec) {  // out of descriptors and the like: the backlog holds them; try again shortly
      self->retry_timer_.expires_after(std::chrono::milliseconds(100));
      self->retry_timer_.async_wait([self](const error_code& e) {
        if (!e && !self->stopped_) self->accept();
      });
      return;
    }
    if (self->open_ >= self->options_.max_connections) {
      // Busy: said without waiting for the peer to read it, then closed.
      std::string busy = plain("503 Service Unavailable", "too many metrics connections at once");
      error_code ignored;
      socket.non_blocking(true, ignored);
      socket.write_some(asio::buffer(busy), ignored);
      socket.close(ignored);
    } else {
      try {
        std::make_shared<Exchange>(std::move(socket), self)->start();
      } catch (const std::exception&) {  // no memory for it: this scrape is dropped, the store goes on
      }
    }
    self->accept();
  });
}

void HttpListener::stop() {
  stopped_ = true;
  error_code ignored;
  acceptor_.close(ignored);
  retry_timer_.cancel();
}

HttpServer::HttpServer(asio::io_context& io, HttpOptions options, std::function<std::string()> render)
    : impl_(std::make_shared<HttpListener>(io, std::move(options), std::move(render))) {
  impl_->accept();
}

HttpServer::~HttpServer() { impl_->stop(); }

uint16_t HttpServer::port() const { return impl_->acceptor_.local_endpoint().port(); }

void HttpServer::stop() { impl_->stop(); }

}  // namespace rdzv::metrics
