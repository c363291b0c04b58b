#include "kdm/kube/kubeconfig.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace kdm::kube {
namespace {

using ::testing::HasSubstr;

// "hello" as base64, and PEM-looking text (the client checks PEM; the
// config only carries bytes).
constexpr char kCaText[] = "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n";

std::string Base64(const std::string& in) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  while (i + 3 <= in.size()) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out.push_back(kAlphabet[(v >> s) & 63]);
    i += 3;
  }
  if (in.size() - i == 1) {
    uint32_t v = uint8_t(in[i]) << 16;
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], '=', '='};
  } else if (in.size() - i == 2) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], kAlphabet[(v >> 6) & 63], '='};
  }
  return out;
}

class KubeconfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-kcfg-XXXXXX";
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

  // A valid kubeconfig whose cluster and user blocks are the arguments.
  static std::string Config(const std::string& cluster, const std::string& user) {
    return "apiVersion: v1\nkind: Config\ncurrent-context: c1\n"
           "contexts:\n- name: other\n  context: {cluster: nowhere, user: nobody}\n"
           "- name: c1\n  context:\n    cluster: k1\n    user: u1\n"
           "clusters:\n- name: k1\n  cluster:\n" +
           cluster + "users:\n- name: u1\n  user:\n" + user;
  }

  StatusOr<ClientConfig> Load(const std::string& text) {
    return LoadKubeconfig(Write("config", text));
  }

  std::string dir_;
};

