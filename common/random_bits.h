// The deterministic bit mixers behind Tandem's seeded values (synthetic
// data, the built-in models' initial weights): identical on every machine,
// and simple enough for client/python/tandem/synthetic.py to reproduce.
#ifndef TANDEM_COMMON_RANDOM_BITS_H_
#define TANDEM_COMMON_RANDOM_BITS_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace tandem {

// SplitMix64's output for state x: the golden-ratio step, then the mixer.
// Counter i of the stream seeded s is SplitMix64(s + i * golden).
constexpr uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ULL;
inline uint64_t SplitMix64(uint64_t x) {
  x += kGoldenGamma;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// FNV-1a, 64-bit, over `bytes`: names to seeds.
inline uint64_t Fnv1a64(absl::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace tandem

#endif  // TANDEM_COMMON_RANDOM_BITS_H_
