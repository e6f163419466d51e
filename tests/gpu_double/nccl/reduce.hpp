// The NCCL double's arithmetic: element sizes and the reduction of several inputs.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>

namespace gpu_double::nccl {

// Bytes per element; 0 for a type the double refuses (fp8, out of range).
size_t dtype_size(ncclDataType_t dtype);
// Whether `op` is a built-in reduction the double implements.
bool valid_op(ncclRedOp_t op);
const char* dtype_name(ncclDataType_t dtype);
const char* op_name(ncclRedOp_t op);

// out[i] = inputs[0][i] op inputs[1][i] op ... (in that order) for `count` elements;
// ncclAvg divides the sum by `ninputs`. f16 and bf16 are reduced in float and
// rounded to nearest even once. `out` may alias any input.
void reduce(ncclDataType_t dtype, ncclRedOp_t op, const uint8_t* const* inputs, int ninputs, uint8_t* out,
            size_t count);

// Conversions of the 16-bit float formats (round to nearest even).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t b);
uint16_t float_to_bf16(float f);

}  // namespace gpu_double::nccl
