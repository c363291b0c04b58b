// kdm::kube::test::TestApiServer: an HTTPS server on 127.0.0.1 (ephemeral
// port) that stands in for the kube-apiserver in tests: each request is
// recorded and answered from a script (a FIFO of replies, then a handler,
// then 404). A reply can be late, can drop the connection without an
// answer, or can be a chunked stream the test feeds line by line (a watch).
// With `client_ca_pem` set it asks for and verifies a client certificate
// (mTLS) and records the client's CN.
//
// Meant for every test that needs an API server (the kube client's, `kdm
// publish`'s and the extender's end-to-end tests): it knows nothing of
// Kubernetes besides HTTP.
//
// Thread-safety: every method may be called from any thread. Handlers run on
// the server's one thread; they must not block, and they must not capture a
// test body's locals by reference (use fixture members).
//
// Example:
//   KDM_ASSIGN_OR_RETURN(auto pki, MakeTestPki());
//   auto server = TestApiServer::Start({.cert_pem = pki.server.cert_pem,
//                                       .key_pem = pki.server.key_pem});
//   (*server)->Enqueue({.status = 429, .headers = {{"Retry-After", "1"}}});
//   (*server)->Enqueue({.status = 200, .body = "{}"});
#ifndef KDM_TEST_KUBE_TEST_API_SERVER_H_
#define KDM_TEST_KUBE_TEST_API_SERVER_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/base/sync.h"

namespace kdm::kube::test {

struct RecordedRequest {
  std::string method;
  std::string target;                          // path and query, as sent
  std::string path;                            // without the query
  std::string query;                           // after '?', or ""
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;
  std::string client_cn;  // the client certificate's CN (mTLS), or ""
  std::string sni;        // the TLS server name the client sent, or ""
};

// The body of a streamed (chunked) reply, written by the test while the
// client reads it. Send() writes one chunk; End() writes the last chunk
// (the body ends properly); Drop() closes the connection mid-stream.
class WatchFeed {
 public:
  void Send(std::string text);
  void End();
  void Drop();
  // True once a connection has started streaming this feed.
  bool attached() const;
  // True once the connection that streamed this feed has gone (closed by
  // either side, or the server stopped).
  bool detached() const;

  // For the server: what to write next, and a waker called on Send/End/Drop
  // (nullptr detaches the connection; later calls only queue).
  struct Next {
    std::deque<std::string> chunks;
    bool end = false;
    bool drop = false;
  };
  Next TakeForServer();
  void AttachForServer(std::function<void()> wake);

 private:
  void Wake() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  mutable Mutex mu_;
  std::deque<std::string> pending_ ABSL_GUARDED_BY(mu_);
  bool end_ ABSL_GUARDED_BY(mu_) = false;
  bool drop_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> wake_ ABSL_GUARDED_BY(mu_);
  bool detached_ ABSL_GUARDED_BY(mu_) = false;
};

struct Reply {
  int status = 200;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // Wait this long before answering (or dropping).
  std::chrono::milliseconds delay{0};
  // Close the connection instead of answering.
  bool drop = false;
  // Stream the body from this feed (chunked) instead of `body`.
  std::shared_ptr<WatchFeed> feed;
};

class TestApiServer {
 public:
  struct Options {
    std::string cert_pem;
    std::string key_pem;
    // Set: require a client certificate signed by this CA.
    std::string client_ca_pem;
    // The port to listen on; 0 picks a free one. A test that restarts a
    // stopped server on its old port passes that port here.
    uint16_t port = 0;
  };
  using Handler = std::function<Reply(const RecordedRequest&)>;

  static StatusOr<std::unique_ptr<TestApiServer>> Start(Options options);
  virtual ~TestApiServer() = default;

  // Closes every connection and joins the server's thread. Idempotent.
  virtual void Stop() = 0;
  virtual uint16_t port() const = 0;
  // "https://127.0.0.1:<port>"
  std::string url() const { return "https://127.0.0.1:" + std::to_string(port()); }

  // The next request is answered with `reply` (FIFO, before the handler).
  virtual void Enqueue(Reply reply) = 0;
  // Answers requests when the FIFO is empty (default: 404).
  virtual void SetHandler(Handler handler) = 0;

  virtual std::vector<RecordedRequest> Requests() const = 0;
  virtual size_t RequestCount() const = 0;
  // TLS handshakes that failed (a client that refused our certificate, or
  // one without a certificate when mTLS is on).
  virtual size_t FailedHandshakes() const = 0;
};

}  // namespace kdm::kube::test

#endif  // KDM_TEST_KUBE_TEST_API_SERVER_H_
