// nanobind bridge between relpos/_calls.py (the Python argument marshalling) and the C++ attention API.
//
// The Python layer allocates every output and passes one dict of named
// arrays and options; this file only turns those into strided views (no copy)
// and calls attention_forward / attention_backward with the GIL released.
// C++ std::invalid_argument surfaces in Python as ValueError.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <typeinfo>
#include <string>

#include "../src/schemes/registry.hpp"
#include "relpos/attention.hpp"
#include "relpos/info.hpp"

namespace nb = nanobind;
using namespace relpos;

namespace {

using InArray = nb::ndarray<nb::ro, nb::device::cpu>;
using OutArray = nb::ndarray<nb::device::cpu>;

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument("relpos: " + msg); }

bool has(const nb::dict& a, const char* key) { return a.contains(key) && !a[key].is_none(); }

template <class V, class Array>
V make_view(const Array& arr, const char* key, void* data) {
  constexpr size_t N = std::tuple_size_v<decltype(V::shape)>;
  if (arr.ndim() != N)
    fail(std::string(key) + ": expected " + std::to_string(N) + " dimensions, got " + std::to_string(arr.ndim()));
  V v;
  v.data = static_cast<decltype(v.data)>(data);
  for (size_t a = 0; a < N; ++a) {
    v.shape[a] = static_cast<int64_t>(arr.shape(a));
    v.stride[a] = arr.stride(a);
  }
  return v;
}

// bfloat16 and float16 arrive as 16-bit integer views of the same memory
// (relpos/_calls.py makes them; the "storage" entry names the type), since
// neither NumPy's buffer protocol nor DLPack carries both for every library.
template <class E>
bool dtype_is(const nb::dlpack::dtype& got) {
  if constexpr (is_half_v<E>)
    return got.bits == 16 && got.lanes == 1 &&
           (got.code == uint8_t(nb::dlpack::dtype_code::Int) || got.code == uint8_t(nb::dlpack::dtype_code::UInt));
  else
    return got == nb::dtype<E>();
}

template <class E>
void check_dtype(const nb::dlpack::dtype& got, const char* key) {
  if (!dtype_is<E>(got))
    fail(std::string(key) + ": dtype must be " + checks::precision_name<E>() +
         (std::strcmp(key, "lse") == 0 ? "" : " like q") +
         "; convert it first");
}

// The array behind dict entry `key`; nanobind refuses what it cannot view in
// place (a foreign object, a non-CPU device) with std::bad_cast, named here.
template <class Array>
Array array(const nb::dict& a, const char* key) {
  try {
    return nb::cast<Array>(a[key]);
  } catch (const std::bad_cast&) {
    fail(std::string(key) + ": cannot be read in place as a CPU array (NumPy array or CPU torch tensor)");
  }
}

// A read-only view of dict entry `key`, or an empty view when absent.
template <class T, size_t N>
View<const T, N> input(const nb::dict& a, const char* key) {
  if (!has(a, key)) return {};
  InArray arr = array<InArray>(a, key);
  check_dtype<T>(arr.dtype(), key);
  return make_view<View<const T, N>>(arr, key, const_cast<void*>(arr.data()));
}

template <class T, size_t N>
View<T, N> output(const nb::dict& a, const char* key) {
  if (!has(a, key)) return {};
  OutArray arr = array<OutArray>(a, key);
  check_dtype<T>(arr.dtype(), key);
  return make_view<View<T, N>>(arr, key, arr.data());
}

template <class X>
X option(const nb::dict& a, const char* key, X fallback) {
  if (!has(a, key)) return fallback;
  try {
    return nb::cast<X>(a[key]);
  } catch (const std::bad_cast&) {
    fail(std::string(key) + ": wrong type or out of range");
  }
}

