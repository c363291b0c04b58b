// deploy/ (issue 30 item 9): the manifests as files, checked against each
// other and against the built kdm binary, so that they cannot drift from it.
// Every YAML document parses into a known kind; the cross references hold
// (deploy_check.h lists them); the kustomization lists every file; and every
// kdm command line of every container, with the container's env applied,
// passes `kdm --dry-run` (exit 0, nothing on stderr). The checker itself is
// shown to fail on inline manifests with one mistake each: an unknown flag,
// a bad value, a misspelt variable, and each broken cross reference.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "kdm/test/e2e/deploy_check.h"
#include "kdm/test/e2e/e2e_util.h"

namespace kdm {
namespace {

using e2e::KdmBinary;
using e2e::deploy_check::Checker;
using e2e::deploy_check::DryRunProblem;
using e2e::deploy_check::KdmRun;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kDeployDir = std::string(KDM_TEST_SOURCE_DIR) + "/deploy";

std::string DeployLines(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += "\n  " + s;
  return out;
}

// A private directory for the dry runs' output.
class DeployTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-deploy-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Every file of deploy/, by its path below deploy/.
  static std::vector<std::pair<std::string, std::string>> DeployTexts() {
    std::vector<std::pair<std::string, std::string>> texts;
    for (const std::string& f : e2e::deploy_check::YamlFiles(kDeployDir)) {
      texts.emplace_back(f, e2e::deploy_check::ReadText(kDeployDir + "/" + f));
    }
    return texts;
  }

  std::vector<std::string> DryRunProblems(const std::vector<KdmRun>& runs) {
    std::vector<std::string> out;
    for (const KdmRun& r : runs) {
      std::string p = DryRunProblem(r, KdmBinary(), dir_);
      if (!p.empty()) out.push_back(p);
    }
    return out;
  }

  std::string dir_;
};

TEST_F(DeployTest, EveryManifestHasAKnownKindAndTheCrossReferencesHold) {
  const auto texts = DeployTexts();
  std::vector<std::string> files;
  for (const auto& t : texts) files.push_back(t.first);
  // What deploy/ is for: the plugin, the publisher, the extender and its
  // scheduler configuration, and the kustomization of them all.
  for (const char* f :
       {"kustomization.yaml", "namespace.yaml", "plugin/daemonset.yaml", "publish/daemonset.yaml",
        "publish/rbac.yaml", "publish/admission-policy.yaml", "extender/deployment.yaml",
        "extender/service.yaml", "extender/rbac.yaml", "extender/scheduler-config.yaml"}) {
    EXPECT_THAT(files, Contains(f));
  }
  Checker checker(texts);
  const auto& result = checker.CheckAll();
  checker.CheckKustomization(files);
  EXPECT_TRUE(result.problems.empty()) << DeployLines(result.problems);

  std::vector<std::string> commands;
  for (const auto& c : result.containers) {
    std::string line = c.workload + ": kdm " + c.subcommand;
    if (c.Flag("--nvml")) line += " --nvml";
    commands.push_back(line);
  }
  EXPECT_THAT(commands, Contains("DaemonSet kdm/kdm-plugin: kdm plugin --nvml"));
  EXPECT_THAT(commands, Contains("DaemonSet kdm/kdm-publish: kdm publish"));
  EXPECT_THAT(commands, Contains("Deployment kdm/kdm-extender: kdm extender"));
}

// The manifests cannot drift from the binary: each command line is taken by
// `kdm --dry-run` as a real run would take it (flags exist, values parse),
// with the container's env (KDM_<FLAG> and NVIDIA's names included), and
// each variable that names a flag is taken as that flag too.
TEST_F(DeployTest, EveryKdmCommandLineInDeployPassesDryRun) {
  Checker checker(DeployTexts());
  const auto& result = checker.CheckAll();
  ASSERT_GE(result.runs.size(), 3u) << DeployLines(result.problems);
  EXPECT_TRUE(DryRunProblems(result.runs).empty()) << DeployLines(DryRunProblems(result.runs));
}

// A small set like deploy/, for the checker's own tests: each test breaks it
// in one place.
std::vector<std::pair<std::string, std::string>> DeployGoodSet() {
  return {
      {"kustomization.yaml", R"(apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [ns.yaml, plugin.yaml, extender.yaml]
images: [{name: registry.example.com/kdm, newTag: "1"}]
)"},
      {"ns.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: kdm}\n"},
      {"plugin.yaml", R"(apiVersion: apps/v1
kind: DaemonSet
metadata: {name: plugin, namespace: kdm}
spec:
  selector: {matchLabels: {app: plugin}}
  template:
    metadata: {labels: {app: plugin}}
    spec:
      enableServiceLinks: false
      containers:
      - name: plugin
        image: registry.example.com/kdm:1
        command: [kdm, plugin, --nvml, --plugin-dir=/var/lib/kubelet/device-plugins]
        env:
        - {name: NVIDIA_VISIBLE_DEVICES, value: all}
        volumeMounts: [{name: dp, mountPath: /var/lib/kubelet/device-plugins}]
      volumes: [{name: dp, hostPath: {path: /var/lib/kubelet/device-plugins}}]
)"},
      {"extender.yaml", R"(apiVersion: v1
kind: ServiceAccount
metadata: {name: ext, namespace: kdm}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: ext}
rules:
- {apiGroups: [""], resources: [nodes, pods], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ext}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ext}
subjects: [{kind: ServiceAccount, name: ext, namespace: kdm}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: ext, namespace: kdm}
spec:
  selector: {matchLabels: {app: ext}}
  template:
    metadata: {labels: {app: ext}}
    spec:
      serviceAccountName: ext
      enableServiceLinks: false
      containers:
      - name: ext
        image: registry.example.com/kdm:1
        command: [kdm, extender, --listen=:8888, --in-cluster, --policy=packed]
        ports: [{name: http, containerPort: 8888}]
        readinessProbe: {httpGet: {path: /readyz, port: http}}
        livenessProbe: {httpGet: {path: /livez, port: 8888}}
---
apiVersion: v1
kind: Service
metadata: {name: kdm-ext, namespace: kdm}
spec:
  selector: {app: ext}
  ports: [{port: 80, targetPort: http}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: sched, namespace: kdm}
data:
  config.yaml: |
    apiVersion: kubescheduler.config.k8s.io/v1
    kind: KubeSchedulerConfiguration
    extenders:
    - urlPrefix: http://kdm-ext.kdm.svc
      filterVerb: filter
      prioritizeVerb: prioritize
      weight: 1
      nodeCacheCapable: true
      managedResources: [{name: nvidia.com/gpu, ignoredByScheduler: false}]
)"},
  };
}

