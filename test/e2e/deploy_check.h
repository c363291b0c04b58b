// The checker behind deploy_manifests_e2e_test.cc: reads Kubernetes
// manifests (the files of deploy/, or inline text in its unit tests) and
// says, in one line each, what does not hold:
//
//   - every document is an object of a known apiVersion and kind, named, in
//     the set's Namespace when namespaced;
//   - cross references: service accounts, roles and bindings, a Service
//     selecting a workload and a port it serves, the scheduler
//     configuration's urlPrefix naming that Service and the port the
//     extender listens on, probes, volumes and the paths the flags name,
//     the RBAC each command needs, one image, one policy;
//   - the kustomization lists every file once and only files that exist;
//   - every container runs `kdm SUBCOMMAND --flag[=value]...` and every
//     variable of its env is read by something.
//
// Each container gives one KdmRun (its command line with the container's
// env applied as the kubelet applies it: `$(VAR)` expanded, `valueFrom`
// given plausible values) and, for each variable that names a kdm flag
// (`KDM_<FLAG>`, or NVIDIA's name of a kdm plugin flag), one more run with
// the variable written as that flag instead: the binary must take both, so
// a misspelt variable (which the binary would silently ignore) fails.
// DryRunProblem() runs one with `kdm --dry-run` (exit 0 and nothing on
// stderr, or a problem naming the container).
//
// Test code only: no product code includes it.
#ifndef KDM_TEST_E2E_DEPLOY_CHECK_H_
#define KDM_TEST_E2E_DEPLOY_CHECK_H_

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kdm/k8s/names.h"
#include "kdm/test/wait_until.h"
#include "kdm/topology/allocator.h"

namespace kdm::e2e::deploy_check {

// One YAML document of the set: `where` is "FILE" or "FILE#N" (N from 1).
struct Manifest {
  std::string file;
  std::string where;
  YAML::Node doc;
};

// One kdm command line of a container, as the container would run it.
struct KdmRun {
  std::string where;              // "FILE: DaemonSet kdm/kdm-plugin container plugin"
  std::vector<std::string> argv;  // argv[0] is "kdm", argv[1] the subcommand
  std::vector<std::pair<std::string, std::string>> env;
};

// A container of a workload, with what the checks need of it.
struct Container {
  const Manifest* manifest = nullptr;
  std::string namespace_name;
  std::string workload;  // "DaemonSet kdm/kdm-plugin"
  YAML::Node pod_spec;
  YAML::Node container;
  std::map<std::string, std::string> labels;
  std::string subcommand;                           // "" when not a kdm command
  std::vector<std::pair<std::string, std::string>>  // --flag, value ("" for a bare flag)
      flags;
  std::optional<std::string> Flag(const std::string& name) const {
    for (const auto& [f, v] : flags) {
      if (f == name) return v;
    }
    return std::nullopt;
  }
};

struct Checked {
  std::vector<Manifest> docs;
  std::vector<Container> containers;
  std::vector<KdmRun> runs;
  std::vector<std::string> problems;
};

// The kdm subcommands (cmd/kdm/main.cc).
inline const std::set<std::string>& Subcommands() {
  static const std::set<std::string> s = {"version", "topo",    "checkpoint", "get",     "plugin",
                                          "kubelet", "conform", "publish",    "extender"};
  return s;
}

// NVIDIA device plugin's environment variables that name a `kdm plugin`
// flag (docs/nvml.md; h30-nvidia's names), as NAME -> the flag.
inline const std::map<std::string, std::string>& NvidiaFlagVariables() {
  static const std::map<std::string, std::string> m = {
      {"MIG_STRATEGY", "--mig-strategy"},
      {"FAIL_ON_INIT_ERROR", "--fail-on-init-error"},
      {"NVIDIA_DRIVER_ROOT", "--driver-root"},
      {"NVIDIA_DEV_ROOT", "--nvidia-dev-root"},
      {"PASS_DEVICE_SPECS", "--pass-device-specs"},
      {"DEVICE_LIST_STRATEGY", "--device-list-strategy"},
      {"DEVICE_ID_STRATEGY", "--device-id-strategy"},
      {"CONFIG_FILE", "--config-file"},
      {"KUBELET_SOCKET", "--kubelet-socket"},
  };
  return m;
}

// Variables a kdm container may set that are read by something else than a
// flag, with who reads them.
inline const std::map<std::string, std::string>& OtherKnownVariables() {
  static const std::map<std::string, std::string> m = {
      {"NVIDIA_VISIBLE_DEVICES", "the NVIDIA container toolkit"},
      {"NVIDIA_DRIVER_CAPABILITIES", "the NVIDIA container toolkit"},
      {"DP_DISABLE_HEALTHCHECKS", "kdm plugin --nvml (docs/nvml.md)"},
  };
  return m;
}

// What each subcommand needs of the API server when it runs in a pod
// (--in-cluster): resource, verb.
inline const std::map<std::string, std::vector<std::pair<std::string, std::string>>>& RbacNeeds() {
  static const std::map<std::string, std::vector<std::pair<std::string, std::string>>> m = {
      {"publish", {{"nodes", "get"}, {"nodes", "patch"}}},
      {"extender", {{"nodes", "list"}, {"nodes", "watch"}, {"pods", "list"}, {"pods", "watch"}}},
  };
  return m;
}

// Path flags whose directory must be writable (a socket is bound there).
inline bool WrittenPathFlag(const std::string& flag) {
  return flag == "--plugin-dir" || flag == "--root";
}

// The host paths a flag must reach when mounted from the host: the real
// kubelet's (docs/nvml.md, docs/publish.md).
inline std::optional<std::string> RequiredHostPath(const std::string& subcommand,
                                                   const std::string& flag) {
  if (subcommand == "plugin" && flag == "--plugin-dir") return "/var/lib/kubelet/device-plugins";
  if (subcommand == "publish" && flag == "--pod-resources-socket") {
    return "/var/lib/kubelet/pod-resources/kubelet.sock";
  }
  return std::nullopt;
}

inline std::string Str(const YAML::Node& n) {
  return n && n.IsScalar() ? n.Scalar() : std::string();
}

inline std::map<std::string, std::string> StringMap(const YAML::Node& n) {
  std::map<std::string, std::string> out;
  if (!n || !n.IsMap()) return out;
  for (const auto& kv : n) out[kv.first.Scalar()] = Str(kv.second);
  return out;
}

inline bool Subset(const std::map<std::string, std::string>& small,
                   const std::map<std::string, std::string>& big) {
  for (const auto& [k, v] : small) {
    auto it = big.find(k);
    if (it == big.end() || it->second != v) return false;
  }
  return true;
}

// True when `path` is `dir` or below it (both absolute, no trailing '/').
inline bool Under(const std::string& path, const std::string& dir) {
  if (dir == "/") return true;
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
                         path[dir.size()] == '/');
}

