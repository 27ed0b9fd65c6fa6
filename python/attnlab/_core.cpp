// attnlab._core: the C++ library as a Python extension (pybind11). Thin on purpose: the public
// API, its argument checks and the rank lifting live in attnlab/__init__.py; this file only moves
// arrays in and out and releases the GIL while the library runs.
//
// Copies: none for q, k, v, out, d_out, the per-token inputs and the score modifiers (bias,
// sinks, ALiBi slopes), which the library reads in place through TensorRef, TokenRef and span
// views of NumPy's buffers (the caller hands over C-contiguous float32); a boolean mask is copied
// (Mask owns it). Every result
// (output, lse, gradients) is handed to NumPy without a copy: the array's base is a capsule
// owning the Tensor (python/tests/test_numpy.py checks both).
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "attnlab/attnlab.hpp"
#include "attnlab/kernels.hpp"

namespace py = pybind11;

namespace {

using Floats = py::array_t<float, py::array::c_style>;
using Bools = py::array_t<bool, py::array::c_style>;
// bfloat16 values as their bits (NumPy has no bf16 type; torch.bfloat16 viewed as int16).
using Halves = py::array_t<std::uint16_t, py::array::c_style>;

// A C-contiguous array of rank R as an owning xtensor: the one copy. The caller (Python) has
// checked dtype, rank and layout; run with the GIL released (the array stays alive in the caller).
template <class T, std::size_t R>
xt::xtensor<T, R> to_tensor(const py::array_t<T, py::array::c_style>& a) {
  if (static_cast<std::size_t>(a.ndim()) != R)
    throw attnlab::Error("expected a rank-" + std::to_string(R) + " array");
  std::array<std::size_t, R> shape;
  for (std::size_t i = 0; i < R; ++i) shape[i] = static_cast<std::size_t>(a.shape(i));
  auto t = xt::xtensor<T, R>::from_shape(shape);
  if (t.size() != 0) std::memcpy(t.data(), a.data(), t.size() * sizeof(T));
  return t;
}

// A C-contiguous float32 array of rank 4 read in place: attention reads NumPy's buffer, no copy.
// The caller (Python) has checked dtype, rank and layout; the array outlives the call.
attnlab::TensorRef view(const Floats& a) {
  if (a.ndim() != 4) throw attnlab::Error("expected a rank-4 array");
  return attnlab::TensorRef(
      a.data(), {static_cast<std::size_t>(a.shape(0)), static_cast<std::size_t>(a.shape(1)),
                 static_cast<std::size_t>(a.shape(2)), static_cast<std::size_t>(a.shape(3))});
}

// A C-contiguous array of bf16 bits of rank 4, read in place as a bf16 tensor.
attnlab::TensorRefBf16 view_bf16(const Halves& a) {
  if (a.ndim() != 4) throw attnlab::Error("expected a rank-4 array");
  return attnlab::TensorRefBf16(
      reinterpret_cast<const attnlab::bf16*>(a.data()),
      {static_cast<std::size_t>(a.shape(0)), static_cast<std::size_t>(a.shape(1)),
       static_cast<std::size_t>(a.shape(2)), static_cast<std::size_t>(a.shape(3))});
}

// A C-contiguous float32 array of rank 3 (g or beta, [B, H, Nk]) read in place, as q, k, v are.
attnlab::TokenRef token_view(const Floats& a) {
  if (a.ndim() != 3) throw attnlab::Error("expected a rank-3 array");
  return attnlab::TokenRef(
      a.data(), {static_cast<std::size_t>(a.shape(0)), static_cast<std::size_t>(a.shape(1)),
                 static_cast<std::size_t>(a.shape(2))});
}

// What a forward saved for its backward (attnlab::Saved: a softmax variant's row log-sum-exp, the
// scan variants' chunk states), opaque to Python but for `lse` and `final_state`.
struct SavedState {
  attnlab::Saved saved;
};

// A C-contiguous float32 array of rank 4 ([S, H, rows, Dv]) and, where the variant has one, a
// rank-3 key sum, read in place as a recurrent state.
attnlab::StateRef state_view(const Floats& memory, const std::optional<Floats>& key_sum) {
  attnlab::StateRef s{view(memory), std::nullopt};
  if (key_sum) s.key_sum = token_view(*key_sum);
  return s;
}

// Hands an xtensor to NumPy without a copy: the array's base is a capsule that owns it.
template <class T>
py::array to_numpy(T&& tensor) {
  using Value = typename std::decay_t<T>::value_type;
  auto* owned = new std::decay_t<T>(std::forward<T>(tensor));
  py::capsule owner(owned, [](void* p) { delete static_cast<std::decay_t<T>*>(p); });
  std::vector<py::ssize_t> shape(owned->shape().begin(), owned->shape().end());
  return py::array_t<Value>(shape, owned->data(), owner);
}

// A bf16 tensor to NumPy as its bits (uint16), without a copy.
py::array bits_to_numpy(attnlab::TensorBf16&& tensor) {
  auto* owned = new attnlab::TensorBf16(std::move(tensor));
  py::capsule owner(owned, [](void* p) { delete static_cast<attnlab::TensorBf16*>(p); });
  std::vector<py::ssize_t> shape(owned->shape().begin(), owned->shape().end());
  return Halves(shape, reinterpret_cast<const std::uint16_t*>(owned->data()), owner);
}

// Floats of `shape` to NumPy without a copy: the array owns the vector.
py::array vector_array(std::vector<float>&& floats, std::vector<py::ssize_t> shape) {
  auto* values = new std::vector<float>(std::move(floats));
  py::capsule owner(values, [](void* v) { delete static_cast<std::vector<float>*>(v); });
  return py::array_t<float>(shape, values->data(), owner);
}

// A parameter (or its gradient) to NumPy without a copy: the array owns its values.
py::array parameter_array(attnlab::ParameterTensor&& p) {
  return vector_array(std::move(p.values), {p.shape.begin(), p.shape.end()});
}

// One value per head (sinks, ALiBi slopes, their gradients) to NumPy without a copy.
py::array head_array(std::vector<float>&& values) {
  const auto heads = static_cast<py::ssize_t>(values.size());
  return vector_array(std::move(values), {heads});
}

struct MaskArgs {
  std::string causal = "none";
  std::vector<std::int64_t> key_lengths;
  std::optional<Bools> allowed;
  std::optional<double> scale;
  std::vector<std::int64_t> documents, key_documents;
  std::optional<std::pair<std::int64_t, std::int64_t>> window;  // (left, right)
  std::vector<std::int64_t> prefix_lengths;
  std::optional<double> softcap;
};

// The Mask of one call. Needs the GIL (reads the mask array).
attnlab::Mask make_mask(const MaskArgs& m) {
  attnlab::Mask mask;
  mask.causal = attnlab::parse_causal(m.causal);
  mask.key_lengths = m.key_lengths;
  if (m.allowed) mask.allowed = to_tensor<bool, 4>(*m.allowed);
  mask.scale = m.scale;
  mask.documents = m.documents;
  mask.key_documents = m.key_documents;
  if (m.window) mask.window = attnlab::Window{m.window->first, m.window->second};
  mask.prefix_lengths = m.prefix_lengths;
  mask.softcap = m.softcap;
  return mask;
}

// The inputs of one call beyond q, k, v (Attention's TokenInputs): optional [B, H, Nk] arrays,
// recurrent states (S [S, H, rows, Dv] and, where the variant has one, z [S, H, rows]), and the
// score modifiers: a bias broadcastable to [B, H, Nq, Nk] (rank 4), sinks and slopes [H].
struct TokenArgs {
  std::optional<Floats> log_decay, beta;
  std::optional<Floats> initial_state, initial_key_sum, d_final_state, d_final_key_sum;
  std::optional<Floats> bias, sinks, alibi_slopes;
};

std::span<const float> span_of(const Floats& a) {
  return {a.data(), static_cast<std::size_t>(a.size())};
}

// The given inputs as views of NumPy's buffers (the arrays outlive the call).
attnlab::TokenInputs token_views(const TokenArgs& t) {
  attnlab::TokenInputs tokens;
  if (t.log_decay) tokens.log_decay = token_view(*t.log_decay);
  if (t.beta) tokens.beta = token_view(*t.beta);
  if (t.initial_state) tokens.initial_state = state_view(*t.initial_state, t.initial_key_sum);
  if (t.d_final_state) tokens.d_final_state = state_view(*t.d_final_state, t.d_final_key_sum);
  if (t.bias) tokens.bias = view(*t.bias);
  if (t.sinks) tokens.sinks = span_of(*t.sinks);
  if (t.alibi_slopes) tokens.alibi_slopes = span_of(*t.alibi_slopes);
  return tokens;
}

py::dict support_dict(const attnlab::Support& s) {
  py::dict d;
  d["causal"] = s.causal;
  d["causal_cross"] = s.causal_cross;
  d["key_lengths"] = s.key_lengths;
  d["allowed"] = s.allowed;
  d["cross"] = s.cross;
  d["value_dim"] = s.value_dim;
  d["backward"] = s.backward;
  d["log_decay"] = s.log_decay;
  d["beta"] = s.beta;
  d["state"] = s.state;
  d["documents"] = s.documents;
  d["grouped_heads"] = s.grouped_heads;
  d["window"] = s.window;
  d["prefix"] = s.prefix;
  d["softcap"] = s.softcap;
  d["bias"] = s.bias;
  d["sinks"] = s.sinks;
  d["alibi"] = s.alibi;
  d["forgetting_gate"] = s.forgetting_gate;
  d["approximates_softmax"] = s.approximates_softmax;
  return d;
}

// A decoder (attnlab::TokenDecoder): q, k, v read in place, outputs handed over without a copy.
class DecoderHandle {
 public:
  explicit DecoderHandle(std::unique_ptr<attnlab::TokenDecoder> d) : decoder_(std::move(d)) {}

