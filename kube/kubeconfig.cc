#include "kdm/kube/kubeconfig.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cstdlib>
#include <utility>

#include "kdm/base/file_system.h"
#include "kdm/base/log_value.h"

namespace kdm::kube {
namespace {

constexpr size_t kMaxQuotedBytes = 128;

std::string Quoted(std::string_view s) { return QuoteLogValue(s, kMaxQuotedBytes); }

std::string_view Trim(std::string_view s) {
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

// Standard base64 with padding; line breaks are ignored (Go's decoder
// ignores them too). nullopt on anything else.
std::optional<std::string> DecodeBase64(std::string_view in) {
  std::string out;
  out.reserve(in.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  size_t symbols = 0;
  size_t padding = 0;
  for (char c : in) {
    if (c == '\r' || c == '\n') continue;
    int v;
    if (c >= 'A' && c <= 'Z') {
      v = c - 'A';
    } else if (c >= 'a' && c <= 'z') {
      v = c - 'a' + 26;
    } else if (c >= '0' && c <= '9') {
      v = c - '0' + 52;
    } else if (c == '+') {
      v = 62;
    } else if (c == '/') {
      v = 63;
    } else if (c == '=') {
      ++padding;
      ++symbols;
      if (padding > 2) return std::nullopt;
      continue;
    } else {
      return std::nullopt;
    }
    if (padding > 0) return std::nullopt;  // data after '='
    ++symbols;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  if (symbols % 4 != 0) return std::nullopt;
  // The bits left over must be zero padding bits.
  if (bits > 0 && (acc & ((1u << bits) - 1)) != 0) return std::nullopt;
  return out;
}

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Parses "https://host[:port][/base]" into config. Errors name `field`.
Status ParseServer(std::string_view server, const std::string& field, ClientConfig& config) {
  auto bad = [&](std::string why) {
    return InvalidArgumentError(field + ": " + Quoted(server) + ": " + why);
  };
  constexpr std::string_view kHttps = "https://";
  if (server.substr(0, kHttps.size()) != kHttps) {
    if (server.substr(0, 7) == "http://") return bad("plain http is not supported; use https://");
    return bad("not an https:// URL");
  }
  std::string_view rest = server.substr(kHttps.size());
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? "" : rest.substr(slash);
  if (path.find_first_of("?#") != std::string_view::npos) {
    return bad("a query or fragment is not allowed");
  }
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  if (authority.find('@') != std::string_view::npos) return bad("user info is not allowed");
  std::string_view host;
  std::string_view port;
  if (!authority.empty() && authority.front() == '[') {
    size_t close = authority.find(']');
    if (close == std::string_view::npos) return bad("unclosed [ in the host");
    host = authority.substr(1, close - 1);
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return bad("junk after the IPv6 address");
      port = after.substr(1);
    }
  } else {
    size_t colon = authority.rfind(':');
    host = authority.substr(0, colon);
    if (colon != std::string_view::npos) port = authority.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) return bad("an IPv6 host needs [brackets]");
  }
  if (host.empty()) return bad("no host");
  for (char c : host) {
    if (static_cast<unsigned char>(c) <= ' ' || c == '/' || c == '\\' || c == 0x7f) {
      return bad("bad character in the host");
    }
  }
  config.port = 443;
  if (!port.empty() || authority.back() == ':') {
    unsigned value = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc() || end != port.data() + port.size() || value == 0 || value > 65535) {
      return bad("port is not a number in 1..65535");
    }
    config.port = static_cast<uint16_t>(value);
  }
  config.host = std::string(host);
  config.base_path = std::string(path);
  return OkStatus();
}

// One kubeconfig being read: the path, its directory, and field helpers.
class Reader {
 public:
  Reader(const std::string& path, Env* env) : path_(path), dir_(DirName(path)), env_(env) {}

  Status Error(const std::string& field, const std::string& why) const {
    return InvalidArgumentError("kubeconfig " + path_ + ": " + field + ": " + why);
  }
  Status Error(const std::string& why) const {
    return InvalidArgumentError("kubeconfig " + path_ + ": " + why);
  }

