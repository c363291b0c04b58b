// FUZZ_CHECK: the property checks of kdm's fuzz targets. A failed check
// prints what broke and aborts, which libFuzzer reports as a crash (and the
// replay tests as a failure), so a broken property is a finding like a crash.
//
// Thread-safety: the macros write to stderr and abort; call from one thread.
//
// Example:
//   FUZZ_CHECK(again.ok(), "render did not parse back: " << again.status());
#ifndef KDM_FUZZ_FUZZ_CHECK_H_
#define KDM_FUZZ_FUZZ_CHECK_H_

#include <cstdlib>
#include <iostream>

#define FUZZ_CHECK(cond, what)                                                               \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::cerr << __FILE__ << ":" << __LINE__ << ": property violated: " << #cond << "\n  " \
                << what << std::endl;                                                        \
      std::abort();                                                                          \
    }                                                                                        \
  } while (false)

#endif  // KDM_FUZZ_FUZZ_CHECK_H_
