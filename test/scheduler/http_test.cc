// The extender's HTTP surface over real sockets: golden requests shaped as
// kube-scheduler sends them (testdata/), bad bodies, wrong methods and
// paths, the body limit, concurrent requests, /healthz, /metrics and HTTPS.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "kdm/scheduler/extender.h"
#include "kdm/scheduler/http_server.h"
#include "kdm/scheduler/metrics.h"
#include "kdm/test/kube/test_pki.h"
#include "scheduler_test_util.h"

namespace kdm::scheduler {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using ::testing::HasSubstr;

std::string ReadTestdata(const std::string& name) {
  std::ifstream in(std::string(KDM_TEST_SOURCE_DIR) + "/test/scheduler/testdata/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct HttpReply {
  int status = 0;
  std::string body;
  std::string content_type;
};

HttpReply Send(uint16_t port, http::verb method, const std::string& target,
               const std::string& body) {
  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  stream.expires_after(std::chrono::seconds(30));
  stream.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  http::request<http::string_body> req(method, target, 11);
  req.set(http::field::host, "127.0.0.1");
  req.set(http::field::content_type, "application/json");
  req.body() = body;
  req.prepare_payload();
  http::write(stream, req);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(1ull << 30);
  beast::error_code ec;
  http::read(stream, buffer, parser, ec);
  if (ec) return {-1, ec.message(), ""};
  auto res = parser.release();
  return {static_cast<int>(res.result_int()), res.body(),
          std::string(res[http::field::content_type])};
}

HttpReply Post(uint16_t port, const std::string& target, const std::string& body) {
  return Send(port, http::verb::post, target, body);
}

class HttpTest : public ::testing::Test {
 protected:
  void StartServer(uint64_t max_body = 128ull << 20, int threads = 2) {
    metrics_ = ExtenderMetrics::Create();
    extender_ = std::make_unique<Extender>(
        Extender::Options{.policy = ScorePolicy::kBestSet, .metrics = metrics_.get()});
    auto s = ExtenderServer::Start({.listen = "127.0.0.1:0",
                                    .threads = threads,
                                    .max_body_bytes = max_body,
                                    .extender = extender_.get(),
                                    .metrics = metrics_.get()});
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(*s);
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }
  uint16_t port() const { return server_->port(); }

  std::unique_ptr<ExtenderMetrics> metrics_;
  std::unique_ptr<Extender> extender_;
  std::unique_ptr<ExtenderServer> server_;
};

TEST_F(HttpTest, GoldenRequestsGetTheSchedulersJson) {
  StartServer();
  for (const std::string name : {"filter_nodes", "prioritize_nodes", "filter_node_names"}) {
    const std::string verb = name.starts_with("filter") ? "/filter" : "/prioritize";
    HttpReply r = Post(port(), verb, ReadTestdata(name + ".request.json"));
    ASSERT_EQ(r.status, 200) << name << ": " << r.body;
    EXPECT_EQ(r.content_type, "application/json");
    auto got = nlohmann::json::parse(r.body, nullptr, false);
    ASSERT_FALSE(got.is_discarded()) << name << ": " << r.body.substr(0, 300);
    auto want = nlohmann::json::parse(ReadTestdata(name + ".response.json"));
    EXPECT_EQ(got, want) << name << ": got " << r.body.substr(0, 2000);
  }
}

TEST_F(HttpTest, BadBodiesAre400WithAnErrorNamingTheProblem) {
  StartServer(/*max_body=*/64 * 1024);
  const std::string pod = test::MakePod(1);
  struct Case {
    std::string body;
    std::string expect;
  };
  std::vector<Case> cases = {
      {"", "not JSON"},
      {"not json at all", "JSON"},
      {"[1,2,3]", "must be a JSON object"},
      {"{\"Nodes\":{\"items\":[]}}", "Pod: missing"},
      {"{\"Pod\":null,\"NodeNames\":[]}", "Pod: missing"},
      {"{\"Pod\":5,\"NodeNames\":[]}", "Pod: must be an object"},
      {"{\"Pod\":" + pod + "}", "neither Nodes nor NodeNames"},
      {"{\"Pod\":" + pod + ",\"NodeNames\":\"n1\"}", "NodeNames: must be an array"},
      {"{\"Pod\":" + pod + ",\"NodeNames\":[\"a\",7]}", "NodeNames[1]: must be a string"},
      {"{\"Pod\":" + pod + ",\"Nodes\":{\"items\":3}}", "Nodes.items: must be an array"},
      {"{\"Pod\":" + pod + ",\"Nodes\":{\"items\":[{\"metadata\":{}}]}}",
       "Nodes.items[0].metadata.name: missing"},
      {"{\"Pod\":" + pod + ",\"Nodes\":{\"items\":[{\"metadata\":{\"name\":1}}]}}",
       "Nodes.items[0].metadata.name: must be a string"},
      {"{\"Pod\":" +
           test::MakePod(1).replace(test::MakePod(1).find("\"nvidia.com/gpu\":\"1\""), 20,
                                    "\"nvidia.com/gpu\":\"1.5x\"") +
           ",\"NodeNames\":[]}",
       "Pod.spec.containers[0].resources.limits['nvidia.com/gpu']: invalid quantity \"1.5x\""},
      {"{\"Pod\":" + test::MakePod(1, {{"NVIDIA_REQUIRE_CUDA", "cdua>=12"}}) + ",\"NodeNames\":[]}",
       "Pod.spec.containers[0].env: NVIDIA_REQUIRE_CUDA"},
      {"{\"Pod\":{\"spec\":{\"containers\":{}}},\"NodeNames\":[]}",
       "Pod.spec.containers: must be an array"},
      {test::MakeArgs(pod, {}).substr(0, 40), "JSON"},
      {std::string(70 * 1024, ' '), "larger than the limit of 65536 bytes"},
  };
  for (const Case& c : cases) {
    for (const char* verb : {"/filter", "/prioritize"}) {
      HttpReply r = Post(port(), verb, c.body);
      EXPECT_EQ(r.status, 400) << verb << " " << c.body.substr(0, 100) << " -> " << r.body;
      auto j = nlohmann::json::parse(r.body, nullptr, false);
      ASSERT_TRUE(j.is_object() && j.contains("Error")) << r.body;
      EXPECT_THAT(j["Error"].get<std::string>(), HasSubstr(c.expect)) << c.body.substr(0, 100);
    }
  }
  // Still serving.
  EXPECT_EQ(Send(port(), http::verb::get, "/healthz", "").status, 200);
}

TEST_F(HttpTest, WrongMethodsPathsAndNonHttpAreRefused) {
  StartServer();
  EXPECT_EQ(Send(port(), http::verb::get, "/filter", "").status, 405);
  EXPECT_EQ(Send(port(), http::verb::put, "/prioritize", "{}").status, 405);
  EXPECT_EQ(Send(port(), http::verb::post, "/healthz", "").status, 405);
  EXPECT_EQ(Send(port(), http::verb::get, "/bind", "").status, 405);
  HttpReply nf = Post(port(), "/preempt", "{}");
  EXPECT_EQ(nf.status, 404);
  EXPECT_THAT(nf.body, HasSubstr("no such path: /preempt"));
  // /bind is served: bad args are a 400 naming the field; good ones, with no
  // API server to post to, an ExtenderBindingResult naming what is missing.
  HttpReply bad = Post(port(), "/bind", "{}");
  EXPECT_EQ(bad.status, 400);
  EXPECT_THAT(bad.body, HasSubstr("PodName"));
  HttpReply bind =
      Post(port(), "/bind", R"({"PodName":"p","PodNamespace":"ml","PodUID":"u1","Node":"n1"})");
  EXPECT_EQ(bind.status, 200);
  EXPECT_THAT(bind.body, HasSubstr("--kubeconfig"));
  HttpReply h = Send(port(), http::verb::get, "/healthz", "");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.body, "ok");
  // Garbage that is not HTTP: the server answers 400 or closes, and lives on.
  {
    net::io_context ioc;
    tcp::socket s(ioc);
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port()));
    net::write(s, net::buffer(std::string("\x16\x03\x01 hello\r\n\r\n")));
    std::string got(64, '\0');
    beast::error_code ec;
    size_t n = s.read_some(net::buffer(got), ec);
    got.resize(n);
    EXPECT_TRUE(ec || got.starts_with("HTTP/1.1 400")) << got;
  }
  EXPECT_EQ(Send(port(), http::verb::get, "/healthz", "").status, 200);
}

