// client-go's loading rules (LoadClientConfig: --kubeconfig, a merged
// KUBECONFIG list, ~/.kube/config, in-cluster), --context, and the fields
// kdm reads, refuses or ignores (issue 30 item 4).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "kdm/kube/kubeconfig.h"

namespace kdm::kube {
namespace {

using ::testing::HasSubstr;

class KubeconfigRulesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-kcrules-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    std::string path = dir_ + "/" + name;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path) << text;
    return path;
  }

  // Rules that see only `vars` (and no real environment).
  LoadingRules Rules(std::map<std::string, std::string> vars) {
    LoadingRules rules;
    rules.lookup_env = [vars](const std::string& name) -> std::optional<std::string> {
      auto it = vars.find(name);
      if (it == vars.end()) return std::nullopt;
      return it->second;
    };
    rules.in_cluster_options.service_account_dir = dir_ + "/sa";
    return rules;
  }

  // One context c1 -> cluster k1 + user u1, with the given stanzas.
  static std::string Config(const std::string& cluster, const std::string& user,
                            const std::string& extra_top = "") {
    return "apiVersion: v1\nkind: Config\ncurrent-context: c1\n" + extra_top +
           "contexts:\n- name: c1\n  context:\n    cluster: k1\n    user: u1\n"
           "clusters:\n- name: k1\n  cluster:\n" +
           cluster + "users:\n- name: u1\n  user:\n" + user;
  }

  StatusOr<ClientConfig> Parse(const std::string& text) {
    return LoadKubeconfig(Write("config", text));
  }

  std::string dir_;
};

constexpr char kServer[] = "    server: https://a.example:6443\n";

TEST_F(KubeconfigRulesTest, ExplicitFileIsUsedAloneEvenWithKubeconfigSet) {
  std::string a = Write("a", Config(kServer, "    token: from-a\n"));
  std::string b = Write("b", Config("    server: https://b.example\n", "    token: from-b\n"));
  LoadingRules rules = Rules({{"KUBECONFIG", b}, {"HOME", dir_}});
  rules.kubeconfig = a;
  StatusOr<ClientConfig> c = LoadClientConfig(rules);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->token, "from-a");
  EXPECT_EQ(c->found_by, "--kubeconfig");
  EXPECT_EQ(c->context, "c1");
  EXPECT_EQ(c->source, "kubeconfig " + a);
}

TEST_F(KubeconfigRulesTest, KubeconfigListMergesFirstFileWins) {
  // a: current-context ctx-a; its cluster k1 and user u1.
  // b: another current-context, a k1 that must lose, ctx-a is only in b,
  //    ctx-b, a cluster kb with a CA relative to b's directory.
  std::string a = Write("one/a",
                        "current-context: ctx-a\n"
                        "clusters:\n- name: k1\n  cluster: {server: 'https://a.example'}\n"
                        "users:\n- name: u1\n  user: {token: token-a}\n");
  Write("two/ca.crt", "CA-B");
  std::string b = Write("two/b",
                        "current-context: ctx-b\n"
                        "clusters:\n- name: k1\n  cluster: {server: 'https://loser.example'}\n"
                        "- name: kb\n  cluster: {server: 'https://b.example', "
                        "certificate-authority: ca.crt}\n"
                        "users:\n- name: u1\n  user: {token: loser}\n"
                        "- name: ub\n  user: {token: token-b}\n"
                        "contexts:\n- name: ctx-a\n  context: {cluster: k1, user: u1}\n"
                        "- name: ctx-b\n  context: {cluster: kb, user: ub}\n");
  LoadingRules rules = Rules({{"KUBECONFIG", a + ":" + b}});
  StatusOr<ClientConfig> c = LoadClientConfig(rules);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->found_by, "KUBECONFIG");
  EXPECT_EQ(c->context, "ctx-a");
  EXPECT_EQ(c->host, "a.example");
  EXPECT_EQ(c->token, "token-a");
  EXPECT_EQ(c->source, "kubeconfig " + a + ":" + b);

  rules.context = "ctx-b";
  c = LoadClientConfig(rules);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host, "b.example");
  EXPECT_EQ(c->token, "token-b");
  EXPECT_EQ(c->ca.text, "CA-B");  // relative to b's directory, not a's

  rules.context = "nope";
  c = LoadClientConfig(rules);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("context \"nope\": no entry named \"nope\""));
}