inline std::string Trim(std::string s) {
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

// Kubernetes' expansion of command and args: $(VAR) becomes the value of a
// variable defined earlier in the container's env; $$ is a literal $; a
// reference to an undefined variable stays as written.
inline std::string ExpandVariables(const std::string& s,
                                   const std::map<std::string, std::string>& vars,
                                   std::set<std::string>* used = nullptr) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '$' || i + 1 >= s.size()) {
      out += s[i];
      continue;
    }
    if (s[i + 1] == '$') {
      out += '$';
      ++i;
      continue;
    }
    if (s[i + 1] == '(') {
      size_t close = s.find(')', i + 2);
      if (close != std::string::npos) {
        std::string name = s.substr(i + 2, close - i - 2);
        auto it = vars.find(name);
        if (it != vars.end()) {
          out += it->second;
          if (used) used->insert(name);
          i = close;
          continue;
        }
      }
    }
    out += s[i];
  }
  return out;
}

// KDM_PLUGIN_DIR -> --plugin-dir.
inline std::string FlagOfKdmVariable(const std::string& name) {
  std::string flag = "--";
  for (char c : name.substr(4)) {
    flag += c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return flag;
}

class Checker {
 public:
  // `texts`: file name (relative to the set's root) -> its text.
  explicit Checker(const std::vector<std::pair<std::string, std::string>>& texts) {
    for (const auto& [file, text] : texts) Load(file, text);
  }

  // Runs every check on the set; the problems are in result().problems.
  const Checked& CheckAll() {
    CheckKinds();
    CollectContainers();
    CheckWorkloads();
    CheckRbac();
    CheckServices();
    CheckSchedulerConfigs();
    CheckAgreement();
    return c_;
  }

  // The kustomization (`kustomization.yaml` of the set) against the files.
  void CheckKustomization(const std::vector<std::string>& files) {
    const Manifest* k = nullptr;
    for (const Manifest& m : c_.docs) {
      if (m.file == "kustomization.yaml") k = &m;
    }
    if (!k) return Problem("kustomization.yaml: missing");
    std::map<std::string, int> listed;
    for (const YAML::Node& r : k->doc["resources"]) ++listed[Str(r)];
    for (const auto& [r, n] : listed) {
      if (n > 1) Problem("kustomization.yaml: " + r + " listed " + std::to_string(n) + " times");
      if (std::find(files.begin(), files.end(), r) == files.end()) {
        Problem("kustomization.yaml: lists " + r + ", which does not exist");
      }
    }
    for (const std::string& f : files) {
      if (f != "kustomization.yaml" && !listed.count(f)) {
        Problem("kustomization.yaml: does not list " + f);
      }
    }
    // The image placeholder is the one its images: entry rewrites.
    std::set<std::string> names;
    for (const YAML::Node& i : k->doc["images"]) names.insert(Str(i["name"]));
    for (const std::string& image : images_) {
      if (!names.count(image.substr(0, image.rfind(':')))) {
        Problem("kustomization.yaml: no images: entry for " + image);
      }
    }
  }

  const Checked& result() const { return c_; }

 private:
  void Problem(const std::string& p) { c_.problems.push_back(p); }

  void Load(const std::string& file, const std::string& text) {
    std::vector<YAML::Node> docs;
    try {
      docs = YAML::LoadAll(text);
    } catch (const YAML::Exception& e) {
      return Problem(file + ": " + e.what());
    }
    int n = 0;
    for (const YAML::Node& d : docs) {
      ++n;
      if (d.IsNull()) continue;
      c_.docs.push_back({file, docs.size() > 1 ? file + "#" + std::to_string(n) : file, d});
    }
  }

  std::string Name(const Manifest& m) const {
    std::string ns = Str(m.doc["metadata"]["namespace"]);
    return Str(m.doc["kind"]) + " " + (ns.empty() ? "" : ns + "/") + Str(m.doc["metadata"]["name"]);
  }

  const Manifest* Find(const std::string& kind, const std::string& ns,
                       const std::string& name) const {
    for (const Manifest& m : c_.docs) {
      if (Str(m.doc["kind"]) == kind && Str(m.doc["metadata"]["namespace"]) == ns &&
          Str(m.doc["metadata"]["name"]) == name) {
        return &m;
      }
    }
    return nullptr;
  }

  void CheckKinds() {
    struct Kind {
      const char* api_version;
      bool namespaced;
    };
    static const std::map<std::string, Kind> kinds = {
        {"Namespace", {"v1", false}},
        {"ServiceAccount", {"v1", true}},
        {"Service", {"v1", true}},
        {"ConfigMap", {"v1", true}},
        {"DaemonSet", {"apps/v1", true}},
        {"Deployment", {"apps/v1", true}},
        {"ClusterRole", {"rbac.authorization.k8s.io/v1", false}},
        {"ClusterRoleBinding", {"rbac.authorization.k8s.io/v1", false}},
        {"Role", {"rbac.authorization.k8s.io/v1", true}},
        {"RoleBinding", {"rbac.authorization.k8s.io/v1", true}},
        {"ValidatingAdmissionPolicy", {"admissionregistration.k8s.io/v1", false}},
        {"ValidatingAdmissionPolicyBinding", {"admissionregistration.k8s.io/v1", false}},
        {"Kustomization", {"kustomize.config.k8s.io/v1beta1", false}},
    };
    std::set<std::string> namespaces;
    for (const Manifest& m : c_.docs) {
      if (Str(m.doc["kind"]) == "Namespace") namespaces.insert(Str(m.doc["metadata"]["name"]));
    }
    std::set<std::string> seen;
    for (const Manifest& m : c_.docs) {
      if (!m.doc.IsMap()) {
        Problem(m.where + ": not an object");
        continue;
      }
      const std::string kind = Str(m.doc["kind"]);
      auto k = kinds.find(kind);
      if (k == kinds.end()) {
        Problem(m.where + ": unknown kind '" + kind + "'");
        continue;
      }
      if (Str(m.doc["apiVersion"]) != k->second.api_version) {
        Problem(m.where + ": " + kind + " is " + k->second.api_version + ", not '" +
                Str(m.doc["apiVersion"]) + "'");
      }
      if (kind == "Kustomization") continue;
      const std::string name = Str(m.doc["metadata"]["name"]);
      if (!k8s::IsDns1123Subdomain(name)) {
        Problem(m.where + ": metadata.name '" + name + "' is not a DNS-1123 subdomain");
      }
      const std::string ns = Str(m.doc["metadata"]["namespace"]);
      if (k->second.namespaced && !namespaces.count(ns)) {
        Problem(m.where + ": " + kind + " " + name + ": namespace '" + ns +
                "' is not a Namespace of the set");
      }
      if (!k->second.namespaced && !ns.empty()) {
        Problem(m.where + ": " + kind + " is cluster-scoped but names namespace " + ns);
      }
      if (!seen.insert(Name(m)).second) Problem(m.where + ": " + Name(m) + " defined twice");
    }
  }

  void CollectContainers() {
    for (const Manifest& m : c_.docs) {
      const std::string kind = Str(m.doc["kind"]);
      if (kind != "DaemonSet" && kind != "Deployment") continue;
      const YAML::Node spec = m.doc["spec"];
      const auto selector = StringMap(spec["selector"]["matchLabels"]);
      const auto labels = StringMap(spec["template"]["metadata"]["labels"]);
      if (selector.empty() || !Subset(selector, labels)) {
        Problem(m.where + ": " + Name(m) +
                ": spec.selector.matchLabels must be non-empty and match the template's labels");
      }
      const YAML::Node pod = spec["template"]["spec"];
      for (const char* list : {"initContainers", "containers"}) {
        for (const YAML::Node& ctr : pod[list]) {
          Container c;
          c.manifest = &m;
          c.namespace_name = Str(m.doc["metadata"]["namespace"]);
          c.workload = Name(m);
          c.pod_spec = pod;
          c.container = ctr;
          c.labels = labels;
          ReadCommand(&c);
          c_.containers.push_back(std::move(c));
        }
      }
    }
  }

  // The container's kdm command line and env, as KdmRuns.
  void ReadCommand(Container* c) {
    const std::string where =
        c->manifest->where + ": " + c->workload + " container " + Str(c->container["name"]);
    const std::string image = Str(c->container["image"]);
    images_.insert(image);
    if (images_.size() > 1) {
      Problem(where + ": image " + image + ": every container must use one image placeholder");
    }
    // The env, in order, as the kubelet builds it.
    std::map<std::string, std::string> vars;
    std::vector<std::pair<std::string, std::string>> env;
    std::set<std::string> used;
    for (const YAML::Node& e : c->container["env"]) {
      const std::string name = Str(e["name"]);
      std::string value;
      if (e["value"]) {
        value = ExpandVariables(Str(e["value"]), vars, &used);
      } else if (e["valueFrom"]["fieldRef"]) {
        const std::string path = Str(e["valueFrom"]["fieldRef"]["fieldPath"]);
        static const std::map<std::string, std::string> fields = {
            {"spec.nodeName", "gpu-node-1"},    {"metadata.name", "kdm-pod-x7k2p"},
            {"status.podIP", "10.244.1.17"},    {"status.hostIP", "192.0.2.10"},
            {"spec.serviceAccountName", "kdm"},
        };
        if (path == "metadata.namespace") {
          value = c->namespace_name;
        } else if (fields.count(path)) {
          value = fields.at(path);
        } else {
          Problem(where + ": env " + name + ": fieldRef " + path + " is not modelled here");
        }
      } else {
        Problem(where + ": env " + name + ": only value and valueFrom.fieldRef are modelled here");
      }
      vars[name] = value;
      env.emplace_back(name, value);
    }
    // The kubelet adds a Service's docker-link variables to every pod of its
    // namespace (enableServiceLinks, on by default): Service kdm-extender
    // gives KDM_EXTENDER_SERVICE_HOST, KDM_EXTENDER_PORT, ..., which kdm
    // would read as KDM_<FLAG> variables. Such a pod must turn them off.
    const YAML::Node links = c->pod_spec["enableServiceLinks"];
    if (!links || links.as<bool>()) {
      for (const Manifest& s : c_.docs) {
        if (Str(s.doc["kind"]) != "Service" ||
            Str(s.doc["metadata"]["namespace"]) != c->namespace_name) {
          continue;
        }
        std::string prefix;
        for (char ch : Str(s.doc["metadata"]["name"])) {
          prefix +=
              ch == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
        }
        if (prefix.rfind("KDM_", 0) == 0) {
          Problem(where + ": enableServiceLinks is on, so Service " +
                  Str(s.doc["metadata"]["name"]) + " gives it " + prefix + "_SERVICE_HOST, " +
                  prefix +
                  "_PORT, ...: variables kdm reads as KDM_<FLAG>; set enableServiceLinks: false");
        }
      }
    }
    std::vector<std::string> argv;
    for (const char* part : {"command", "args"}) {
      for (const YAML::Node& a : c->container[part]) {
        argv.push_back(ExpandVariables(Str(a), vars, &used));
      }
    }
    if (argv.empty() || !c->container["command"] || argv[0] != "kdm") {
      return Problem(where + ": command must start with kdm (the image's entrypoint is not " +
                     "assumed)");
    }
    if (argv.size() < 2 || !Subcommands().count(argv[1])) {
      return Problem(where + ": '" + (argv.size() < 2 ? "" : argv[1]) +
                     "' is not a kdm subcommand");
    }
    c->subcommand = argv[1];
    for (size_t i = 2; i < argv.size(); ++i) {
      const std::string& a = argv[i];
      if (a.size() < 2 || a[0] != '-') {
        Problem(where + ": argument '" + a + "': write every flag with its value as " +
                "--flag=value, so that flags and values cannot be told apart wrongly");
        continue;
      }
      size_t eq = a.find('=');
      c->flags.emplace_back(a.substr(0, eq), eq == std::string::npos ? "" : a.substr(eq + 1));
    }
    c_.runs.push_back({where, argv, env});
    // Each variable is read by something; those that name a flag are also
    // run as that flag.
    for (const auto& [name, value] : env) {
      std::optional<std::string> flag;
      if (name.rfind("KDM_", 0) == 0 && name.size() > 4) {
        flag = FlagOfKdmVariable(name);
      } else if (NvidiaFlagVariables().count(name)) {
        if (c->subcommand != "plugin") {
          Problem(where + ": env " + name + ": NVIDIA's name of a kdm plugin flag, on kdm " +
                  c->subcommand);
        }
        flag = NvidiaFlagVariables().at(name);
      } else if (!OtherKnownVariables().count(name) && !used.count(name)) {
        Problem(where + ": env " + name +
                ": read by nothing (not KDM_<FLAG>, not NVIDIA's name of a kdm flag, not " +
                "used by the command)");
      }
      if (!flag) continue;
      if (c->Flag(*flag)) {
        Problem(where + ": env " + name + ": " + *flag +
                " is also on the command line, which wins over it");
        continue;
      }
      KdmRun as_flag{where + " (env " + name + " as " + *flag + ")", argv, {}};
      for (const auto& e : env) {
        if (e.first != name) as_flag.env.push_back(e);
      }
      as_flag.argv.push_back(*flag + "=" + value);
      c_.runs.push_back(std::move(as_flag));
    }
  }

  std::string Where(const Container& c) const {
    return c.manifest->where + ": " + c.workload + " container " + Str(c.container["name"]);
  }

  void CheckWorkloads() {
    for (const Container& c : c_.containers) {
      const std::string where = Where(c);
      const std::string sa = Str(c.pod_spec["serviceAccountName"]);
      if (!sa.empty() && !Find("ServiceAccount", c.namespace_name, sa)) {
        Problem(where + ": serviceAccountName " + sa + ": no such ServiceAccount in " +
                c.namespace_name);
      }
      if (c.Flag("--in-cluster")) {
        if (c.pod_spec["automountServiceAccountToken"] &&
            !c.pod_spec["automountServiceAccountToken"].as<bool>()) {
          Problem(where + ": --in-cluster without a service account token " +
                  "(automountServiceAccountToken: false)");
        }
        auto needs = RbacNeeds().find(c.subcommand);
        if (needs != RbacNeeds().end()) {
          for (const auto& [resource, verb] : needs->second) {
            if (!Grants(c.namespace_name, sa, resource, verb)) {
              Problem(where + ": service account '" + sa + "' may not " + verb + " " + resource +
                      " (kdm " + c.subcommand + " --in-cluster needs it)");
            }
          }
        }
      }
      CheckVolumes(c, where);
    }
  }

  // volumeMounts name volumes; each path a flag names is mounted (or has a
  // mount below it); the kubelet's directories come from the host's; every
  // hostPath volume serves a flag.
  void CheckVolumes(const Container& c, const std::string& where) {
    std::map<std::string, YAML::Node> volumes;
    for (const YAML::Node& v : c.pod_spec["volumes"]) volumes[Str(v["name"])] = v;
    struct Mount {
      std::string path;
      bool read_only;
      std::string host_path;  // "" when not a hostPath volume
      std::string volume;
    };
    std::vector<Mount> mounts;
    for (const YAML::Node& m : c.container["volumeMounts"]) {
      const std::string name = Str(m["name"]);
      auto v = volumes.find(name);
      if (v == volumes.end()) {
        Problem(where + ": volumeMount " + name + ": no such volume");
        continue;
      }
      mounts.push_back({Trim(Str(m["mountPath"])), m["readOnly"] && m["readOnly"].as<bool>(),
                        Trim(Str(v->second["hostPath"]["path"])), name});
    }
    std::set<std::string> used_volumes;
    for (const auto& [flag, raw] : c.flags) {
      // A path value, or the path after RESOURCE= (--topology R=/file).
      std::string value = raw.substr(raw.rfind('=') == std::string::npos ? 0 : raw.rfind('=') + 1);
      if (value.empty() || value[0] != '/') continue;
      value = Trim(value);
      const Mount* holder = nullptr;
      bool below = false;
      for (const Mount& m : mounts) {
        if (Under(value, m.path) && (!holder || m.path.size() > holder->path.size())) holder = &m;
        if (Under(m.path, value)) {
          below = true;
          used_volumes.insert(m.volume);
        }
      }
      if (holder) used_volumes.insert(holder->volume);
      if (!holder && !below) {
        Problem(where + ": " + flag + "=" + value + ": no volume is mounted at, above or below it");
        continue;
      }
      if (holder && WrittenPathFlag(flag) && holder->read_only) {
        Problem(where + ": " + flag + "=" + value + ": its mount " + holder->path +
                " is readOnly, and kdm binds a socket there");
      }
      std::optional<std::string> need = RequiredHostPath(c.subcommand, flag);
      if (need) {
        const std::string host =
            holder && !holder->host_path.empty()
                ? holder->host_path + value.substr(std::min(value.size(), holder->path.size()))
                : "";
        if (host != *need) {
          Problem(where + ": " + flag + "=" + value + ": must be the host's " + *need +
                  (host.empty() ? " (no hostPath holds it)" : ", is the host's " + host));
        }
      }
    }
    for (const Mount& m : mounts) {
      if (!m.host_path.empty() && !used_volumes.count(m.volume)) {
        Problem(where + ": hostPath volume " + m.volume + " (" + m.host_path + " at " + m.path +
                ") is used by no flag");
      }
    }
  }

  // Whether a binding gives ServiceAccount ns/sa `verb` on core `resource`.
  bool Grants(const std::string& ns, const std::string& sa, const std::string& resource,
              const std::string& verb) const {
    auto has = [](const YAML::Node& list, const std::string& v) {
      for (const YAML::Node& x : list) {
        if (Str(x) == v || Str(x) == "*") return true;
      }
      return false;
    };
    for (const Manifest& b : c_.docs) {
      const std::string kind = Str(b.doc["kind"]);
      if (kind != "ClusterRoleBinding" && kind != "RoleBinding") continue;
      if (kind == "RoleBinding" && Str(b.doc["metadata"]["namespace"]) != ns) continue;
      bool subject = false;
      for (const YAML::Node& s : b.doc["subjects"]) {
        subject = subject || (Str(s["kind"]) == "ServiceAccount" && Str(s["name"]) == sa &&
                              Str(s["namespace"]) == ns);
      }
      if (!subject) continue;
      const std::string role_kind = Str(b.doc["roleRef"]["kind"]);
      const Manifest* role =
          Find(role_kind, role_kind == "Role" ? ns : "", Str(b.doc["roleRef"]["name"]));
      if (!role) continue;
      for (const YAML::Node& rule : role->doc["rules"]) {
        if (has(rule["apiGroups"], "") && has(rule["resources"], resource) &&
            has(rule["verbs"], verb)) {
          return true;
        }
      }
    }
    return false;
  }

  void CheckRbac() {
    for (const Manifest& m : c_.docs) {
      const std::string kind = Str(m.doc["kind"]);
      if (kind == "ClusterRoleBinding" || kind == "RoleBinding") {
        const std::string role_kind = Str(m.doc["roleRef"]["kind"]);
        const std::string role = Str(m.doc["roleRef"]["name"]);
        if (!Find(role_kind, role_kind == "Role" ? Str(m.doc["metadata"]["namespace"]) : "",
                  role)) {
          Problem(m.where + ": " + Name(m) + ": roleRef " + role_kind + " " + role +
                  " is not in the set");
        }
        for (const YAML::Node& s : m.doc["subjects"]) {
          if (Str(s["kind"]) == "ServiceAccount" &&
              !Find("ServiceAccount", Str(s["namespace"]), Str(s["name"]))) {
            Problem(m.where + ": " + Name(m) + ": subject ServiceAccount " + Str(s["namespace"]) +
                    "/" + Str(s["name"]) + " is not in the set");
          }
        }
      }
      if (kind == "ValidatingAdmissionPolicyBinding" &&
          !Find("ValidatingAdmissionPolicy", "", Str(m.doc["spec"]["policyName"]))) {
        Problem(m.where + ": policyName " + Str(m.doc["spec"]["policyName"]) +
                " is not in the set");
      }
      if (kind == "ValidatingAdmissionPolicy") {
        // The service accounts its CEL names by user name exist.
        std::stringstream text;
        text << m.doc;
        const std::string s = text.str();
        std::regex re("system:serviceaccount:([a-z0-9.-]+):([a-z0-9.-]+)");
        for (auto it = std::sregex_iterator(s.begin(), s.end(), re); it != std::sregex_iterator();
             ++it) {
          if (!Find("ServiceAccount", (*it)[1].str(), (*it)[2].str())) {
            Problem(m.where + ": names " + it->str() + ", which is not in the set");
          }
        }
      }
    }
  }

  // The containers of the set's workloads that a Service selects.
  std::vector<const Container*> Selected(const Manifest& service) const {
    std::vector<const Container*> out;
    const auto selector = StringMap(service.doc["spec"]["selector"]);
    for (const Container& c : c_.containers) {
      if (!selector.empty() && c.namespace_name == Str(service.doc["metadata"]["namespace"]) &&
          Subset(selector, c.labels)) {
        out.push_back(&c);
      }
    }
    return out;
  }

  // The container port a Service port's targetPort names among `selected`,
  // or 0.
  static int TargetPort(const YAML::Node& port, const std::vector<const Container*>& selected,
                        const Container** which) {
    const YAML::Node target = port["targetPort"] ? port["targetPort"] : port["port"];
    for (const Container* c : selected) {
      for (const YAML::Node& p : c->container["ports"]) {
        if (Str(p["name"]) == Str(target) || Str(p["containerPort"]) == Str(target)) {
          *which = c;
          return p["containerPort"].as<int>();
        }
      }
    }
    return 0;
  }

  void CheckServices() {
    for (const Manifest& m : c_.docs) {
      if (Str(m.doc["kind"]) != "Service") continue;
      std::vector<const Container*> selected = Selected(m);
      if (selected.empty()) {
        Problem(m.where + ": " + Name(m) + ": its selector selects no workload of the set");
        continue;
      }
      for (const YAML::Node& port : m.doc["spec"]["ports"]) {
        const Container* c = nullptr;
        if (TargetPort(port, selected, &c) == 0) {
          Problem(m.where + ": " + Name(m) + ": port " + Str(port["port"]) + ": targetPort " +
                  Str(port["targetPort"]) + " is no port of the selected containers");
        }
      }
    }
    // Probes: the extender's readiness is /readyz, its liveness /livez, on
    // the port it listens on.
    for (const Container& c : c_.containers) {
      if (c.subcommand != "extender") continue;
      const int listen = ListenPort(c);
      for (auto [probe, path] :
           {std::pair{"readinessProbe", "/readyz"}, std::pair{"livenessProbe", "/livez"}}) {
        const YAML::Node get = c.container[probe]["httpGet"];
        if (Str(get["path"]) != path) {
          Problem(Where(c) + ": " + probe + " must GET " + path + ", not '" + Str(get["path"]) +
                  "'");
        }
        int port = 0;
        for (const YAML::Node& p : c.container["ports"]) {
          if (Str(p["name"]) == Str(get["port"]) || Str(p["containerPort"]) == Str(get["port"])) {
            port = p["containerPort"].as<int>();
          }
        }
        if (port == 0 || port != listen) {
          Problem(Where(c) + ": " + probe + " port " + Str(get["port"]) +
                  " is not the port of --listen (" + std::to_string(listen) + ")");
        }
      }
    }
  }

  // The port of --listen=HOST:PORT, or 0.
  static int ListenPort(const Container& c) {
    std::optional<std::string> listen = c.Flag("--listen");
    if (!listen || listen->rfind(':') == std::string::npos) return 0;
    try {
      return std::stoi(listen->substr(listen->rfind(':') + 1));
    } catch (const std::exception&) {
      return 0;
    }
  }

  void CheckSchedulerConfigs() {
    int configs = 0;
    for (const Manifest& m : c_.docs) {
      if (Str(m.doc["kind"]) != "ConfigMap") continue;
      for (const auto& kv : m.doc["data"]) {
        YAML::Node config;
        try {
          config = YAML::Load(Str(kv.second));
        } catch (const YAML::Exception& e) {
          continue;  // not YAML: not a scheduler configuration
        }
        if (!config.IsMap() || Str(config["kind"]) != "KubeSchedulerConfiguration") continue;
        ++configs;
        CheckSchedulerConfig(m.where + ": data." + kv.first.Scalar(), config);
      }
    }
    if (configs == 0) Problem("no ConfigMap holds a KubeSchedulerConfiguration");
  }

  void CheckSchedulerConfig(const std::string& where, const YAML::Node& config) {
    if (Str(config["apiVersion"]) != "kubescheduler.config.k8s.io/v1") {
      Problem(where + ": apiVersion must be kubescheduler.config.k8s.io/v1");
    }
    if (!config["extenders"] || config["extenders"].size() == 0) {
      return Problem(where + ": no extenders");
    }
    int i = -1;
    for (const YAML::Node& e : config["extenders"]) {
      const std::string at = where + ": extenders[" + std::to_string(++i) + "]";
      const bool https = e["enableHTTPS"] && e["enableHTTPS"].as<bool>();
      std::smatch u;
      const std::string url = Str(e["urlPrefix"]);
      if (!std::regex_match(url, u, std::regex(R"((https?)://([^:/]+)(?::([0-9]+))?(/.*)?)"))) {
        Problem(at + ": urlPrefix '" + url + "' is not http(s)://HOST[:PORT][/PATH]");
        continue;
      }
      if ((u[1].str() == "https") != https) {
        Problem(at + ": urlPrefix " + url + " and enableHTTPS " + (https ? "true" : "false") +
                " disagree");
      }
      const int port = u[3].matched ? std::stoi(u[3].str()) : (https ? 443 : 80);
      std::smatch h;
      const std::string host = u[2].str();
      if (!std::regex_match(host, h, std::regex(R"(([^.]+)\.([^.]+)\.svc(\.cluster\.local)?)"))) {
        Problem(at + ": urlPrefix host " + host + " is not SERVICE.NAMESPACE.svc[.cluster.local]");
        continue;
      }
      const Manifest* service = Find("Service", h[2].str(), h[1].str());
      if (!service) {
        Problem(at + ": urlPrefix names Service " + h[2].str() + "/" + h[1].str() +
                ", which is not in the set");
        continue;
      }
      const Container* extender = nullptr;
      int target = 0;
      for (const YAML::Node& p : service->doc["spec"]["ports"]) {
        if (p["port"].as<int>() == port) target = TargetPort(p, Selected(*service), &extender);
      }
      if (!extender || target == 0) {
        Problem(at + ": urlPrefix port " + std::to_string(port) + " is not a port of " +
                Name(*service));
        continue;
      }
      if (extender->subcommand != "extender") {
        Problem(at + ": " + Name(*service) + " selects " + extender->workload +
                ", which does not run kdm extender");
        continue;
      }
      if (ListenPort(*extender) != target) {
        Problem(at + ": urlPrefix reaches container port " + std::to_string(target) +
                ", but kdm extender --listen is " + extender->Flag("--listen").value_or("unset"));
      }
      if (https && (!extender->Flag("--tls-cert") || !extender->Flag("--tls-key"))) {
        Problem(at + ": enableHTTPS true, but kdm extender has no --tls-cert and --tls-key");
      }
      for (auto [verb, route] :
           {std::pair{"filterVerb", "filter"}, std::pair{"prioritizeVerb", "prioritize"},
            std::pair{"bindVerb", "bind"}}) {
        if (e[verb] && Str(e[verb]) != route) {
          Problem(at + ": " + verb + " '" + Str(e[verb]) + "': kdm extender serves /" + route);
        }
      }
      if (!e["filterVerb"]) Problem(at + ": no filterVerb");
      if (e["prioritizeVerb"] && (!e["weight"] || e["weight"].as<int>() < 1)) {
        Problem(at + ": prioritizeVerb needs a weight of at least 1");
      }
      if (e["nodeCacheCapable"] && e["nodeCacheCapable"].as<bool>() &&
          !extender->Flag("--in-cluster") && !extender->Flag("--kubeconfig") &&
          !extender->Flag("--context")) {
        Problem(at + ": nodeCacheCapable true, but kdm extender has no --in-cluster, " +
                "--kubeconfig or --context (it would have no opinion on any node)");
      }
      if (e["bindVerb"] &&
          !Grants(extender->namespace_name, Str(extender->pod_spec["serviceAccountName"]),
                  "pods/binding", "create")) {
        Problem(at + ": bindVerb, but the extender's service account may not create pods/binding");
      }
      if (!e["managedResources"] || e["managedResources"].size() == 0) {
        Problem(at + ": no managedResources (every pod would be sent to the extender)");
      }
      for (const YAML::Node& r : e["managedResources"]) {
        const std::string name = Str(r["name"]);
        if (!ServedResources().count(name)) {
          Problem(at + ": managedResources " + name + " is served by no kdm plugin of the set");
        }
        if (!r["ignoredByScheduler"] || r["ignoredByScheduler"].as<bool>()) {
          Problem(at + ": managedResources " + name +
                  ": ignoredByScheduler must be false (the scheduler's own count of the " +
                  "resource keeps pods off full nodes)");
        }
      }
    }
  }

  // The resources the set's kdm plugins serve.
  std::set<std::string> ServedResources() const {
    std::set<std::string> out;
    for (const Container& c : c_.containers) {
      if (c.subcommand != "plugin") continue;
      std::optional<std::string> r = c.Flag("--resource");
      if (r) {
        out.insert(*r);
      } else if (c.Flag("--nvml")) {
        out.insert("nvidia.com/gpu");
      }
    }
    return out;
  }

  // The plugins' policy, the one the publishers say they run and the
  // extender's ranking agree (each unset one is kdm's one default).
  void CheckAgreement() {
    const std::string fallback{topology::PolicyName(topology::kDefaultPolicy)};
    std::map<std::string, std::string> policies;  // who -> policy
    for (const Container& c : c_.containers) {
      if (c.subcommand == "plugin" || c.subcommand == "extender") {
        policies["kdm " + c.subcommand + " --policy (" + c.workload + ")"] =
            c.Flag("--policy").value_or(fallback);
      }
      if (c.subcommand == "publish") {
        std::string said = fallback;
        for (const auto& [flag, value] : c.flags) {
          if (flag == "--plugin-policy") said = value.substr(value.find('=') + 1);
        }
        policies["kdm publish --plugin-policy (" + c.workload + ")"] = said;
      }
    }
    std::set<std::string> distinct;
    std::string all;
    for (const auto& [who, p] : policies) {
      distinct.insert(p);
      all += (all.empty() ? "" : ", ") + who + ": " + p;
    }
    if (distinct.size() > 1) Problem("the policies disagree: " + all);
  }

  Checked c_;
  std::set<std::string> images_;
};

// Every *.yaml under `root`, relative, sorted.
inline std::vector<std::string> YamlFiles(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    if (e.is_regular_file() && e.path().extension() == ".yaml") {
      out.push_back(std::filesystem::relative(e.path(), root).string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `kdm --dry-run ARGS...` for `run` (the container's env and what every
// pod has, nothing else) with its output in `dir`; "" when it exits 0 with
// nothing on stderr, else one line naming the container, the command, the
// exit and the first line of stderr.
inline std::string DryRunProblem(const KdmRun& run, const std::string& kdm,
                                 const std::string& dir) {
  static int n = 0;
  const std::string base = dir + "/dry-run-" + std::to_string(++n);
  std::vector<std::string> args = {kdm, "--dry-run"};
  args.insert(args.end(), run.argv.begin() + 1, run.argv.end());
  std::vector<std::string> env = {"KUBERNETES_SERVICE_HOST=10.96.0.1",
                                  "KUBERNETES_SERVICE_PORT=443"};
  for (const auto& [k, v] : run.env) env.push_back(k + "=" + v);
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, (base + ".out").c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, (base + ".err").c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, kdm.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  std::string command = "kdm --dry-run";
  for (size_t i = 1; i < run.argv.size(); ++i) command += " " + run.argv[i];
  if (spawned != 0) return run.where + ": cannot start " + kdm;
  int status = 0;
  bool exited = kdm::test::WaitUntil([&] { return ::waitpid(pid, &status, WNOHANG) == pid; },
                                     std::chrono::seconds(30));
  if (!exited) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return run.where + ": `" + command + "` did not exit within 30 s";
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  const std::string err = ReadText(base + ".err");
  if (code == 0 && err.empty()) return "";
  return run.where + ": `" + command + "` exited " + std::to_string(code) + ": " +
         err.substr(0, err.find('\n'));
}

}  // namespace kdm::e2e::deploy_check

#endif  // KDM_TEST_E2E_DEPLOY_CHECK_H_