// `texts` with `from` replaced by `to` in `file` (which must hold it).
std::vector<std::pair<std::string, std::string>> DeployBroken(const std::string& file,
                                                              const std::string& from,
                                                              const std::string& to) {
  auto texts = DeployGoodSet();
  for (auto& [f, t] : texts) {
    if (f != file) continue;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << file << " holds no " << from;
    if (at != std::string::npos) t.replace(at, from.size(), to);
  }
  return texts;
}

std::vector<std::string> DeployProblems(
    const std::vector<std::pair<std::string, std::string>>& texts) {
  Checker checker(texts);
  checker.CheckAll();
  std::vector<std::string> files;
  for (const auto& t : texts) files.push_back(t.first);
  checker.CheckKustomization(files);
  return checker.result().problems;
}

TEST_F(DeployTest, TheCheckersGoodSetHasNoProblem) {
  EXPECT_TRUE(DeployProblems(DeployGoodSet()).empty())
      << DeployLines(DeployProblems(DeployGoodSet()));
  Checker checker(DeployGoodSet());
  EXPECT_EQ(checker.CheckAll().runs.size(), 2u);
}

// One mistake each, found and named.
TEST_F(DeployTest, EachBrokenCrossReferenceIsNamed) {
  struct Case {
    std::string file, from, to, expected;
  };
  const std::vector<Case> cases = {
      {"ns.yaml", "kind: Namespace", "kind: Namespaces", "unknown kind 'Namespaces'"},
      {"extender.yaml", "apiVersion: apps/v1", "apiVersion: extensions/v1beta1",
       "Deployment is apps/v1, not 'extensions/v1beta1'"},
      {"plugin.yaml", "namespace: kdm", "namespace: kube-system",
       "namespace 'kube-system' is not a Namespace of the set"},
      {"extender.yaml", "serviceAccountName: ext", "serviceAccountName: extender",
       "serviceAccountName extender: no such ServiceAccount in kdm"},
      {"extender.yaml", "subjects: [{kind: ServiceAccount, name: ext,",
       "subjects: [{kind: ServiceAccount, name: other,", "may not list nodes"},
      {"extender.yaml", "verbs: [list, watch]", "verbs: [list]", "may not watch nodes"},
      {"extender.yaml", "  selector: {app: ext}", "  selector: {app: extender}",
       "Service kdm/kdm-ext: its selector selects no workload of the set"},
      {"extender.yaml", "targetPort: http", "targetPort: https",
       "targetPort https is no port of the selected containers"},
      {"extender.yaml", "urlPrefix: http://kdm-ext.kdm.svc",
       "urlPrefix: http://kdm-ext.kdm.svc:8888",
       "urlPrefix port 8888 is not a port of Service kdm/kdm-ext"},
      {"extender.yaml", "urlPrefix: http://kdm-ext.kdm.svc", "urlPrefix: http://extender.kdm.svc",
       "urlPrefix names Service kdm/extender, which is not in the set"},
      {"extender.yaml", "--listen=:8888", "--listen=:9999",
       "urlPrefix reaches container port 8888, but kdm extender --listen is :9999"},
      {"extender.yaml", "urlPrefix: http://", "enableHTTPS: true\n      urlPrefix: http://",
       "and enableHTTPS true disagree"},
      {"extender.yaml", "filterVerb: filter", "filterVerb: filters",
       "filterVerb 'filters': kdm extender serves /filter"},
      {"extender.yaml", " --in-cluster,", "", "nodeCacheCapable true, but kdm extender has no"},
      {"extender.yaml", "weight: 1", "bindVerb: bind\n      weight: 1",
       "may not create pods/binding"},
      {"extender.yaml", "name: nvidia.com/gpu, ignoredByScheduler: false",
       "name: nvidia.com/gpu, ignoredByScheduler: true", "ignoredByScheduler must be false"},
      {"extender.yaml", "name: nvidia.com/gpu,", "name: example.com/fpga,",
       "managedResources example.com/fpga is served by no kdm plugin of the set"},
      {"extender.yaml", "path: /readyz", "path: /healthz", "readinessProbe must GET /readyz"},
      {"extender.yaml", "port: 8888}}", "port: 9090}}", "livenessProbe port 9090 is not the port"},
      {"extender.yaml", "--policy=packed", "--policy=best-set", "the policies disagree"},
      {"plugin.yaml", "      enableServiceLinks: false\n", "",
       "enableServiceLinks is on, so Service kdm-ext gives it KDM_EXT_SERVICE_HOST"},
      {"extender.yaml",
       "        ports:", "        env: [{name: KDM_POLICY, value: packed}]\n        ports:",
       "env KDM_POLICY: --policy is also on the command line, which wins over it"},
      {"plugin.yaml", "--plugin-dir=/var/lib/kubelet/device-plugins",
       "--plugin-dir=/var/lib/kubelet/device-plugin",
       "--plugin-dir=/var/lib/kubelet/device-plugin: no volume is mounted at, above or below it"},
      {"plugin.yaml", "mountPath: /var/lib/kubelet/device-plugins}",
       "mountPath: /var/lib/kubelet/device-plugins, readOnly: true}",
       "is readOnly, and kdm binds a socket there"},
      {"plugin.yaml", "hostPath: {path: /var/lib/kubelet/device-plugins}",
       "hostPath: {path: /var/lib/kdm/device-plugins}",
       "must be the host's /var/lib/kubelet/device-plugins, is the host's "
       "/var/lib/kdm/device-plugins"},
      {"plugin.yaml",
       "volumeMounts: [{name: dp, mountPath: /var/lib/kubelet/device-plugins}]\n"
       "      volumes: [{name: dp,",
       "volumeMounts: [{name: dev, mountPath: /host/dev}, {name: dp, mountPath: "
       "/var/lib/kubelet/device-plugins}]\n"
       "      volumes: [{name: dev, hostPath: {path: /dev}}, {name: dp,",
       "hostPath volume dev (/dev at /host/dev) is used by no flag"},
      {"plugin.yaml", "volumeMounts: [{name: dp,",
       "volumeMounts: [{name: dev, mountPath: /host/dev}, {name: dp,",
       "volumeMount dev: no such volume"},
      {"plugin.yaml", "command: [kdm, plugin,", "command: [nvidia-device-plugin, plugin,",
       "command must start with kdm"},
      {"plugin.yaml", "command: [kdm, plugin,", "command: [kdm, plugins,",
       "'plugins' is not a kdm subcommand"},
      {"plugin.yaml", "--plugin-dir=/var", "--plugin-dir, /var",
       "argument '/var/lib/kubelet/device-plugins': write every flag with its value as "
       "--flag=value"},
      {"plugin.yaml", "{name: NVIDIA_VISIBLE_DEVICES, value: all}",
       "{name: NVIDIA_VISIBLE_DEVICE, value: all}", "env NVIDIA_VISIBLE_DEVICE: read by nothing"},
      {"plugin.yaml", "image: registry.example.com/kdm:1", "image: example.com/kdm:1",
       "every container must use one image placeholder"},
      {"kustomization.yaml", "resources: [ns.yaml, plugin.yaml, extender.yaml]",
       "resources: [ns.yaml, plugin.yaml]", "kustomization.yaml: does not list extender.yaml"},
      {"kustomization.yaml", "resources: [ns.yaml,", "resources: [gone.yaml, ns.yaml,",
       "kustomization.yaml: lists gone.yaml, which does not exist"},
      {"kustomization.yaml", "name: registry.example.com/kdm", "name: example.com/kdm",
       "no images: entry for registry.example.com/kdm:1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file + ": " + c.from + " -> " + c.to);
    std::vector<std::string> problems = DeployProblems(DeployBroken(c.file, c.from, c.to));
    if (c.expected.empty()) {
      EXPECT_TRUE(problems.empty()) << DeployLines(problems);
    } else {
      EXPECT_THAT(problems, Contains(HasSubstr(c.expected))) << DeployLines(problems);
    }
  }
}

// Kubernetes' $(VAR) expansion and the env as the checker hands it over.
TEST_F(DeployTest, TheContainersEnvIsAppliedAsTheKubeletAppliesIt) {
  auto texts = DeployBroken("plugin.yaml", "        env:\n", R"(        env:
        - name: NODE
          valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
        - {name: KDM_HEALTH_RECOVERY, value: 10m}
        - {name: FAIL_ON_INIT_ERROR, value: "false"}
)");
  texts = {texts[0], texts[1], texts[2]};  // the plugin alone
  for (auto& [f, t] : texts) {
    if (f != "plugin.yaml") continue;
    t.replace(t.find("--nvml,"), 7, "--nvml, --socket-name=$(NODE).sock, $$(NODE), $(NONE),");
  }
  Checker checker(texts);
  const auto& result = checker.CheckAll();
  ASSERT_EQ(result.runs.size(), 3u) << DeployLines(result.problems);
  EXPECT_THAT(result.runs[0].argv, Contains("--socket-name=gpu-node-1.sock"));
  EXPECT_THAT(result.runs[0].argv, Contains("$(NODE)"));
  EXPECT_THAT(result.runs[0].argv, Contains("$(NONE)"));
  EXPECT_THAT(result.runs[0].env,
              Contains(std::pair<std::string, std::string>{"KDM_HEALTH_RECOVERY", "10m"}));
  // Each variable that names a flag is also run as that flag, without it.
  EXPECT_THAT(result.runs[1].where, HasSubstr("env KDM_HEALTH_RECOVERY as --health-recovery"));
  EXPECT_THAT(result.runs[1].argv, Contains("--health-recovery=10m"));
  EXPECT_THAT(result.runs[1].env,
              Not(Contains(std::pair<std::string, std::string>{"KDM_HEALTH_RECOVERY", "10m"})));
  EXPECT_THAT(result.runs[2].argv, Contains("--fail-on-init-error=false"));
}

// The dry run fails on what the binary refuses: an unknown flag, a bad
// value, a bad value from a KDM_ variable, and a misspelt KDM_ variable
// (which the binary alone would ignore).
TEST_F(DeployTest, TheDryRunFailsOnAnUnknownFlagOrABadValue) {
  struct Case {
    std::string from, to, expected;
  };
  const std::vector<Case> cases = {
      {"--policy=packed]", "--policy=packed, --no-such-flag]", "--no-such-flag"},
      {"--policy=packed]", "--policy=tightest]", "tightest"},
      {"--listen=:8888,", "--listen=8888,", "8888"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.to);
    Checker checker(DeployBroken("extender.yaml", c.from, c.to));
    const auto& result = checker.CheckAll();
    ASSERT_EQ(result.runs.size(), 2u);
    std::string p = DryRunProblem(result.runs[1], KdmBinary(), dir_);
    EXPECT_THAT(p, AllOf(HasSubstr("extender.yaml#4: Deployment kdm/ext container ext: `kdm "
                                   "--dry-run extender"),
                         HasSubstr("exited 2"), HasSubstr(c.expected)));
  }
  // From the env: KDM_THREADS=many fails as a variable and as a flag;
  // KDM_THRADS fails as the flag it would be (--thrads).
  for (const char* env : {"{name: KDM_THREADS, value: many}", "{name: KDM_THRADS, value: '2'}"}) {
    SCOPED_TRACE(env);
    Checker checker(DeployBroken("extender.yaml", "        ports:",
                                 std::string("        env: [") + env + "]\n        ports:"));
    const auto& result = checker.CheckAll();
    ASSERT_EQ(result.runs.size(), 3u) << DeployLines(result.problems);
    EXPECT_THAT(DryRunProblem(result.runs[2], KdmBinary(), dir_), HasSubstr("exited 2"));
    if (std::string(env).find("KDM_THREADS") != std::string::npos) {
      EXPECT_THAT(DryRunProblem(result.runs[1], KdmBinary(), dir_), HasSubstr("exited 2"));
    }
  }
  // And the good set passes: the failures above are the mistakes'.
  Checker good(DeployGoodSet());
  EXPECT_TRUE(DryRunProblems(good.CheckAll().runs).empty())
      << DeployLines(DryRunProblems(good.CheckAll().runs));
}

}  // namespace
}  // namespace kdm
