// kube::NodeAnnotationWriter against the in-tree HTTPS test server: the
// PATCH it sends (path, Content-Type, merge-patch body that round-trips the
// value), a 404 for an unknown node, a 503 then 200 retried within the
// deadline, and node names that must never reach the URL.
#include "kdm/kube/node_annotation_writer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "kdm/k8s/devices_annotation.h"
#include "kdm/test/kube/test_api_server.h"
#include "kdm/test/kube/test_pki.h"
#include "kdm/test/wait_until.h"

namespace kdm::kube {
namespace {

using std::chrono::milliseconds;
using test::TestApiServer;
using test::TestPki;
using ::testing::HasSubstr;

class NodeAnnotationWriterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    StatusOr<TestPki> pki = test::MakeTestPki();
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = new TestPki(std::move(*pki));
  }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
  }
  void SetUp() override {
    auto s =
        TestApiServer::Start({.cert_pem = pki_->server.cert_pem, .key_pem = pki_->server.key_pem});
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    Client::Options options;
    options.config.source = "test";
    options.config.host = "127.0.0.1";
    options.config.port = server_->port();
    options.config.ca = Pem{pki_->ca.cert_pem, "the test CA"};
    options.config.token = "t0";
    auto clock = std::make_shared<FakeClock>();
    clock->SetAdvanceOnSleep(true);  // retries at once
    options.clock = clock;
    auto c = Client::Create(std::move(options));
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }

  static TestPki* pki_;
  std::unique_ptr<TestApiServer> server_;
  std::unique_ptr<Client> client_;
};

TestPki* NodeAnnotationWriterTest::pki_ = nullptr;

TEST_F(NodeAnnotationWriterTest, PatchesTheNodeWithAMergePatch) {
  server_->Enqueue({.status = 200, .body = R"({"metadata":{"name":"gpu-node-7"}})"});
  NodeAnnotationWriter writer(client_.get(), milliseconds(20'000));
  // A value with quotes and backslashes: it travels as a JSON string.
  const std::string value = R"({"version":1,"node":"gpu-node-7","x":"a\"b\\c"})";
  ASSERT_TRUE(writer.Write("gpu-node-7", value).ok());
  std::vector<test::RecordedRequest> seen = server_->Requests();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].method, "PATCH");
  EXPECT_EQ(seen[0].target, "/api/v1/nodes/gpu-node-7");
  EXPECT_EQ(seen[0].headers["content-type"], "application/merge-patch+json");
  EXPECT_EQ(seen[0].headers["authorization"], "Bearer t0");
  nlohmann::json body = nlohmann::json::parse(seen[0].body);
  EXPECT_EQ(body, nlohmann::json::parse(DevicesAnnotationPatch(value)));
  // Exactly one key on the way down: nothing else of the Node is touched.
  ASSERT_EQ(body.size(), 1u);
  ASSERT_EQ(body["metadata"].size(), 1u);
  ASSERT_EQ(body["metadata"]["annotations"].size(), 1u);
  EXPECT_EQ(body["metadata"]["annotations"]["kdm.io/devices"], value);
}

TEST_F(NodeAnnotationWriterTest, PatchBodyRoundTripsARealAnnotation) {
  k8s::DevicesAnnotation a;
  a.node = "n1";
  a.updated = "2026-11-26T08:41:48Z";
  a.resources["nvidia.com/gpu"].devices = {{"GPU0", 0}, {"GPU1", std::nullopt}};
  a.resources["nvidia.com/gpu"].available = {"GPU1"};
  const std::string value = k8s::EncodeDevicesAnnotation(a);
  nlohmann::json body = nlohmann::json::parse(DevicesAnnotationPatch(value));
  StatusOr<k8s::DevicesAnnotation> back = k8s::DecodeDevicesAnnotation(
      body["metadata"]["annotations"]["kdm.io/devices"].get<std::string>());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(k8s::EncodeDevicesAnnotation(*back), value);
}

TEST_F(NodeAnnotationWriterTest, UnknownNodeIsAClearNotFound) {
  server_->Enqueue({.status = 404,
                    .body = R"({"kind":"Status","status":"Failure","message":"nodes \"gone\" not )"
                            R"(found","reason":"NotFound","code":404})"});
  NodeAnnotationWriter writer(client_.get(), milliseconds(20'000));
  Status s = writer.Write("gone", "{}");
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("node 'gone'"));
  EXPECT_THAT(s.message(), HasSubstr("404"));
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s;
  EXPECT_EQ(server_->RequestCount(), 1u) << "a 404 is not retried";
}

TEST_F(NodeAnnotationWriterTest, UnavailableThenOkIsRetriedWithinTheDeadline) {
  server_->Enqueue({.status = 503});
  server_->Enqueue({.status = 200, .body = "{}"});
  NodeAnnotationWriter writer(client_.get(), milliseconds(20'000));
  Status s = writer.Write("n1", "{}");
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(server_->RequestCount(), 2u);
}

TEST_F(NodeAnnotationWriterTest, ServerThatNeverAnswersIsADeadline) {
  server_->SetHandler([](const test::RecordedRequest&) {
    return test::Reply{.status = 200, .body = "{}", .delay = milliseconds(5'000)};
  });
  NodeAnnotationWriter writer(client_.get(), milliseconds(300));
  Status s = writer.Write("n1", "{}");
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(s.message(), HasSubstr("node 'n1'"));
}

// Issue 30 (stop means stop): `kdm publish` stopping mid-write no longer
// waits for a hung API server until --timeout; a later Write is refused too.
TEST_F(NodeAnnotationWriterTest, CancelEndsAWriteInFlightAndEveryLaterOne) {
  server_->SetHandler([](const test::RecordedRequest&) {
    return test::Reply{.status = 200, .body = "{}", .delay = milliseconds(20'000)};
  });
  NodeAnnotationWriter writer(client_.get(), milliseconds(30'000));
  Status s;
  std::thread write([&] { s = writer.Write("n1", "{}"); });
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return server_->RequestCount() == 1; }));
  const auto start = std::chrono::steady_clock::now();
  writer.Cancel();
  write.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  EXPECT_EQ(s.code(), StatusCode::kCancelled) << s;
  EXPECT_THAT(s.message(), HasSubstr("node 'n1'"));
  Status later = writer.Write("n1", "{}");
  EXPECT_EQ(later.code(), StatusCode::kCancelled) << later;
  EXPECT_EQ(server_->RequestCount(), 1u);
}

TEST_F(NodeAnnotationWriterTest, NamesThatAreNotNodeNamesNeverReachTheServer) {
  NodeAnnotationWriter writer(client_.get(), milliseconds(20'000));
  for (const std::string& bad :
       {std::string(), std::string("../namespaces"), std::string("n1?watch=1"), std::string("N1"),
        std::string("n1/status"), std::string("-n1"), std::string("n1."), std::string("a\nb"),
        std::string("n%2f1"), std::string(254, 'a')}) {
    Status s = writer.Write(bad, "{}");
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr("not a DNS-1123 subdomain")) << bad;
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << s;
  }
  EXPECT_EQ(server_->RequestCount(), 0u);
}

}  // namespace
}  // namespace kdm::kube