  // The scalar at node[key], or nullopt when absent/null. Errors when it is
  // a map or a list.
  StatusOr<std::optional<std::string>> Scalar(const YAML::Node& node, const std::string& key,
                                              const std::string& field) const {
    YAML::Node v = node[key];
    // A missing key of a const map is an invalid node: IsDefined first.
    if (!v.IsDefined() || v.IsNull()) return std::optional<std::string>();
    if (!v.IsScalar()) return Error(field, "not a string");
    return std::optional<std::string>(v.Scalar());
  }

  StatusOr<bool> Bool(const YAML::Node& node, const std::string& key,
                      const std::string& field) const {
    KDM_ASSIGN_OR_RETURN(std::optional<std::string> v, Scalar(node, key, field));
    if (!v) return false;
    if (*v == "true" || *v == "True" || *v == "TRUE") return true;
    if (*v == "false" || *v == "False" || *v == "FALSE") return false;
    return Error(field, "not true or false: " + Quoted(*v));
  }

  // A file name from the kubeconfig, relative ones against its directory.
  std::string Resolve(const std::string& file) const {
    if (!file.empty() && file.front() == '/') return file;
    return JoinPath(dir_, file);
  }

  // The PEM of `<key>` (a file) or `<key>-data` (base64), or an empty Pem.
  StatusOr<Pem> PemField(const YAML::Node& node, const std::string& key,
                         const std::string& prefix) const {
    const std::string data_field = prefix + "." + key + "-data";
    const std::string file_field = prefix + "." + key;
    KDM_ASSIGN_OR_RETURN(std::optional<std::string> data, Scalar(node, key + "-data", data_field));
    KDM_ASSIGN_OR_RETURN(std::optional<std::string> file, Scalar(node, key, file_field));
    if (data && !data->empty()) {
      std::optional<std::string> decoded = DecodeBase64(*data);
      if (!decoded) return Error(data_field, "not base64");
      if (decoded->empty()) return Error(data_field, "empty");
      return Pem{std::move(*decoded), "kubeconfig " + path_ + ": " + data_field};
    }
    if (file && !file->empty()) {
      std::string resolved = Resolve(*file);
      StatusOr<std::string> text = env_->ReadFile(resolved, kMaxCredentialFileBytes);
      if (!text.ok()) return Error(file_field, text.status().message());
      if (text->empty()) return Error(file_field, resolved + " is empty");
      return Pem{std::move(*text), resolved};
    }
    return Pem{};
  }