// An option by its name (SchemeOption); an enum's by the names of its values.
template <class X>
void read_option(const nb::dict& a, const SchemeOption& o, X& member) {
  if constexpr (std::is_enum_v<X>) {
    const std::string given = option<std::string>(a, o.name, o.choices[static_cast<std::size_t>(member)]);
    std::string allowed;
    for (std::size_t n = 0; n < o.choices.size() && o.choices[n]; ++n) {
      if (given == o.choices[n]) return void(member = static_cast<X>(n));
      const bool last = n + 1 == o.choices.size() || !o.choices[n + 1];
      allowed += std::string(n == 0 ? "" : last ? " or " : ", ") + "'" + o.choices[n] + "'";
    }
    fail(std::string(o.name) + ": must be " + allowed + ", got '" + given + "'");
  } else {
    member = option<X>(a, o.name, member);
  }
}

template <class T>
void fill_forward(const nb::dict& a, AttentionForward<T>& p) {
  p.q = input<T, 4>(a, "q");
  p.k = input<T, 4>(a, "k");
  p.v = input<T, 4>(a, "v");
  p.out = output<T, 4>(a, "out");
  p.lse = output<compute_t<T>, 3>(a, "lse");
  p.causal = option<bool>(a, "causal", false);
  if (has(a, "key_padding")) {
    InArray kp = array<InArray>(a, "key_padding");
    if (kp.dtype() != nb::dtype<uint8_t>() && kp.dtype() != nb::dtype<bool>())
      fail("key_padding: dtype must be bool or uint8");
    p.key_padding = make_view<View2<const uint8_t>>(kp, "key_padding", const_cast<void*>(kp.data()));
  }
  for (const auto& [key, view] : {std::pair{"q_segments", &p.q_segments}, std::pair{"k_segments", &p.k_segments}})
    if (has(a, key)) {
      InArray ids = array<InArray>(a, key);
      if (ids.dtype() != nb::dtype<int32_t>()) fail(std::string(key) + ": dtype must be int32");
      *view = make_view<View2<const int32_t>>(ids, key, const_cast<void*>(ids.data()));
    }
  p.q_offset = option<int64_t>(a, "q_offset", 0);
  p.k_offset = option<int64_t>(a, "k_offset", 0);
  if (has(a, "scale")) p.scale = option<double>(a, "scale", 0.0);
  p.algorithm = parse_algorithm(option<std::string>(a, "algorithm", "auto"));
  p.num_threads = option<int>(a, "threads", 0);
  p.dropout.p = option<double>(a, "dropout_p", 0.0);
  p.dropout.seed = option<uint64_t>(a, "dropout_seed", 0);
  p.dropout.offset = option<uint32_t>(a, "dropout_offset", 0);

  PositionParams<T>& pos = p.pos;
  pos.scheme = parse_scheme(option<std::string>(a, "scheme", "none"));
  // Every scheme's learnable tensors and other options, by their names
  // ("t5_table", "shaw_k", ...); an option not given keeps its default.
  for_each_scheme_param(pos, [&](const char* name, auto& param) {
    param = input<T, std::tuple_size_v<decltype(param.shape)>>(a, name);
  });
  for_each_scheme_option([&](const SchemeOption& o, auto& member) { read_option(a, o, member); }, pos);
}

template <class T>
void run_forward(const nb::dict& a) {
  AttentionForward<T> p;
  fill_forward(a, p);
  nb::gil_scoped_release release;
  attention_forward(p);
}

template <class T>
void run_backward(const nb::dict& a) {
  AttentionBackward<T> p;
  fill_forward(a, p);
  p.dout = input<T, 4>(a, "dout");
  p.dq = output<T, 4>(a, "dq");
  p.dk = output<T, 4>(a, "dk");
  p.dv = output<T, 4>(a, "dv");
  // Their gradients, by "d_" and the parameter's name.
  for_each_scheme_param(p.pos, [&](const char* name, const auto&, auto& grad) {
    grad = output<T, std::tuple_size_v<decltype(grad.shape)>>(a, ("d_" + std::string(name)).c_str());
  }, p.dpos);
  nb::gil_scoped_release release;
  attention_backward(p);
}

