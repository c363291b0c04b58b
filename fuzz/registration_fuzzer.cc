// Fuzz target: the checks a Register call passes before the Manager sees it,
// the wire layer's rules (pluginapi/api_rules.h: ValidateVersion,
// IsExtendedResourceName, ValidateResourceName, CheckEndpointName,
// CheckPluginEndpoint).
//
// Input: "<version>\n<resource name>\n<endpoint>" (missing fields are empty;
// the endpoint is the rest, newlines and NUL bytes included).
//
// Properties:
// - ValidateVersion accepts exactly "v1beta1";
// - an accepted resource name satisfies the documented rules, checked here
//   independently, and a pod manifest may ask for it (the pod manifest
//   reader keeps it as a device limit); ValidateResourceName agrees with
//   IsExtendedResourceName;
// - CheckPluginEndpoint, against a private directory made once (a socket, a
//   symlink to it, a regular file, a sub-directory, a dangling symlink and a
//   symlink to a socket outside), accepts only a plain socket of that
//   directory (or a symlink resolving to one inside it) and returns
//   dir + "/" + endpoint; the real socket is always accepted; a name it
//   accepts passes CheckEndpointName.
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>

#include "fuzz_check.h"
#include "kdm/fakes/pod_manifest.h"
#include "kdm/k8s/names.h"
#include "kdm/pluginapi/api_rules.h"
#include "nlohmann/json.hpp"

