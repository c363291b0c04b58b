#include "kdm/k8s/quantity.h"

#include <cstddef>
#include <limits>
#include <string>

namespace kdm::k8s {
namespace {

using Int128 = __int128;

constexpr int64_t kNanosPerUnit = 1000000000;
// The mantissa is limited to this many significant digits, which keeps every
// intermediate product inside 128 bits.
constexpr int kMaxSignificantDigits = 30;

Status Invalid(std::string_view text, std::string_view why) {
  return InvalidArgumentError("invalid quantity \"" + std::string(text) +
                              "\": " + std::string(why));
}

bool IsQuantityDigit(char c) { return c >= '0' && c <= '9'; }

struct Suffix {
  int pow10 = 0;  // value *= 10^pow10
  int pow2 = 0;   // value *= 2^pow2
};

// Parses the suffix (everything after the number). Returns false if unknown.
bool ParseSuffix(std::string_view s, Suffix* out, std::string* why) {
  if (s.empty()) return true;
  if (s.size() == 2 && s[1] == 'i') {
    switch (s[0]) {
      case 'K':
        out->pow2 = 10;
        return true;
      case 'M':
        out->pow2 = 20;
        return true;
      case 'G':
        out->pow2 = 30;
        return true;
      case 'T':
        out->pow2 = 40;
        return true;
      case 'P':
        out->pow2 = 50;
        return true;
      case 'E':
        out->pow2 = 60;
        return true;
      default:
        break;
    }
    *why = "unknown suffix \"" + std::string(s) + "\"";
    return false;
  }
  if (s.size() == 1) {
    switch (s[0]) {
      case 'n':
        out->pow10 = -9;
        return true;
      case 'u':
        out->pow10 = -6;
        return true;
      case 'm':
        out->pow10 = -3;
        return true;
      case 'k':
        out->pow10 = 3;
        return true;
      case 'M':
        out->pow10 = 6;
        return true;
      case 'G':
        out->pow10 = 9;
        return true;
      case 'T':
        out->pow10 = 12;
        return true;
      case 'P':
        out->pow10 = 15;
        return true;
      case 'E':
        out->pow10 = 18;
        return true;
      default:
        break;
    }
  }
  if (s[0] == 'e' || s[0] == 'E') {
    std::string_view e = s.substr(1);
    bool negative = false;
    if (!e.empty() && (e[0] == '+' || e[0] == '-')) {
      negative = e[0] == '-';
      e.remove_prefix(1);
    }
    if (e.empty()) {
      *why = "exponent has no digits";
      return false;
    }
    int64_t value = 0;
    for (char c : e) {
      if (!IsQuantityDigit(c)) {
        *why = "exponent \"" + std::string(s.substr(1)) + "\" is not an integer";
        return false;
      }
      value = value * 10 + (c - '0');
      if (value > 1000) {
        *why = "exponent out of range";
        return false;
      }
    }
    out->pow10 = static_cast<int>(negative ? -value : value);
    return true;
  }
  *why = "unknown suffix \"" + std::string(s) + "\"";
  return false;
}

}  // namespace

StatusOr<Quantity> Quantity::Parse(std::string_view text) {
  if (text.empty()) return Invalid(text, "empty");
  std::string_view s = text;
  bool negative = false;
  if (s[0] == '+' || s[0] == '-') {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  // Mantissa: digits with an optional point; `scale` counts digits after it.
  Int128 mantissa = 0;
  int significant = 0;
  int scale = 0;
  bool seen_point = false;
  bool seen_digit = false;
  int extra_pow10 = 0;  // integer digits dropped beyond the precision limit
  size_t i = 0;
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (c == '.') {
      if (seen_point) return Invalid(text, "more than one decimal point");
      seen_point = true;
      continue;
    }
    if (!IsQuantityDigit(c)) break;
    seen_digit = true;
    if (mantissa == 0 && c == '0') {
      if (seen_point) ++scale;
      continue;
    }
    if (significant >= kMaxSignificantDigits) {
      // Beyond the precision limit: a non-zero digit after the point can
      // only add less than one nano unit after scaling (the limit is far
      // above 18 + 9 digits), so it only matters for rounding up; digits
      // before the point multiply the value by ten.
      if (!seen_point) {
        ++extra_pow10;
      } else if (c != '0') {
        return Invalid(
            text, "more than " + std::to_string(kMaxSignificantDigits) + " significant digits");
      }
      continue;
    }
    mantissa = mantissa * 10 + (c - '0');
    ++significant;
    if (seen_point) ++scale;
  }
  if (!seen_digit) return Invalid(text, "no digits");
  std::string why;
  Suffix suffix;
  if (!ParseSuffix(s.substr(i), &suffix, &why)) return Invalid(text, why);

  // value in nano units = mantissa * 2^pow2 * 10^(pow10 - scale + extra + 9)
  const Int128 kLimit = static_cast<Int128>(std::numeric_limits<int64_t>::max()) * kNanosPerUnit;
  Int128 nanos = mantissa;
  if (nanos != 0) {
    for (int k = 0; k < suffix.pow2; ++k) {
      nanos *= 2;
      if (nanos > kLimit) return Invalid(text, "out of range");
    }
    int exp10 = suffix.pow10 - scale + extra_pow10 + 9;
    for (; exp10 > 0; --exp10) {
      nanos *= 10;
      if (nanos > kLimit) return Invalid(text, "out of range");
    }
    bool remainder = false;
    for (; exp10 < 0 && nanos != 0; ++exp10) {
      if (nanos % 10 != 0) remainder = true;
      nanos /= 10;
    }
    if (exp10 < 0) remainder = true;  // all digits shifted out
    // Round towards +inf: up in magnitude for positive values only.
    if (remainder && !negative) nanos += 1;
    if (nanos > kLimit) return Invalid(text, "out of range");
  }
  if (negative) nanos = -nanos;
  // floor division into units and a non-negative nano fraction
  Int128 units = nanos / kNanosPerUnit;
  Int128 frac = nanos % kNanosPerUnit;
  if (frac < 0) {
    frac += kNanosPerUnit;
    units -= 1;
  }
  if (units > std::numeric_limits<int64_t>::max() || units < std::numeric_limits<int64_t>::min() ||
      (units == std::numeric_limits<int64_t>::max() && frac != 0)) {
    return Invalid(text, "out of range");
  }
  return Quantity(static_cast<int64_t>(units), static_cast<int32_t>(frac), std::string(text));
}

Quantity Quantity::FromInt(int64_t units) { return Quantity(units, 0, std::to_string(units)); }

StatusOr<int64_t> Quantity::DeviceCount() const {
  if (units_ < 0) {
    return InvalidArgumentError("quantity \"" + text_ +
                                "\" is negative; a device count must be >= 0");
  }
  if (nanos_ != 0) {
    return InvalidArgumentError("quantity \"" + text_ +
                                "\" is not a whole number; devices are counted in whole units");
  }
  if (units_ > kMaxDeviceCount) {
    return InvalidArgumentError("quantity \"" + text_ +
                                "\" is too large for a device count (at most " +
                                std::to_string(kMaxDeviceCount) + ")");
  }
  return units_;
}

StatusOr<Quantity> Quantity::Plus(const Quantity& other) const {
  int64_t units = 0;
  int64_t nanos = int64_t{nanos_} + other.nanos_;
  const int64_t carry = nanos >= kNanosPerUnit ? 1 : 0;
  nanos -= carry * kNanosPerUnit;
  if (__builtin_add_overflow(units_, other.units_, &units) ||
      __builtin_add_overflow(units, carry, &units) ||
      (units == std::numeric_limits<int64_t>::max() && nanos != 0)) {
    return OutOfRangeError("quantity \"" + text_ + "\" + \"" + other.text_ +
                           "\" is out of range (2^63 units or more)");
  }
  std::string text = std::to_string(units);
  if (nanos != 0) {
    // value = units + nanos / 10^9 with units the floor: a negative value
    // with a fraction is written as -(|units| - 1).(10^9 - nanos).
    int64_t whole = units;
    int64_t frac = nanos;
    std::string sign;
    if (units < 0) {
      whole = -(units + 1);
      frac = kNanosPerUnit - nanos;
      sign = "-";
    }
    std::string digits = std::to_string(frac);
    digits.insert(0, 9 - digits.size(), '0');
    while (!digits.empty() && digits.back() == '0') digits.pop_back();
    text = sign + std::to_string(whole) + "." + digits;
  }
  return Quantity(units, static_cast<int32_t>(nanos), std::move(text));
}

std::optional<int64_t> CheckedAdd(int64_t a, int64_t b) {
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) return std::nullopt;
  return sum;
}

int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t sum = 0;
  if (!__builtin_add_overflow(a, b, &sum)) return sum;
  return b > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
}

}  // namespace kdm::k8s