// Dispatch on q's dtype: float32, float64, or the half type "storage" names.
template <template <class> class Run>
auto by_dtype(const nb::dict& a) -> decltype(Run<float>{}(a)) {
  if (!has(a, "q")) fail("q: missing");
  const nb::dlpack::dtype dt = array<InArray>(a, "q").dtype();
  const std::string storage = option<std::string>(a, "storage", "");
  if (storage.empty() && dt == nb::dtype<float>()) return Run<float>{}(a);
  if (storage.empty() && dt == nb::dtype<double>()) return Run<double>{}(a);
  if (storage == "bfloat16" && dtype_is<bfloat16>(dt)) return Run<bfloat16>{}(a);
  if (storage == "float16" && dtype_is<float16>(dt)) return Run<float16>{}(a);
  fail("q: dtype must be float32, float64, bfloat16 or float16");
}

template <class T>
struct Forward {
  void operator()(const nb::dict& a) const { run_forward<T>(a); }
};
template <class T>
struct Available {
  std::vector<std::string> operator()(const nb::dict& a) const {
    AttentionForward<T> p;
    fill_forward(a, p);
    std::vector<std::string> names;
    for (Algorithm algorithm : available_algorithms(p)) names.push_back(to_string(algorithm));
    return names;
  }
};
template <class T>
struct Backward {
  void operator()(const nb::dict& a) const { run_backward<T>(a); }
};

// Every scheme's options as the Python records read them (relpos/schemes.py,
// through scheme_options.json): by scheme, in declaration order, each with its
// kind, its default (a default PositionParams' member), range and choices.
nb::dict scheme_options() {
  nb::dict by_scheme;
  PositionParams<double> defaults;
  AllSchemes::for_each([&](auto scheme) {
    using S = decltype(scheme);
    nb::list options;
    if constexpr (HasOptions<S>)
      S::for_each_option(
          [&](const SchemeOption& o, const auto& member) {
            using X = std::decay_t<decltype(member)>;
            nb::dict d;
            d["name"] = o.name;
            nb::list choices;
            for (const char* c : o.choices)
              if (c) choices.append(c);
            if constexpr (std::is_enum_v<X>) {
              d["kind"] = "choice";
              d["default"] = o.choices[static_cast<std::size_t>(member)];
            } else if constexpr (std::is_same_v<X, bool>) {
              d["kind"] = "bool";
              d["default"] = member;
            } else {
              d["kind"] = std::is_floating_point_v<X> ? "float" : "int";
              if (o.zero_is_none && member == 0)
                d["default"] = nb::none();
              else
                d["default"] = member;
            }
            d["choices"] = choices;
            const auto bound = [](double x) -> nb::object {
              if (std::isinf(x)) return nb::none();
              if constexpr (std::is_integral_v<X>) return nb::int_(int64_t(x));  // declared whole: an int's
              return nb::float_(x);
            };
            d["low"] = bound(o.low);
            d["high"] = bound(o.high);
            d["low_open"] = o.low_open;
            d["even"] = o.even;
            d["core_none"] = o.zero_is_none ? nb::object(nb::int_(0)) : nb::object(nb::none());
            d["note"] = o.note;
            options.append(d);
          },
          defaults);
    by_scheme[S::name] = options;
  });
  return by_scheme;
}

}  // namespace

