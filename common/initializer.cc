#include "common/initializer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/hash.h"

namespace asyncps {
namespace {

constexpr double kTwoPi = 6.283185307179586;

// Uniform in (0, 1), from the 53 high bits of a mixed counter.
double Uniform(uint64_t stream, uint64_t counter) {
  const uint64_t bits = Mix64(stream ^ Mix64(counter));
  return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

double StandardNormal(uint64_t stream, uint64_t i) {
  const double u1 = Uniform(stream, 2 * i);
  const double u2 = Uniform(stream, 2 * i + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

uint64_t HashName(absl::string_view s) { return Fnv1a64(s); }

}  // namespace

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

absl::Status ValidateInitializer(const v1::Initializer& init,
                                 absl::string_view tensor) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor, "' initializer: ", what));
  };
  switch (init.kind()) {
    case v1::Initializer::ZEROS:
      return absl::OkStatus();
    case v1::Initializer::CONSTANT:
      return std::isfinite(init.value()) ? absl::OkStatus()
                                         : bad("value is not finite");
    case v1::Initializer::UNIFORM:
      if (!std::isfinite(init.low()) || !std::isfinite(init.high()) ||
          init.low() > init.high()) {
        return bad("needs finite low <= high");
      }
      return absl::OkStatus();
    case v1::Initializer::NORMAL:
      if (!std::isfinite(init.mean()) || !std::isfinite(init.stddev()) ||
          init.stddev() < 0) {
        return bad("needs finite mean and stddev >= 0");
      }
      return absl::OkStatus();
    case v1::Initializer::GLOROT_UNIFORM:
      if (init.fan_in() <= 0 || init.fan_out() <= 0) {
        return bad("GLOROT_UNIFORM needs fan_in and fan_out >= 1");
      }
      return absl::OkStatus();
    case v1::Initializer::HE_NORMAL:
      if (init.fan_in() <= 0) return bad("HE_NORMAL needs fan_in >= 1");
      return absl::OkStatus();
    default:
      return bad(absl::StrCat("unknown kind ", static_cast<int>(init.kind())));
  }
}

void FillInitial(const v1::Initializer& init, uint64_t seed,
                 absl::string_view tensor, uint64_t begin,
                 absl::Span<float> out) {
  const uint64_t stream = Mix64(seed) ^ HashName(tensor);
  for (size_t k = 0; k < out.size(); ++k) {
    const uint64_t i = begin + k;
    double x = 0;
    switch (init.kind()) {
      case v1::Initializer::CONSTANT:
        x = init.value();
        break;
      case v1::Initializer::UNIFORM:
        x = init.low() + (init.high() - init.low()) * Uniform(stream, i);
        break;
      case v1::Initializer::NORMAL:
        x = init.mean() + init.stddev() * StandardNormal(stream, i);
        break;
      case v1::Initializer::GLOROT_UNIFORM: {
        const double a = std::sqrt(6.0 / (init.fan_in() + init.fan_out()));
        x = -a + 2 * a * Uniform(stream, i);
        break;
      }
      case v1::Initializer::HE_NORMAL:
        x = std::sqrt(2.0 / init.fan_in()) * StandardNormal(stream, i);
        break;
      default:
        x = 0;
        break;
    }
    out[k] = static_cast<float>(x);
  }
}

}  // namespace asyncps
