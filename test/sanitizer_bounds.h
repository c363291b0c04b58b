// How far the time and memory bounds that tests assert may stretch in the
// sanitizer builds of `./run test --sanitize ...`, where the test and every
// kdm process it starts are built alike (docs/reliability.md, "Sanitizers"):
//   - ThreadSanitizer runs instrumented code 5-15x slower on 2 cores and maps
//     shadow memory for every byte touched (about 4x);
//   - AddressSanitizer runs about 2-3x slower and adds shadow memory (1/8),
//     redzones around every allocation and a quarantine of freed memory
//     (256 MB unless ASAN_OPTIONS says less).
// The plain build asserts the bounds as stated; the scaled ones still tell a
// fixed program from the broken one (each test's "before" was far above).
//
// Example:
//   EXPECT_LT(peak_kib, 64 * 1024 * test::kSanitizerMemoryScale);
//   EXPECT_LT(seconds, 1.0 * test::kSanitizerTimeScale);
#ifndef KDM_TEST_SANITIZER_BOUNDS_H_
#define KDM_TEST_SANITIZER_BOUNDS_H_

#include <cstdint>

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KDM_TEST_TSAN 1
#endif
#if __has_feature(address_sanitizer)
#define KDM_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define KDM_TEST_TSAN 1
#endif
#if defined(__SANITIZE_ADDRESS__)
#define KDM_TEST_ASAN 1
#endif

namespace kdm::test {

#if defined(KDM_TEST_TSAN)
inline constexpr int64_t kSanitizerTimeScale = 10;
inline constexpr int64_t kSanitizerMemoryScale = 4;
#elif defined(KDM_TEST_ASAN)
inline constexpr int64_t kSanitizerTimeScale = 3;
inline constexpr int64_t kSanitizerMemoryScale = 3;
#else
inline constexpr int64_t kSanitizerTimeScale = 1;
inline constexpr int64_t kSanitizerMemoryScale = 1;
#endif

}  // namespace kdm::test

#endif  // KDM_TEST_SANITIZER_BOUNDS_H_
