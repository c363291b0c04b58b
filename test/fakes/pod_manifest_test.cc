// Pod manifest parser: every field, YAML and JSON, and every bad input the
// fake kubelet must reject with a message naming the file and the field.
#include "kdm/fakes/pod_manifest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "kdm/k8s/names.h"
#include "kdm/pluginapi/api_rules.h"
#include "kdm/test/fakes/yaml_alias_bomb.h"

namespace kdm::fakes {
namespace {

using devicemanager::Quantity;
using ::testing::HasSubstr;
// The manifest reader's rule for resource names is the wire layer's.
using k8s::IsExtendedResourceName;

constexpr char kFullYaml[] = R"(apiVersion: v1
kind: Pod
metadata:
  name: train
  namespace: ml
  uid: 11111111-2222-3333-4444-555555555555
  labels: {app: x}
spec:
  nodeName: ignored
  initContainers:
  - name: fetch
    image: busybox
    resources:
      limits:
        nvidia.com/gpu: 1
  - name: proxy
    restartPolicy: Always
    resources:
      limits: {example.com/fpga: "1"}
      requests: {example.com/fpga: "1"}
  containers:
  - name: main
    resources:
      limits:
        nvidia.com/gpu: "2"
        cpu: 500m
        memory: 1Gi
      requests:
        nvidia.com/gpu: 2
        cpu: 250m
  - name: side
)";

TEST(PodManifestTest, ReadsEveryFieldFromYaml) {
  PodIdentity id;
  auto pod = ParsePodManifest(kFullYaml, "/x/train.yaml", &id);
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ(pod->name, "train");
  EXPECT_EQ(pod->namespace_name, "ml");
  EXPECT_EQ(pod->uid, "11111111-2222-3333-4444-555555555555");
  EXPECT_EQ(id.name, "train");
  EXPECT_EQ(id.namespace_name, "ml");
  ASSERT_EQ(pod->init_containers.size(), 2u);
  EXPECT_EQ(pod->init_containers[0].name, "fetch");
  EXPECT_FALSE(pod->init_containers[0].restartable);
  EXPECT_EQ(pod->init_containers[0].limits.at("nvidia.com/gpu"), Quantity::FromInt(1));
  // A missing request defaults to the limit.
  EXPECT_EQ(pod->init_containers[0].requests.at("nvidia.com/gpu"), Quantity::FromInt(1));
  EXPECT_EQ(pod->init_containers[1].name, "proxy");
  EXPECT_TRUE(pod->init_containers[1].restartable);
  ASSERT_EQ(pod->containers.size(), 2u);
  const auto& main = pod->containers[0];
  EXPECT_EQ(main.name, "main");
  EXPECT_EQ(main.limits.at("nvidia.com/gpu"), Quantity::FromInt(2));
  EXPECT_EQ(main.limits.at("cpu"), *Quantity::Parse("500m"));
  EXPECT_EQ(main.limits.at("memory"), *Quantity::Parse("1Gi"));
  EXPECT_EQ(main.requests.at("cpu"), *Quantity::Parse("250m"));
  EXPECT_EQ(main.requests.at("memory"), *Quantity::Parse("1Gi"));
  EXPECT_TRUE(pod->containers[1].limits.empty());
}

TEST(PodManifestTest, ReadsTheSamePodFromJson) {
  constexpr char kJson[] = R"({"apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "train", "namespace": "ml"},
    "spec": {"initContainers": [{"name": "proxy", "restartPolicy": "Always"}],
             "containers": [{"name": "main", "resources": {
               "limits": {"nvidia.com/gpu": 2, "memory": "1Gi"},
               "requests": {"nvidia.com/gpu": "2"}}}]}})";
  auto pod = ParsePodManifest(kJson, "train.json");
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ(pod->name, "train");
  EXPECT_EQ(pod->uid, DerivePodUid("ml", "train"));
  ASSERT_EQ(pod->init_containers.size(), 1u);
  EXPECT_TRUE(pod->init_containers[0].restartable);
  EXPECT_EQ(pod->containers[0].limits.at("nvidia.com/gpu"), Quantity::FromInt(2));
  EXPECT_EQ(pod->containers[0].requests.at("nvidia.com/gpu"), Quantity::FromInt(2));
  // JSON is YAML too: a .yaml file holding JSON parses the same.
  auto as_yaml = ParsePodManifest(kJson, "train.yaml");
  ASSERT_TRUE(as_yaml.ok()) << as_yaml.status();
  EXPECT_EQ(as_yaml->uid, pod->uid);
}

