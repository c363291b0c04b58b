#include "kdm/kube/kubeconfig.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <nlohmann/json.hpp>
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

// "host", "host:port", "[v6]" or "[v6]:port" split into host and port
// (`default_port` when none is given). The error is the reason alone, for
// the caller to prefix with the field and URL.
struct Authority {
  std::string host;
  uint16_t port = 0;
};
StatusOr<Authority> ParseAuthority(std::string_view authority, uint16_t default_port) {
  auto bad = [](const char* why) { return InvalidArgumentError(why); };
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
  Authority out{std::string(host), default_port};
  if (!port.empty() || (!authority.empty() && authority.back() == ':')) {
    unsigned value = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc() || end != port.data() + port.size() || value == 0 || value > 65535) {
      return bad("port is not a number in 1..65535");
    }
    out.port = static_cast<uint16_t>(value);
  }
  return out;
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
  StatusOr<Authority> parsed = ParseAuthority(authority, 443);
  if (!parsed.ok()) return bad(std::string(parsed.status().message()));
  config.port = parsed->port;
  config.host = std::move(parsed->host);
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

  const std::string& path() const { return path_; }
  Env* env() const { return env_; }

 private:
  std::string path_;
  std::string dir_;
  Env* env_;
};

std::string EncodeBase64(std::string_view in) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  auto at = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(in[k])); };
  for (; i + 3 <= in.size(); i += 3) {
    uint32_t v = (at(i) << 16) | (at(i + 1) << 8) | at(i + 2);
    for (int shift = 18; shift >= 0; shift -= 6) out.push_back(kAlphabet[(v >> shift) & 63]);
  }
  if (in.size() - i == 1) {
    uint32_t v = at(i) << 16;
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], '=', '='};
  } else if (in.size() - i == 2) {
    uint32_t v = (at(i) << 16) | (at(i + 1) << 8);
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], kAlphabet[(v >> 6) & 63], '='};
  }
  return out;
}

// The keys of a kubeconfig stanza: those kdm reads, and those client-go
// knows that kdm does not implement (refused by name, never ignored).
// `extensions` is always ignored: it carries data for other programs.
struct StanzaKeys {
  std::vector<std::string_view> implemented;
  std::vector<std::string_view> unsupported;
};

// Every key of `map` must be implemented (or `extensions`).
Status CheckKeys(const Reader& r, const YAML::Node& map, const std::string& field,
                 const StanzaKeys& keys) {
  for (const auto& kv : map) {
    if (!kv.first.IsScalar()) return r.Error(field, "a key that is not a string");
    const std::string key = kv.first.Scalar();
    if (key == "extensions") continue;
    auto has = [&key](const std::vector<std::string_view>& list) {
      return std::find(list.begin(), list.end(), key) != list.end();
    };
    if (has(keys.implemented)) continue;
    if (has(keys.unsupported)) return r.Error(field + "." + key, "not supported by kdm");
    return r.Error(field + "." + Quoted(key), "unknown field (not supported by kdm)");
  }
  return OkStatus();
}

const StanzaKeys kClusterKeys{
    {"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify",
     "tls-server-name", "proxy-url", "disable-compression"},
    {}};
const StanzaKeys kUserKeys{
    {"token", "tokenFile", "client-certificate", "client-certificate-data", "client-key",
     "client-key-data", "exec"},
    {"auth-provider", "username", "password", "as", "as-uid", "as-groups", "as-user-extra"}};
// namespace is kubectl's default namespace for its own commands; kdm names
// every namespace it uses, so it has nothing to apply it to.
const StanzaKeys kContextKeys{{"cluster", "user", "namespace"}, {}};
const StanzaKeys kExecKeys{{"command", "args", "env", "apiVersion", "installHint",
                            "provideClusterInfo", "interactiveMode"},
                           {}};
const StanzaKeys kExecEnvKeys{{"name", "value"}, {}};

constexpr std::string_view kExecV1 = "client.authentication.k8s.io/v1";
constexpr std::string_view kExecV1beta1 = "client.authentication.k8s.io/v1beta1";