TEST_F(HttpTest, ConcurrentRequestsAllGetTheirOwnAnswer) {
  StartServer(128ull << 20, /*threads=*/4);
  const std::string filter = ReadTestdata("filter_nodes.request.json");
  const std::string prioritize = ReadTestdata("prioritize_nodes.request.json");
  const auto want_filter = nlohmann::json::parse(ReadTestdata("filter_nodes.response.json"));
  const auto want_prio = nlohmann::json::parse(ReadTestdata("prioritize_nodes.response.json"));
  std::atomic<int> ok{0}, bad{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 8; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < 10; ++i) {
        const bool f = (c + i) % 2 == 0;
        HttpReply r = Post(port(), f ? "/filter" : "/prioritize", f ? filter : prioritize);
        auto j = nlohmann::json::parse(r.body, nullptr, false);
        (r.status == 200 && j == (f ? want_filter : want_prio) ? ok : bad)++;
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), 80);
  EXPECT_EQ(bad.load(), 0);
  // The metrics saw them.
  HttpReply m = Send(port(), http::verb::get, "/metrics", "");
  EXPECT_EQ(m.status, 200);
  EXPECT_THAT(m.body, HasSubstr("kdm_extender_requests_total{code=\"200\",verb=\"filter\"} 40"));
  EXPECT_THAT(m.body,
              HasSubstr("kdm_extender_requests_total{code=\"200\",verb=\"prioritize\"} 40"));
  EXPECT_THAT(m.body, HasSubstr("kdm_extender_request_seconds_count{verb=\"filter\"} 40"));
  EXPECT_THAT(m.body, HasSubstr("kdm_extender_nodes_total{verb=\"prioritize\"} 120"));
  EXPECT_THAT(m.body, HasSubstr("kdm_extender_score_memo_total{result=\"hit\"}"));
}