TEST(PodManifestTest, NamespaceDefaultsAndUidIsDerivedStably) {
  auto pod = ParsePodManifest(
      "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n"
      "spec: {containers: [{name: c}]}\n",
      "a.yml");
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ(pod->namespace_name, "default");
  EXPECT_EQ(pod->uid, DerivePodUid("default", "a"));
  EXPECT_THAT(pod->uid, ::testing::MatchesRegex(
                            "[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"));
  EXPECT_EQ(DerivePodUid("default", "a"), DerivePodUid("default", "a"));
  EXPECT_NE(DerivePodUid("default", "a"), DerivePodUid("default", "b"));
  EXPECT_NE(DerivePodUid("x", "ab"), DerivePodUid("xa", "b"));
}

TEST(PodManifestTest, ZeroDeviceLimitIsAccepted) {
  auto pod = ParsePodManifest(
      "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n"
      "spec: {containers: [{name: c, resources: {limits: {nvidia.com/gpu: 0}}}]}\n",
      "a.yaml");
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_TRUE(pod->containers[0].limits.at("nvidia.com/gpu").IsZero());
}

TEST(PodManifestTest, ReadsEnvWithLiteralValues) {
  constexpr char kYaml[] = R"(apiVersion: v1
kind: Pod
metadata: {name: cuda}
spec:
  initContainers:
  - name: init
    env: [{name: NVIDIA_DISABLE_REQUIRE, value: "true"}]
  containers:
  - name: main
    env:
    - name: NVIDIA_REQUIRE_CUDA
      value: "cuda>=12.2 brand=tesla,driver>=470"
    - name: FROM_API
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    - name: EMPTY
    - name: NVIDIA_REQUIRE_CUDA
      value: cuda>=12.0
    - name: COUNT
      value: 7
)";
  auto pod = ParsePodManifest(kYaml, "cuda.yaml");
  ASSERT_TRUE(pod.ok()) << pod.status();
  using Env = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(pod->init_containers[0].env, (Env{{"NVIDIA_DISABLE_REQUIRE", "true"}}));
  // A later entry of the same name replaces the value in place; valueFrom is
  // not readable here and is skipped.
  EXPECT_EQ(pod->containers[0].env,
            (Env{{"NVIDIA_REQUIRE_CUDA", "cuda>=12.0"}, {"EMPTY", ""}, {"COUNT", "7"}}));

  auto json = ParsePodManifest(
      R"({"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[)"
      R"({"name":"c","env":[{"name":"NVIDIA_REQUIRE_CUDA","value":"cuda>=12"}]}]}})",
      "p.json");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->containers[0].env, (Env{{"NVIDIA_REQUIRE_CUDA", "cuda>=12"}}));
}

TEST(PodManifestTest, BadEnvNamesTheField) {
  auto error = [](const std::string& container_fields, const char* file = "p.yaml") {
    auto pod = ParsePodManifest(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n" +
            container_fields,
        file);
    EXPECT_FALSE(pod.ok()) << container_fields;
    return pod.ok() ? std::string() : pod.status().message();
  };
  EXPECT_THAT(error("    env: {A: b}\n"),
              HasSubstr("p.yaml: spec.containers[0].env: must be a list, got a mapping"));
  EXPECT_THAT(error("    env: [x]\n"), HasSubstr("spec.containers[0].env[0]: must be a mapping"));
  EXPECT_THAT(error("    env: [{value: x}]\n"), HasSubstr("env[0].name: missing"));
  EXPECT_THAT(error("    env: [{name: [a]}]\n"), HasSubstr("env[0].name: must be a string"));
  EXPECT_THAT(error("    env: [{name: 'A=B', value: x}]\n"),
              HasSubstr("env[0].name: \"A=B\" is not an environment variable name"));
  EXPECT_THAT(error("    env: [{name: 'A B'}]\n"), HasSubstr("is not an environment variable"));
  EXPECT_THAT(error("    env: [{name: A, value: {x: 1}}]\n"),
              HasSubstr("env[0].value: must be a string, got a mapping"));
  auto pod = ParsePodManifest(
      R"({"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[)"
      R"({"name":"c","env":[{"name":"A","value":7}]}]}})",
      "p.json");
  ASSERT_FALSE(pod.ok());
  EXPECT_THAT(pod.status().message(),
              HasSubstr("p.json: spec.containers[0].env[0].value: must be a string, got a number"));
}