  py::array prefill(const Floats& q, const Floats& k, const Floats& v, const TokenArgs& t,
                    const std::vector<std::int64_t>& lengths) {
    attnlab::Tensor out;
    {
      py::gil_scoped_release release;
      out = decoder_->prefill(view(q), view(k), view(v), token_views(t), lengths);
    }
    return to_numpy(std::move(out));
  }

  py::array step(const Floats& q, const Floats& k, const Floats& v, const TokenArgs& t) {
    attnlab::Tensor out;
    {
      py::gil_scoped_release release;
      out = decoder_->step(view(q), view(k), view(v), token_views(t));
    }
    return to_numpy(std::move(out));
  }

  void extend(const Floats& k, const Floats& v, const TokenArgs& t) {
    py::gil_scoped_release release;
    decoder_->extend(view(k), view(v), token_views(t));
  }

  std::vector<std::size_t> tokens() const {
    std::vector<std::size_t> t;
    for (std::size_t b = 0; b < decoder_->config().batch; ++b) t.push_back(decoder_->tokens(b));
    return t;
  }
  std::size_t bytes() const { return decoder_->bytes(); }

 private:
  std::unique_ptr<attnlab::TokenDecoder> decoder_;
};

// One backend built from a factory string, shared by the Python objects that hold it.
class Backend {
 public:
  explicit Backend(const std::string& spec) : attention_(attnlab::make_attention(spec)) {}