// "http://host[:port][/]" (an HTTP CONNECT proxy) or "socks5://host[:port]".
// Other schemes are refused.
Status ParseProxy(const Reader& r, std::string_view url, const std::string& field,
                  ProxyConfig& proxy) {
  auto bad = [&](const std::string& why) { return r.Error(field, Quoted(url) + ": " + why); };
  size_t scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) return bad("not a URL (http://host:port)");
  std::string_view scheme = url.substr(0, scheme_end);
  if (scheme != "http" && scheme != "socks5") {
    return bad("scheme " + Quoted(scheme) +
               " is not supported by kdm (only http:// proxies, through HTTP CONNECT, and "
               "socks5://)");
  }
  std::string_view rest = url.substr(scheme_end + 3);
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (slash != std::string_view::npos && rest.substr(slash) != "/") {
    return bad("a path, query or fragment is not allowed");
  }
  if (authority.find('@') != std::string_view::npos) {
    return bad("proxy credentials are not supported by kdm");
  }
  StatusOr<Authority> parsed = ParseAuthority(authority, scheme == "socks5" ? 1080 : 80);
  if (!parsed.ok()) return bad(std::string(parsed.status().message()));
  proxy.url = std::string(url);
  proxy.host = std::move(parsed->host);
  proxy.port = parsed->port;
  return OkStatus();
}

// One file of a (merged) kubeconfig.
struct Doc {
  Reader reader;
  YAML::Node root;
};

// An entry found by name, and the file it is in.
struct Found {
  const Reader* reader;
  YAML::Node body;
  std::string field;
};

// The entry of `list` named `name`: the first file that has one wins, as
// client-go merges a KUBECONFIG list. Errors name the file of the entry
// (or, when none has it, `wanted_by`'s).
StatusOr<Found> FindEntry(const std::vector<Doc>& docs, const std::string& list,
                          const std::string& inner, const std::string& name,
                          const Reader& wanted_by_reader, const std::string& wanted_by) {
  for (const Doc& doc : docs) {
    const Reader& r = doc.reader;
    YAML::Node entries = doc.root[list];
    // A missing key of a const map is an invalid node: ask IsDefined first.
    const bool present = entries.IsDefined() && !entries.IsNull();
    if (!present) continue;
    if (!entries.IsSequence()) return r.Error(list, "not a list");
    for (size_t i = 0; i < entries.size(); ++i) {
      const std::string at = list + "[" + std::to_string(i) + "]";
      YAML::Node entry = entries[i];
      if (!entry.IsMap()) return r.Error(at, "not a map");
      KDM_ASSIGN_OR_RETURN(std::optional<std::string> entry_name,
                           r.Scalar(entry, "name", at + ".name"));
      if (!entry_name || *entry_name != name) continue;
      KDM_RETURN_IF_ERROR(CheckKeys(r, entry, at, StanzaKeys{{"name", inner}, {}}));
      YAML::Node body = entry[inner];
      if (!body.IsDefined() || body.IsNull()) return r.Error(at + "." + inner, "missing");
      if (!body.IsMap()) return r.Error(at + "." + inner, "not a map");
      return Found{&r, body, at + "." + inner};
    }
  }
  return wanted_by_reader.Error(wanted_by, "no entry named " + Quoted(name) + " in " + list);
}

