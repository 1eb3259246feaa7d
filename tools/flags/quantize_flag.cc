#include "tools/flags/quantize_flag.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, quantize, "",
          "int8: weight-only int8 for the decoder's linear layers, quantised "
          "per output channel at load (a checkpoint written by "
          "convert_checkpoint --quantize int8 loads as int8 without it).");