NB_MODULE(_relpos, m) {
  m.doc() = "relpos C++ core: use the relpos package, not this module directly";
  m.def("forward", &by_dtype<Forward>, nb::arg("args"), "Fill args['out'] and args['lse'].");
  m.def("available_algorithms", &by_dtype<Available>, nb::arg("args"),
        "The algorithms that serve a forward call (validated, not run), from the capability table.");
  m.def("backward", &by_dtype<Backward>, nb::arg("args"), "Add gradients into args['d*'] arrays.");
  m.def(
      "t5_bucket",
      [](int64_t r, bool bidirectional, int64_t num_buckets, int64_t max_distance) {
        check_t5_config(bidirectional, num_buckets, max_distance);
        return t5_bucket(r, bidirectional, num_buckets, max_distance);
      },
      nb::arg("r"), nb::arg("bidirectional"), nb::arg("num_buckets"), nb::arg("max_distance"),
      "HF T5 bucket of relative distance r = key_pos - query_pos.");
  m.def("scheme_options", &scheme_options,
        "Every scheme's options (name, kind, default, range, choices), as src/schemes/ declares them.");
  m.def("check_t5_config", &check_t5_config, nb::arg("bidirectional"), nb::arg("num_buckets"),
        nb::arg("max_distance"), nb::arg("num_buckets_name"), nb::arg("max_distance_name"),
        "Raise ValueError unless the configuration defines buckets, the messages starting with the names given.");
  m.def(
      "deberta_bucket",
      [](int64_t x, int64_t position_buckets, int64_t max_relative_positions) {
        check_deberta_config(position_buckets, max_relative_positions);
        return deberta_bucket(x, position_buckets, max_relative_positions);
      },
      nb::arg("x"), nb::arg("position_buckets"), nb::arg("max_relative_positions"),
      "transformers' DeBERTa log bucket of relative position x = query_pos - key_pos.");
  m.def(
      "view_info",
      [](const InArray& arr) {
        std::vector<int64_t> shape, stride;
        for (size_t a = 0; a < arr.ndim(); ++a) {
          shape.push_back(static_cast<int64_t>(arr.shape(a)));
          stride.push_back(arr.stride(a));
        }
        return nb::make_tuple(reinterpret_cast<uintptr_t>(arr.data()), shape, stride);
      },
      nb::arg("array"),
      "(address, shape, strides in elements) of an array as the core receives it: lets tests check that "
      "NumPy arrays and torch tensors reach the core in place, not copied.");
  m.def(
      "dropout_mask",
      [](uint64_t seed, uint32_t offset, double p, int64_t q_offset, int64_t k_offset, OutArray keep) {
        if (keep.ndim() != 4 || keep.dtype() != nb::dtype<uint8_t>() || keep.stride(3) != 1 ||
            keep.stride(2) != int64_t(keep.shape(3)) || keep.stride(1) != int64_t(keep.shape(2) * keep.shape(3)) ||
            keep.stride(0) != int64_t(keep.shape(1) * keep.shape(2) * keep.shape(3)))
          fail("dropout_mask: expected a contiguous uint8 array (B, H, Lq, Lk)");
        uint8_t* out = static_cast<uint8_t*>(keep.data());
        const AttentionDropout d{p, seed, offset, 0};
        const int64_t B = keep.shape(0), H = keep.shape(1), Lq = keep.shape(2), Lk = keep.shape(3);
        nb::gil_scoped_release release;
        dropout_mask(d, B, H, Lq, Lk, q_offset, k_offset, out);
      },
      nb::arg("seed"), nb::arg("offset"), nb::arg("p"), nb::arg("q_offset"), nb::arg("k_offset"), nb::arg("keep"),
      "Fill keep (B, H, Lq, Lk) uint8 with 1 where the dropout mask keeps an entry.");
  m.def("alibi_slopes", &alibi_slopes, nb::arg("num_heads"), "ALiBi head slopes of the paper, any head count.");
  m.def(
      "build_info",
      [] {
        const BuildInfo i = build_info();
        nb::dict d;
        d["version"] = i.version;
        d["simd_target"] = i.simd_target;
        d["simd_compiled"] = i.simd_compiled;
        d["simd_supported"] = i.simd_supported;
        d["gemm"] = i.gemm;
        d["gemm_isa"] = i.gemm_isa;
        d["gemm_bf16"] = i.gemm_bf16;
        d["half_storage"] = i.half_storage;
        d["cpu_avx512_bf16"] = i.cpu_avx512_bf16;
        d["threads"] = i.max_threads;
        d["openmp_wait_policy"] = i.openmp_wait_policy;
        d["l1d_bytes"] = i.l1d_bytes;
        d["l2_bytes"] = i.l2_bytes;
        d["l3_bytes"] = i.l3_bytes;
        d["forward_tiles"] = i.forward_tiles;
        return d;
      },
      "What this build runs on (see relpos.info()).");
}
