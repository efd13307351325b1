// Activation and weight formats (DESIGN.md §2 and §4.2) and their per-token sizes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace epmoe {

// What travels between ranks (and what combine may send back).
enum class ActFormat : uint8_t {
  bf16,   // H x bf16
  fp8,    // H x e4m3 + ceil(H/128) x fp32 scale (block 128, the last one partial when H % 128 != 0;
          // ue8m0 option makes scales powers of two)
  nvfp4,  // H/2 bytes of packed e2m1 + H/16 x e4m3 scale; fp32 global scale known to both sides
};

// How expert weights are stored.
enum class WeightFormat : uint8_t {
  bf16,   // plain
  fp8,    // e4m3 + one fp32 scale per 128x128 tile (the DeepSeek-V3 checkpoint format)
  nvfp4,  // packed e2m1 + e4m3 scale per 16 along K + fp32 global scale per expert and matrix
};

const char* format_name(ActFormat);
const char* format_name(WeightFormat);
std::optional<ActFormat> parse_act_format(std::string_view);
std::optional<WeightFormat> parse_weight_format(std::string_view);

// fp8 blocks of a row of n elements: blocks of 128, the last one covering what is left (n % 128,
// a multiple of 16) when n is not a multiple of 128.
constexpr int fp8_blocks(int n) { return (n + 127) / 128; }
// Bytes of one token's payload / scales in format `f` for hidden size `h`.
constexpr size_t payload_bytes(ActFormat f, int h) {
  return f == ActFormat::bf16 ? size_t(h) * 2 : f == ActFormat::fp8 ? size_t(h) : size_t(h) / 2;
}
constexpr size_t scale_bytes(ActFormat f, int h) {
  return f == ActFormat::bf16 ? 0 : f == ActFormat::fp8 ? size_t(fp8_blocks(h)) * 4 : size_t(h / 16);
}
// Required divisor of the hidden size for `f` (1 = none): fp8 and nvfp4 move rows in 16-element
// (16-byte fp8) pieces, and nvfp4's blocks are 16 wide.
constexpr int hidden_multiple(ActFormat f) { return f == ActFormat::fp8 || f == ActFormat::nvfp4 ? 16 : 1; }

// Quantization parameters that sender and receiver share.
struct QuantParams {
  bool ue8m0 = false;              // fp8: power-of-two scales rounded up
  float nvfp4_global_scale = 0.f;  // nvfp4: gs = 448*6/amax (per layer), never sent
};

}  // namespace epmoe