TEST_F(KubeconfigTest, ReadsServerCaDataAndToken) {
  StatusOr<ClientConfig> c =
      Load(Config("    server: https://api.example.com:6443/prefix/\n"
                  "    certificate-authority-data: " +
                      Base64(kCaText) + "\n",
                  "    token: abc.def\n"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host, "api.example.com");
  EXPECT_EQ(c->port, 6443);
  EXPECT_EQ(c->base_path, "/prefix");
  EXPECT_EQ(c->ca.text, kCaText);
  EXPECT_THAT(c->ca.origin, HasSubstr("clusters[0].cluster.certificate-authority-data"));
  EXPECT_EQ(c->token, "abc.def");
  EXPECT_TRUE(c->token_file.empty());
  EXPECT_FALSE(c->insecure_skip_tls_verify);
  EXPECT_EQ(c->ServerUrl(), "https://api.example.com:6443/prefix");
  EXPECT_EQ(c->source, "kubeconfig " + dir_ + "/config");
}

TEST_F(KubeconfigTest, DefaultPortAndIpv6Host) {
  StatusOr<ClientConfig> c =
      Load(Config("    server: https://[fd00::1]\n"
                  "    insecure-skip-tls-verify: true\n",
                  "    token: t\n"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host, "fd00::1");
  EXPECT_EQ(c->port, 443);
  EXPECT_TRUE(c->insecure_skip_tls_verify);
  EXPECT_EQ(c->ServerUrl(), "https://[fd00::1]:443");
}

TEST_F(KubeconfigTest, RelativeFilesResolveAgainstTheKubeconfigDirectory) {
  Write("sub/certs/ca.crt", kCaText);
  Write("sub/certs/client.crt", "CERT");
  Write("sub/certs/client.key", "KEY");
  Write("sub/token", "  tok-1\n");
  std::string path = Write("sub/config", Config("    server: https://10.0.0.1:443\n"
                                                "    certificate-authority: certs/ca.crt\n",
                                                "    client-certificate: certs/client.crt\n"
                                                "    client-key: ./certs/client.key\n"
                                                "    tokenFile: token\n"));
  StatusOr<ClientConfig> c = LoadKubeconfig(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ca.text, kCaText);
  EXPECT_EQ(c->ca.origin, dir_ + "/sub/certs/ca.crt");
  EXPECT_EQ(c->client_certificate.text, "CERT");
  EXPECT_EQ(c->client_key.text, "KEY");
  EXPECT_EQ(c->token_file, dir_ + "/sub/token");
  StatusOr<std::string> token = ReadTokenFile(c->token_file);
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(*token, "tok-1");
}

TEST_F(KubeconfigTest, ClientCertificateAndKeyData) {
  StatusOr<ClientConfig> c = Load(
      Config("    server: https://h:1\n", "    client-certificate-data: " + Base64("CERT!") + "\n" +
                                              "    client-key-data: " + Base64("KEY!!") + "\n"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->client_certificate.text, "CERT!");
  EXPECT_EQ(c->client_key.text, "KEY!!");
  EXPECT_THAT(c->client_key.origin, HasSubstr("users[0].user.client-key-data"));
}

TEST_F(KubeconfigTest, ContextOverridePicksAnotherContext) {
  std::string text = Config("    server: https://h:1\n", "    token: t\n") +
                     "- name: u2\n  user:\n    token: second\n"
                     "- name: zz\n  user: {token: z}\n";
  text += "";
  // Add a context pointing at u2.
  text.replace(text.find("contexts:\n"), 10,
               "contexts:\n- name: c2\n  context: {cluster: k1, user: u2}\n");
  StatusOr<ClientConfig> c = ParseKubeconfigContext(text, dir_ + "/x", "c2");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->token, "second");
  StatusOr<ClientConfig> missing = ParseKubeconfigContext(text, dir_ + "/x", "nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("no entry named \"nope\" in contexts"));
}

// Each bad kubeconfig, and the words its error must hold.
TEST_F(KubeconfigTest, BadKubeconfigsNameTheField) {
  const std::string good_cluster = "    server: https://h:6443\n";
  const std::map<std::string, std::pair<std::string, std::string>> cases = {
      {"garbage", {"\x01\x02{{{[[[: :", "not YAML"}},
      {"truncated", {Config(good_cluster, "    token: t\n").substr(0, 70), ""}},
      {"list at top", {"- a\n- b\n", "not a map of kubeconfig fields"}},
      {"no current context", {"clusters: []\n", "current-context: missing"}},
      {"unknown context", {"current-context: zzz\ncontexts: []\n", "no entry named \"zzz\""}},
      {"contexts not a list", {"current-context: a\ncontexts: {a: 1}\n", "contexts: not a list"}},
      {"context without cluster",
       {"current-context: a\ncontexts:\n- name: a\n  context: {user: u}\n",
        "contexts[0].context.cluster: missing"}},
      {"unknown cluster",
       {"current-context: a\ncontexts:\n- name: a\n  context: {cluster: k, user: u}\n",
        "contexts[0].context.cluster: no entry named \"k\" in clusters"}},
      {"no server",
       {Config("    insecure-skip-tls-verify: false\n", "    token: t\n"),
        "clusters[0].cluster.server: missing"}},
      {"http server",
       {Config("    server: http://h:80\n", "    token: t\n"), "plain http is not supported"}},
      {"server not a url",
       {Config("    server: h:80\n", "    token: t\n"), "clusters[0].cluster.server"}},
      {"bad port",
       {Config("    server: https://h:99999\n", "    token: t\n"), "port is not a number"}},
      {"server is a map",
       {Config("    server: {a: b}\n", "    token: t\n"),
        "clusters[0].cluster.server: not a string"}},
      {"bad ca data",
       {Config(good_cluster + "    certificate-authority-data: '!!notbase64'\n", "    token: t\n"),
        "clusters[0].cluster.certificate-authority-data: not base64"}},
      {"missing ca file",
       {Config(good_cluster + "    certificate-authority: nope/ca.crt\n", "    token: t\n"),
        "clusters[0].cluster.certificate-authority:"}},
      {"bad insecure flag",
       {Config(good_cluster + "    insecure-skip-tls-verify: maybe\n", "    token: t\n"),
        "insecure-skip-tls-verify: not true or false"}},
      {"insecure with a ca",
       {Config(good_cluster +
                   "    insecure-skip-tls-verify: true\n"
                   "    certificate-authority-data: " +
                   Base64("x") + "\n",
               "    token: t\n"),
        "certificate-authority and insecure-skip-tls-verify together"}},
      {"bad key data",
       {Config(good_cluster,
               "    client-certificate-data: " + Base64("C") + "\n    client-key-data: abc\n"),
        "users[0].user.client-key-data: not base64"}},
      {"cert without key",
       {Config(good_cluster, "    client-certificate-data: " + Base64("C") + "\n"),
        "users[0].user: client-certificate without client-key"}},
      {"missing token file",
       {Config(good_cluster, "    tokenFile: /nonexistent/kdm/token\n"),
        "users[0].user.tokenFile:"}},
      {"exec plugin without apiVersion",
       {Config(good_cluster, "    exec: {command: aws}\n"),
        "users[0].user.exec.apiVersion: missing"}},
      {"unknown user",
       {"current-context: a\ncontexts:\n- name: a\n  context: {cluster: k, user: ghost}\n"
        "clusters:\n- name: k\n  cluster: {server: 'https://h'}\nusers: []\n",
        "contexts[0].context.user: no entry named \"ghost\" in users"}},
      {"user not a map", {Config(good_cluster, "      - 1\n"), "users[0].user: not a map"}},
  };
  for (const auto& [name, c] : cases) {
    StatusOr<ClientConfig> r = Load(c.first);
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << name << ": " << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("kubeconfig " + dir_ + "/config")) << name;
    EXPECT_THAT(r.status().message(), HasSubstr(c.second)) << name << ": " << r.status();
  }
}