struct BadCase {
  const char* label;
  std::string text;
  std::string file;
  std::string message;  // expected substring
};

std::string PodWith(const std::string& container_resources) {
  return "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: c\n"
         "    resources:\n" +
         container_resources;
}

class BadManifestTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadManifestTest, IsRejectedNamingFileAndField) {
  const BadCase& c = GetParam();
  auto pod = ParsePodManifest(c.text, "/some/dir/" + c.file);
  ASSERT_FALSE(pod.ok()) << c.label;
  EXPECT_EQ(pod.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(pod.status().message(), HasSubstr(c.file + ": ")) << c.label;
  EXPECT_THAT(pod.status().message(), HasSubstr(c.message)) << c.label;
}

INSTANTIATE_TEST_SUITE_P(
    AllBadInputs, BadManifestTest,
    ::testing::Values(
        BadCase{"invalid yaml", "apiVersion: v1\nkind: [Pod\n", "bad.yaml",
                "bad.yaml: invalid YAML at line"},
        BadCase{"invalid json", "{\"apiVersion\": \"v1\",", "bad.json", "bad.json: invalid JSON"},
        BadCase{"empty file", "", "empty.yaml", "not a Pod: the document is empty"},
        BadCase{"a list", "- a\n- b\n", "list.yaml", "not a Pod: the document is a list"},
        BadCase{"not a pod", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n",
                "deploy.yaml", "kind: not a Pod: kind is \"Deployment\""},
        BadCase{"no kind", "apiVersion: v1\nmetadata: {name: d}\n", "nokind.yaml", "kind: missing"},
        BadCase{"wrong api version", "apiVersion: v2\nkind: Pod\n", "v2.yaml",
                "apiVersion: must be \"v1\" for a Pod, got \"v2\""},
        BadCase{"no metadata.name",
                "apiVersion: v1\nkind: Pod\nmetadata: {namespace: x}\nspec: {containers: [{name: "
                "c}]}\n",
                "noname.yaml", "metadata.name: missing"},
        BadCase{"bad name", "apiVersion: v1\nkind: Pod\nmetadata: {name: Big_Name}\n", "n.yaml",
                "metadata.name: \"Big_Name\" is not a DNS-1123 subdomain"},
        BadCase{"bad namespace", "apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: A}\n",
                "ns.yaml", "metadata.namespace: \"A\" is not a DNS-1123 label"},
        BadCase{"no spec", "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n", "nospec.yaml",
                "spec: missing"},
        BadCase{"no containers", "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {}\n",
                "noc.yaml", "spec.containers: a Pod needs at least one container"},
        BadCase{"containers not a list",
                "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: x}\n",
                "cl.yaml", "spec.containers: must be a list, got a string"},
        BadCase{
            "container without name",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{image: x}]}\n",
            "cn.yaml", "spec.containers[0].name: missing"},
        BadCase{"duplicate container names",
                "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  initContainers: [{name: "
                "c}]\n  containers: [{name: d}, {name: c}]\n",
                "dup.yaml", "spec.containers[1].name: duplicate container name \"c\""},
        BadCase{"restartPolicy on app container",
                "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c, "
                "restartPolicy: Always}]}\n",
                "rp.yaml", "spec.containers[0].restartPolicy: may only be set on init containers"},
        BadCase{"bad init restartPolicy",
                "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {initContainers: [{name: i, "
                "restartPolicy: Never}], containers: [{name: c}]}\n",
                "rpi.yaml",
                "spec.initContainers[0].restartPolicy: must be \"Always\" when set, got \"Never\""},
        BadCase{"missing limits for a device resource",
                PodWith("      requests: {nvidia.com/gpu: 1}\n"), "nolimit.yaml",
                "spec.containers[0].resources.requests[nvidia.com/gpu]: device resource "
                "\"nvidia.com/gpu\" is requested without a limit"},
        BadCase{"requests different from limits",
                PodWith("      limits: {nvidia.com/gpu: 2}\n      requests: {nvidia.com/gpu: 1}\n"),
                "neq.yaml",
                "spec.containers[0].resources.requests[nvidia.com/gpu]: must be equal to the limit "
                "\"2\" for device resource \"nvidia.com/gpu\", got \"1\""},
        BadCase{"unknown resource", PodWith("      limits: {gpu: 1}\n"), "unknown.yaml",
                "spec.containers[0].resources.limits[gpu]: unknown resource \"gpu\""},
        BadCase{"unknown resource with bad domain", PodWith("      limits: {Vendor_X/gpu: 1}\n"),
                "unknown2.yaml", "unknown resource \"Vendor_X/gpu\""},
        BadCase{"negative count", PodWith("      limits: {nvidia.com/gpu: -1}\n"), "neg.yaml",
                "spec.containers[0].resources.limits[nvidia.com/gpu]: must be greater than or "
                "equal to 0, got \"-1\""},
        BadCase{"negative cpu", PodWith("      limits: {cpu: -100m}\n"), "negcpu.yaml",
                "limits[cpu]: must be greater than or equal to 0"},
        BadCase{"fractional count", PodWith("      limits: {nvidia.com/gpu: 1.5}\n"), "frac.yaml",
                "spec.containers[0].resources.limits[nvidia.com/gpu]: must be a whole number of "
                "devices, got \"1.5\""},
        BadCase{"milli count", PodWith("      limits: {nvidia.com/gpu: 500m}\n"), "milli.yaml",
                "must be a whole number of devices, got \"500m\""},
        BadCase{"garbage quantity", PodWith("      limits: {memory: 1Qi}\n"), "q.yaml",
                "spec.containers[0].resources.limits[memory]: "},
        BadCase{"quantity is a map", PodWith("      limits: {memory: {a: 1}}\n"), "qm.yaml",
                "limits[memory]: must be a quantity, got a mapping"},
        BadCase{"huge count", PodWith("      limits: {nvidia.com/gpu: 3000000000}\n"), "huge.yaml",
                "limits[nvidia.com/gpu]: "},
        BadCase{"json wrong type",
                R"({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": 7}})", "t.json",
                "metadata.name: must be a string, got a number"},
        BadCase{"too large", std::string(kMaxManifestBytes + 1, '#'), "big.yaml",
                "big.yaml: file is larger than the 1048576-byte manifest limit"}),
    [](const ::testing::TestParamInfo<BadCase>& info) {
      std::string name;
      for (char ch : std::string(info.param.label)) name += std::isalnum(ch) ? ch : '_';
      return name;
    });