  // The entry of `list` (clusters, users, contexts) whose name is `name`:
  // its inner map (entry[inner]) and its field prefix ("users[2].user").
  StatusOr<std::pair<YAML::Node, std::string>> Find(const YAML::Node& root, const std::string& list,
                                                    const std::string& inner,
                                                    const std::string& name,
                                                    const std::string& wanted_by) const {
    YAML::Node entries = root[list];
    // A missing key of a const map is an invalid node: ask IsDefined first.
    const bool present = entries.IsDefined() && !entries.IsNull();
    if (present && !entries.IsSequence()) return Error(list, "not a list");
    if (present) {
      for (size_t i = 0; i < entries.size(); ++i) {
        const std::string at = list + "[" + std::to_string(i) + "]";
        YAML::Node entry = entries[i];
        if (!entry.IsMap()) return Error(at, "not a map");
        KDM_ASSIGN_OR_RETURN(std::optional<std::string> entry_name,
                             Scalar(entry, "name", at + ".name"));
        if (!entry_name || *entry_name != name) continue;
        YAML::Node body = entry[inner];
        if (!body.IsDefined() || body.IsNull()) return Error(at + "." + inner, "missing");
        if (!body.IsMap()) return Error(at + "." + inner, "not a map");
        return std::make_pair(body, at + "." + inner);
      }
    }
    return Error(wanted_by, "no entry named " + Quoted(name) + " in " + list);
  }

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string dir_;
  Env* env_;
};

StatusOr<ClientConfig> Parse(std::string_view yaml, const std::string& path,
                             const std::string* context_override, Env* env) {
  Reader r(path, env);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    std::string where;
    if (!e.mark.is_null()) {
      where = " at line " + std::to_string(e.mark.line + 1) + ", column " +
              std::to_string(e.mark.column + 1);
    }
    return r.Error("not YAML" + where + ": " + e.msg);
  }
  try {
    if (!root.IsMap()) return r.Error("not a map of kubeconfig fields");
    std::string context_name;
    std::string context_field = "current-context";
    if (context_override != nullptr) {
      context_name = *context_override;
      context_field = "context " + Quoted(context_name);
    } else {
      KDM_ASSIGN_OR_RETURN(std::optional<std::string> current,
                           r.Scalar(root, "current-context", "current-context"));
      if (!current || current->empty()) return r.Error("current-context", "missing");
      context_name = *current;
    }
    KDM_ASSIGN_OR_RETURN(auto context,
                         r.Find(root, "contexts", "context", context_name, context_field));
    const auto& [ctx, ctx_field] = context;
    KDM_ASSIGN_OR_RETURN(std::optional<std::string> cluster_name,
                         r.Scalar(ctx, "cluster", ctx_field + ".cluster"));
    if (!cluster_name || cluster_name->empty()) return r.Error(ctx_field + ".cluster", "missing");
    KDM_ASSIGN_OR_RETURN(std::optional<std::string> user_name,
                         r.Scalar(ctx, "user", ctx_field + ".user"));

    ClientConfig config;
    config.source = "kubeconfig " + path;
    KDM_ASSIGN_OR_RETURN(
        auto cluster, r.Find(root, "clusters", "cluster", *cluster_name, ctx_field + ".cluster"));
    const auto& [cl, cl_field] = cluster;
    KDM_ASSIGN_OR_RETURN(std::optional<std::string> server,
                         r.Scalar(cl, "server", cl_field + ".server"));
    if (!server || server->empty()) return r.Error(cl_field + ".server", "missing");
    Status server_ok = ParseServer(*server, cl_field + ".server", config);
    if (!server_ok.ok()) return r.Error(server_ok.message());
    KDM_ASSIGN_OR_RETURN(config.ca, r.PemField(cl, "certificate-authority", cl_field));
    KDM_ASSIGN_OR_RETURN(
        config.insecure_skip_tls_verify,
        r.Bool(cl, "insecure-skip-tls-verify", cl_field + ".insecure-skip-tls-verify"));
    if (config.insecure_skip_tls_verify && !config.ca.empty()) {
      // kubectl refuses this pair too: one of them is a mistake.
      return r.Error(cl_field, "certificate-authority and insecure-skip-tls-verify together");
    }

    // A context may name no user (anonymous); a named one must exist.
    if (user_name && !user_name->empty()) {
      KDM_ASSIGN_OR_RETURN(auto user,
                           r.Find(root, "users", "user", *user_name, ctx_field + ".user"));
      const auto& [us, us_field] = user;
      KDM_ASSIGN_OR_RETURN(std::optional<std::string> token,
                           r.Scalar(us, "token", us_field + ".token"));
      if (token) config.token = std::string(Trim(*token));
      KDM_ASSIGN_OR_RETURN(std::optional<std::string> token_file,
                           r.Scalar(us, "tokenFile", us_field + ".tokenFile"));
      if (token_file && !token_file->empty()) {
        config.token_file = r.Resolve(*token_file);
        StatusOr<std::string> first = ReadTokenFile(config.token_file, env);
        if (!first.ok()) return r.Error(us_field + ".tokenFile", first.status().message());
      }
      KDM_ASSIGN_OR_RETURN(config.client_certificate,
                           r.PemField(us, "client-certificate", us_field));
      KDM_ASSIGN_OR_RETURN(config.client_key, r.PemField(us, "client-key", us_field));
      if (config.client_certificate.empty() != config.client_key.empty()) {
        return r.Error(us_field, config.client_key.empty()
                                     ? "client-certificate without client-key"
                                     : "client-key without client-certificate");
      }
      for (const char* unsupported : {"exec", "auth-provider", "username"}) {
        YAML::Node v = us[unsupported];
        if (v.IsDefined() && !v.IsNull() && config.token.empty() && config.token_file.empty() &&
            config.client_certificate.empty()) {
          return r.Error(us_field + "." + unsupported,
                         "not supported by kdm (use a token, tokenFile or client certificate)");
        }
      }
    }
    return config;
  } catch (const YAML::Exception& e) {
    return r.Error(std::string("unexpected YAML structure: ") + e.msg);
  }
}

}  // namespace

