// kube::CreateBinding against the in-tree HTTPS test server: the POST's
// path, method, content type and body; 201 -> OK; 409 -> ABORTED after one
// request (never posted again, even with retries on); a 409 after a 503
// says an earlier attempt may have landed; 404; names with '/', '..',
// '%2F', empty, too long or upper case refused before any request.
#include "kdm/kube/binding.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "kdm/base/clock.h"
#include "kdm/test/kube/test_api_server.h"
#include "kdm/test/kube/test_pki.h"

namespace kdm::kube {
namespace {

using std::chrono::milliseconds;
using test::TestApiServer;
using ::testing::HasSubstr;

class BindingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatusOr<test::TestPki> pki = test::MakeTestPki();
    ASSERT_TRUE(pki.ok()) << pki.status();
    StatusOr<std::unique_ptr<TestApiServer>> s =
        TestApiServer::Start({.cert_pem = pki->server.cert_pem, .key_pem = pki->server.key_pem});
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    clock_->SetAdvanceOnSleep(true);  // the client's retry waits pass at once
    Client::Options options;
    options.config.source = "test";
    options.config.host = "127.0.0.1";
    options.config.port = server_->port();
    options.config.ca = Pem{pki->ca.cert_pem, "the test CA"};
    options.config.token = "t";
    options.clock = clock_;  // retries on (8 attempts): 409 must not use them
    StatusOr<std::unique_ptr<Client>> c = Client::Create(std::move(options));
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }

  Status Bind(const Binding& b) { return CreateBinding(*client_, b, milliseconds(10'000)); }

  const Binding good_{.namespace_name = "ml", .name = "train-0", .uid = "0f3c-11", .node = "gpu-7"};
  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
  std::unique_ptr<TestApiServer> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(BindingTest, PostsTheBindingAndCreatedIsOk) {
  server_->Enqueue({.status = 201, .body = R"({"kind":"Status","status":"Success","code":201})"});
  ASSERT_TRUE(Bind(good_).ok());
  std::vector<test::RecordedRequest> seen = server_->Requests();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].method, "POST");
  EXPECT_EQ(seen[0].target, "/api/v1/namespaces/ml/pods/train-0/binding");
  EXPECT_EQ(seen[0].headers["content-type"], "application/json");
  EXPECT_EQ(seen[0].headers["authorization"], "Bearer t");
  nlohmann::json body = nlohmann::json::parse(seen[0].body);
  EXPECT_EQ(body, nlohmann::json::parse(
                      R"({"apiVersion":"v1","kind":"Binding","metadata":{"name":"train-0",)"
                      R"("namespace":"ml","uid":"0f3c-11"},"target":{"apiVersion":"v1",)"
                      R"("kind":"Node","name":"gpu-7"}})"));
  // Without a uid, the body has none.
  server_->Enqueue({.status = 201});
  Binding no_uid = good_;
  no_uid.uid = "";
  ASSERT_TRUE(Bind(no_uid).ok());
  EXPECT_FALSE(nlohmann::json::parse(server_->Requests()[1].body)["metadata"].contains("uid"));
}

TEST_F(BindingTest, ConflictIsAbortedAfterOneRequest) {
  server_->SetHandler([](const test::RecordedRequest&) -> test::Reply {
    return {.status = 409,
            .body = R"({"kind":"Status","message":"pod train-0 is already assigned to node )"
                    R"(\"gpu-3\"","reason":"Conflict","code":409})"};
  });
  Status s = Bind(good_);
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_THAT(s.message(), HasSubstr("POST /api/v1/namespaces/ml/pods/train-0/binding: 409 "
                                     "Conflict: pod train-0 is already assigned"));
  EXPECT_EQ(server_->RequestCount(), 1u);
  EXPECT_TRUE(clock_->Sleeps().empty());  // no retry was even waited for
}

// A 503 may come after the binding was stored: the 409 that answers the
// retry may be this call's own, and the error says so.
TEST_F(BindingTest, ConflictAfterARetrySaysAnEarlierAttemptMayHaveLanded) {
  server_->Enqueue({.status = 503, .body = R"({"message":"etcd timeout"})"});
  server_->SetHandler([](const test::RecordedRequest&) -> test::Reply {
    return {.status = 409, .body = R"({"message":"already assigned"})"};
  });
  Status s = Bind(good_);
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_THAT(s.message(), HasSubstr("(attempt 2: an earlier attempt may have been applied)"));
  EXPECT_EQ(server_->RequestCount(), 2u);
}

TEST_F(BindingTest, ServerErrorIsRetriedAndNotFoundIsNot) {
  server_->Enqueue({.status = 500});
  server_->Enqueue({.status = 201});
  EXPECT_TRUE(Bind(good_).ok());
  EXPECT_EQ(server_->RequestCount(), 2u);
  server_->Enqueue({.status = 404, .body = R"({"message":"pods \"train-0\" not found"})"});
  Status s = Bind(good_);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("404 Not Found: pods \"train-0\" not found"));
  EXPECT_EQ(server_->RequestCount(), 3u);
}

TEST_F(BindingTest, BadNamesAreRefusedBeforeAnyRequest) {
  struct Case {
    std::string namespace_name, name, node, uid, error;
  } cases[] = {
      {"ml", "a/b", "gpu-7", "u", R"(binding: pod name "a/b" is not a DNS-1123 subdomain)"},
      {"ml", "..", "gpu-7", "u", "pod name"},
      {"ml", "a%2Fb", "gpu-7", "u", "pod name"},
      {"ml", "", "gpu-7", "u", "pod name"},
      {"ml", std::string(300, 'a'), "gpu-7", "u", "pod name"},
      {"ml", "Train", "gpu-7", "u", "pod name"},
      {"ml", "a?watch=1", "gpu-7", "u", "pod name"},
      {"ml/../kube-system", "a", "gpu-7", "u", "binding: namespace"},
      {"..", "a", "gpu-7", "u", "binding: namespace"},
      {"a.b", "a", "gpu-7", "u", "binding: namespace"},  // a label: no dots
      {"%2F", "a", "gpu-7", "u", "binding: namespace"},
      {"", "a", "gpu-7", "u", "binding: namespace"},
      {std::string(64, 'n'), "a", "gpu-7", "u", "binding: namespace"},
      {"ml", "a", "gpu/7", "u", "binding: node"},
      {"ml", "a", "", "u", "binding: node"},
      {"ml", "a", std::string(254, 'g'), "u", "binding: node"},
      {"ml", "a", "gpu-7", "u\nx", "binding: uid \"u\\nx\" has a control character"},
      {"ml", "a", "gpu-7", std::string(129, 'u'), "binding: uid is 129 bytes, more than 128"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.error);
    Status s =
        Bind({.namespace_name = c.namespace_name, .name = c.name, .uid = c.uid, .node = c.node});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(c.error));
    EXPECT_LT(s.message().size(), 200u);  // a long name is quoted cut
  }
  EXPECT_EQ(server_->RequestCount(), 0u);
  // The longest names that are valid pass (and reach the server).
  server_->Enqueue({.status = 201});
  EXPECT_TRUE(Bind({.namespace_name = std::string(63, 'n'),
                    .name = std::string(253, 'a'),
                    .uid = std::string(128, 'u'),
                    .node = std::string(253, 'g')})
                  .ok());
  EXPECT_EQ(server_->RequestCount(), 1u);
}

}  // namespace
}  // namespace kdm::kube
