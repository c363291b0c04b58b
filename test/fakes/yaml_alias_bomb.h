// The "billion laughs" pod manifest of issue 16 (anchors of anchors under
// metadata.annotations: 9 levels of 9 aliases, 9^9 = 387 million strings
// once expanded, 478 bytes as written). Shared by the parser's unit test and
// the node agent's end-to-end test; fuzz/regressions/pod_manifest/ holds the
// same text for the fuzzer.
#ifndef KDM_TEST_FAKES_YAML_ALIAS_BOMB_H_
#define KDM_TEST_FAKES_YAML_ALIAS_BOMB_H_

namespace kdm::test {

inline constexpr char kYamlAliasBomb[] = R"(apiVersion: v1
kind: Pod
metadata:
  name: laughs
  annotations:
    a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
    b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
    c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
    d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
    e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
    f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
    g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
    h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
    i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
spec:
  containers:
  - name: main
)";

}  // namespace kdm::test

#endif  // KDM_TEST_FAKES_YAML_ALIAS_BOMB_H_