TEST(PodManifestTest, IdentityIsKnownWhenALaterFieldIsBad) {
  PodIdentity id;
  auto pod = ParsePodManifest(PodWith("      limits: {gpu: 1}\n"), "p.yaml", &id);
  ASSERT_FALSE(pod.ok());
  EXPECT_EQ(id.namespace_name, "default");
  EXPECT_EQ(id.name, "p");
}

TEST(PodManifestTest, DeeplyNestedYamlIsRefusedNotCrashed) {
  std::string deep =
      "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {x: " + std::string(200, '[') +
      std::string(200, ']') + "}\n";
  auto pod = ParsePodManifest(deep, "deep.yaml");
  ASSERT_FALSE(pod.ok());
  EXPECT_THAT(pod.status().message(), HasSubstr("deep.yaml: "));
}

TEST(PodManifestTest, LoadCapsTheBytesReadFromAHugeFile) {
  char tmpl[] = "/tmp/kdm-manifest-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string path = std::string(tmpl) + "/huge.yaml";
  {
    std::ofstream out(path);
    std::string line = "# " + std::string(1022, 'x') + "\n";
    for (int i = 0; i < 10 * 1024; ++i) out << line;  // 10 MiB
  }
  auto bytes = ReadManifestBytes(path);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->size(), kMaxManifestBytes + 1);
  auto pod = LoadPodManifest(path);
  ASSERT_FALSE(pod.ok());
  EXPECT_THAT(pod.status().message(),
              HasSubstr("huge.yaml: file is larger than the 1048576-byte manifest limit"));
  auto missing = LoadPodManifest(std::string(tmpl) + "/missing.yaml");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("missing.yaml"));
  std::filesystem::remove_all(tmpl);
}