// users[i].user.exec into config.exec.
Status ReadExec(const Reader& r, const YAML::Node& exec, const std::string& field,
                const std::string& user_name, const std::string& server_text,
                const ClientConfig& cluster, ClientConfig& config) {
  if (!exec.IsMap()) return r.Error(field, "not a map");
  KDM_RETURN_IF_ERROR(CheckKeys(r, exec, field, kExecKeys));
  ExecConfig e;
  e.who = "user " + Quoted(user_name) + " (kubeconfig " + r.path() + ": " + field + ")";
  e.kubeconfig_dir = DirName(r.path());
  KDM_ASSIGN_OR_RETURN(std::optional<std::string> api_version,
                       r.Scalar(exec, "apiVersion", field + ".apiVersion"));
  if (!api_version || api_version->empty()) return r.Error(field + ".apiVersion", "missing");
  if (*api_version != kExecV1 && *api_version != kExecV1beta1) {
    return r.Error(field + ".apiVersion", Quoted(*api_version) + " is not supported by kdm (use " +
                                              std::string(kExecV1) + " or " +
                                              std::string(kExecV1beta1) + ")");
  }
  e.api_version = *api_version;
  KDM_ASSIGN_OR_RETURN(std::optional<std::string> command,
                       r.Scalar(exec, "command", field + ".command"));
  if (!command || command->empty()) return r.Error(field + ".command", "missing");
  e.command = *command;
  YAML::Node args = exec["args"];
  if (args.IsDefined() && !args.IsNull()) {
    if (!args.IsSequence()) return r.Error(field + ".args", "not a list");
    for (size_t i = 0; i < args.size(); ++i) {
      if (!args[i].IsScalar()) {
        return r.Error(field + ".args[" + std::to_string(i) + "]", "not a string");
      }
      e.args.push_back(args[i].Scalar());
    }
  }
  YAML::Node env = exec["env"];
  if (env.IsDefined() && !env.IsNull()) {
    if (!env.IsSequence()) return r.Error(field + ".env", "not a list");
    for (size_t i = 0; i < env.size(); ++i) {
      const std::string at = field + ".env[" + std::to_string(i) + "]";
      if (!env[i].IsMap()) return r.Error(at, "not a map of name and value");
      KDM_RETURN_IF_ERROR(CheckKeys(r, env[i], at, kExecEnvKeys));
      KDM_ASSIGN_OR_RETURN(std::optional<std::string> name, r.Scalar(env[i], "name", at + ".name"));
      if (!name || name->empty()) return r.Error(at + ".name", "missing");
      if (name->find_first_of("=\0", 0, 2) != std::string::npos) {
        return r.Error(at + ".name", Quoted(*name) + ": not a variable name");
      }
      KDM_ASSIGN_OR_RETURN(std::optional<std::string> value,
                           r.Scalar(env[i], "value", at + ".value"));
      if (value && value->find('\0') != std::string::npos) {
        return r.Error(at + ".value", "holds a NUL byte");
      }
      e.env.emplace_back(*name, value.value_or(""));
    }
  }
  KDM_ASSIGN_OR_RETURN(std::optional<std::string> hint,
                       r.Scalar(exec, "installHint", field + ".installHint"));
  e.install_hint = hint.value_or("");
  KDM_ASSIGN_OR_RETURN(bool provide_cluster_info,
                       r.Bool(exec, "provideClusterInfo", field + ".provideClusterInfo"));
  KDM_ASSIGN_OR_RETURN(std::optional<std::string> mode,
                       r.Scalar(exec, "interactiveMode", field + ".interactiveMode"));
  if (!mode || mode->empty()) {
    // client-go requires it from v1 on.
    if (e.api_version == kExecV1) return r.Error(field + ".interactiveMode", "missing");
  } else if (*mode == "Always") {
    return r.Error(field + ".interactiveMode",
                   "Always: kdm never runs a plugin interactively (use Never or IfAvailable)");
  } else if (*mode != "Never" && *mode != "IfAvailable") {
    return r.Error(field + ".interactiveMode",
                   Quoted(*mode) + " is not Never, IfAvailable or Always");
  }
  nlohmann::json info = {{"apiVersion", e.api_version},
                         {"kind", "ExecCredential"},
                         {"spec", {{"interactive", false}}}};
  if (provide_cluster_info) {
    nlohmann::json c = {{"server", server_text}};
    if (!cluster.tls_server_name.empty()) c["tls-server-name"] = cluster.tls_server_name;
    if (cluster.insecure_skip_tls_verify) c["insecure-skip-tls-verify"] = true;
    if (!cluster.ca.empty()) c["certificate-authority-data"] = EncodeBase64(cluster.ca.text);
    if (!cluster.proxy.empty()) c["proxy-url"] = cluster.proxy.url;
    info["spec"]["cluster"] = std::move(c);
  }
  e.exec_info_json = info.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  config.exec = std::move(e);
  return OkStatus();
}