TEST_F(KubeconfigTest, MissingAndHugeFilesAreRefused) {
  StatusOr<ClientConfig> missing = LoadKubeconfig(dir_ + "/absent");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr(dir_ + "/absent"));
  std::string huge = Write("huge", std::string(kMaxKubeconfigBytes + 1, '#'));
  StatusOr<ClientConfig> r = LoadKubeconfig(huge);
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange) << r.status();
}

TEST_F(KubeconfigTest, InClusterReadsEnvCaAndToken) {
  Write("sa/ca.crt", kCaText);
  Write("sa/token", "sa-token\n");
  std::map<std::string, std::string> env = {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                                            {"KUBERNETES_SERVICE_PORT", "443"}};
  InClusterOptions options;
  options.service_account_dir = dir_ + "/sa";
  options.lookup_env = [env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  StatusOr<ClientConfig> c = LoadInClusterConfig(options);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->source, "in-cluster");
  EXPECT_EQ(c->host, "10.96.0.1");
  EXPECT_EQ(c->port, 443);
  EXPECT_EQ(c->ca.text, kCaText);
  EXPECT_EQ(c->token_file, dir_ + "/sa/token");
  EXPECT_TRUE(c->token.empty());
}

TEST_F(KubeconfigTest, InClusterErrors) {
  InClusterOptions options;
  options.service_account_dir = dir_ + "/sa";
  std::map<std::string, std::string> env;
  options.lookup_env = [&env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  StatusOr<ClientConfig> r = LoadInClusterConfig(options);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("KUBERNETES_SERVICE_HOST"));

  env = {{"KUBERNETES_SERVICE_HOST", "10.0.0.1"}, {"KUBERNETES_SERVICE_PORT", "http"}};
  r = LoadInClusterConfig(options);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("port is not a number"));

  env["KUBERNETES_SERVICE_PORT"] = "6443";
  r = LoadInClusterConfig(options);  // no ca.crt
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr(dir_ + "/sa/ca.crt"));

  Write("sa/ca.crt", kCaText);
  Write("sa/token", " \n");
  r = LoadInClusterConfig(options);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("token file " + dir_ + "/sa/token is empty"));

  env["KUBERNETES_SERVICE_HOST"] = "fd00::1";
  Write("sa/token", "t");
  r = LoadInClusterConfig(options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ServerUrl(), "https://[fd00::1]:6443");
}

TEST_F(KubeconfigTest, TokenFileWithControlCharactersIsRefused) {
  std::string path = Write("tok",
                           "abc\x01"
                           "def");
  StatusOr<std::string> t = ReadTokenFile(path);
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("control character"));
}

// Issue 28: a kubeconfig nested 100,000 deep (YAML flow, which is also the
// JSON form, and block style) is refused by yaml-cpp's own depth guard,
// not a stack overflow.
TEST_F(KubeconfigTest, AHundredThousandDeepDocumentIsRefused) {
  for (const std::string& text :
       {"clusters: " + std::string(100'000, '[') + std::string(100'000, ']') + "\n",
        R"({"clusters":)" + std::string(100'000, '{') + "\n"}) {
    StatusOr<ClientConfig> c = Load(text);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status();
    EXPECT_THAT(c.status().message(), HasSubstr("not YAML"));
  }
}

}  // namespace
}  // namespace kdm::kube
