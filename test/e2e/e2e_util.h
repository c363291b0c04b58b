// Helpers shared by the end-to-end tests, which drive the built kdm binary.
#ifndef KDM_TEST_E2E_E2E_UTIL_H_
#define KDM_TEST_E2E_E2E_UTIL_H_

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace kdm::e2e {

// Upper bound of every wait in an e2e test.
inline constexpr std::chrono::seconds kWaitBound{30};

// The kdm binary under test: $KDM_BINARY_DIR/bin/kdm (set by ctest), else the
// build tree the test was compiled in (KDM_TEST_BINARY_DIR).
inline std::string KdmBinary() {
  const char* dir = std::getenv("KDM_BINARY_DIR");
  return std::string(dir && *dir ? dir : KDM_TEST_BINARY_DIR) + "/bin/kdm";
}

// The whole file, or "" if it cannot be read.
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Waits (bounded) until `pred` holds; polls state owned by other processes
// that offer no notification. Returns whether it held.
template <typename Pred>
bool WaitFor(Pred pred, std::chrono::milliseconds bound = kWaitBound) {
  auto end = std::chrono::steady_clock::now() + bound;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace kdm::e2e

#endif  // KDM_TEST_E2E_E2E_UTIL_H_