std::string ClientConfig::ServerUrl() const {
  const bool v6 = host.find(':') != std::string::npos;
  return "https://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port) + base_path;
}

StatusOr<std::string> ReadTokenFile(const std::string& path, Env* env) {
  KDM_ASSIGN_OR_RETURN(std::string text, env->ReadFile(path, kMaxCredentialFileBytes));
  std::string_view token = Trim(text);
  if (token.empty()) return InvalidArgumentError("token file " + path + " is empty");
  for (char c : token) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return InvalidArgumentError("token file " + path + " holds a control character");
    }
  }
  return std::string(token);
}

StatusOr<ClientConfig> LoadKubeconfig(const std::string& path, Env* env) {
  StatusOr<std::string> text = env->ReadFile(path, kMaxKubeconfigBytes);
  if (!text.ok()) return text.status().WithPrefix("kubeconfig " + path);
  return ParseKubeconfig(*text, path, env);
}

StatusOr<ClientConfig> ParseKubeconfig(std::string_view yaml, const std::string& path, Env* env) {
  return Parse(yaml, path, nullptr, env);
}

StatusOr<ClientConfig> ParseKubeconfigContext(std::string_view yaml, const std::string& path,
                                              const std::string& context_name, Env* env) {
  return Parse(yaml, path, &context_name, env);
}

StatusOr<ClientConfig> LoadInClusterConfig(const InClusterOptions& options) {
  auto lookup = options.lookup_env;
  if (!lookup) {
    lookup = [](const std::string& name) -> std::optional<std::string> {
      const char* v = std::getenv(name.c_str());
      if (v == nullptr) return std::nullopt;
      return std::string(v);
    };
  }
  std::optional<std::string> host = lookup("KUBERNETES_SERVICE_HOST");
  std::optional<std::string> port = lookup("KUBERNETES_SERVICE_PORT");
  if (!host || host->empty() || !port || port->empty()) {
    return FailedPreconditionError(
        "in-cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set (is kdm "
        "running in a pod?)");
  }
  ClientConfig config;
  config.source = "in-cluster";
  const bool v6 = host->find(':') != std::string::npos;
  Status server = ParseServer("https://" + (v6 ? "[" + *host + "]" : *host) + ":" + *port,
                              "in-cluster: KUBERNETES_SERVICE_HOST/PORT", config);
  if (!server.ok()) return server;
  const std::string ca_path = JoinPath(options.service_account_dir, "ca.crt");
  StatusOr<std::string> ca = options.env->ReadFile(ca_path, kMaxCredentialFileBytes);
  if (!ca.ok()) return ca.status().WithPrefix("in-cluster: CA " + ca_path);
  if (ca->empty()) return InvalidArgumentError("in-cluster: CA " + ca_path + " is empty");
  config.ca = Pem{std::move(*ca), ca_path};
  config.token_file = JoinPath(options.service_account_dir, "token");
  StatusOr<std::string> token = ReadTokenFile(config.token_file, options.env);
  if (!token.ok()) return token.status().WithPrefix("in-cluster");
  return config;
}

}  // namespace kdm::kube