StatusOr<Doc> LoadDoc(std::string_view yaml, const std::string& path, Env* env) {
  Doc doc{Reader(path, env), YAML::Node()};
  try {
    doc.root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    std::string where;
    if (!e.mark.is_null()) {
      where = " at line " + std::to_string(e.mark.line + 1) + ", column " +
              std::to_string(e.mark.column + 1);
    }
    return doc.reader.Error("not YAML" + where + ": " + e.msg);
  }
  // An empty file is an empty config (client-go reads it so).
  if (doc.root.IsNull()) doc.root = YAML::Node(YAML::NodeType::Map);
  if (!doc.root.IsMap()) return doc.reader.Error("not a map of kubeconfig fields");
  return doc;
}

StatusOr<ClientConfig> Resolve(const std::vector<Doc>& docs, const std::string& source,
                               const std::string* context_override) {
  const Reader& first = docs.front().reader;
  // Errors not about one file name them all.
  Reader all(source, nullptr);
  std::string context_name;
  std::string context_field = "current-context";
  const Reader* context_reader = &all;
  if (context_override != nullptr) {
    context_name = *context_override;
    context_field = "context " + Quoted(context_name);
  } else {
    for (const Doc& doc : docs) {
      KDM_ASSIGN_OR_RETURN(std::optional<std::string> current,
                           doc.reader.Scalar(doc.root, "current-context", "current-context"));
      if (current && !current->empty()) {
        context_name = *current;
        context_reader = &doc.reader;
        break;
      }
    }
    if (context_name.empty()) {
      return (docs.size() == 1 ? first : all).Error("current-context", "missing");
    }
  }
  if (docs.size() == 1) context_reader = &first;
  KDM_ASSIGN_OR_RETURN(Found ctx, FindEntry(docs, "contexts", "context", context_name,
                                            *context_reader, context_field));
  const Reader& cr = *ctx.reader;
  KDM_RETURN_IF_ERROR(CheckKeys(cr, ctx.body, ctx.field, kContextKeys));
  KDM_ASSIGN_OR_RETURN(std::optional<std::string> cluster_name,
                       cr.Scalar(ctx.body, "cluster", ctx.field + ".cluster"));
  if (!cluster_name || cluster_name->empty()) return cr.Error(ctx.field + ".cluster", "missing");
  KDM_ASSIGN_OR_RETURN(std::optional<std::string> user_name,
                       cr.Scalar(ctx.body, "user", ctx.field + ".user"));
  KDM_ASSIGN_OR_RETURN(std::optional<std::string> ns,
                       cr.Scalar(ctx.body, "namespace", ctx.field + ".namespace"));

  ClientConfig config;
  config.source = "kubeconfig " + source;
  config.context = context_name;
  KDM_ASSIGN_OR_RETURN(
      Found cl, FindEntry(docs, "clusters", "cluster", *cluster_name, cr, ctx.field + ".cluster"));
  const Reader& kr = *cl.reader;
  KDM_RETURN_IF_ERROR(CheckKeys(kr, cl.body, cl.field, kClusterKeys));
  KDM_ASSIGN_OR_RETURN(std::optional<std::string> server,
                       kr.Scalar(cl.body, "server", cl.field + ".server"));
  if (!server || server->empty()) return kr.Error(cl.field + ".server", "missing");
  Status server_ok = ParseServer(*server, cl.field + ".server", config);
  if (!server_ok.ok()) return kr.Error(server_ok.message());
  KDM_ASSIGN_OR_RETURN(config.ca, kr.PemField(cl.body, "certificate-authority", cl.field));
  KDM_ASSIGN_OR_RETURN(
      config.insecure_skip_tls_verify,
      kr.Bool(cl.body, "insecure-skip-tls-verify", cl.field + ".insecure-skip-tls-verify"));
  if (config.insecure_skip_tls_verify && !config.ca.empty()) {
    // kubectl refuses this pair too: one of them is a mistake.
    return kr.Error(cl.field, "certificate-authority and insecure-skip-tls-verify together");
  }
  // kdm never asks for a compressed answer: disable-compression holds
  // whatever it says; only its type is checked.
  KDM_ASSIGN_OR_RETURN(bool ignored_compression,
                       kr.Bool(cl.body, "disable-compression", cl.field + ".disable-compression"));
  (void)ignored_compression;
  KDM_ASSIGN_OR_RETURN(std::optional<std::string> sni,
                       kr.Scalar(cl.body, "tls-server-name", cl.field + ".tls-server-name"));
  if (sni && !sni->empty()) {
    for (char c : *sni) {
      if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f || c == '/' || c == '\\') {
        return kr.Error(cl.field + ".tls-server-name", Quoted(*sni) + ": not a host name");
      }
    }
    config.tls_server_name = *sni;
  }
  KDM_ASSIGN_OR_RETURN(std::optional<std::string> proxy,
                       kr.Scalar(cl.body, "proxy-url", cl.field + ".proxy-url"));
  if (proxy && !proxy->empty()) {
    KDM_RETURN_IF_ERROR(ParseProxy(kr, *proxy, cl.field + ".proxy-url", config.proxy));
  }

  // A context may name no user (anonymous); a named one must exist.
  if (user_name && !user_name->empty()) {
    KDM_ASSIGN_OR_RETURN(Found us,
                         FindEntry(docs, "users", "user", *user_name, cr, ctx.field + ".user"));
    const Reader& ur = *us.reader;
    KDM_RETURN_IF_ERROR(CheckKeys(ur, us.body, us.field, kUserKeys));
    KDM_ASSIGN_OR_RETURN(std::optional<std::string> token,
                         ur.Scalar(us.body, "token", us.field + ".token"));
    if (token) config.token = std::string(Trim(*token));
    KDM_ASSIGN_OR_RETURN(std::optional<std::string> token_file,
                         ur.Scalar(us.body, "tokenFile", us.field + ".tokenFile"));
    if (token_file && !token_file->empty()) {
      config.token_file = ur.Resolve(*token_file);
      StatusOr<std::string> read = ReadTokenFile(config.token_file, ur.env());
      if (!read.ok()) return ur.Error(us.field + ".tokenFile", read.status().message());
    }
    KDM_ASSIGN_OR_RETURN(config.client_certificate,
                         ur.PemField(us.body, "client-certificate", us.field));
    KDM_ASSIGN_OR_RETURN(config.client_key, ur.PemField(us.body, "client-key", us.field));
    if (config.client_certificate.empty() != config.client_key.empty()) {
      return ur.Error(us.field, config.client_key.empty()
                                    ? "client-certificate without client-key"
                                    : "client-key without client-certificate");
    }
    YAML::Node exec = us.body["exec"];
    if (exec.IsDefined() && !exec.IsNull()) {
      if (!config.token.empty() || !config.token_file.empty()) {
        return ur.Error(us.field, "exec together with token or tokenFile: give one");
      }
      KDM_RETURN_IF_ERROR(
          ReadExec(ur, exec, us.field + ".exec", *user_name, *server, config, config));
    }
  }
  return config;
}

