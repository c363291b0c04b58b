// The real `kdm` binary finding its kubeconfig as kubectl does (issue 30
// item 4): a two-file KUBECONFIG list with --context, an exec credential
// plugin whose stderr reaches kdm's, and the errors a user meets when no
// config is there or a field is not supported. Each kdm runs under
// `env -i` so that only the variables the test gives it count.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "kdm/base/sync.h"
#include "kdm/test/e2e/e2e_util.h"
#include "kdm/test/kube/test_api_server.h"
#include "kdm/test/kube/test_pki.h"
#include "kdm/test/wait_until.h"

namespace kdm::e2e {
namespace {

using ::testing::HasSubstr;

class KubeconfigE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-kce2e-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    std::filesystem::create_directories(root_ + "/home");
    auto pki = kube::test::MakeTestPki();
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    auto s = kube::test::TestApiServer::Start(
        {.cert_pem = pki->server.cert_pem, .key_pem = pki->server.key_pem});
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(*s);
    server_->SetHandler([this](const kube::test::RecordedRequest& r) { return Serve(r); });
    std::ofstream(root_ + "/ca.crt") << pki->ca.cert_pem;
  }
  void TearDown() override {
    if (kdm_ != nullptr) {
      kdm_->Signal(SIGTERM);
      kdm_->Wait();
      kdm_.reset();
    }
    if (server_) server_->Stop();
    std::filesystem::remove_all(root_);
  }

  // LISTs answer an empty list; watches stay open and quiet.
  kube::test::Reply Serve(const kube::test::RecordedRequest& r) {
    MutexLock lock(&mu_);
    if (r.query.find("watch=1") != std::string::npos) {
      feeds_.push_back(std::make_shared<kube::test::WatchFeed>());
      return {.feed = feeds_.back()};
    }
    if (r.path == "/api/v1/nodes") {
      return {.body = R"({"kind":"NodeList","metadata":{"resourceVersion":"1"},"items":[]})"};
    }
    return {.body = R"({"kind":"PodList","metadata":{"resourceVersion":"1"},"items":[]})"};
  }

  std::string Cluster(const std::string& name) const {
    return "- name: " + name + "\n  cluster:\n    server: " + server_->url() +
           "\n    certificate-authority: " + root_ + "/ca.crt\n";
  }

  // `kdm ARGS` with exactly `env` as its environment.
  std::unique_ptr<Process> Kdm(const std::vector<std::string>& env,
                               const std::vector<std::string>& args) {
    std::vector<std::string> all = {"-i"};
    all.insert(all.end(), env.begin(), env.end());
    all.push_back(KdmBinary());
    all.insert(all.end(), args.begin(), args.end());
    return std::make_unique<Process>("/usr/bin/env", all, root_ + "/kdm.log");
  }

  // The Authorization header of the first LIST of nodes, once it came.
  std::string FirstNodeListAuthorization() {
    std::string auth;
    EXPECT_TRUE(kdm::test::WaitUntil(
        [&] {
          for (const auto& r : server_->Requests()) {
            if (r.path == "/api/v1/nodes") {
              auto it = r.headers.find("authorization");
              auth = it == r.headers.end() ? "(none)" : it->second;
              return true;
            }
          }
          return false;
        },
        kWaitBound))
        << kdm_->Log();
    return auth;
  }

  std::string root_;
  std::unique_ptr<kube::test::TestApiServer> server_;
  std::unique_ptr<Process> kdm_;
  Mutex mu_;
  std::vector<std::shared_ptr<kube::test::WatchFeed>> feeds_ ABSL_GUARDED_BY(mu_);
};

TEST_F(KubeconfigE2eTest, ExtenderUsesAMergedKubeconfigListAndContext) {
  // a.yaml: the current context (a wrong token) and user "shared" that wins
  // over b's; b.yaml: the cluster and the context --context picks.
  std::ofstream(root_ + "/a.yaml") << "apiVersion: v1\nkind: Config\ncurrent-context: first\n"
                                      "contexts:\n- name: first\n  context: {cluster: k, user: "
                                      "other}\nusers:\n- name: other\n  user: {token: wrong}\n"
                                      "- name: shared\n  user: {token: from-a}\n";
  std::ofstream(root_ + "/b.yaml") << "apiVersion: v1\nkind: Config\ncurrent-context: picked\n"
                                      "clusters:\n"
                                   << Cluster("k")
                                   << "contexts:\n- name: picked\n  context: {cluster: k, user: "
                                      "shared}\nusers:\n- name: shared\n  user: {token: from-b}\n";
  kdm_ = Kdm({"KUBECONFIG=" + root_ + "/missing.yaml:" + root_ + "/a.yaml:" + root_ + "/b.yaml",
              "HOME=" + root_ + "/home"},
             {"extender", "--listen", "127.0.0.1:0", "--context", "picked"});
  EXPECT_EQ(FirstNodeListAuthorization(), "Bearer from-a");
  EXPECT_TRUE(kdm::test::WaitUntil([&] {
    return kdm_->Log().find("event=kubeconfig_loaded source=KUBECONFIG config=\"kubeconfig " +
                            root_ + "/a.yaml:" + root_ + "/b.yaml\" context=\"picked\"") !=
           std::string::npos;
  })) << kdm_->Log();
}