TEST(PodManifestTest, ManifestFileNames) {
  EXPECT_TRUE(IsManifestFileName("a.yaml"));
  EXPECT_TRUE(IsManifestFileName("a.yml"));
  EXPECT_TRUE(IsManifestFileName("a.json"));
  EXPECT_FALSE(IsManifestFileName(".a.yaml"));
  EXPECT_FALSE(IsManifestFileName(".a.yaml.swp"));
  EXPECT_FALSE(IsManifestFileName("a.yaml~"));
  EXPECT_FALSE(IsManifestFileName(".#a.yaml"));
  EXPECT_FALSE(IsManifestFileName("4913"));
  EXPECT_FALSE(IsManifestFileName("a.yaml.tmp"));
  EXPECT_FALSE(IsManifestFileName("a.txt"));
  EXPECT_FALSE(IsManifestFileName(""));
}

TEST(PodManifestTest, ExtendedResourceNames) {
  EXPECT_TRUE(IsExtendedResourceName("nvidia.com/gpu"));
  EXPECT_TRUE(IsExtendedResourceName("example.com/fpga"));
  EXPECT_FALSE(IsExtendedResourceName("cpu"));
  EXPECT_FALSE(IsExtendedResourceName("kubernetes.io/x"));
  EXPECT_FALSE(IsExtendedResourceName("requests.example.com/x"));
  EXPECT_FALSE(IsExtendedResourceName("a/b/c"));
  EXPECT_FALSE(IsExtendedResourceName("Example.com/x"));
  EXPECT_FALSE(IsExtendedResourceName("example.com/-x"));
}

// Fuzz finding (fuzz/regressions/registration/resource-domain-label-over-63-chars):
// the registration check accepted "ve5...5com/gf" (one 64+-character domain
// part) while the manifest reader called it a native resource. Kubernetes'
// IsDNS1123Subdomain limits only the whole domain (253), not each part, so
// both now accept it and a pod can ask for the resource a plugin registered.
TEST(PodManifestRegression, ResourceDomainLabelOver63Chars) {
  const std::string domain = "ve" + std::string(62, '5') + "com";  // one 67-char part
  EXPECT_TRUE(IsExtendedResourceName(domain + "/gf"));
  EXPECT_TRUE(IsExtendedResourceName(std::string(253, 'a') + "/gpu"));
  EXPECT_FALSE(IsExtendedResourceName(std::string(254, 'a') + "/gpu"));
  const std::string manifest =
      "apiVersion: v1\nkind: Pod\nmetadata: {name: " + std::string(70, 'p') +
      "}\nspec:\n  containers:\n  - name: main\n"
      "    resources: {limits: {" +
      domain + "/gf: 1}}\n";
  auto pod = ParsePodManifest(manifest, "long.yaml");
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ(pod->name, std::string(70, 'p'));
  EXPECT_EQ(pod->containers[0].limits.at(domain + "/gf"), Quantity::FromInt(1));
  // The namespace is a DNS label: 63 characters at most.
  auto bad = ParsePodManifest("apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: " +
                                  std::string(64, 'n') + "}\nspec: {containers: [{name: m}]}\n",
                              "ns.yaml");
  EXPECT_FALSE(bad.ok());
}

