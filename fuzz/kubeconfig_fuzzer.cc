// Fuzz target: the kubeconfig reader (kube/kubeconfig.h), on an in-memory
// file system holding a CA, a token file and a client certificate and key
// that the input may name.
//
// Properties of every input:
// - a refusal is INVALID_ARGUMENT and starts with "kubeconfig <path>: ";
// - an accepted config has a host, a port in 1..65535, a server URL that
//   starts with https://, a base path that is empty or starts with '/' and
//   does not end with one, a certificate exactly when it has a key, and no
//   CA when insecure-skip-tls-verify is set.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fuzz_check.h"
#include "kdm/base/env.h"
#include "kdm/kube/kubeconfig.h"

namespace {

constexpr char kPath[] = "/fuzz/config";

kdm::Env* FuzzEnv() {
  static kdm::Env* env = [] {
    auto* memory = kdm::NewMemoryEnv().release();
    (void)memory->CreateDirectories("/fuzz", 0755);
    for (const char* f : {"/fuzz/ca.crt", "/fuzz/token", "/fuzz/client.crt", "/fuzz/client.key"}) {
      (void)memory->WriteFileAtomically(f, "fuzz-file-content\n", {});
    }
    return memory;
  }();
  return env;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  kdm::StatusOr<kdm::kube::ClientConfig> c = kdm::kube::ParseKubeconfig(text, kPath, FuzzEnv());
  if (!c.ok()) {
    FUZZ_CHECK(c.status().code() == kdm::StatusCode::kInvalidArgument,
               "refusal code: " << c.status());
    FUZZ_CHECK(c.status().message().rfind(std::string("kubeconfig ") + kPath + ": ", 0) == 0,
               "refusal does not name the file: " << c.status());
    return 0;
  }
  FUZZ_CHECK(!c->host.empty(), "no host");
  FUZZ_CHECK(c->port != 0, "port 0");
  FUZZ_CHECK(c->ServerUrl().rfind("https://", 0) == 0, "server url " << c->ServerUrl());
  FUZZ_CHECK(c->base_path.empty() || (c->base_path.front() == '/' && c->base_path.back() != '/'),
             "base path " << c->base_path);
  FUZZ_CHECK(c->client_certificate.empty() == c->client_key.empty(), "certificate without key");
  FUZZ_CHECK(!(c->insecure_skip_tls_verify && !c->ca.empty()), "insecure with a CA");
  return 0;
}