TEST_F(KubeconfigE2eTest, ExtenderRunsAnExecPluginAndPassesItsStderrThrough) {
  // The plugin sits beside the kubeconfig (./plugin.sh, as kubectl resolves it).
  std::filesystem::create_directories(root_ + "/kube");
  std::ofstream(root_ + "/kube/plugin.sh")
      << "#!/bin/sh\necho \"plugin-stderr: $KDM_TEST_ENV $KUBERNETES_EXEC_INFO\" >&2\n"
         "echo '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\","
         "\"status\":{\"token\":\"exec-token\",\"expirationTimestamp\":\"2999-01-01T00:00:00Z\"}}'"
         "\n";
  ::chmod((root_ + "/kube/plugin.sh").c_str(), 0755);
  std::ofstream(root_ + "/home/config") << "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                                           "clusters:\n"
                                        << Cluster("k")
                                        << "contexts:\n- name: c\n  context: {cluster: k, user: "
                                           "eks}\nusers:\n- name: eks\n  user:\n    exec:\n"
                                           "      apiVersion: client.authentication.k8s.io/v1\n"
                                           "      command: ../kube/plugin.sh\n"
                                           "      env: [{name: KDM_TEST_ENV, value: from-env}]\n"
                                           "      interactiveMode: Never\n";
  // The extender with --kubeconfig: the node LIST carries the plugin's token.
  kdm_ = Kdm({"HOME=" + root_ + "/home"},
             {"extender", "--listen", "127.0.0.1:0", "--kubeconfig", root_ + "/home/config"});
  EXPECT_EQ(FirstNodeListAuthorization(), "Bearer exec-token");
  EXPECT_TRUE(kdm::test::WaitUntil([&] {
    return kdm_->Log().find(
               "plugin-stderr: from-env "
               "{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\","
               "\"spec\":{\"interactive\":false}}") != std::string::npos;
  })) << kdm_->Log();
  EXPECT_THAT(kdm_->Log(), HasSubstr("event=exec_credential_run"));
}

TEST_F(KubeconfigE2eTest, MissingAndUnsupportedConfigsAreOneClearLine) {
  std::ofstream(root_ + "/gcp.yaml") << "current-context: c\nclusters:\n"
                                     << Cluster("k")
                                     << "contexts:\n- name: c\n  context: {cluster: k, user: g}\n"
                                        "users:\n- name: g\n  user:\n    auth-provider: {name: "
                                        "gcp}\n";
  std::ofstream(root_ + "/notfound.yaml")
      << "current-context: c\nclusters:\n"
      << Cluster("k")
      << "contexts:\n- name: c\n  context: {cluster: k, user: g}\n"
         "users:\n- name: g\n  user:\n    exec: {apiVersion: client.authentication.k8s.io/v1beta1,"
         " command: no-such-login-tool, installHint: 'brew install no-such-login-tool'}\n";
  const std::vector<std::string> publish = {"publish", "--node-name", "n1",
                                            "--pod-resources-socket", root_ + "/none.sock"};
  struct Case {
    std::vector<std::string> env;
    std::vector<std::string> extra;
    int code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"HOME=" + root_ + "/home"},
       {},
       1,
       "kdm publish: no kubeconfig: KUBECONFIG is not set, " + root_ +
           "/home/.kube/config does not exist, and kdm is not in a pod "
           "(KUBERNETES_SERVICE_HOST is not set); give --kubeconfig FILE or --in-cluster\n"},
      {{"KUBECONFIG=" + root_ + "/x:" + root_ + "/y"},
       {},
       1,
       "kdm publish: KUBECONFIG=\"" + root_ + "/x:" + root_ +
           "/y\": none of the files it lists exists\n"},
      {{"KUBECONFIG=" + root_ + "/gcp.yaml"},
       {},
       1,
       "kdm publish: kubeconfig " + root_ +
           "/gcp.yaml: users[0].user.auth-provider: not supported by kdm\n"},
      {{}, {"--kubeconfig", root_ + "/gcp.yaml"}, 1, "--kubeconfig: kubeconfig " + root_},
      {{}, {"--context", "c", "--in-cluster"}, 2, "--context and --in-cluster"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::filesystem::remove(root_ + "/kdm.log");
    std::vector<std::string> args = publish;
    args.insert(args.end(), cases[i].extra.begin(), cases[i].extra.end());
    std::unique_ptr<Process> p = Kdm(cases[i].env, args);
    std::optional<int> code = p->Wait();
    ASSERT_TRUE(code.has_value()) << i;
    EXPECT_EQ(*code, cases[i].code) << i << ": " << p->Log();
    EXPECT_THAT(p->Log(), HasSubstr(cases[i].message)) << i;
  }
  // An exec plugin that is not installed: the install hint, in the error
  // the extender's informer logs (the plugin runs at the first request).
  kdm_ = Kdm({}, {"extender", "--listen", "127.0.0.1:0", "--kubeconfig", root_ + "/notfound.yaml"});
  EXPECT_TRUE(kdm::test::WaitUntil([&] {
    return kdm_->Log().find("not found in PATH; installHint: ") != std::string::npos;
  })) << kdm_->Log();
  EXPECT_EQ(server_->RequestCount(), 0u);
}

}  // namespace
}  // namespace kdm::e2e