  std::string spec() const { return attention_->spec(); }
  py::dict support() const { return support_dict(attention_->support()); }

  // out, or (out, saved) when `save`: saved is what backward() reads instead of recomputing.
  py::object forward(const Floats& q, const Floats& k, const Floats& v, const MaskArgs& m,
                     const TokenArgs& t, bool save) const {
    attnlab::Mask mask = make_mask(m);
    attnlab::Tensor out;
    auto state = std::make_shared<SavedState>();
    {
      py::gil_scoped_release release;
      const attnlab::TokenInputs tokens = token_views(t);
      if (save)
        attention_->forward(view(q), view(k), view(v), mask, tokens, out, state->saved);
      else
        attention_->forward(view(q), view(k), view(v), mask, tokens, out);
    }
    if (!save) return to_numpy(std::move(out));
    return py::make_tuple(to_numpy(std::move(out)), state);
  }

  // bf16 q, k, v (bits): out in bf16 bits, or float32 when `float32_out`; (out, saved) when
  // `save`. The library's bf16 overloads (attnlab/bf16.hpp).
  py::object forward_bf16(const Halves& q, const Halves& k, const Halves& v, const MaskArgs& m,
                          const TokenArgs& t, bool save, bool float32_out) const {
    attnlab::Mask mask = make_mask(m);
    attnlab::Tensor out32;
    attnlab::TensorBf16 out16;
    auto state = std::make_shared<SavedState>();
    {
      py::gil_scoped_release release;
      const attnlab::TokenInputs tokens = token_views(t);
      attnlab::Saved* saved = save ? &state->saved : nullptr;
      if (float32_out)
        attention_->forward(view_bf16(q), view_bf16(k), view_bf16(v), mask, tokens, out32, saved);
      else
        attention_->forward(view_bf16(q), view_bf16(k), view_bf16(v), mask, tokens, out16, saved);
    }
    py::object out = float32_out ? to_numpy(std::move(out32)) : bits_to_numpy(std::move(out16));
    if (!save) return out;
    return py::make_tuple(out, state);
  }

