// kdm::k8s::Quantity: a Kubernetes resource quantity ("2", "500m",
// "1Gi", "1e3", "1.5k"), as written in a container's limits and requests.
//
// Grammar (Kubernetes' resource.Quantity):
//   quantity  = [sign] number [suffix]
//   number    = digits | digits "." [digits] | "." digits
//   suffix    = binarySI | decimalSI | exponent
//   binarySI  = Ki | Mi | Gi | Ti | Pi | Ei            (powers of 1024)
//   decimalSI = n | u | m | "" | k | M | G | T | P | E (10^-9 ... 10^18)
//   exponent  = ("e" | "E") [sign] digits              (a power of ten)
// No white space anywhere. The value is kept exactly down to nano units
// (10^-9); finer parts are rounded up to the next nano unit (towards +inf),
// as Kubernetes does. Magnitudes of 2^63 units or more are rejected, and so
// are numbers with more than 30 significant digits.
//
// Extended resources (devices) are counted in whole units: DeviceCount()
// turns a quantity into a count, rejecting fractions, negatives and counts
// that do not fit the wire protocol's int32 allocation size.
//
// Arithmetic never wraps: Plus() refuses a sum beyond the range (OUT_OF_RANGE),
// and CheckedAdd/SaturatingAdd are the two policies for plain counts.
//
// Thread-safety: a value type; distinct objects may be used from distinct
// threads, const methods concurrently.
//
// Example:
//   kdm::StatusOr<Quantity> q = Quantity::Parse("2");
//   if (!q.ok()) return q.status();  // e.g. `invalid quantity "2x": ...`
//   kdm::StatusOr<int64_t> n = q->DeviceCount();  // 2
#ifndef KDM_K8S_QUANTITY_H_
#define KDM_K8S_QUANTITY_H_

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "kdm/base/status.h"

namespace kdm::k8s {

class Quantity {
 public:
  // The largest count DeviceCount() accepts (the wire's int32 allocation_size).
  static constexpr int64_t kMaxDeviceCount = 2147483647;

  // Zero.
  Quantity() = default;

  // Parses `text`. On failure: INVALID_ARGUMENT naming the text and what is
  // wrong with it (empty, bad character, bad suffix, out of range, ...).
  static StatusOr<Quantity> Parse(std::string_view text);

  // A whole number of units, e.g. FromInt(2) == Parse("2").
  static Quantity FromInt(int64_t units);

  // The count of devices this quantity asks for. Errors (INVALID_ARGUMENT,
  // naming the quantity as written): negative, not a whole number, more than
  // kMaxDeviceCount.
  StatusOr<int64_t> DeviceCount() const;

  // this + other. OUT_OF_RANGE (naming both) when the sum's magnitude
  // reaches 2^63 units; the sum is never wrapped. ToString() of the result is
  // its canonical decimal form ("3", "1.5").
  StatusOr<Quantity> Plus(const Quantity& other) const;

  bool IsZero() const { return units_ == 0 && nanos_ == 0; }
  bool IsNegative() const { return units_ < 0; }

  // Whole units, rounded towards -inf (1500m -> 1, -500m -> -1).
  int64_t FloorUnits() const { return units_; }
  // The fractional part in nano units, 0 <= FractionNanos() < 10^9, so that
  // value = FloorUnits() + FractionNanos() / 10^9.
  int32_t FractionNanos() const { return nanos_; }

  // The text this quantity was parsed from; for FromInt() the decimal number.
  const std::string& ToString() const { return text_; }

  // Compare values, not spellings: Parse("1") == Parse("1000m").
  friend bool operator==(const Quantity& a, const Quantity& b) {
    return a.units_ == b.units_ && a.nanos_ == b.nanos_;
  }
  friend std::strong_ordering operator<=>(const Quantity& a, const Quantity& b) {
    if (auto c = a.units_ <=> b.units_; c != 0) return c;
    return a.nanos_ <=> b.nanos_;
  }

 private:
  Quantity(int64_t units, int32_t nanos, std::string text)
      : units_(units), nanos_(nanos), text_(std::move(text)) {}

  int64_t units_ = 0;  // floor of the value
  int32_t nanos_ = 0;  // [0, 10^9)
  std::string text_ = "0";
};

// a + b, or nullopt when the sum does not fit int64_t.
std::optional<int64_t> CheckedAdd(int64_t a, int64_t b);
// a + b, clamped to [INT64_MIN, INT64_MAX].
int64_t SaturatingAdd(int64_t a, int64_t b);

}  // namespace kdm::k8s

#endif  // KDM_K8S_QUANTITY_H_