TEST_F(KubeconfigRulesTest, MissingFilesInTheListAreSkippedButNotAllOfThem) {
  std::string a = Write("a", Config(kServer, "    token: t\n"));
  LoadingRules rules = Rules({{"KUBECONFIG", "::" + dir_ + "/gone:" + a + ":" + a + ":"}});
  StatusOr<ClientConfig> c = LoadClientConfig(rules);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->source, "kubeconfig " + a);

  rules = Rules({{"KUBECONFIG", dir_ + "/gone:" + dir_ + "/also-gone"}, {"HOME", dir_}});
  Write(".kube/config", Config(kServer, "    token: home\n"));  // not used: KUBECONFIG is set
  c = LoadClientConfig(rules);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("KUBECONFIG=\"" + dir_ + "/gone:"));
  EXPECT_THAT(c.status().message(), HasSubstr("none of the files it lists exists"));
}

TEST_F(KubeconfigRulesTest, PathTricksInKubeconfigAreNamed) {
  std::string good = Write("good", Config(kServer, "    token: t\n"));
  Write("garbage", "clusters: [\n  {name: x\n");
  Write("huge", std::string(kMaxKubeconfigBytes + 1, '#'));
  std::filesystem::create_directories(dir_ + "/adir");
  struct Case {
    std::string list;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {dir_ + "/adir:" + good, "kubeconfig " + dir_ + "/adir"},
           {good + ":" + dir_ + "/garbage", "kubeconfig " + dir_ + "/garbage: not YAML"},
           {dir_ + "/huge:" + good, "kubeconfig " + dir_ + "/huge"},
           {good + ":" + dir_ + "/../" + dir_.substr(5) + "/garbage", "garbage: not YAML"},
       }) {
    StatusOr<ClientConfig> r = LoadClientConfig(Rules({{"KUBECONFIG", c.list}}));
    ASSERT_FALSE(r.ok()) << c.list;
    EXPECT_THAT(r.status().message(), HasSubstr(c.message)) << c.list;
  }
}

TEST_F(KubeconfigRulesTest, HomeConfigThenInClusterThenAClearError) {
  // Nothing: the error lists what was tried.
  StatusOr<ClientConfig> c = LoadClientConfig(Rules({{"HOME", dir_}}));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(),
              HasSubstr("no kubeconfig: KUBECONFIG is not set, " + dir_ +
                        "/.kube/config does not exist, and kdm is not in a pod "
                        "(KUBERNETES_SERVICE_HOST is not set)"));

  // In a pod: KUBERNETES_SERVICE_HOST and the token.
  Write("sa/token", "pod-token\n");
  Write("sa/ca.crt", "CA");
  std::map<std::string, std::string> pod = {
      {"HOME", dir_}, {"KUBERNETES_SERVICE_HOST", "10.0.0.1"}, {"KUBERNETES_SERVICE_PORT", "443"}};
  c = LoadClientConfig(Rules(pod));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->found_by, "in-cluster");
  EXPECT_EQ(c->host, "10.0.0.1");

  // --context does not fall back to in-cluster.
  LoadingRules rules = Rules(pod);
  rules.context = "c1";
  c = LoadClientConfig(rules);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("--context \"c1\": no kubeconfig"));

  // ~/.kube/config comes before in-cluster.
  Write(".kube/config", Config(kServer, "    token: home\n"));
  c = LoadClientConfig(Rules(pod));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->found_by, "home");
  EXPECT_EQ(c->token, "home");

  // Also with the home directory injected instead of HOME.
  rules = Rules({});
  rules.home = dir_;
  c = LoadClientConfig(rules);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->source, "kubeconfig " + dir_ + "/.kube/config");

  // --in-cluster is used alone, and refuses --context.
  rules = Rules(pod);
  rules.in_cluster = true;
  c = LoadClientConfig(rules);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->source, "in-cluster");
  rules.context = "c1";
  EXPECT_FALSE(LoadClientConfig(rules).ok());
}