  // The backward of forward_bf16 with bf16 out and d_out (bits): dq, dk, dv as bf16 bits, the
  // other inputs' gradients float32, keyed as backward's.
  py::dict backward_bf16(const Halves& q, const Halves& k, const Halves& v, const MaskArgs& m,
                         const TokenArgs& t, const Halves& out, const Halves& d_out,
                         const std::shared_ptr<SavedState>& state) const {
    attnlab::Mask mask = make_mask(m);
    attnlab::AllGradientsBf16 g;
    {
      py::gil_scoped_release release;
      static const attnlab::Saved recompute;
      attention_->backward(view_bf16(q), view_bf16(k), view_bf16(v), mask, token_views(t),
                           view_bf16(out), view_bf16(d_out), state ? state->saved : recompute, g);
    }
    py::dict d;
    d["dq"] = bits_to_numpy(std::move(g.dq));
    d["dk"] = bits_to_numpy(std::move(g.dk));
    d["dv"] = bits_to_numpy(std::move(g.dv));
    add_input_gradients(g.rest, t, d);
    return d;
  }

  // For benchmarks/python_bench.py only: seconds per call of the same forward made from C++
  // (fresh output each call, as attnlab.attention returns a new array), the inputs copied once
  // outside the timing; `calls` calls after one warm-up, the GIL released throughout.
  double time_cpp_forward(const Floats& q, const Floats& k, const Floats& v, const MaskArgs& m,
                          int calls) const {
    if (calls < 1) throw attnlab::Error("calls must be >= 1");
    attnlab::Mask mask = make_mask(m);
    py::gil_scoped_release release;
    const attnlab::Tensor tq = to_tensor<float, 4>(q), tk = to_tensor<float, 4>(k),
                          tv = to_tensor<float, 4>(v);
    attnlab::Tensor out = attention_->forward(tq, tk, tv, mask);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) out = attention_->forward(tq, tk, tv, mask);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls;
  }

