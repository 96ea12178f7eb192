// What a position scheme needs to know of relpos's byte-level model
// (relpos/nn/model.hpp) to be trained in it: the model's shape and the
// schemes' model options. nn::ModelConfig extends it with the rest of the
// model, so the attention layer never depends on the model.
#pragma once

#include <map>
#include <string>

namespace relpos {

struct SchemeModelConfig {
  int width = 128;   // model dimension; heads * head_dim
  int heads = 4;
  int context = 64;  // training length; size of the learned absolute table
  // The position schemes' model options by key ("shaw_k", "t5_buckets",
  // "t5_max_distance", "rope_base", "deberta_buckets", ...). Each scheme
  // declares its own once, with its default, range and meaning
  // (`relpos train --help` lists them as --shaw-k, ...); a key missing here
  // takes its default, a key no scheme declares is refused by validate(),
  // and an integer option holds a whole number.
  std::map<std::string, double> scheme_options;
};

}  // namespace relpos