StatusOr<ClientConfig> Parse(std::string_view yaml, const std::string& path,
                             const std::string* context_override, Env* env) {
  KDM_ASSIGN_OR_RETURN(Doc doc, LoadDoc(yaml, path, env));
  std::vector<Doc> docs;
  docs.push_back(std::move(doc));
  try {
    return Resolve(docs, path, context_override);
  } catch (const YAML::Exception& e) {
    return docs.front().reader.Error(std::string("unexpected YAML structure: ") + e.msg);
  }
}

EnvLookup OrGetenv(EnvLookup lookup) {
  if (lookup) return lookup;
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

// The most files a KUBECONFIG list may name.
constexpr size_t kMaxKubeconfigFiles = 64;

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
  EnvLookup lookup = OrGetenv(options.lookup_env);
  std::optional<std::string> host = lookup("KUBERNETES_SERVICE_HOST");
  std::optional<std::string> port = lookup("KUBERNETES_SERVICE_PORT");
  if (!host || host->empty() || !port || port->empty()) {
    return FailedPreconditionError(
        "in-cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set (is kdm "
        "running in a pod?)");
  }
  ClientConfig config;
  config.source = "in-cluster";
  config.found_by = "in-cluster";
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

StatusOr<ClientConfig> LoadClientConfig(const LoadingRules& rules) {
  EnvLookup lookup = OrGetenv(rules.lookup_env);
  Env* env = rules.env;
  const std::string* context = rules.context.empty() ? nullptr : &rules.context;
  InClusterOptions in_cluster = rules.in_cluster_options;
  if (!in_cluster.lookup_env) in_cluster.lookup_env = lookup;
  if (rules.in_cluster) {
    if (context != nullptr) {
      return InvalidArgumentError("--context names a kubeconfig context; --in-cluster has none");
    }
    return LoadInClusterConfig(in_cluster);
  }
  auto load_list = [&](const std::vector<std::string>& paths, const std::string& found_by,
                       const std::string& shown) -> StatusOr<ClientConfig> {
    std::vector<Doc> docs;
    for (const std::string& path : paths) {
      StatusOr<std::string> text = env->ReadFile(path, kMaxKubeconfigBytes);
      if (!text.ok()) return text.status().WithPrefix("kubeconfig " + path);
      KDM_ASSIGN_OR_RETURN(Doc doc, LoadDoc(*text, path, env));
      docs.push_back(std::move(doc));
    }
    try {
      KDM_ASSIGN_OR_RETURN(ClientConfig config, Resolve(docs, shown, context));
      config.found_by = found_by;
      return config;
    } catch (const YAML::Exception& e) {
      return InvalidArgumentError("kubeconfig " + shown + ": unexpected YAML structure: " + e.msg);
    }
  };
  if (!rules.kubeconfig.empty()) {
    return load_list({rules.kubeconfig}, "--kubeconfig", rules.kubeconfig);
  }
  std::optional<std::string> list = lookup("KUBECONFIG");
  if (list && !list->empty()) {
    // Missing files are skipped (client-go does too), duplicates read once;
    // relative names are against the working directory.
    std::vector<std::string> paths, missing;
    size_t begin = 0;
    while (begin <= list->size()) {
      size_t end = list->find(':', begin);
      if (end == std::string::npos) end = list->size();
      std::string path = list->substr(begin, end - begin);
      begin = end + 1;
      if (path.empty()) continue;
      if (std::find(paths.begin(), paths.end(), path) != paths.end() ||
          std::find(missing.begin(), missing.end(), path) != missing.end()) {
        continue;
      }
      if (paths.size() + missing.size() >= kMaxKubeconfigFiles) {
        return InvalidArgumentError("KUBECONFIG: more than " + std::to_string(kMaxKubeconfigFiles) +
                                    " files");
      }
      StatusOr<FileInfo> info = env->Stat(path);
      if (!info.ok() && info.status().code() == StatusCode::kNotFound) {
        missing.push_back(path);
        continue;
      }
      paths.push_back(path);
    }
    if (paths.empty()) {
      return InvalidArgumentError("KUBECONFIG=" + Quoted(*list) +
                                  ": none of the files it lists exists");
    }
    std::string shown;
    for (const std::string& p : paths) shown += (shown.empty() ? "" : ":") + p;
    return load_list(paths, "KUBECONFIG", shown);
  }
  std::string home = rules.home.empty() ? lookup("HOME").value_or("") : rules.home;
  std::string home_config;
  if (!home.empty()) {
    home_config = JoinPath(JoinPath(home, ".kube"), "config");
    StatusOr<FileInfo> info = env->Stat(home_config);
    if (info.ok() || info.status().code() != StatusCode::kNotFound) {
      return load_list({home_config}, "home", home_config);
    }
  }
  std::optional<std::string> service_host = lookup("KUBERNETES_SERVICE_HOST");
  const std::string token = JoinPath(in_cluster.service_account_dir, "token");
  const bool in_pod = service_host && !service_host->empty() && env->Stat(token).ok();
  if (in_pod && context == nullptr) return LoadInClusterConfig(in_cluster);
  std::string tried = "KUBECONFIG is not set, " + (home.empty() ? std::string("HOME is not set")
                                                                : home_config + " does not exist");
  if (context != nullptr) {
    return NotFoundError("--context " + Quoted(*context) + ": no kubeconfig (" + tried +
                         "); give --kubeconfig FILE");
  }
  return NotFoundError("no kubeconfig: " + tried + ", and kdm is not in a pod (" +
                       (service_host && !service_host->empty()
                            ? token + " does not exist"
                            : std::string("KUBERNETES_SERVICE_HOST is not set")) +
                       "); give --kubeconfig FILE or --in-cluster");
}

}  // namespace kdm::kube
