#include "tools/flags/quantize_flag.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, quantize, "",
          "int8: weight-only int8 for the decoder's linear layers, quantised "
          "per output channel at load (a checkpoint written by "
          "convert_checkpoint --quantize int8 loads as int8 without it); "
          "fp8 or fp8-per-tensor: E4M3 weights (one byte each) with "
          "per-channel or per-tensor scales, quantised at load (emulated on "
          "the CPU; generation computes with their dequantised values).");