  // {"dq", "dk", "dv"}, "d_log_decay" / "d_beta" / "d_bias" / "d_sinks" / "d_alibi_slopes" for
  // the inputs given, and "d_" + name (lower case) for each of the variant's own parameters
  // (linformer: "d_e", "d_f").
  py::dict backward(const Floats& q, const Floats& k, const Floats& v, const MaskArgs& m,
                    const TokenArgs& t, const Floats& out, const Floats& d_out,
                    const std::shared_ptr<SavedState>& state) const {
    attnlab::Mask mask = make_mask(m);
    attnlab::AllGradients g;
    {
      py::gil_scoped_release release;
      static const attnlab::Saved recompute;
      attention_->backward(view(q), view(k), view(v), mask, token_views(t), view(out), view(d_out),
                           state ? state->saved : recompute, g);
    }
    py::dict d;
    d["dq"] = to_numpy(std::move(g.qkv.dq));
    d["dk"] = to_numpy(std::move(g.qkv.dk));
    d["dv"] = to_numpy(std::move(g.qkv.dv));
    add_input_gradients(g, t, d);
    return d;
  }

  // Into d: the gradients of the inputs given beyond q, k, v (see backward).
  static void add_input_gradients(attnlab::AllGradients& g, const TokenArgs& t, py::dict& d) {
    if (t.log_decay) d["d_log_decay"] = to_numpy(std::move(g.d_log_decay));
    if (t.beta) d["d_beta"] = to_numpy(std::move(g.d_beta));
    if (t.bias) d["d_bias"] = to_numpy(std::move(g.d_bias));
    if (t.sinks) d["d_sinks"] = head_array(std::move(g.d_sinks));
    if (t.alibi_slopes) d["d_alibi_slopes"] = head_array(std::move(g.d_alibi_slopes));
    if (t.initial_state) {
      d["d_initial_state"] = to_numpy(std::move(g.d_initial_state.memory));
      if (g.d_initial_state.key_sum.size() != 0)
        d["d_initial_key_sum"] = to_numpy(std::move(g.d_initial_state.key_sum));
    }
    for (attnlab::ParameterTensor& p : g.parameters) {
      std::string key = "d_";
      for (char c : p.name) key += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      d[key.c_str()] = parameter_array(std::move(p));
    }
  }

  // A decoder of this variant (Attention::start_decoding); kv_heads, max_tokens 0: H, no limit;
  // the window and softcap of `m`, the sinks and ALiBi slopes of `t` (copied: the decoder's).
  DecoderHandle start_decoding(std::size_t batch, std::size_t heads, std::size_t dk, std::size_t dv,
                               std::size_t kv_heads, std::optional<double> scale,
                               std::size_t max_tokens, const MaskArgs& m,
                               const TokenArgs& t) const {
    attnlab::DecodeConfig c(batch, heads, dk, dv);
    c.kv_heads = kv_heads;
    c.scale = scale;
    c.max_tokens = max_tokens;
    if (m.window) c.window = attnlab::Window{m.window->first, m.window->second};
    c.softcap = m.softcap;
    for (const auto& [given, into] :
         {std::pair{&t.sinks, &c.sinks}, std::pair{&t.alibi_slopes, &c.alibi_slopes}})
      if (*given) {
        const auto values = span_of(**given);
        into->assign(values.begin(), values.end());
      }
    return DecoderHandle(attention_->start_decoding(c));
  }

  // The variant's own learned tensors for `heads` heads: {name: array} (linformer: "E", ...).
  py::dict parameters(std::size_t heads) const {
    py::dict d;
    for (attnlab::ParameterTensor& p : attention_->parameters(heads))
      d[p.name.c_str()] = parameter_array(std::move(p));
    return d;
  }

  // Replaces them from {name: C-contiguous float32 array} (copied).
  void set_parameters(const std::map<std::string, Floats>& values) {
    std::vector<attnlab::ParameterTensor> tensors;
    for (const auto& [name, a] : values)
      tensors.push_back({name, {a.shape(), a.shape() + a.ndim()}, {a.data(), a.data() + a.size()}});
    py::gil_scoped_release release;
    attention_->set_parameters(tensors);
  }

