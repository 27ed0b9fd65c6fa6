// attnlab: efficient attention variants behind one interface. Include this one header.
#pragma once

#include "attnlab/attention.hpp"
#include "attnlab/decoder.hpp"
#include "attnlab/error.hpp"
#include "attnlab/factory.hpp"
#include "attnlab/mask.hpp"
#include "attnlab/metrics.hpp"
#include "attnlab/reference.hpp"
#include "attnlab/tensor.hpp"

/// Efficient attention variants behind one interface: Attention, make_attention, Mask, the fp64
/// reference and the error metrics; the backends in variants/, the model layers in models/.
namespace attnlab {}

/// Building blocks of models (multi-head attention, Transformer layers) over any attention spec.
namespace attnlab::models {}

/// What BLAS runs (OpenBLAS's core, threads) and the OpenBLAS core that fits this CPU.
namespace attnlab::blas {}

/// The hot loops shared by the variants (tiles, online softmax), one build per instruction set.
namespace attnlab::kernels {}
