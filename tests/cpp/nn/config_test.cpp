// ModelConfig: validation errors name the field, the text form round-trips
// and refuses unknown keys and bad values; position kind names.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "relpos/nn/model.hpp"

using namespace relpos::nn;

namespace {

// validate()'s message, or "accepted".
std::string message_of(const ModelConfig& c) {
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "accepted";
}

// Expects validate() to throw std::invalid_argument whose message names `field`.
::testing::AssertionResult refused_naming(const ModelConfig& c, const std::string& field) {
  const std::string message = message_of(c);
  if (message == "accepted") return ::testing::AssertionFailure() << "accepted a bad " << field;
  if (message.find(field) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "message '" << message << "' does not name " << field;
}

ModelConfig with(std::function<void(ModelConfig&)> change) {
  ModelConfig c;
  change(c);
  return c;
}

}  // namespace

TEST(NnConfig, DefaultsAreValid) {
  const ModelConfig defaults;
  EXPECT_NO_THROW(defaults.validate());
}

TEST(NnConfig, ErrorsNameTheField) {
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.layers = 0; }), "layers"));
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.width = 0; }), "width"));
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.heads = 0; }), "heads"));
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.width = 130; }), "heads"));  // 130 % 4 != 0
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.ffn = -1; }), "ffn"));
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.context = 0; }), "context"));
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.position = "shaw", c.scheme_options["shaw_k"] = -1; }),
                             "shaw_k"));
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.position = "t5", c.scheme_options["t5_buckets"] = 0; }),
                             "t5_buckets"));
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.position = "t5", c.scheme_options["t5_max_distance"] = 2; }),
                             "t5_max_distance"));
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.position = "rope", c.scheme_options["rope_base"] = 0.5; }),
                             "rope_base"));
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.position = "rope", c.width = 12, c.heads = 4; }),
                             "heads"));  // head dimension 3 cannot be rotated in pairs
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.position = "sinusoidal", c.width = 9, c.heads = 3; }),
                             "width"));
  EXPECT_THROW(Model(with([](ModelConfig& c) { c.ffn = 0; })), std::invalid_argument);
}

// The schemes' options: a key no scheme declares is refused by name whichever
// scheme is trained, an integer option must be whole, and a key not given
// takes the default its scheme declares (written out by to_text).
TEST(NnConfig, SchemeOptionsByKey) {
  const std::string unknown = message_of(with([](ModelConfig& c) { c.scheme_options["shaw_kk"] = 3; }));
  EXPECT_NE(unknown.find("scheme_options"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("'shaw_kk'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("shaw_k,"), std::string::npos) << unknown;  // the known keys listed
  EXPECT_TRUE(refused_naming(with([](ModelConfig& c) { c.position = "shaw", c.scheme_options["shaw_k"] = 2.5; }),
                             "shaw_k"));
  const ModelConfig defaults;
  const std::string text = defaults.to_text();
  for (const char* line : {"shaw_k=16\n", "t5_buckets=32\n", "t5_max_distance=128\n", "rope_base=10000\n",
                           "deberta_buckets=16\n", "deberta_max_distance=32\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line << " not in\n" << text;
  const ModelConfig back = ModelConfig::from_text(text);
  EXPECT_EQ(back.scheme_options.at("shaw_k"), 16);
  // Every option given is checked, the trained scheme's or not: to_text writes
  // them all, and what validate accepts must read back.
  for (double bad : {3e9, 2.5, -1.0, std::nan("")})
    EXPECT_TRUE(refused_naming(with([&](ModelConfig& c) { c.position = "alibi", c.scheme_options["shaw_k"] = bad; }),
                               "shaw_k"))
        << bad;
  EXPECT_EQ(back.to_text(), text);
  // DeBERTa's reach checked against its bucket count, each by the model's key.
  const std::string reach = message_of(with([](ModelConfig& c) {
    c.position = "deberta", c.scheme_options["deberta_buckets"] = 16, c.scheme_options["deberta_max_distance"] = 9;
  }));
  EXPECT_NE(reach.find("ModelConfig.deberta_max_distance: with ModelConfig.deberta_buckets 16 must exceed 9"), std::string::npos)
      << reach;
}

TEST(NnConfig, TextRoundTrips) {
  ModelConfig c;
  c.layers = 3, c.width = 96, c.heads = 6, c.ffn = 200, c.context = 48, c.position = "t5";
  c.scheme_options = {{"shaw_k", 5}, {"t5_buckets", 16}, {"t5_max_distance", 64}, {"rope_base", 12345.678}};
  c.seed = 18446744073709551615ull;
  const ModelConfig back = ModelConfig::from_text(c.to_text());
  EXPECT_EQ(back.to_text(), c.to_text());
  EXPECT_EQ(back.layers, 3);
  EXPECT_EQ(back.width, 96);
  EXPECT_EQ(back.heads, 6);
  EXPECT_EQ(back.ffn, 200);
  EXPECT_EQ(back.context, 48);
  EXPECT_EQ(back.position, "t5");
  EXPECT_EQ(back.scheme_options.at("shaw_k"), 5);
  EXPECT_EQ(back.scheme_options.at("t5_buckets"), 16);
  EXPECT_EQ(back.scheme_options.at("t5_max_distance"), 64);
  EXPECT_EQ(back.scheme_options.at("rope_base"), 12345.678);
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