 private:
  std::unique_ptr<attnlab::Attention> attention_;
};

// The float64 reference under a mask and the score modifiers in `t` (which the caller has
// validated: reference_attention does not), as float64 [B, H, Nq, Dv].
py::array reference(const Floats& q, const Floats& k, const Floats& v, const MaskArgs& m,
                    const TokenArgs& t) {
  attnlab::Mask mask = make_mask(m);
  attnlab::Tensor64 ref;
  {
    py::gil_scoped_release release;
    ref = attnlab::reference_attention(to_tensor<float, 4>(q), to_tensor<float, 4>(k),
                                       to_tensor<float, 4>(v), mask, token_views(t));
  }
  return to_numpy(std::move(ref));
}

py::dict compare(const Floats& out, const py::array_t<double, py::array::c_style>& ref) {
  const attnlab::ErrorMetrics e =
      attnlab::compare(to_tensor<float, 4>(out), to_tensor<double, 4>(ref));
  py::dict d;
  d["rel_fro"] = e.rel_fro;
  d["max_abs"] = e.max_abs;
  d["mean_cos"] = e.mean_cos;
  d["p99_row"] = e.p99_row;
  return d;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "attnlab's C++ library; use the attnlab package, which checks arguments first.";

  // Unsupported derives from Error, so it is caught first. Other exceptions keep pybind11's
  // translation (std::bad_alloc: MemoryError).
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const attnlab::Unsupported& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what());
    } catch (const attnlab::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  py::class_<MaskArgs>(m, "Mask")
      .def(py::init<>())
      .def_readwrite("causal", &MaskArgs::causal)
      .def_readwrite("key_lengths", &MaskArgs::key_lengths)
      .def_readwrite("allowed", &MaskArgs::allowed)
      .def_readwrite("scale", &MaskArgs::scale)
      .def_readwrite("documents", &MaskArgs::documents)
      .def_readwrite("key_documents", &MaskArgs::key_documents)
      .def_readwrite("window", &MaskArgs::window)
      .def_readwrite("prefix_lengths", &MaskArgs::prefix_lengths)
      .def_readwrite("softcap", &MaskArgs::softcap);

  py::class_<TokenArgs>(m, "Tokens")
      .def(py::init<>())
      .def_readwrite("log_decay", &TokenArgs::log_decay)
      .def_readwrite("beta", &TokenArgs::beta)
      .def_readwrite("initial_state", &TokenArgs::initial_state)
      .def_readwrite("initial_key_sum", &TokenArgs::initial_key_sum)
      .def_readwrite("d_final_state", &TokenArgs::d_final_state)
      .def_readwrite("d_final_key_sum", &TokenArgs::d_final_key_sum)
      .def_readwrite("bias", &TokenArgs::bias)
      .def_readwrite("sinks", &TokenArgs::sinks)
      .def_readwrite("alibi_slopes", &TokenArgs::alibi_slopes);

  py::class_<SavedState, std::shared_ptr<SavedState>>(m, "Saved")
      .def_property_readonly(
          "lse",
          [](py::object self) -> py::object {
            const attnlab::RowLogSumExp& lse = self.cast<SavedState&>().saved.lse;
            if (lse.size() == 0) return py::none();
            std::vector<py::ssize_t> shape(lse.shape().begin(), lse.shape().end());
            return py::array_t<float>(shape, lse.data(), self);  // a view kept alive by self
          })
      .def_property_readonly("final_state", [](py::object self) -> py::object {
        // (S, z or None), views kept alive by self; None where the variant has no state.
        const attnlab::RecurrentState& s = self.cast<SavedState&>().saved.final_state;
        if (s.empty()) return py::none();
        const auto array = [&](const auto& t) -> py::object {
          if (t.size() == 0) return py::none();
          std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
          return py::array_t<float>(shape, t.data(), self);
        };
        return py::make_tuple(array(s.memory), array(s.key_sum));
      });

  py::class_<DecoderHandle>(m, "TokenDecoder")
      .def("prefill", &DecoderHandle::prefill, py::arg("q"), py::arg("k"), py::arg("v"),
           py::arg("tokens"), py::arg("lengths"))
      .def("step", &DecoderHandle::step, py::arg("q"), py::arg("k"), py::arg("v"),
           py::arg("tokens"))
      .def("extend", &DecoderHandle::extend, py::arg("k"), py::arg("v"), py::arg("tokens"))
      .def_property_readonly("tokens", &DecoderHandle::tokens)
      .def_property_readonly("bytes", &DecoderHandle::bytes);

  py::class_<Backend>(m, "Backend")
      .def(py::init<const std::string&>(), py::arg("spec"))
      .def_property_readonly("spec", &Backend::spec)
      .def_property_readonly("support", &Backend::support)
      .def("forward", &Backend::forward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("mask"),
           py::arg("tokens"), py::arg("save") = false)
      .def("backward", &Backend::backward, py::arg("q"), py::arg("k"), py::arg("v"),
           py::arg("mask"), py::arg("tokens"), py::arg("out"), py::arg("d_out"),
           py::arg("saved") = py::none())
      .def("start_decoding", &Backend::start_decoding, py::arg("batch"), py::arg("heads"),
           py::arg("dk"), py::arg("dv"), py::arg("kv_heads"), py::arg("scale"),
           py::arg("max_tokens"), py::arg("mask"), py::arg("tokens"))
      .def("forward_bf16", &Backend::forward_bf16, py::arg("q"), py::arg("k"), py::arg("v"),
           py::arg("mask"), py::arg("tokens"), py::arg("save") = false,
           py::arg("float32_out") = false)
      .def("backward_bf16", &Backend::backward_bf16, py::arg("q"), py::arg("k"), py::arg("v"),
           py::arg("mask"), py::arg("tokens"), py::arg("out"), py::arg("d_out"),
           py::arg("saved") = py::none())
      .def("parameters", &Backend::parameters, py::arg("heads"))
      .def("set_parameters", &Backend::set_parameters, py::arg("values"))
      .def("_time_cpp_forward", &Backend::time_cpp_forward, py::arg("q"), py::arg("k"),
           py::arg("v"), py::arg("mask"), py::arg("calls"));

  m.def("variants", &attnlab::attention_names);
  // float32 to bf16 bits (round to nearest even) and back (exact), any shape.
  m.def(
      "round_bf16",
      [](const Floats& a) {
        Halves bits(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()));
        attnlab::round_to_bf16(a.data(), reinterpret_cast<attnlab::bf16*>(bits.mutable_data()),
                               static_cast<std::size_t>(a.size()));
        return bits;
      },
      py::arg("a"));
  m.def(
      "widen_bf16",
      [](const Halves& a) {
        Floats out(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()));
        attnlab::widen_bf16(reinterpret_cast<const attnlab::bf16*>(a.data()), out.mutable_data(),
                            static_cast<std::size_t>(a.size()));
        return out;
      },
      py::arg("a"));
  m.def("bf16_path", [] {
    return std::string(attnlab::kernels::bf16_path_name(attnlab::kernels::active_bf16_path()));
  });
  m.def(
      "alibi_slopes", [](std::size_t heads) { return head_array(attnlab::alibi_slopes(heads)); },
      py::arg("heads"));
  // For python/tests/test_numpy.py: the address the library reads an argument at.
  m.def("_read_address", [](const Floats& a) {
    return reinterpret_cast<std::uintptr_t>(a.ndim() == 3 ? token_view(a).data() : view(a).data());
  });
  m.def("reference", &reference, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("mask"),
        py::arg("tokens"));
  m.def("compare", &compare, py::arg("out"), py::arg("ref"));
}