// Fuzz finding (fuzz/regressions/pod_manifest/json-number-overflow-uncaught-exception):
// a JSON number too large for a double made nlohmann throw out_of_range,
// which only parse_error was caught for, so one bad manifest terminated the
// fake kubelet. It is now an INVALID_ARGUMENT naming the file.
TEST(PodManifestRegression, JsonNumberOverflowUncaughtException) {
  for (const char* text : {R"({"apiVersion":1e400})", R"({"kind": -1e999, "apiVersion": "v1"})",
                           R"({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"},
                               "spec": {"containers": [{"name": "m", "resources":
                               {"limits": {"vendor.com/gpu": 1e400}}}]}})"}) {
    auto pod = ParsePodManifest(text, "big.json");
    ASSERT_FALSE(pod.ok()) << text;
    EXPECT_EQ(pod.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(pod.status().message(), HasSubstr("big.json: invalid JSON"));
    EXPECT_THAT(pod.status().message(), HasSubstr("number overflow"));
  }
  // The YAML reader keeps scalars as text: 1e400 there is a bad quantity.
  auto yaml = ParsePodManifest(
      "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  containers:\n"
      "  - name: m\n    resources: {limits: {vendor.com/gpu: 1e400}}\n",
      "big.yaml");
  EXPECT_FALSE(yaml.ok());
}

// Fuzz finding (fuzz/regressions/pod_manifest/json-text-after-nul-byte-ignored):
// nlohmann's parser takes a NUL byte for the end of the input, so a JSON
// manifest with garbage after a NUL was accepted (the YAML reader refused the
// same bytes). Both now refuse a manifest with a NUL byte, naming its offset.
TEST(PodManifestRegression, JsonTextAfterNulByteIgnored) {
  const std::string good =
      R"({"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"containers":[{"name":"m"}]}})";
  ASSERT_TRUE(ParsePodManifest(good, "a.json").ok());
  const std::string bad = good + std::string("\0\\q", 3);
  for (const char* file : {"a.json", "a.yaml"}) {
    auto pod = ParsePodManifest(bad, file);
    ASSERT_FALSE(pod.ok()) << file;
    EXPECT_THAT(pod.status().message(),
                HasSubstr("NUL byte at offset " + std::to_string(good.size())));
  }
}

// Issue 16: a 478-byte "billion laughs" manifest (anchors of anchors under
// metadata.annotations: 9 levels of 9 aliases, 9^9 = 387 million strings)
// was expanded in full while it was converted to JSON: RSS passed 4.9 GB and
// the agent died of bad_alloc, again on every restart. The expansion is now
// bounded (kMaxManifestNodes, kMaxManifestExpandedBytes) and checked as it
// goes, so refusing it costs about 100,000 nodes of work.
using kdm::test::kYamlAliasBomb;

TEST(PodManifestRegression, YamlAliasBombIsRefused) {
  PodIdentity id;
  auto pod = ParsePodManifest(kYamlAliasBomb, "laughs.yaml", &id);
  ASSERT_FALSE(pod.ok());
  EXPECT_EQ(pod.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(pod.status().message(),
              HasSubstr("laughs.yaml: more than 100000 YAML nodes once aliases are expanded "
                        "(the limit is 100000 nodes)"));
}

// The byte bound: few nodes, each a long string used many times.
TEST(PodManifestRegression, YamlAliasBombOfLongStringsIsRefused) {
  std::string text =
      "apiVersion: v1\nkind: Pod\nmetadata:\n  name: long\n  annotations:\n"
      "    a: &a \"" +
      std::string(4000, 'x') + "\"\n";
  std::string prev = "a";
  for (std::string level : {"b", "c", "d"}) {
    text += "    " + level + ": &" + level + " [";
    for (int i = 0; i < 10; ++i) text += (i ? ",*" : "*") + prev;
    text += "]\n";
    prev = level;
  }
  text += "spec:\n  containers:\n  - name: main\n";
  auto pod = ParsePodManifest(text, "long.yaml");
  ASSERT_FALSE(pod.ok());
  EXPECT_THAT(pod.status().message(),
              HasSubstr("long.yaml: more than 4194304 bytes of YAML keys and values once "
                        "aliases are expanded (the limit is 4194304 bytes)"));
}

// Aliases themselves are fine YAML: a manifest that uses a few still parses.
TEST(PodManifestTest, AliasesWithinTheBoundsAreExpanded) {
  auto pod = ParsePodManifest(R"(apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  containers:
  - name: main
    resources:
      limits: &gpus {nvidia.com/gpu: 2}
      requests: *gpus
)",
                              "p.yaml");
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ(pod->containers[0].requests.at("nvidia.com/gpu"), Quantity::FromInt(2));
}

}  // namespace
}  // namespace kdm::fakes