TEST_F(KubeconfigRulesTest, TlsServerNameProxyAndIgnoredFields) {
  StatusOr<ClientConfig> c = Parse(
      Config(std::string(kServer) + "    tls-server-name: api.internal\n"
                                    "    proxy-url: http://proxy.example:3128\n"
                                    "    disable-compression: true\n"
                                    "    extensions:\n    - name: x\n      extension: {a: 1}\n",
             "    token: t\n    extensions: []\n",
             "preferences: {colors: true}\nextensions: []\nsomething-new: 1\n"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tls_server_name, "api.internal");
  EXPECT_EQ(c->proxy.host, "proxy.example");
  EXPECT_EQ(c->proxy.port, 3128);
  EXPECT_EQ(c->proxy.url, "http://proxy.example:3128");
  c = Parse(Config(std::string(kServer) + "    proxy-url: http://[::1]/\n", "    token: t\n"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->proxy.host, "::1");
  EXPECT_EQ(c->proxy.port, 80);
  c = Parse(
      Config(std::string(kServer) + "    proxy-url: socks5://socks.example\n", "    token: t\n"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->proxy.host, "socks.example");
  EXPECT_EQ(c->proxy.port, 1080);
}

TEST_F(KubeconfigRulesTest, EveryFieldKdmDoesNotImplementIsRefusedByName) {
  const std::string user = "    token: t\n";
  struct Case {
    std::string text;
    std::string message;
  };
  const std::vector<Case> cases = {
      {Config(kServer, "    auth-provider: {name: gcp}\n"),
       "users[0].user.auth-provider: not supported by kdm"},
      {Config(kServer, user + "    username: admin\n"),
       "users[0].user.username: not supported by kdm"},
      {Config(kServer, user + "    password: x\n"), "users[0].user.password: not supported by kdm"},
      {Config(kServer, user + "    as: someone\n"), "users[0].user.as: not supported by kdm"},
      {Config(kServer, user + "    as-groups: [a]\n"),
       "users[0].user.as-groups: not supported by kdm"},
      {Config(kServer, user + "    tokenfile: x\n"),
       "users[0].user.\"tokenfile\": unknown field (not supported by kdm)"},
      {Config(std::string(kServer) + "    certificate-authority-dat: x\n", user),
       "clusters[0].cluster.\"certificate-authority-dat\": unknown field"},
      {"current-context: c1\ncontexts:\n- name: c1\n  context: {cluster: k1, usr: u1}\n"
       "clusters:\n- name: k1\n  cluster: {server: 'https://a'}\n",
       "contexts[0].context.\"usr\": unknown field"},
      {"current-context: c1\ncontexts:\n- name: c1\n  context: {cluster: k1}\n  extra: 1\n"
       "clusters:\n- name: k1\n  cluster: {server: 'https://a'}\n",
       "contexts[0].\"extra\": unknown field"},
      // Wrong types of the new fields.
      {Config(std::string(kServer) + "    tls-server-name: {a: b}\n", user),
       "clusters[0].cluster.tls-server-name: not a string"},
      {Config(std::string(kServer) + "    tls-server-name: 'a b'\n", user),
       "clusters[0].cluster.tls-server-name: \"a b\": not a host name"},
      {Config(std::string(kServer) + "    proxy-url: [http://p]\n", user),
       "clusters[0].cluster.proxy-url: not a string"},
      {Config(std::string(kServer) + "    disable-compression: maybe\n", user),
       "clusters[0].cluster.disable-compression: not true or false"},
      // Proxies kdm does not implement.
      {Config(std::string(kServer) + "    proxy-url: socks4://p:1080\n", user),
       "proxy-url: \"socks4://p:1080\": scheme \"socks4\" is not supported by kdm"},
      {Config(std::string(kServer) + "    proxy-url: socks5://u:pw@p\n", user),
       "proxy credentials are not supported by kdm"},
      {Config(std::string(kServer) + "    proxy-url: https://p:443\n", user),
       "scheme \"https\" is not supported by kdm"},
      {Config(std::string(kServer) + "    proxy-url: http://u:pw@p:3128\n", user),
       "proxy credentials are not supported by kdm"},
      {Config(std::string(kServer) + "    proxy-url: http://p:99999\n", user),
       "port is not a number"},
      {Config(std::string(kServer) + "    proxy-url: http://p:3128/path\n", user),
       "a path, query or fragment is not allowed"},
      {Config(std::string(kServer) + "    proxy-url: p:3128\n", user), "not a URL"},
      // exec stanzas.
      {Config(kServer, "    exec: cmd\n"), "users[0].user.exec: not a map"},
      {Config(kServer, "    exec: {command: x}\n"), "users[0].user.exec.apiVersion: missing"},
      {Config(kServer,
              "    exec: {command: x, apiVersion: client.authentication.k8s.io/v1alpha1}\n"),
       "exec.apiVersion: \"client.authentication.k8s.io/v1alpha1\" is not supported by kdm"},
      {Config(kServer, "    exec: {apiVersion: client.authentication.k8s.io/v1beta1}\n"),
       "users[0].user.exec.command: missing"},
      {Config(kServer, "    exec: {command: x, apiVersion: client.authentication.k8s.io/v1}\n"),
       "users[0].user.exec.interactiveMode: missing"},
      {Config(kServer,
              "    exec: {command: x, apiVersion: client.authentication.k8s.io/v1beta1, "
              "interactiveMode: Always}\n"),
       "interactiveMode: Always: kdm never runs a plugin interactively"},
      {Config(kServer,
              "    exec: {command: x, apiVersion: client.authentication.k8s.io/v1beta1, "
              "interactiveMode: Sometimes}\n"),
       "\"Sometimes\" is not Never, IfAvailable or Always"},
      {Config(kServer,
              "    exec: {command: x, apiVersion: client.authentication.k8s.io/v1beta1, "
              "args: x}\n"),
       "users[0].user.exec.args: not a list"},
      {Config(kServer,
              "    exec: {command: x, apiVersion: client.authentication.k8s.io/v1beta1, "
              "args: [a, [b]]}\n"),
       "users[0].user.exec.args[1]: not a string"},
      {Config(kServer,
              "    exec: {command: x, apiVersion: client.authentication.k8s.io/v1beta1, "
              "env: {A: b}}\n"),
       "users[0].user.exec.env: not a list"},
      {Config(kServer,
              "    exec: {command: x, apiVersion: client.authentication.k8s.io/v1beta1, "
              "env: [{value: b}]}\n"),
       "users[0].user.exec.env[0].name: missing"},
      {Config(kServer,
              "    exec: {command: x, apiVersion: client.authentication.k8s.io/v1beta1, "
              "env: [{name: 'A=B', value: b}]}\n"),
       "users[0].user.exec.env[0].name: \"A=B\": not a variable name"},
      {Config(kServer,
              "    exec: {command: x, apiVersion: client.authentication.k8s.io/v1beta1, "
              "env: [{name: A, valu: b}]}\n"),
       "users[0].user.exec.env[0].\"valu\": unknown field"},
      {Config(kServer,
              "    exec: {command: x, apiVersion: client.authentication.k8s.io/v1beta1, "
              "provideClusterInfo: sometimes}\n"),
       "users[0].user.exec.provideClusterInfo: not true or false"},
      {Config(kServer, "    exec: {command: [x], apiVersion: client.authentication.k8s.io/v1}\n"),
       "users[0].user.exec.command: not a string"},
      {Config(kServer, "    exec: {command: x, apiVersion: {a: b}}\n"),
       "users[0].user.exec.apiVersion: not a string"},
      {Config(kServer,
              "    exec: {command: x, apiVersion: client.authentication.k8s.io/v1beta1, "
              "installHint: [a]}\n"),
       "users[0].user.exec.installHint: not a string"},
      {Config(kServer,
              "    exec: {command: x, apiVersion: client.authentication.k8s.io/v1beta1, "
              "env: [{name: A, value: [b]}]}\n"),
       "users[0].user.exec.env[0].value: not a string"},
      {Config(kServer,
              "    exec: {command: x, apiVersion: client.authentication.k8s.io/v1beta1, "
              "env: [A]}\n"),
       "users[0].user.exec.env[0]: not a map of name and value"},
      {Config(kServer,
              "    exec: {command: x, apiVersion: client.authentication.k8s.io/v1beta1, "
              "interactive: false}\n"),
       "users[0].user.exec.\"interactive\": unknown field"},
      {Config(kServer,
              "    token: t\n    exec: {command: x, apiVersion: "
              "client.authentication.k8s.io/v1beta1}\n"),
       "users[0].user: exec together with token or tokenFile"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    StatusOr<ClientConfig> c = Parse(cases[i].text);
    ASSERT_FALSE(c.ok()) << i << ": " << cases[i].text;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << i;
    EXPECT_THAT(c.status().message(), HasSubstr("kubeconfig " + dir_ + "/config: ")) << i;
    EXPECT_THAT(c.status().message(), HasSubstr(cases[i].message)) << i;
  }
}

TEST_F(KubeconfigRulesTest, ExecStanzaAsCloudProvidersWriteIt) {
  Write("ca.crt", "CA-TEXT");
  StatusOr<ClientConfig> c = Parse(
      Config(std::string(kServer) +
                 "    certificate-authority: ca.crt\n    tls-server-name: api.internal\n",
             "    exec:\n"
             "      apiVersion: client.authentication.k8s.io/v1beta1\n"
             "      command: aws\n"
             "      args: [--region, eu-west-1, eks, get-token, --cluster-name, prod]\n"
             "      env:\n      - name: AWS_PROFILE\n        value: prod\n      - name: EMPTY\n"
             "      installHint: install the aws CLI\n"
             "      provideClusterInfo: true\n"
             "      interactiveMode: IfAvailable\n"));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->exec.has_value());
  const ExecConfig& e = *c->exec;
  EXPECT_EQ(e.command, "aws");
  EXPECT_EQ(e.kubeconfig_dir, dir_);
  EXPECT_EQ(e.args.size(), 6u);
  ASSERT_EQ(e.env.size(), 2u);
  EXPECT_EQ(e.env[0], (std::pair<std::string, std::string>("AWS_PROFILE", "prod")));
  EXPECT_EQ(e.env[1], (std::pair<std::string, std::string>("EMPTY", "")));
  EXPECT_EQ(e.install_hint, "install the aws CLI");
  EXPECT_THAT(e.who, HasSubstr("user \"u1\" (kubeconfig " + dir_ + "/config: users[0].user.exec)"));
  nlohmann::json info = nlohmann::json::parse(e.exec_info_json);
  EXPECT_EQ(info["apiVersion"], "client.authentication.k8s.io/v1beta1");
  EXPECT_EQ(info["kind"], "ExecCredential");
  EXPECT_EQ(info["spec"]["interactive"], false);
  EXPECT_EQ(info["spec"]["cluster"]["server"], "https://a.example:6443");
  EXPECT_EQ(info["spec"]["cluster"]["tls-server-name"], "api.internal");
  EXPECT_EQ(info["spec"]["cluster"]["certificate-authority-data"], "Q0EtVEVYVA==");
  EXPECT_TRUE(c->token.empty());

  // Without provideClusterInfo, no cluster.
  c = Parse(Config(kServer,
                   "    exec: {command: x, apiVersion: client.authentication.k8s.io/v1, "
                   "interactiveMode: Never}\n"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->exec->exec_info_json,
            "{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\","
            "\"spec\":{\"interactive\":false}}");
}

}  // namespace
}  // namespace kdm::kube
