// ModelConfig: validation errors name the field, the text form round-trips
// and refuses unknown keys and bad values; position kind names.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "relpos/nn/model.hpp"

using namespace relpos::nn;

namespace {

// Expects validate() to throw std::invalid_argument whose message names `field`.
::testing::AssertionResult refused_naming(const ModelConfig& c, const std::string& field) {
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).find(field) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "message '" << e.what() << "' does not name " << field;
  }
  return ::testing::AssertionFailure() << "accepted a bad " << field;
}

ModelConfig with(std::function<void(ModelConfig&)> change) {
  ModelConfig c;
  change(c);
  return c;
}

}  // namespace

TEST(NnConfig, DefaultsAreValid) { EXPECT_NO_THROW(ModelConfig{}.validate()); }

TEST(NnConfig, ErrorsNameTheField) {
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.layers = 0; }), "layers"));
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.width = 0; }), "width"));
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.heads = 0; }), "heads"));
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.width = 130; }), "heads"));  // 130 % 4 != 0
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.ffn = -1; }), "ffn"));
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.context = 0; }), "context"));
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.position = "shaw", c.shaw_k = -1; }), "shaw_k"));
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.position = "t5", c.t5_buckets = 0; }), "t5_buckets"));
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.position = "t5", c.t5_max_distance = 2; }),
                             "t5_max_distance"));
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.position = "rope", c.rope_base = 0.5; }),
                             "rope_base"));
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.position = "rope", c.width = 12, c.heads = 4; }),
                             "heads"));  // head dimension 3 cannot be rotated in pairs
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.position = "sinusoidal", c.width = 9, c.heads = 3; }),
                             "width"));
  EXPECT_THROW(Model(with([](ModelConfig& c) { c.ffn = 0; })), std::invalid_argument);
}

TEST(NnConfig, TextRoundTrips) {
  ModelConfig c;
  c.layers = 3, c.width = 96, c.heads = 6, c.ffn = 200, c.context = 48, c.position = "t5";
  c.shaw_k = 5, c.t5_buckets = 16, c.t5_max_distance = 64, c.rope_base = 12345.678;
  c.seed = 18446744073709551615ull;
  const ModelConfig back = ModelConfig::from_text(c.to_text());
  EXPECT_EQ(back.to_text(), c.to_text());
  EXPECT_EQ(back.layers, 3);
  EXPECT_EQ(back.width, 96);
  EXPECT_EQ(back.heads, 6);
  EXPECT_EQ(back.ffn, 200);
  EXPECT_EQ(back.context, 48);
  EXPECT_EQ(back.position, "t5");
  EXPECT_EQ(back.shaw_k, 5);
  EXPECT_EQ(back.t5_buckets, 16);
  EXPECT_EQ(back.t5_max_distance, 64);
  EXPECT_EQ(back.rope_base, 12345.678);
  EXPECT_EQ(back.seed, 18446744073709551615ull);
}

TEST(NnConfig, TextRefusesUnknownKeysAndBadValues) {
  auto message = [](const std::string& text) -> std::string {
    try {
      ModelConfig::from_text(text);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_NE(message("layers=2\ndropout=0.1\n").find("dropout"), std::string::npos);
  EXPECT_NE(message("layers=two\n").find("layers"), std::string::npos);
  EXPECT_NE(message("layers=2x\n").find("layers"), std::string::npos);
  EXPECT_NE(message("rope_base=nan\n").find("rope_base"), std::string::npos);
  EXPECT_NE(message("position=sinusoid\n").find("position"), std::string::npos);
  EXPECT_NE(message("width=100000000000\n").find("width"), std::string::npos);
  EXPECT_NE(message("heads=4\nheads=8\n").find("heads"), std::string::npos);
  EXPECT_NE(message("layers 2\n").find("layers 2"), std::string::npos);
  EXPECT_NE(message("width=130\n").find("heads"), std::string::npos);  // validated after parsing
}

TEST(NnConfig, PositionKindNamesRoundTrip) {
  for (const char* name : {"none", "sinusoidal", "learned", "shaw", "t5", "alibi", "rope", "xl", "kerple", "kerple_power"})
    EXPECT_EQ(parse_position_kind(name), name);
  EXPECT_THROW(parse_position_kind("ALiBi"), std::invalid_argument);
}