TEST_F(HttpTest, ServesHttpsWithTheGivenCertificate) {
  auto pki = kube::test::MakeTestPki();
  ASSERT_TRUE(pki.ok()) << pki.status().message();
  metrics_ = ExtenderMetrics::Create();
  extender_ = std::make_unique<Extender>(
      Extender::Options{.policy = ScorePolicy::kBestSet, .metrics = metrics_.get()});
  auto s = ExtenderServer::Start({.listen = "127.0.0.1:0",
                                  .tls_cert_pem = pki->server.cert_pem,
                                  .tls_key_pem = pki->server.key_pem,
                                  .extender = extender_.get(),
                                  .metrics = metrics_.get()});
  ASSERT_TRUE(s.ok()) << s.status().message();
  server_ = std::move(*s);
  net::io_context ioc;
  net::ssl::context ctx(net::ssl::context::tls_client);
  ctx.add_certificate_authority(net::buffer(pki->ca.cert_pem));
  ctx.set_verify_mode(net::ssl::verify_peer);
  beast::ssl_stream<beast::tcp_stream> stream(ioc, ctx);
  beast::get_lowest_layer(stream).expires_after(std::chrono::seconds(30));
  beast::get_lowest_layer(stream).connect(
      tcp::endpoint(net::ip::make_address("127.0.0.1"), port()));
  stream.handshake(net::ssl::stream_base::client);
  http::request<http::string_body> req(http::verb::post, "/prioritize", 11);
  req.set(http::field::host, "127.0.0.1");
  req.body() = ReadTestdata("prioritize_nodes.request.json");
  req.prepare_payload();
  http::write(stream, req);
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  http::read(stream, buffer, res);
  EXPECT_EQ(res.result_int(), 200u);
  EXPECT_EQ(nlohmann::json::parse(res.body()),
            nlohmann::json::parse(ReadTestdata("prioritize_nodes.response.json")));
  // Plain HTTP to the HTTPS port gets no answer.
  EXPECT_NE(Send(port(), http::verb::get, "/healthz", "").status, 200);
}

TEST(ExtenderServerStart, RefusesBadOptions) {
  auto metrics = ExtenderMetrics::Create();
  Extender extender({.policy = ScorePolicy::kBestSet});
  for (const std::string listen : {"", "8080", "host:80", "127.0.0.1:99999", "127.0.0.1:x"}) {
    auto s = ExtenderServer::Start({.listen = listen, .extender = &extender});
    ASSERT_FALSE(s.ok()) << listen;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr("--listen")) << listen;
  }
  auto tls = ExtenderServer::Start({.listen = "127.0.0.1:0",
                                    .tls_cert_pem = "garbage",
                                    .tls_key_pem = "garbage",
                                    .extender = &extender});
  ASSERT_FALSE(tls.ok());
  EXPECT_THAT(std::string(tls.status().message()), HasSubstr("TLS certificate"));
  EXPECT_FALSE(ExtenderServer::Start({.listen = "127.0.0.1:0"}).ok());
}

}  // namespace
}  // namespace kdm::scheduler