namespace {

namespace api = kdm::pluginapi;

void BindSocket(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  FUZZ_CHECK(fd >= 0, "socket()");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  FUZZ_CHECK(path.size() < sizeof(addr.sun_path), "socket path too long: " << path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  FUZZ_CHECK(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0, "bind " << path);
  // The fd stays open for the process's life.
}

// Removed again at a normal exit (the replay tests, libFuzzer's time limit);
// a crashing run leaves it behind in /tmp for a look.
struct PluginDir {
  std::string root;
  std::string dir;
  std::string real_dir;
  ~PluginDir() {
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
  }
  PluginDir() {
    char tmpl[] = "/tmp/kdm-fuzz-reg-XXXXXX";
    FUZZ_CHECK(mkdtemp(tmpl) != nullptr, "mkdtemp");
    root = tmpl;
    dir = root + "/plugins";
    FUZZ_CHECK(mkdir(dir.c_str(), 0750) == 0 && mkdir((root + "/out").c_str(), 0750) == 0, "mkdir");
    BindSocket(dir + "/plugin.sock");
    BindSocket(root + "/out/outside.sock");
    FUZZ_CHECK(symlink("plugin.sock", (dir + "/link.sock").c_str()) == 0, "symlink");
    FUZZ_CHECK(symlink("../out/outside.sock", (dir + "/escape.sock").c_str()) == 0, "symlink");
    FUZZ_CHECK(symlink("nothing", (dir + "/dangling.sock").c_str()) == 0, "symlink");
    FUZZ_CHECK(mkdir((dir + "/subdir").c_str(), 0750) == 0, "mkdir");
    std::ofstream(dir + "/file") << "not a socket\n";
    char buf[PATH_MAX];
    FUZZ_CHECK(realpath(dir.c_str(), buf) != nullptr, "realpath");
    real_dir = buf;
  }
};

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
bool IsAlnum(char c) { return IsLowerAlnum(c) || (c >= 'A' && c <= 'Z'); }

// The documented rules, written out once more, plainly.
bool FollowsDocumentedRules(std::string_view name) {
  size_t slash = name.find('/');
  if (slash == std::string_view::npos || name.find('/', slash + 1) != std::string_view::npos) {
    return false;
  }
  if (name.find("kubernetes.io/") != std::string_view::npos) return false;
  if (name.substr(0, 9) == "requests.") return false;
  std::string_view prefix = name.substr(0, slash);
  std::string_view part = name.substr(slash + 1);
  if (prefix.empty() || prefix.size() > 253) return false;
  size_t start = 0;
  while (start <= prefix.size()) {
    size_t end = prefix.find('.', start);
    if (end == std::string_view::npos) end = prefix.size();
    std::string_view label = prefix.substr(start, end - start);
    if (label.empty()) return false;  // no per-label limit, as in Kubernetes
    if (!IsLowerAlnum(label.front()) || !IsLowerAlnum(label.back())) return false;
    for (char c : label) {
      if (!IsLowerAlnum(c) && c != '-') return false;
    }
    start = end + 1;
  }
  if (part.empty() || part.size() > 63 || !IsAlnum(part.front()) || !IsAlnum(part.back())) {
    return false;
  }
  for (char c : part) {
    if (!IsAlnum(c) && c != '-' && c != '_' && c != '.') return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const PluginDir owned_dir;
  const PluginDir* plugin_dir = &owned_dir;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  size_t nl1 = in.find('\n');
  size_t nl2 = nl1 == std::string_view::npos ? nl1 : in.find('\n', nl1 + 1);
  std::string version(in.substr(0, nl1));
  std::string resource =
      nl1 == std::string_view::npos
          ? std::string()
          : std::string(in.substr(nl1 + 1, nl2 == in.npos ? in.npos : nl2 - nl1 - 1));
  std::string endpoint =
      nl2 == std::string_view::npos ? std::string() : std::string(in.substr(nl2 + 1));

  kdm::Status v = api::ValidateVersion(version);
  FUZZ_CHECK(v.ok() == (version == "v1beta1"), "version \"" << version << "\": " << v);

  const bool extended = kdm::k8s::IsExtendedResourceName(resource);
  FUZZ_CHECK(api::ValidateResourceName(resource).ok() == extended,
             "ValidateResourceName disagrees");
  if (extended) {
    FUZZ_CHECK(FollowsDocumentedRules(resource), "accepted \"" << resource << "\"");
    // A pod can ask for every resource a plugin can register.
    nlohmann::json limits = {{resource, 1}};
    nlohmann::json manifest = {
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata", {{"name", "p"}}},
        {"spec", {{"containers", {{{"name", "m"}, {"resources", {{"limits", limits}}}}}}}}};
    auto pod = kdm::fakes::ParsePodManifest(manifest.dump(), "pod.json");
    FUZZ_CHECK(pod.ok() && pod->containers[0].limits.count(resource) == 1,
               "registration accepts \"" << resource << "\" but a pod cannot ask for it: "
                                         << (pod.ok() ? kdm::Status() : pod.status()));
  }

  kdm::StatusOr<std::string> socket = api::CheckPluginEndpoint(plugin_dir->dir, endpoint);
  if (endpoint == "plugin.sock") {
    FUZZ_CHECK(socket.ok(), "the real socket is refused: " << socket.status());
  }
  if (socket.ok()) {
    FUZZ_CHECK(!endpoint.empty() && endpoint.find('/') == std::string::npos &&
                   endpoint.find('\0') == std::string::npos && endpoint != "." && endpoint != "..",
               "accepted endpoint \"" << endpoint << "\"");
    FUZZ_CHECK(*socket == plugin_dir->dir + "/" + endpoint, "returned " << *socket);
    FUZZ_CHECK(api::CheckEndpointName(endpoint).ok(), "name rules refuse \"" << endpoint << "\"");
    struct stat st;
    FUZZ_CHECK(stat(socket->c_str(), &st) == 0 && S_ISSOCK(st.st_mode),
               "accepted a non-socket " << *socket);
    char buf[PATH_MAX];
    FUZZ_CHECK(realpath(socket->c_str(), buf) != nullptr, "realpath " << *socket);
    std::string resolved = buf;
    FUZZ_CHECK(resolved.rfind(plugin_dir->real_dir + "/", 0) == 0 &&
                   resolved.find('/', plugin_dir->real_dir.size() + 1) == std::string::npos,
               "accepted " << *socket << " resolving outside to " << resolved);
  } else {
    FUZZ_CHECK(!socket.status().message().empty(), "an error without a message");
  }
  return 0;
}
